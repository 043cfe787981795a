"""The pool's manager: one detached async actor that only schedules.

It knows the sampler types (name -> factory, worker group, time limit), the published weights (key -> version,
ObjectRef) and the worker groups (``cluster.pool_groups``: workers and their lifecycle; ``cluster.pool_slots``: who may
use which slot now); it runs maps (``cluster.pool_dispatch``) and streams each worker call's ``(request indices,
results ObjectRef)`` to the caller. The manager owns those results (it made the worker calls) and outlives every
job, and it *holds* each one until its client acknowledges it (``ack``/``forget``) or the client's driver is gone:
a ref nested in a streaming generator's item may otherwise be freed by its owner before the consumer's borrow is
registered (ray-project/ray#58080, PR #58082), which the client saw as ``ReferenceCountingAssertionError`` and
took for a lost manager (re-sending requests to a manager that was alive).

The manager's state is in memory and may be lost (its node fails, it is killed): Ray restarts it, it re-attaches the
detached workers by name and starts a new ``incarnation``. Weight versions are ``(incarnation, n)``, so a worker
never serves an old incarnation's weights under a new one's number; clients re-register their samplers and
re-publish their latest weights (a re-published version older than the one known is ignored) and re-send the
requests whose results they had not received (``cluster.pool.SharedPool``).
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

from cluster.echo_sampler import BUILTIN_SAMPLERS
from cluster.pool_config import DEFAULT_GROUP, POOL_PROTOCOL, PoolConfig
from cluster.pool_dispatch import Dispatch, _Map
from cluster.pool_groups import Group
from cluster.pool_metrics import PoolMetrics
from cluster.pool_slots import ALIVE
from cluster.pool_worker import SamplerError

log = logging.getLogger(__name__)

DRIVER_CHECK_S = 1.0  # how often a running map checks that its driver still lives
MAX_HELD_MAPS = 4096  # maps whose unacknowledged results are held (a client that vanished unnoticed: oldest out)


class UnknownName(KeyError):
    """A sampler type or weights key this manager incarnation does not know (lost with a restart, or never made)."""


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=10_000)
class PoolManager(Dispatch):
    """Single controller of the pool (async actor: many callers, many in-flight requests)."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = PoolConfig(**cfg)
        self.incarnation = uuid.uuid4().hex[:8]
        # name -> (factory, group, time limit in s or None: the pool's)
        self.factories: dict[str, tuple[str, str, float | None]] = {
            n: (f, DEFAULT_GROUP, None) for n, f in BUILTIN_SAMPLERS.items()}
        self.published: OrderedDict[str, tuple[int, ray.ObjectRef, str | None]] = OrderedDict()
        self.groups = {name: Group(self.cfg.name, name, g, self.cfg.max_samplers_per_worker,
                                   self.cfg.max_weights_per_worker) for name, g in self.cfg.worker_groups().items()}
        self.counts: dict[str, Any] = {"requests": 0, "calls": 0, "samples": 0, "retries": 0, "restarts": 0,
                                       "queued": 0, "failed": 0, "timeouts": 0, "batch_deaths": 0, "cancelled": 0}
        self.maps: dict[int, _Map] = {}  # the maps running now (their requests not yet started are the queue)
        self.seconds_per_request: OrderedDict[str, float] = OrderedDict()  # per sampler and config: for batching
        self.per_sampler: dict[str, dict[str, float]] = defaultdict(
            lambda: {"requests": 0, "samples": 0, "busy_s": 0.0})
        self.clients: OrderedDict[str, float] = OrderedDict()  # client -> last seen
        self.started = time.time()
        self.metrics = PoolMetrics(self.cfg.name)
        # map id -> {item number: results ref}: the results streamed to a client and not yet acknowledged by it
        self.held: OrderedDict[str, dict[int, ray.ObjectRef]] = OrderedDict()
        self.watchers: set[asyncio.Task] = set()  # the event loop keeps only weak references to tasks


    # -- registry and weights --------------------------------------------------------------------------------------
    def _set_queued(self) -> None:
        self.counts["queued"] = sum(m.queued() for m in self.maps.values())
        self.metrics.queue_depth(self.counts["queued"])

    def _ensure_refresher(self) -> None:
        self.metrics.keep_fresh(lambda: self.counts["queued"],
                                lambda: {k: v for k, (v, _, _) in self.published.items()})

    async def ready(self, timeout_s: float | None = None) -> dict:
        """Every worker answers (within ``timeout_s``, else a SamplerError naming what could not be placed). Pings
        run in the workers' health group, so busy workers answer at once."""
        self._ensure_refresher()
        pings = [w.ping.remote() for g in self.groups.values() for w in g.workers]
        try:
            await asyncio.wait_for(asyncio.gather(*pings), timeout=timeout_s)
        except asyncio.TimeoutError:
            wanted = {name: g.cfg.resources_per_worker() for name, g in self.groups.items()}
            raise SamplerError(f"pool {self.cfg.name!r}: its workers could not all be placed within {timeout_s:.0f} s; "
                               f"each worker needs {wanted} (per group); the cluster has "
                               f"{ray.available_resources()} available of {ray.cluster_resources()}") from None
        return {"name": self.cfg.name, "config": asdict(self.cfg), "incarnation": self.incarnation,
                "protocol": POOL_PROTOCOL}

    async def register(self, name: str, factory: str, group: str = DEFAULT_GROUP,
                       timeout_s: float | None = None) -> None:
        old = self.factories.get(name)
        if old is not None and old[0] != factory:
            raise ValueError(f"sampler {name!r} is already registered as {old[0]!r}, not {factory!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"sampler {name!r}: timeout_s must be > 0 seconds, got {timeout_s}")
        self.factories[name] = (factory, group if group in self.groups else DEFAULT_GROUP, timeout_s)

    async def publish(self, key: str, boxed: list, scope: str | None = None,
                      version: int | None = None) -> tuple[str, int]:
        """Record a new version of ``key``: the next number, or the ``version`` its publisher numbered it (a client
        re-publishing after a restart, or publishing on from its own last version). A version older than the one
        recorded is ignored: a late re-publish never replaces newer weights. ``boxed[0]`` is the publisher's
        ObjectRef, kept in a list so that Ray hands it over without fetching: nothing is copied here."""
        current = self.published.get(key, (0, None, None))[0]
        if version is None:
            version = current + 1
        if version > current:
            self.published[key] = (version, boxed[0], scope)
            self.metrics.weights_version(key, version)
        if key in self.published:
            self.published.move_to_end(key)
        while len(self.published) > self.cfg.max_published_keys:  # runs that crashed before releasing their keys
            self.published.popitem(last=False)
        return self.incarnation, max(version, current)

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
                if g.slots.state[i] != ALIVE:
                    continue
                try:  # the worker's health group: answers while its requests run
                    out = await asyncio.wait_for(w.release.remote(scope), timeout=10)
                    dropped["samplers"] += out["samplers"]
                    dropped["worker_weights"] += out["weights"]
                except Exception:  # noqa: BLE001 - a dying worker has nothing left to release
                    pass
        return dropped

    # -- results held until their client has them -----------------------------------------------------------------
    async def ack(self, map_id: str, items: list[int]) -> None:
        """The client has fetched these items' results: stop holding them."""
        held = self.held.get(map_id)
        for k in items if held is not None else ():
            held.pop(k, None)

    async def forget(self, map_id: str) -> None:
        """The client is done with the map (every result fetched, or it abandoned the map)."""
        self.held.pop(map_id, None)

    def _hold(self, map_id: str, item: int, ref: ray.ObjectRef) -> None:
        if map_id not in self.held:
            self.held[map_id] = {}
            while len(self.held) > MAX_HELD_MAPS:
                self.held.popitem(last=False)
        self.held[map_id][item] = ref

    async def _watch_driver(self, m: _Map, map_id: str, token: ray.ObjectRef) -> None:
        """End the map once its driver has exited, which takes its objects (``token``) with it (Ray does not cancel
        a dead caller's stream, and small requests travel inline, independent of the driver), and drop the results
        held for it. Lives past the map's stream as long as results are held for it."""
        while True:
            await asyncio.sleep(DRIVER_CHECK_S)
            if map_id not in self.held and id(m) not in self.maps:
                return  # the client took everything (or the map never yielded) and the stream ended
            try:
                await token
            except ray.exceptions.ObjectLostError as err:  # OwnerDiedError: the driver is gone
                m.done.put_nowait(SamplerError(f"the map's driver is gone ({type(err).__name__})"))
                self.held.pop(map_id, None)
                return

    async def run(self, sampler: str, digest: str, config: dict, chunks: list, bounds: list[int],
                  weights_key: str | None = None, affinity: list[int] | None = None, client: str = "anonymous",
                  scope: str | None = None, driver: list | None = None, map_id: str | None = None):
        """Streaming generator: yields ``(item number, request indices, ObjectRef of their results)`` as each call
        finishes; each results ref is held here until the client acknowledges the item (``ack``) or the map
        (``forget``), or its driver is gone.

        ``chunks``: the lists of requests, pickled (small ones) or put by the driver (chunk c holds requests
        ``bounds[c]`` to ``bounds[c + 1] - 1``); ``digest``: the exact hash of ``config``
        (``cluster.pool_worker.config_digest``); ``driver``: ``[ref]`` of an object the driver owns, to notice its
        exit. Cancelling the stream (the driver abandoned the map) or the driver's exit stops launching requests."""
        self._ensure_refresher()
        map_id = map_id or uuid.uuid4().hex
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
        factory, group, timeout_s = self.factories[sampler]
        g = self.groups[group]
        m = _Map(sampler, factory, digest, config, chunks, bounds, weights, client, scope, group,
                 timeout_s or self.cfg.request_timeout_s)
        for i in range(len(m)):
            preferred = None if affinity is None else affinity[i] % len(g.workers)
            m.lanes.setdefault(preferred, deque()).append(i)
        launchers = []
        for preferred, lane in m.lanes.items():
            slots = g.cfg.slots_per_worker * (1 if preferred is not None else len(g.workers))
            m.launchers[preferred] = min(slots, len(lane))
            launchers += [asyncio.ensure_future(self._launcher(m, g, preferred)) for _ in range(m.launchers[preferred])]
        self.maps[id(m)] = m
        if driver:  # not cancelled with the launchers: it also drops the held results of a driver that exits
            watcher = asyncio.ensure_future(self._watch_driver(m, map_id, driver[0]))
            self.watchers.add(watcher)
            watcher.add_done_callback(self.watchers.discard)
        self._set_queued()
        remaining, item_number = len(m), 0
        try:
            while remaining:
                item = await m.done.get()
                if isinstance(item, BaseException):
                    raise item
                remaining -= len(item[0])
                self._hold(map_id, item_number, item[1])
                yield item_number, *item
                item_number += 1
        except (GeneratorExit, asyncio.CancelledError):
            self.held.pop(map_id, None)  # the client stopped reading (it cancelled the stream): it fetches no more
            raise
        finally:
            if remaining:
                self.counts["cancelled"] += m.queued()
            for t in launchers:
                t.cancel()
            del self.maps[id(m)]
            self._set_queued()

    # -- inspection ------------------------------------------------------------------------------------------------
    async def stats(self) -> dict[str, Any]:
        async def one(g: Group, i: int, w: Any) -> dict:
            try:  # the worker's health group: answers while its requests run
                return await asyncio.wait_for(w.stats.remote(), timeout=5)
            except Exception as err:  # noqa: BLE001 - a dying worker must not break monitoring
                return {"group": g.name, "index": i, "error": repr(err)}
        worker_stats = await asyncio.gather(*[one(g, i, w) for g in self.groups.values()
                                              for i, w in enumerate(g.workers)])

        def group_stats(name: str, g: Group) -> dict:
            return {"alive": [s == ALIVE for s in g.slots.state], "states": list(g.slots.state),
                    "inflight": list(g.slots.inflight),
                    "queued": sum(m.queued() for m in self.maps.values() if m.group == name)}
        default = group_stats(DEFAULT_GROUP, self.groups[DEFAULT_GROUP])
        return {**self.counts, "name": self.cfg.name, "incarnation": self.incarnation, "pid": os.getpid(),
                "num_workers": sum(len(g.workers) for g in self.groups.values()),
                "alive": default["alive"], "states": default["states"], "inflight": default["inflight"],
                "groups": {n: group_stats(n, g) for n, g in self.groups.items()},
                "uptime_s": time.time() - self.started, "clients": len(self.clients),
                "held_results": sum(len(h) for h in self.held.values()),
                "per_sampler": {k: dict(v) for k, v in self.per_sampler.items()},
                "weights_versions": {k: v for k, (v, _, _) in self.published.items()}, "workers": list(worker_stats),
                "samplers": {n: f for n, (f, _, _) in self.factories.items()},
                "sampler_groups": {n: g for n, (_, g, _) in self.factories.items()}, "config": asdict(self.cfg)}

    async def worker_handles(self, group: str = DEFAULT_GROUP) -> list:
        return list(self.groups[group].workers)

    async def shutdown_workers(self) -> None:
        for g in self.groups.values():
            for w in g.workers:
                ray.kill(w, no_restart=True)
