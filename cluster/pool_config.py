"""The shared pool's shape: worker groups (one per resource shape) and the pool's bounds.

The top-level fields describe the ``default`` group, which every sampler can use; ``groups`` adds named groups of
another shape, e.g. GPU workers for diffusion models and LMs beside CPU workers for MuJoCo env shards (verl's
resource pools). A sampler type declares the group it wants when it is registered; a pool without that group runs
it in ``default``, so a laptop keeps one small group.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

DEFAULT_GROUP = "default"
# What a client and a running manager must agree on (call signatures, stream items, acknowledgements). The pool is
# detached and outlives the code that started it: a client of other pool code would fail deep inside a call, so
# attach compares this first. Bump it with any change to the manager's methods or what they stream.
POOL_PROTOCOL = 2


@dataclass
class WorkerGroup:
    num_workers: int = 2
    num_cpus: float = 0.5  # fractional by default: on 2 cores the pool must leave room for learners and trials
    num_gpus: float = 0.0
    slots_per_worker: int = 1  # concurrent requests per worker (threads; for samplers that release the GIL)
    torch_threads: int = 1
    # Placement over nodes: DEFAULT (Ray packs, then spreads) or SPREAD (one worker per node first, so a node that
    # leaves takes few workers with it); ``resources`` are custom resources each worker needs (e.g. {"sampler": 1}
    # to keep samplers on nodes started with --resources='{"sampler": 8}').
    strategy: str = "DEFAULT"
    resources: dict[str, float] = field(default_factory=dict)
    # Bytes of arrays/tensors each worker's caches (samplers and weights) may hold; least recently used out. Set it
    # to what one worker's memory (a GPU share) fits: a few LMs, not 16.
    max_cache_bytes: int = 4 * 2**30

    def check(self, where: str) -> None:
        if self.num_workers < 1:
            raise ValueError(f"{where}.num_workers: must be >= 1, got {self.num_workers}")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError(f"{where}.num_cpus/num_gpus: must be >= 0, got {self.num_cpus}/{self.num_gpus}")
        if self.num_gpus > 1 and self.num_gpus != int(self.num_gpus):
            raise ValueError(f"{where}.num_gpus: fractions must fit one GPU (<= 1) or be whole, got {self.num_gpus}")
        if self.slots_per_worker < 1:
            raise ValueError(f"{where}.slots_per_worker: must be >= 1, got {self.slots_per_worker}")
        if self.torch_threads < 1:
            raise ValueError(f"{where}.torch_threads: must be >= 1, got {self.torch_threads}")
        if self.strategy not in ("DEFAULT", "SPREAD"):
            raise ValueError(f"{where}.strategy: must be DEFAULT or SPREAD, got {self.strategy!r}")
        if self.max_cache_bytes < 1:
            raise ValueError(f"{where}.max_cache_bytes: must be >= 1, got {self.max_cache_bytes}")
        bad = {k: v for k, v in self.resources.items() if not isinstance(v, (int, float)) or v < 0}
        if bad:
            raise ValueError(f"{where}.resources: amounts must be numbers >= 0, got {bad}")

    def resources_per_worker(self) -> dict[str, float]:
        out = {"CPU": self.num_cpus, **self.resources}
        if self.num_gpus:
            out["GPU"] = self.num_gpus
        return out


_GROUP_KEYS = {f.name for f in fields(WorkerGroup)}


@dataclass
class PoolConfig(WorkerGroup):
    name: str = "orrery-pool"
    groups: dict[str, Any] = field(default_factory=dict)  # named groups: {gpu: {num_workers: 4, num_gpus: 0.25}}
    revive_timeout_s: float = 60.0
    max_retries: int = 2  # worker deaths one request may cause before it fails with a SamplerError
    ready_timeout_s: float = 120.0  # attach fails, naming the resources, when workers are not placed by then
    max_samplers_per_worker: int = 16  # LRU bounds of each worker's caches (runs that crashed never release)
    max_weights_per_worker: int = 8
    max_published_keys: int = 256  # weights keys the manager keeps (least recently used first out)
    # Small requests travel in batches: one worker call carries as many of a map's requests as take about
    # batch_target_s (from the seconds its earlier requests took), at most max_batch, and never so many that the
    # map's workers go idle. Ray's per-call cost (~3 ms of CPU over driver, manager and worker) then stops
    # dominating requests of a few ms. 0 turns batching off.
    batch_target_s: float = 0.05
    max_batch: int = 64
    # A request running longer than this (building its sampler and loading weights included) ends its map with a
    # RequestTimeout naming it; its worker is killed and replaced. A sampler may set its own at register(timeout_s=).
    request_timeout_s: float = 600.0
    max_request_bytes: int = 2**30  # one request's payload; a bigger one is refused before it is sent

    def __post_init__(self) -> None:
        self.check("pool")
        for name, group in self.groups.items():
            if name == DEFAULT_GROUP:
                raise ValueError(f"pool.groups.{name}: the default group is the pool's top-level keys")
            unknown = sorted(set(group) - _GROUP_KEYS) if isinstance(group, dict) else ["(not a mapping)"]
            if unknown:
                raise ValueError(f"pool.groups.{name}.{unknown[0]}: unknown key (valid: {', '.join(sorted(_GROUP_KEYS))})")
            WorkerGroup(**group).check(f"pool.groups.{name}")
        for key in ("max_retries",):
            if getattr(self, key) < 0:
                raise ValueError(f"pool.{key}: must be >= 0, got {getattr(self, key)}")
        if self.batch_target_s < 0:
            raise ValueError(f"pool.batch_target_s: must be >= 0 (0: no batching), got {self.batch_target_s}")
        for key in ("max_samplers_per_worker", "max_weights_per_worker", "max_published_keys", "max_batch"):
            if getattr(self, key) < 1:
                raise ValueError(f"pool.{key}: must be >= 1, got {getattr(self, key)}")
        if self.ready_timeout_s <= 0 or self.revive_timeout_s <= 0:
            raise ValueError("pool.ready_timeout_s/revive_timeout_s: must be > 0")
        if not self.request_timeout_s > 0:
            raise ValueError(f"pool.request_timeout_s: must be > 0 seconds, got {self.request_timeout_s}")
        if self.max_request_bytes < 1:
            raise ValueError(f"pool.max_request_bytes: must be >= 1, got {self.max_request_bytes}")

    def worker_groups(self) -> dict[str, WorkerGroup]:
        default = WorkerGroup(**{k: v for k, v in asdict(self).items() if k in _GROUP_KEYS})
        return {DEFAULT_GROUP: default, **{name: WorkerGroup(**g) for name, g in self.groups.items()}}
