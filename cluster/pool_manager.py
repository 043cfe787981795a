"""The pool's manager: one detached async actor that only schedules.

It knows the sampler types (name -> factory, worker group), the published weights (key -> version, ObjectRef), the
worker groups and their free slots. A map's requests wait for slots of their sampler's group: clients (drivers) take
turns, each client's oldest request first, so a driver with 10,000 queued requests does not starve one with 10. Each
slot a map gets runs one worker call, which carries one request, or several small ones (``pool.batch_target_s``: as
many as take ~50 ms at the sampler's recent speed, never more than a fair share of the map's remaining requests per
slot). The manager reads only the worker's small ``(samples, seconds)`` reply and hands the results' ObjectRef to
the caller, so no payload crosses the manager.

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
import os
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
from cluster.pool_worker import PoolWorker, SamplerError, request_summary, sampler_key

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


class _Map:
    """One ``run`` call: its requests, the lanes of those not started yet (per preferred worker; None: any worker),
    the launchers serving each lane, the deaths each request has seen, and the queue its finished calls arrive on."""

    def __init__(self, sampler: str, factory: str, config: dict, requests: list[dict], weights: tuple | None,
                 client: str, scope: str | None, group: str) -> None:
        self.sampler, self.factory, self.config, self.requests = sampler, factory, config, requests
        self.weights, self.client, self.scope, self.group = weights, client, scope, group
        self.key = sampler_key(factory, config)
        self.lanes: dict[int | None, deque[int]] = {}
        self.launchers: dict[int | None, int] = {}  # preferred worker -> launchers serving its lane
        self.deaths: dict[int, int] = {}
        self.solo: set[int] = set()  # requests whose worker died under them: they run alone from then on
        self.done: asyncio.Queue = asyncio.Queue()

    def queued(self) -> int:
        return sum(len(lane) for lane in self.lanes.values())


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
        self.counts: dict[str, Any] = {"requests": 0, "calls": 0, "samples": 0, "retries": 0, "restarts": 0,
                                       "queued": 0, "failed": 0}
        self.maps: dict[int, _Map] = {}  # the maps running now (their requests not yet started are the queue)
        self.seconds_per_request: OrderedDict[str, float] = OrderedDict()  # per sampler and config: for batching
        self.per_sampler: dict[str, dict[str, float]] = defaultdict(
            lambda: {"requests": 0, "samples": 0, "busy_s": 0.0})
        self.clients: OrderedDict[str, float] = OrderedDict()  # client -> last seen
        self.started = time.time()
        self.metrics = PoolMetrics(self.cfg.name)

    # -- registry and weights --------------------------------------------------------------------------------------
    def _set_queued(self) -> None:
        self.counts["queued"] = sum(m.queued() for m in self.maps.values())
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

    def _batch_size(self, m: "_Map", preferred: int | None) -> int:
        """How many of the lane's requests the next call carries: about ``batch_target_s`` of work at this sampler's
        recent seconds per request, at most ``max_batch``, and at most a fair share of what is left, so that batching
        never leaves one of the map's workers idle while another holds a long batch."""
        mean = self.seconds_per_request.get(m.key)
        if not self.cfg.batch_target_s or mean is None:
            return 1
        fair = -(-len(m.lanes[preferred]) // m.launchers[preferred])
        return max(1, min(int(self.cfg.batch_target_s / max(mean, 1e-6)), self.cfg.max_batch, fair))

    def _learn_speed(self, key: str, requests: int, seconds: float) -> None:
        per_request = seconds / requests
        old = self.seconds_per_request.pop(key, per_request)
        self.seconds_per_request[key] = 0.7 * old + 0.3 * per_request  # most recent last: LRU order
        while len(self.seconds_per_request) > 1024:
            self.seconds_per_request.popitem(last=False)

    async def _launcher(self, m: "_Map", g: Group, preferred: int | None) -> None:
        """Serve the map's lane for ``preferred`` (its requests for that worker; None: for any) one slot at a time until
        it is empty; each call's ``(request indices, result ref)`` goes to the map's ``done`` queue, an error ends the
        map."""
        lane = m.lanes[preferred]
        try:
            while lane:
                w = await g.acquire(m.client, preferred)
                if not lane:  # another launcher of this map took the rest meanwhile
                    g.release(w)
                    return
                batch = [lane.popleft()]
                if batch[0] not in m.solo:
                    for _ in range(self._batch_size(m, preferred) - 1 if lane else 0):
                        if not lane or lane[0] in m.solo:
                            break
                        batch.append(lane.popleft())
                self._set_queued()
                meta_ref, data_ref = g.workers[w].run.remote(m.factory, m.config, [m.requests[i] for i in batch],
                                                             m.weights, m.scope)
                try:
                    n, seconds = await meta_ref
                except asyncio.CancelledError:
                    # The map was abandoned (another of its requests failed, or its driver left) while the worker
                    # still runs this call: its slot comes back when the worker is done, not before and not never.
                    asyncio.get_running_loop().create_task(self._release_when_done(g, w, meta_ref))
                    raise
                except (RayActorError, ActorUnavailableError) as err:
                    self._worker_died(m, g, w, batch, lane, err)
                    continue
                except ray.exceptions.RayTaskError as err:
                    g.release(w)
                    self.counts["failed"] += 1
                    raise (err.cause if isinstance(err.cause, SamplerError) else SamplerError(str(err))) from None
                except Exception:
                    g.release(w)
                    raise
                g.release(w)
                self._record(m, len(batch), n, seconds)
                m.done.put_nowait((batch, data_ref))
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # noqa: BLE001 - the map's generator re-raises it to the caller
            m.done.put_nowait(err)

    def _worker_died(self, m: "_Map", g: Group, w: int, batch: list[int], lane: deque, err: Exception) -> None:
        """A call's worker died: its requests go back to the front of their lane to run alone (so a request that
        kills its worker takes no neighbour down twice), or fail once one of them has died ``max_retries`` + 1 times."""
        self.counts["retries"] += 1
        self.metrics.retry()
        if g.alive[w]:
            g.alive[w] = False
            asyncio.get_running_loop().create_task(self._revive(g, w))
        g.release(w)  # after it is marked dead: the slot must not go to a waiting request
        for i in batch:
            m.deaths[i] = m.deaths.get(i, 0) + 1
            if m.deaths[i] > self.cfg.max_retries:
                self.counts["failed"] += 1
                raise SamplerError(
                    f"request {i} of sampler {m.sampler!r} ({request_summary(m.requests[i])}) was running on a worker "
                    f"that died {m.deaths[i]} times (last: {type(err).__name__}); "
                    f"pool.max_retries={self.cfg.max_retries}, so it is not run again (a request that kills its "
                    f"worker: out of memory, a crash in native code)")
        m.solo.update(batch)
        lane.extendleft(reversed(batch))
        log.warning("pool worker %s/%d died during requests %s of %s: retrying elsewhere", g.name, w, batch, m.sampler)

    def _record(self, m: "_Map", requests: int, n: int, seconds: float) -> None:
        self.counts["requests"] += requests
        self.counts["calls"] += 1
        self.counts["samples"] += n
        stats = self.per_sampler[m.sampler]
        stats["requests"] += requests
        stats["samples"] += n
        stats["busy_s"] += seconds
        self._learn_speed(m.key, requests, seconds)
        self.metrics.served(m.sampler, n, seconds)

    async def run(self, sampler: str, config: dict, requests: list[dict], weights_key: str | None = None,
                  affinity: list[int] | None = None, client: str = "anonymous", scope: str | None = None):
        """Streaming generator: yields ``(request indices, ObjectRef of their results)`` as each call finishes."""
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
        factory, group = self.factories[sampler]
        g = self.groups[group]
        m = _Map(sampler, factory, config, requests, weights, client, scope, group)
        for i in range(len(requests)):
            preferred = None if affinity is None else affinity[i] % len(g.workers)
            m.lanes.setdefault(preferred, deque()).append(i)
        launchers = []
        for preferred, lane in m.lanes.items():
            slots = g.cfg.slots_per_worker * (1 if preferred is not None else len(g.workers))
            m.launchers[preferred] = min(slots, len(lane))
            launchers += [asyncio.ensure_future(self._launcher(m, g, preferred)) for _ in range(m.launchers[preferred])]
        self.maps[id(m)] = m
        self._set_queued()
        try:
            remaining = len(requests)
            while remaining:
                item = await m.done.get()
                if isinstance(item, BaseException):
                    raise item
                remaining -= len(item[0])
                yield item
        finally:
            for t in launchers:
                t.cancel()
            del self.maps[id(m)]
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
        return {**self.counts, "name": self.cfg.name, "incarnation": self.incarnation, "pid": os.getpid(),
                "num_workers": sum(len(g.workers) for g in self.groups.values()),
                "alive": list(default.alive), "inflight": list(default.inflight),
                "groups": {n: {"alive": list(g.alive), "inflight": list(g.inflight),
                               "queued": sum(m.queued() for m in self.maps.values() if m.group == n)}
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

