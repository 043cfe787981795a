"""The shared actor pool: long-lived sampler workers that every job on the cluster attaches to by name.

Shape (one per cluster, in the ``orrery`` namespace, all detached so they outlive the driver that made them):

    PoolManager "<name>"            async actor, 0 CPUs: registry of sampler factories, weights by version,
        │                           load balancing, retries, Ray metrics; streams results back as they finish
        ├── PoolWorker "<name>-worker-0"   hosts samplers built from registered factories ("module:callable")
        └── PoolWorker "<name>-worker-1"   ... each with its own ``num_cpus`` / fractional ``num_gpus``

A sampler is any object built as ``factory(config: dict)`` with ``sample(request: dict) -> Any`` and, if it uses
weights, ``load_weights(weights, version: int)``. Samplers are cached per (factory, config) in each worker, so
stateful samplers (vectorised envs mid-episode) keep their state between requests; ``affinity`` pins requests of
one shard to one worker while it lives.

Weights are published once per version: the manager re-puts them so it owns the object (a driver may exit), and
requests carry only ``(key, version, [ObjectRef])``; a worker fetches a version at most once.

A worker that dies mid-request is restarted (by Ray, or re-created by the manager when killed for good) and the
request is re-run on whichever worker is free next: each request yields exactly one result; ``retries`` and
``restarts`` are counted and exported.
"""
from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import time
from collections import defaultdict, deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Sequence

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from cluster.connect import NAMESPACE
from cluster.echo_sampler import BUILTIN_SAMPLERS

log = logging.getLogger(__name__)

HEAD_NODE_RESOURCE = "node:__internal_head__"  # every Ray head node has 1 of it


@dataclass
class PoolConfig:
    name: str = "orrery-pool"
    num_workers: int = 2
    num_cpus: float = 0.5  # fractional by default: on 2 cores the pool must leave room for learners and trials
    num_gpus: float = 0.0
    slots_per_worker: int = 1  # concurrent requests per worker (>1 only for samplers that release the GIL)
    torch_threads: int = 1
    revive_timeout_s: float = 60.0
    # Placement over nodes: DEFAULT (Ray packs, then spreads) or SPREAD (one worker per node first, so a node that
    # leaves takes few workers with it); ``resources`` are custom resources each worker needs (e.g. {"sampler": 1}
    # to keep samplers on nodes started with --resources='{"sampler": 8}').
    strategy: str = "DEFAULT"
    resources: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"pool.num_workers: must be >= 1, got {self.num_workers}")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError(f"pool.num_cpus/num_gpus: must be >= 0, got {self.num_cpus}/{self.num_gpus}")
        if self.num_gpus > 1 and self.num_gpus != int(self.num_gpus):
            raise ValueError(f"pool.num_gpus: fractions must fit one GPU (<= 1) or be whole, got {self.num_gpus}")
        if self.slots_per_worker < 1:
            raise ValueError(f"pool.slots_per_worker: must be >= 1, got {self.slots_per_worker}")
        if self.strategy not in ("DEFAULT", "SPREAD"):
            raise ValueError(f"pool.strategy: must be DEFAULT or SPREAD, got {self.strategy!r}")
        bad = {k: v for k, v in self.resources.items() if not isinstance(v, (int, float)) or v < 0}
        if bad:
            raise ValueError(f"pool.resources: amounts must be numbers >= 0, got {bad}")


class SamplerError(RuntimeError):
    """A sampler raised: a bug or bad request, not a dead worker, so the request is not retried."""


def _import(path: str) -> Callable[..., Any]:
    module, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"sampler factory must look like 'package.module:callable', got {path!r}")
    return getattr(importlib.import_module(module), attr)


def _config_key(factory: str, config: dict) -> str:
    return factory + json.dumps(config, sort_keys=True, default=str)


@ray.remote(max_restarts=-1, max_task_retries=0)
class PoolWorker:
    """Hosts samplers; caches the latest weights of each key."""

    def __init__(self, index: int, torch_threads: int) -> None:
        self.index = index
        self.torch_threads = torch_threads
        self.samplers: dict[str, Any] = {}
        self.loaded: dict[str, tuple[str, int]] = {}  # sampler key -> (weights key, version) it holds
        self.weights: dict[str, tuple[int, Any]] = {}
        self.weight_fetches = 0
        self.requests = 0
        os.environ.setdefault("OMP_NUM_THREADS", str(torch_threads))

    def ping(self) -> int:
        return os.getpid()

    def stats(self) -> dict[str, Any]:
        return {"index": self.index, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "requests": self.requests,
                "resources": ray.get_runtime_context().get_assigned_resources(),
                "weight_fetches": self.weight_fetches, "samplers": len(self.samplers),
                "cached_weights": {k: v for k, (v, _) in self.weights.items()}}

    def _sampler(self, factory: str, config: dict) -> tuple[str, Any]:
        key = _config_key(factory, config)
        if key not in self.samplers:
            _limit_torch_threads(self.torch_threads)
            self.samplers[key] = _import(factory)(config)
        return key, self.samplers[key]

    def _weights(self, key: str, version: int, boxed: list) -> Any:
        cached = self.weights.get(key)
        if cached is None or cached[0] != version:
            self.weights[key] = (version, ray.get(boxed[0]))
            self.weight_fetches += 1
        return self.weights[key][1]

    def run(self, factory: str, config: dict, request: dict, weights: tuple | None) -> tuple[Any, int, float]:
        start = time.perf_counter()
        self.requests += 1
        try:
            skey, sampler = self._sampler(factory, config)
            if weights is not None:
                wkey, version, boxed = weights
                if self.loaded.get(skey) != (wkey, version):
                    sampler.load_weights(self._weights(wkey, version, boxed), version)
                    self.loaded[skey] = (wkey, version)
            result = sampler.sample(request)
        except Exception as err:  # noqa: BLE001 - reported to the caller with the sampler's own traceback
            import traceback
            raise SamplerError(f"sampler {factory} failed on worker {self.index}: {err!r}\n"
                               f"{traceback.format_exc()}") from None
        n = result.get("num_samples", 1) if isinstance(result, dict) else 1
        return result, int(n), time.perf_counter() - start


def _limit_torch_threads(n: int) -> None:
    try:
        import torch
        torch.set_num_threads(n)
    except ImportError:
        pass


class RateWindow:
    """Samples per second over the last ``seconds``: a queue of (time, samples) with a running total, so adding
    and reading cost O(1) amortised however many requests the window holds."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.events: deque[tuple[float, int]] = deque()
        self.total = 0

    def _expire(self, now: float) -> None:
        while self.events and now - self.events[0][0] >= self.seconds:
            self.total -= self.events.popleft()[1]

    def add(self, now: float, samples: int) -> None:
        self.events.append((now, samples))
        self.total += samples
        self._expire(now)

    def rate(self, now: float) -> float:
        """Samples in the window / its span (at least 1 s, so one early request does not read as a burst)."""
        self._expire(now)
        span = max(now - self.events[0][0], 1.0) if self.events else 1.0
        return self.total / span


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=10_000)
class PoolManager:
    """Single controller of the pool (async actor: many callers, many in-flight requests)."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = PoolConfig(**cfg)
        self.factories: dict[str, str] = dict(BUILTIN_SAMPLERS)
        self.published: dict[str, tuple[int, ray.ObjectRef]] = {}
        self.workers: list[Any] = [self._make_worker(i) for i in range(self.cfg.num_workers)]
        self.alive = [True] * self.cfg.num_workers
        self.inflight = [0] * self.cfg.num_workers
        # requests waiting for a worker, oldest first: (preferred worker or None, future that receives the worker)
        self.waiting: deque[tuple[int | None, asyncio.Future]] = deque()
        self.counts: dict[str, Any] = {"requests": 0, "samples": 0, "retries": 0, "restarts": 0, "queued": 0}
        self.per_sampler: dict[str, dict[str, float]] = defaultdict(
            lambda: {"requests": 0, "samples": 0, "busy_s": 0.0})
        self.started = time.time()
        self.window = RateWindow(30.0)
        self.refresher: asyncio.Task | None = None
        self._metrics()

    # -- setup ---------------------------------------------------------------------------------------------------
    def _make_worker(self, i: int) -> Any:
        opts: dict[str, Any] = dict(name=f"{self.cfg.name}-worker-{i}", namespace=NAMESPACE, lifetime="detached",
                                    get_if_exists=True, num_cpus=self.cfg.num_cpus)
        if self.cfg.num_gpus:
            opts["num_gpus"] = self.cfg.num_gpus
        if self.cfg.resources:
            opts["resources"] = dict(self.cfg.resources)
        # An explicit strategy also keeps workers out of any placement group of the caller (a Tune trial's).
        opts["scheduling_strategy"] = self.cfg.strategy
        return PoolWorker.options(**opts).remote(i, self.cfg.torch_threads)

    def _metrics(self) -> None:
        from ray.util import metrics
        tags = ("pool",)
        self.m_requests = metrics.Counter("orrery_pool_requests", "requests served", tag_keys=tags + ("sampler",))
        self.m_samples = metrics.Counter("orrery_pool_samples", "samples produced", tag_keys=tags + ("sampler",))
        self.m_retries = metrics.Counter("orrery_pool_retries", "requests re-run after a worker died", tag_keys=tags)
        self.m_restarts = metrics.Counter("orrery_pool_restarts", "workers restarted or replaced", tag_keys=tags)
        self.m_queue = metrics.Gauge("orrery_pool_queue_depth", "requests waiting for a worker", tag_keys=tags)
        self.m_rate = metrics.Gauge("orrery_pool_samples_per_second", "samples/s over the last 30 s", tag_keys=tags)
        self.m_version = metrics.Gauge("orrery_pool_weights_version", "latest published version",
                                       tag_keys=tags + ("key",))
        self.m_latency = metrics.Histogram("orrery_pool_request_seconds", "request latency",
                                           boundaries=[0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120],
                                           tag_keys=tags + ("sampler",))
        self.tags = {"pool": self.cfg.name}

    async def _refresh_gauges(self) -> None:
        """Re-set the gauges periodically: Ray's metrics agent drops a gauge not refreshed within two export
        intervals, so an idle pool would otherwise vanish from Prometheus (and samples/s would never decay to 0)."""
        period = max(0.5, ray._config.metrics_report_interval_ms() / 2000)
        while True:
            self.m_rate.set(self.window.rate(time.time()), tags=self.tags)
            self.m_queue.set(self.counts["queued"], tags=self.tags)
            for key, (version, _) in self.published.items():
                self.m_version.set(version, tags={**self.tags, "key": key})
            await asyncio.sleep(period)

    def _ensure_refresher(self) -> None:
        if self.refresher is None:
            self.refresher = asyncio.get_running_loop().create_task(self._refresh_gauges())

    async def ready(self) -> dict:
        self._ensure_refresher()
        await asyncio.gather(*[w.ping.remote() for w in self.workers])
        return {"name": self.cfg.name, "config": asdict(self.cfg)}

    async def register(self, name: str, factory: str) -> None:
        old = self.factories.get(name)
        if old is not None and old != factory:
            raise ValueError(f"sampler {name!r} is already registered as {old!r}, not {factory!r}")
        self.factories[name] = factory

    async def publish(self, key: str, boxed: list) -> int:
        obj = await boxed[0]
        version = self.published.get(key, (0, None))[0] + 1
        self.published[key] = (version, ray.put(obj))  # owned by the (detached) manager, not the publisher
        self.m_version.set(version, tags={**self.tags, "key": key})
        return version

    async def version(self, key: str) -> int:
        return self.published.get(key, (0, None))[0]

    # -- scheduling ----------------------------------------------------------------------------------------------
    def _pick(self, preferred: int | None) -> int | None:
        """The least busy free worker a request may use now (its pinned worker while that one lives), or None."""
        n = len(self.workers)
        pin = preferred % n if preferred is not None else None
        candidates = (pin,) if pin is not None and self.alive[pin] else range(n)
        free = [i for i in candidates if self.alive[i] and self.inflight[i] < self.cfg.slots_per_worker]
        return min(free, key=self.inflight.__getitem__) if free else None

    def _any_free(self) -> bool:
        return any(alive and busy < self.cfg.slots_per_worker for alive, busy in zip(self.alive, self.inflight))

    def _set_queued(self) -> None:
        self.counts["queued"] = len(self.waiting)
        self.m_queue.set(self.counts["queued"], tags=self.tags)

    def _dispatch(self) -> None:
        """Hand free slots to waiting requests, oldest first; only a request that gets a worker wakes up.

        Invariant (after every call): no waiting request could use a free slot, so a new request that finds a
        free slot takes it without overtaking anyone who could have had it.
        """
        skipped = []
        while self.waiting and self._any_free():
            preferred, slot = self.waiting.popleft()
            if slot.done():  # cancelled while waiting
                continue
            w = self._pick(preferred)
            if w is None:  # pinned to a busy worker: keep its place in the queue
                skipped.append((preferred, slot))
                continue
            self.inflight[w] += 1
            slot.set_result(w)
        self.waiting.extendleft(reversed(skipped))
        self._set_queued()

    async def _acquire(self, preferred: int | None) -> int:
        w = self._pick(preferred)
        if w is not None:
            self.inflight[w] += 1
            return w
        slot = asyncio.get_running_loop().create_future()
        entry = (preferred, slot)
        self.waiting.append(entry)
        self._set_queued()
        try:
            return await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():  # handed a worker just as the request was cancelled
                self._release(slot.result())
            elif entry in self.waiting:
                self.waiting.remove(entry)
                self._set_queued()
            raise

    def _release(self, w: int) -> None:
        self.inflight[w] -= 1
        self._dispatch()

    async def _release_when_done(self, w: int, ref: ray.ObjectRef) -> None:
        try:
            await ref
        except Exception:  # noqa: BLE001 - the result was abandoned; only the slot matters
            pass
        finally:
            self._release(w)

    async def _revive(self, w: int) -> None:
        """Wait for Ray to restart worker ``w``; re-create it if it was killed for good."""
        self.counts["restarts"] += 1
        self.m_restarts.inc(1, tags=self.tags)
        deadline = time.time() + self.cfg.revive_timeout_s
        while time.time() < deadline:
            try:
                await asyncio.wait_for(self.workers[w].ping.remote(), timeout=10)
                break
            except ActorDiedError:
                await asyncio.sleep(0.2)  # the name is released asynchronously
                try:
                    self.workers[w] = self._make_worker(w)
                except ValueError:
                    pass
            except (RayActorError, ActorUnavailableError, asyncio.TimeoutError):
                await asyncio.sleep(0.2)
        self.alive[w] = True
        self._dispatch()

    async def _run_one(self, i: int, sampler: str, factory: str, config: dict, request: dict,
                       weights: tuple | None, preferred: int | None) -> tuple[int, Any]:
        while True:
            w = await self._acquire(preferred)
            ref = self.workers[w].run.remote(factory, config, request, weights)
            try:
                result, n, seconds = await ref
            except asyncio.CancelledError:
                # The map was abandoned (another of its requests failed, or its driver left) while the worker still
                # runs this request: its slot comes back when the worker is done, not before and not never.
                asyncio.get_running_loop().create_task(self._release_when_done(w, ref))
                raise
            except (RayActorError, ActorUnavailableError):
                self.counts["retries"] += 1
                self.m_retries.inc(1, tags=self.tags)
                log.warning("pool worker %d died during request %d of %s: retrying elsewhere", w, i, sampler)
                if self.alive[w]:
                    self.alive[w] = False
                    asyncio.get_running_loop().create_task(self._revive(w))
                self._release(w)
                continue
            except ray.exceptions.RayTaskError as err:
                self._release(w)
                raise (err.cause if isinstance(err.cause, SamplerError) else SamplerError(str(err))) from None
            except Exception:
                self._release(w)
                raise
            self._release(w)
            self.counts["requests"] += 1
            self.counts["samples"] += n
            stats = self.per_sampler[sampler]
            stats["requests"] += 1
            stats["samples"] += n
            stats["busy_s"] += seconds
            now = time.time()
            self.window.add(now, n)
            tags = {**self.tags, "sampler": sampler}
            self.m_requests.inc(1, tags=tags)
            self.m_samples.inc(n, tags=tags)
            self.m_latency.observe(seconds, tags=tags)
            self.m_rate.set(self.window.rate(now), tags=self.tags)
            return i, result

    async def run(self, sampler: str, config: dict, requests: list[dict], weights_key: str | None = None,
                  affinity: list[int] | None = None):
        """Streaming generator: yields ``(request_index, result)`` as each request finishes."""
        self._ensure_refresher()
        factory = self.factories.get(sampler)
        if factory is None:
            raise KeyError(f"unknown sampler {sampler!r}; registered: {sorted(self.factories)}")
        weights = None
        if weights_key is not None:
            if weights_key not in self.published:
                raise KeyError(f"no weights published under {weights_key!r}; published: {sorted(self.published)}")
            version, ref = self.published[weights_key]
            weights = (weights_key, version, [ref])
        tasks = [asyncio.ensure_future(self._run_one(i, sampler, factory, config, req, weights,
                                                     None if affinity is None else affinity[i]))
                 for i, req in enumerate(requests)]
        try:
            for fut in asyncio.as_completed(tasks):
                yield await fut
        finally:
            for t in tasks:
                t.cancel()

    async def stats(self) -> dict[str, Any]:
        worker_stats = []
        for i, w in enumerate(self.workers):
            try:
                worker_stats.append(await asyncio.wait_for(w.stats.remote(), timeout=5))
            except Exception as err:  # noqa: BLE001 - a dying worker must not break monitoring
                worker_stats.append({"index": i, "error": repr(err)})
        return {**self.counts, "name": self.cfg.name, "num_workers": len(self.workers), "alive": list(self.alive),
                "inflight": list(self.inflight),
                "uptime_s": time.time() - self.started, "per_sampler": {k: dict(v) for k, v in self.per_sampler.items()},
                "weights_versions": {k: v for k, (v, _) in self.published.items()}, "workers": worker_stats,
                "samplers": dict(self.factories), "config": asdict(self.cfg)}

    async def worker_handles(self) -> list:
        return list(self.workers)

    async def shutdown_workers(self) -> None:
        for w in self.workers:
            ray.kill(w, no_restart=True)


class SharedPool:
    """Driver-side handle to the named pool; any number of drivers/jobs may hold one at once."""

    def __init__(self, manager: Any, name: str) -> None:
        self.manager = manager
        self.name = name

    @classmethod
    def attach(cls, cfg: PoolConfig | dict | None = None, *, create: bool = True) -> "SharedPool":
        """Attach to the pool named ``cfg.name``, creating it (and its workers) if it does not exist yet."""
        cfg = cfg if isinstance(cfg, PoolConfig) else PoolConfig(**(cfg or {}))
        if create:
            # The manager holds the pool's state: keep it on the head node, which outlives worker nodes. The
            # explicit strategy keeps it out of the caller's placement group (a Tune trial's, a Train worker's):
            # the pool belongs to the cluster, not to whoever happened to create it.
            manager = PoolManager.options(name=cfg.name, namespace=NAMESPACE, lifetime="detached",
                                          get_if_exists=True, resources={HEAD_NODE_RESOURCE: 0.001},
                                          scheduling_strategy="DEFAULT").remote(asdict(cfg))
        else:
            manager = ray.get_actor(cfg.name, namespace=NAMESPACE)
        info = ray.get(manager.ready.remote())
        if create and info["config"] != asdict(cfg):
            log.warning("pool %r already exists with %s; attaching to it as is (asked for %s)",
                        cfg.name, info["config"], asdict(cfg))
        return cls(manager, cfg.name)

    def register(self, name: str, factory: str) -> None:
        ray.get(self.manager.register.remote(name, factory))

    def publish(self, key: str, weights: Any) -> int:
        """Publish a new version of ``weights`` under ``key``; returns the version number (1, 2, ...)."""
        return ray.get(self.manager.publish.remote(key, [ray.put(weights)]))

    def imap(self, sampler: str, requests: Sequence[dict], *, config: dict | None = None,
             weights: str | None = None, affinity: Sequence[int] | None = None) -> Iterator[tuple[int, Any]]:
        """Yield ``(index, result)`` for every request, in completion order, each exactly once."""
        if affinity is not None and len(affinity) != len(requests):
            raise ValueError(f"affinity has {len(affinity)} entries for {len(requests)} requests")
        gen = self.manager.run.options(num_returns="streaming").remote(
            sampler, config or {}, list(requests), weights, None if affinity is None else list(affinity))
        for ref in gen:
            try:
                yield ray.get(ref)
            except ray.exceptions.RayTaskError as err:
                # re-raise what went wrong (a SamplerError with the worker's traceback, an unknown sampler, ...)
                raise (err.cause if isinstance(err.cause, Exception) else err) from None

    def map(self, sampler: str, requests: Sequence[dict], **kwargs: Any) -> list[Any]:
        """Like :meth:`imap` but returns results in request order."""
        out: list[Any] = [None] * len(requests)
        for i, result in self.imap(sampler, requests, **kwargs):
            out[i] = result
        return out

    def submit(self, sampler: str, requests: Sequence[dict], **kwargs: Any) -> "PendingMap":
        """Start a map in the background (e.g. collect step k+1 while learning on step k)."""
        return PendingMap(self, sampler, list(requests), kwargs)

    def stats(self) -> dict[str, Any]:
        return ray.get(self.manager.stats.remote())

    def workers(self) -> list:
        return ray.get(self.manager.worker_handles.remote())

    def shutdown(self) -> None:
        """Kill the workers and the manager (other drivers attached to the pool lose it too)."""
        try:
            ray.get(self.manager.shutdown_workers.remote())
        finally:
            ray.kill(self.manager, no_restart=True)


class PendingMap:
    """A map running in a background thread of the driver; ``result()`` blocks and returns results in order."""

    def __init__(self, pool: SharedPool, sampler: str, requests: list[dict], kwargs: dict) -> None:
        import concurrent.futures
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self._future = self._executor.submit(pool.map, sampler, requests, **kwargs)
        self.started = time.perf_counter()

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> list[Any]:
        try:
            return self._future.result(timeout)
        finally:
            self._executor.shutdown(wait=False)
