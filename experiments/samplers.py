"""Sampler types the experiments put on the shared pool, by name -> ``module:factory``.

A new method plugs in by adding its sampler here; the pool itself never changes.
"""
from __future__ import annotations

from cluster.pool import PoolConfig, SharedPool

SAMPLERS: dict[str, str] = {
    "env": "experiments.env_sampler:EnvSampler",
    "diffusion": "experiments.vidd_sampler:DiffusionSampler",
    "lm": "experiments.attnrl_sampler:LMSampler",
}


def attach_pool(cfg: PoolConfig | dict | None = None) -> SharedPool:
    """Attach to (or create) the named pool and make sure every sampler type is registered."""
    pool = SharedPool.attach(cfg)
    for name, factory in SAMPLERS.items():
        pool.register(name, factory)
    return pool
