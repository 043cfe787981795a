"""The shared pool's interface served in this process: the same sampler classes a pool worker builds, called directly.

A learner driven by ``ddp.local_session`` (a study unit: one rank, no Ray) talks to this instead of ``SharedPool``, so
its real env steps and evaluations run the very sampler code a cluster job's pool workers run. Samplers are cached
as a pool worker caches them (per factory, exact config and affinity slot: a stateful env keeps its episodes between
requests) and get a published weight version once, before their next request.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cluster.pool_worker import config_digest, import_factory


class LocalPool:
    """``map`` and ``publish`` of ``SharedPool`` for one process. ``factories``: sampler name -> ``module:callable``
    (or (``module:callable``, group), as ``experiments.registry.sampler_factories`` gives them)."""

    def __init__(self, factories: Mapping[str, str | tuple[str, str]]) -> None:
        self.factories = {name: f if isinstance(f, str) else f[0] for name, f in factories.items()}
        self.weights: dict[str, tuple[int, Any]] = {}
        self.samplers: dict[tuple[str, str, int], list[Any]] = {}  # key -> [sampler, loaded version per weight key]

    def publish(self, key: str, weights: Any) -> int:
        version = self.weights.get(key, (0, None))[0] + 1
        self.weights[key] = (version, weights)
        return version

    def map(self, sampler: str, requests: Sequence[dict], *, config: dict | None = None, weights: str | None = None,
            affinity: Sequence[int] | None = None) -> list[Any]:
        """Results in request order. ``affinity`` picks the sampler instance (a pool worker slot), as on the pool."""
        if sampler not in self.factories:
            raise KeyError(f"unknown sampler {sampler!r}; registered: {sorted(self.factories)}")
        if affinity is not None and len(affinity) != len(requests):
            raise ValueError(f"affinity has {len(affinity)} entries for {len(requests)} requests")
        if weights is not None and weights not in self.weights:
            raise KeyError(f"no weights published under {weights!r}")
        config = config or {}
        digest = config_digest(config)
        out = []
        for i, request in enumerate(requests):
            slot = -1 if affinity is None else int(affinity[i])
            entry = self.samplers.get((sampler, digest, slot))
            if entry is None:
                instance = import_factory(self.factories[sampler])(dict(config))
                entry = self.samplers[(sampler, digest, slot)] = [instance, {}]
            instance, loaded = entry
            if weights is not None:
                version, value = self.weights[weights]
                if loaded.get(weights) != version:
                    instance.load_weights(value, version)
                    loaded[weights] = version
            out.append(instance.sample(dict(request)))
        return out

    def close(self) -> None:
        for instance, _ in self.samplers.values():
            rollout = getattr(instance, "rollout", None)
            if rollout is not None and hasattr(rollout, "close"):
                rollout.close()
        self.samplers.clear()
