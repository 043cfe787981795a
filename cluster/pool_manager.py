"""The pool's manager: one detached async actor that only schedules.

It knows the sampler types (name -> factory, worker group), the published weights (key -> version, ObjectRef), the
worker groups and their free slots. A request waits for a slot of its sampler's group: clients (drivers) take turns,
each client's oldest request first, so a driver with 10,000 queued requests does not starve one with 10. The
request runs on the worker; the manager reads only the worker's small ``(samples, seconds)`` reply and hands the
result's ObjectRef to the caller, so no payload crosses the manager.

A worker that dies mid-request is restarted (by Ray, or re-created here when it was killed for good) and the request
runs again elsewhere; after ``max_retries`` such deaths caused by one request, the request fails with a
SamplerError instead of taking down worker after worker.

The manager's state is in memory and may be lost (its node fails, it is killed): Ray restarts it, it re-attaches the
detached workers by name and starts a new ``incarnation``. Weight versions are ``(incarnation, n)``, so a worker
never serves an old incarnation's weights under a new one's number; clients re-register their samplers and
re-publish their latest weights when the new incarnation does not know them, and re-send the requests whose results
they had not received (``cluster.pool.SharedPool``).
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict, defaultdict, deque
from dataclasses import asdict
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from cluster.connect import NAMESPACE
from cluster.echo_sampler import BUILTIN_SAMPLERS
from cluster.pool_config import DEFAULT_GROUP, PoolConfig, WorkerGroup
from cluster.pool_metrics import PoolMetrics
from cluster.pool_worker import PoolWorker, SamplerError

log = logging.getLogger(__name__)


class UnknownName(KeyError):
    """A sampler type or weights key this manager incarnation does not know (lost with a restart, or never made)."""


class Group:
    """One worker group: its workers, which are alive, their busy slots and the requests waiting per client."""

    def __init__(self, pool: str, name: str, cfg: WorkerGroup, max_samplers: int, max_weights: int) -> None:
        self.pool, self.name, self.cfg = pool, name, cfg
        self.max_samplers, self.max_weights = max_samplers, max_weights
        self.workers = [self.make_worker(i) for i in range(cfg.num_workers)]
        self.alive = [True] * cfg.num_workers
        self.inflight = [0] * cfg.num_workers
        self.waiting: dict[str, deque[tuple[int | None, asyncio.Future]]] = {}
        self.turns: deque[str] = deque()  # clients with waiting requests, in the order they are served

    def worker_name(self, i: int) -> str:
        return f"{self.pool}-worker-{i}" if self.name == DEFAULT_GROUP else f"{self.pool}-{self.name}-worker-{i}"

    def make_worker(self, i: int) -> Any:
        c = self.cfg
        opts: dict[str, Any] = dict(name=self.worker_name(i), namespace=NAMESPACE, lifetime="detached",
                                    get_if_exists=True, num_cpus=c.num_cpus, max_concurrency=c.slots_per_worker)
        if c.num_gpus:
            opts["num_gpus"] = c.num_gpus
        if c.resources:
            opts["resources"] = dict(c.resources)
        # An explicit strategy also keeps workers out of any placement group of the caller (a Tune trial's).
        opts["scheduling_strategy"] = c.strategy
        return PoolWorker.options(**opts).remote(self.name, i, c.torch_threads, self.max_samplers, self.max_weights)

    def pick(self, preferred: int | None) -> int | None:
        """The least busy free worker a request may use now (its pinned worker while that one lives), or None."""
        n = len(self.workers)
        pin = preferred % n if preferred is not None else None
        candidates = (pin,) if pin is not None and self.alive[pin] else range(n)
        free = [i for i in candidates if self.alive[i] and self.inflight[i] < self.cfg.slots_per_worker]
        return min(free, key=self.inflight.__getitem__) if free else None

    def any_free(self) -> bool:
        return any(a and busy < self.cfg.slots_per_worker for a, busy in zip(self.alive, self.inflight))

    def queued(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def dispatch(self) -> None:
        """Hand free slots to waiting requests: clients take turns, each client's oldest servable request first; only
        a request that gets a worker wakes up. Afterwards no waiting request could use a free slot, so a new request
        that finds a free slot may take it without overtaking anyone."""
        stalled = 0
        while self.turns and self.any_free() and stalled < len(self.turns):
            client = self.turns.popleft()
            queue = self.waiting[client]
            served = False
            for entry in list(queue):
                preferred, slot = entry
                if slot.done():  # cancelled while waiting
                    queue.remove(entry)
                    continue
                w = self.pick(preferred)
                if w is None:  # pinned to a busy worker: keeps its place
                    continue
                queue.remove(entry)
                self.inflight[w] += 1
                slot.set_result(w)
                served = True
                break
            if queue:
                self.turns.append(client)
            else:
                del self.waiting[client]
            stalled = 0 if served else stalled + 1

    async def acquire(self, client: str, preferred: int | None) -> int:
        w = self.pick(preferred)
        if w is not None:
            self.inflight[w] += 1
            return w
        slot = asyncio.get_running_loop().create_future()
        entry = (preferred, slot)
        if client not in self.waiting:
            self.waiting[client] = deque()
            self.turns.append(client)
        self.waiting[client].append(entry)
        try:
            return await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():  # handed a worker just as the request was cancelled
                self.release(slot.result())
            elif client in self.waiting and entry in self.waiting[client]:
                self.waiting[client].remove(entry)
            raise

    def release(self, w: int) -> None:
        self.inflight[w] -= 1
        self.dispatch()


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=10_000)
class PoolManager:
    """Single controller of the pool (async actor: many callers, many in-flight requests)."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = PoolConfig(**cfg)
        self.incarnation = uuid.uuid4().hex[:8]
        self.factories: dict[str, tuple[str, str]] = {n: (f, DEFAULT_GROUP) for n, f in BUILTIN_SAMPLERS.items()}
        self.published: OrderedDict[str, tuple[int, ray.ObjectRef, str | None]] = OrderedDict()
        self.groups = {name: Group(self.cfg.name, name, g, self.cfg.max_samplers_per_worker,
                                   self.cfg.max_weights_per_worker) for name, g in self.cfg.worker_groups().items()}
        self.counts: dict[str, Any] = {"requests": 0, "samples": 0, "retries": 0, "restarts": 0, "queued": 0,
                                       "failed": 0}
        self.per_sampler: dict[str, dict[str, float]] = defaultdict(
            lambda: {"requests": 0, "samples": 0, "busy_s": 0.0})
        self.clients: OrderedDict[str, float] = OrderedDict()  # client -> last seen
        self.started = time.time()
        self.metrics = PoolMetrics(self.cfg.name)

    # -- registry and weights --------------------------------------------------------------------------------------
    def _set_queued(self) -> None:
        self.counts["queued"] = sum(g.queued() for g in self.groups.values())
        self.metrics.queue_depth(self.counts["queued"])

    def _ensure_refresher(self) -> None:
        self.metrics.keep_fresh(lambda: self.counts["queued"],
                                lambda: {k: v for k, (v, _, _) in self.published.items()})

    async def ready(self, timeout_s: float | None = None) -> dict:
        """Every worker answers (within ``timeout_s``, else a SamplerError naming what could not be placed)."""
        self._ensure_refresher()
        pings = [w.ping.remote() for g in self.groups.values() for w in g.workers]
        try:
            await asyncio.wait_for(asyncio.gather(*pings), timeout=timeout_s)
        except asyncio.TimeoutError:
            wanted = {name: g.cfg.resources_per_worker() for name, g in self.groups.items()}
            raise SamplerError(f"pool {self.cfg.name!r}: its workers could not all be placed within {timeout_s:.0f} s; "
                               f"each worker needs {wanted} (per group); the cluster has "
                               f"{ray.available_resources()} available of {ray.cluster_resources()}") from None
        return {"name": self.cfg.name, "config": asdict(self.cfg), "incarnation": self.incarnation}

    async def register(self, name: str, factory: str, group: str = DEFAULT_GROUP) -> None:
        old = self.factories.get(name)
        if old is not None and old[0] != factory:
            raise ValueError(f"sampler {name!r} is already registered as {old[0]!r}, not {factory!r}")
        self.factories[name] = (factory, group if group in self.groups else DEFAULT_GROUP)

    async def publish(self, key: str, boxed: list, scope: str | None = None,
                      version: int | None = None) -> tuple[str, int]:
        """Record a new version of ``key`` (or, after a restart, the ``version`` a client re-publishes). ``boxed[0]`` is
        the publisher's ObjectRef, kept in a list so that Ray hands it over without fetching: nothing is copied here."""
        if version is None:
            version = self.published.get(key, (0, None, None))[0] + 1
        self.published[key] = (version, boxed[0], scope)
        self.published.move_to_end(key)
        while len(self.published) > self.cfg.max_published_keys:  # runs that crashed before releasing their keys
            self.published.popitem(last=False)
        self.metrics.weights_version(key, version)
        return self.incarnation, version

    async def version(self, key: str) -> tuple[str, int]:
        return self.incarnation, self.published.get(key, (0, None, None))[0]

    async def release(self, scope: str) -> dict[str, int]:
        """Forget a finished run: its weights here, its samplers and cached weights in every worker."""
        keys = [k for k, (_, _, s) in self.published.items() if s == scope]
        for k in keys:
            del self.published[k]
        dropped = {"weights": len(keys), "samplers": 0, "worker_weights": 0}
        for g in self.groups.values():
            for i, w in enumerate(g.workers):
                if not g.alive[i]:
                    continue
                try:
                    out = await asyncio.wait_for(w.release.remote(scope), timeout=10)
                    dropped["samplers"] += out["samplers"]
                    dropped["worker_weights"] += out["weights"]
                except Exception:  # noqa: BLE001 - a dying worker has nothing left to release
                    pass
        return dropped

    # -- running requests ------------------------------------------------------------------------------------------
    async def _revive(self, g: Group, w: int) -> None:
        """Wait for Ray to restart worker ``w``; re-create it if it was killed for good."""
        self.counts["restarts"] += 1
        self.metrics.restart()
        deadline = time.time() + self.cfg.revive_timeout_s
        while time.time() < deadline:
            try:
                await asyncio.wait_for(g.workers[w].ping.remote(), timeout=10)
                break
            except ActorDiedError:
                await asyncio.sleep(0.2)  # the name is released asynchronously
                try:
                    g.workers[w] = g.make_worker(w)
                except ValueError:
                    pass
            except (RayActorError, ActorUnavailableError, asyncio.TimeoutError):
                await asyncio.sleep(0.2)
        g.alive[w] = True
        g.dispatch()

    async def _release_when_done(self, g: Group, w: int, ref: ray.ObjectRef) -> None:
        try:
            await ref
        except Exception:  # noqa: BLE001 - the result was abandoned; only the slot matters
            pass
        finally:
            g.release(w)

    async def _run_one(self, i: int, sampler: str, request: dict, config: dict, weights: tuple | None,
                       preferred: int | None, client: str, scope: str | None) -> tuple[int, ray.ObjectRef]:
        factory, group = self.factories[sampler]
        g = self.groups[group]
        deaths = 0
        while True:
            w = await g.acquire(client, preferred)
            self._set_queued()
            meta_ref, data_ref = g.workers[w].run.remote(factory, config, request, weights, scope)
            try:
                n, seconds = await meta_ref
            except asyncio.CancelledError:
                # The map was abandoned (another of its requests failed, or its driver left) while the worker still
                # runs this request: its slot comes back when the worker is done, not before and not never.
                asyncio.get_running_loop().create_task(self._release_when_done(g, w, meta_ref))
                raise
            except (RayActorError, ActorUnavailableError) as err:
                deaths += 1
                self.counts["retries"] += 1
                self.metrics.retry()
                if g.alive[w]:
                    g.alive[w] = False
                    asyncio.get_running_loop().create_task(self._revive(g, w))
                g.release(w)
                if deaths > self.cfg.max_retries:
                    self.counts["failed"] += 1
                    raise SamplerError(
                        f"request {i} of sampler {sampler!r} ({_summary(request)}) was running on a worker that died "
                        f"{deaths} times (last: {type(err).__name__}); pool.max_retries={self.cfg.max_retries}, so it "
                        f"is not run again (a request that kills its worker: out of memory, a crash in native code)"
                    ) from None
                log.warning("pool worker %s/%d died during request %d of %s: retrying elsewhere", group, w, i, sampler)
                continue
            except ray.exceptions.RayTaskError as err:
                g.release(w)
                self.counts["failed"] += 1
                raise (err.cause if isinstance(err.cause, SamplerError) else SamplerError(str(err))) from None
            except Exception:
                g.release(w)
                raise
            g.release(w)
            self._record(sampler, n, seconds)
            return i, data_ref

    def _record(self, sampler: str, n: int, seconds: float) -> None:
        self.counts["requests"] += 1
        self.counts["samples"] += n
        stats = self.per_sampler[sampler]
        stats["requests"] += 1
        stats["samples"] += n
        stats["busy_s"] += seconds
        self.metrics.served(sampler, n, seconds)

    async def run(self, sampler: str, config: dict, requests: list[dict], weights_key: str | None = None,
                  affinity: list[int] | None = None, client: str = "anonymous", scope: str | None = None):
        """Streaming generator: yields ``(request_index, result ObjectRef)`` as each request finishes."""
        self._ensure_refresher()
        if sampler not in self.factories:
            raise UnknownName(f"unknown sampler {sampler!r}; registered: {sorted(self.factories)}")
        weights = None
        if weights_key is not None:
            if weights_key not in self.published:
                raise UnknownName(f"no weights published under {weights_key!r} (manager incarnation "
                                  f"{self.incarnation}); published: {sorted(self.published)}")
            version, ref, wscope = self.published[weights_key]
            self.published.move_to_end(weights_key)
            weights = (weights_key, self.incarnation, version, [ref], wscope)
        self.clients[client] = time.time()
        self.clients.move_to_end(client)
        while len(self.clients) > 1000:
            self.clients.popitem(last=False)
        tasks = [asyncio.ensure_future(self._run_one(i, sampler, req, config, weights,
                                                     None if affinity is None else affinity[i], client, scope))
                 for i, req in enumerate(requests)]
        try:
            for fut in asyncio.as_completed(tasks):
                yield await fut
        finally:
            for t in tasks:
                t.cancel()
            self._set_queued()

    # -- inspection ------------------------------------------------------------------------------------------------
    async def stats(self) -> dict[str, Any]:
        worker_stats = []
        for g in self.groups.values():
            for i, w in enumerate(g.workers):
                try:
                    worker_stats.append(await asyncio.wait_for(w.stats.remote(), timeout=5))
                except Exception as err:  # noqa: BLE001 - a dying worker must not break monitoring
                    worker_stats.append({"group": g.name, "index": i, "error": repr(err)})
        default = self.groups[DEFAULT_GROUP]
        return {**self.counts, "name": self.cfg.name, "incarnation": self.incarnation,
                "num_workers": sum(len(g.workers) for g in self.groups.values()),
                "alive": list(default.alive), "inflight": list(default.inflight),
                "groups": {n: {"alive": list(g.alive), "inflight": list(g.inflight), "queued": g.queued()}
                           for n, g in self.groups.items()},
                "uptime_s": time.time() - self.started, "clients": len(self.clients),
                "per_sampler": {k: dict(v) for k, v in self.per_sampler.items()},
                "weights_versions": {k: v for k, (v, _, _) in self.published.items()}, "workers": worker_stats,
                "samplers": {n: f for n, (f, _) in self.factories.items()},
                "sampler_groups": {n: g for n, (_, g) in self.factories.items()}, "config": asdict(self.cfg)}

    async def worker_handles(self, group: str = DEFAULT_GROUP) -> list:
        return list(self.groups[group].workers)

    async def shutdown_workers(self) -> None:
        for g in self.groups.values():
            for w in g.workers:
                ray.kill(w, no_restart=True)


def _summary(request: dict, limit: int = 160) -> str:
    text = repr({k: v for k, v in request.items() if not isinstance(v, (bytes, bytearray))})
    return text if len(text) <= limit else text[:limit] + "...}"
