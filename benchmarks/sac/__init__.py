"""orrery's SAC learner against Stable-Baselines3 and RLlib: ``python -m benchmarks.sac`` (``__main__.py``: the command
and its RESULTS.md section; ``updates.py``, ``pendulum.py``, ``humanoid.py``: its three parts)."""
import os

# Set before any submodule imports numpy or torch (they read it at import).
os.environ.setdefault("OMP_NUM_THREADS", "1")
