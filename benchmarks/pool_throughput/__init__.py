"""Humanoid-v5 env steps/s through the pool against bare MuJoCo and the usual vector envs: ``python -m
benchmarks.pool_throughput`` (``__main__.py``; rows in ``baselines.py`` and ``pool.py``, the section in ``report.py``)."""
import os

# Set before any submodule imports numpy or Ray (they read these at import).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Token auth off for this embedded cluster only: otherwise ray.init writes ~/.ray/auth_token, which flips every later
# `ray start --head` on this machine into token mode (shared/reference/ray.md, P1).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
