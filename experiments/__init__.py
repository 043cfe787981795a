"""Hydra entry points that wire ``algos`` and ``envs`` onto the cluster (Ray Train, Tune and the shared pool).

Kept import-free: ``python3 -m experiments.venv`` must run with nothing but the standard library.
"""
