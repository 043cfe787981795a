"""The methods orrery runs, found by package: every subpackage of ``experiments`` declares its experiments and the
pool samplers they use.

    experiments/<method>/__init__.py:
        EXPERIMENTS = {"<experiment name>": "experiments.<method>.<module>"}   # module: Config, run(cfg, ctx)
        SAMPLERS = {"<sampler name>": "experiments.<method>.sampler:<Factory>"}   # runs in the default group
        SAMPLERS = {"<sampler name>": ("experiments.<method>.sampler:<Factory>", "gpu")}   # or names its group

A fourth method arrives as new folders (``algos/<method>/``, ``envs/...``, ``experiments/<method>/``, a
``configs/experiment/<name>.yaml``); nothing here, in ``experiments/config.py`` or in ``cluster/`` changes.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any

from cluster.pool import SharedPool
from cluster.pool_config import DEFAULT_GROUP, PoolConfig

# experiments that drive several methods at once live at the top of the package
TOP_LEVEL_EXPERIMENTS = {"tour": "experiments.tour"}


@functools.cache
def method_packages() -> tuple[str, ...]:
    import experiments
    return tuple(f"experiments.{m.name}" for m in pkgutil.iter_modules(experiments.__path__) if m.ispkg)


def _declared(attr: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for package in method_packages():
        for name, target in getattr(importlib.import_module(package), attr, {}).items():
            if name in out:
                raise RuntimeError(f"{attr} {name!r} is declared by {package} and by another method package")
            out[name] = target
    return out


@functools.cache
def experiment_modules() -> dict[str, str]:
    """Experiment name -> module with a ``Config`` dataclass and ``run(cfg, ctx) -> dict``."""
    return {**_declared("EXPERIMENTS"), **TOP_LEVEL_EXPERIMENTS}


@functools.cache
def sampler_factories() -> dict[str, tuple[str, str]]:
    """Pool sampler name -> (``module:factory``, worker group)."""
    return {name: (target, DEFAULT_GROUP) if isinstance(target, str) else tuple(target)
            for name, target in _declared("SAMPLERS").items()}


def attach_pool(cfg: PoolConfig | dict | None = None, *, scope: str | None = None) -> SharedPool:
    """Attach to (or create) the named pool and make sure every method's sampler types are registered; ``scope``
    (a run id) tags what this client leaves in the workers, for ``pool.release()`` at the end of the run."""
    pool = SharedPool.attach(cfg, scope=scope)
    for name, (factory, group) in sampler_factories().items():
        pool.register(name, factory, group)
    return pool
