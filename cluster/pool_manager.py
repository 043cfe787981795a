"""The pool's manager: one detached async actor that only schedules.

It knows the sampler types (name -> factory, worker group, time limit), the published weights (key -> version,
ObjectRef), the worker groups and their free slots. A map's requests wait for slots of their sampler's group: clients
(drivers) take turns, each client's oldest request first, so a driver with 10,000 queued requests does not starve one
with 10. Each slot a map gets runs one worker call, which carries one request, or several small ones
(``pool.batch_target_s``: as many as take ~50 ms at the sampler's recent speed, never more than a fair share of the
map's remaining requests per slot). Requests come in chunks the manager never opens: refs the driver put (or, for
small chunks, pickled bytes); it hands each worker the chunks and offsets of its batch, reads only the worker's small
``(samples, seconds)`` reply and hands the results' ObjectRef to the caller, so no payload is unpickled here.

Each worker is ``alive``, ``reviving`` (dead or killed; the manager waits for Ray to restart it, or re-creates it)
or ``dead`` (it did not come back within ``pool.revive_timeout_s``: tried again after a growing backoff); only an
alive worker gets requests. A worker that dies mid-call has the call's requests run again alone on a whole worker
(no other request beside them), so a request that kills workers is isolated before it is charged: only a death
while running alone counts towards ``pool.max_retries``; past it the request fails with a SamplerError naming it.
A call that outlives its time limit (``pool.request_timeout_s`` or the sampler's own) has its worker killed (Ray
restarts it): a lone request then fails its map with a RequestTimeout, a batch's requests run again alone.

Every slot is held through a ``Group.slot`` context: it is given back when the call it served has ended, however
the map ends (an error, the driver cancelling it), so a slot cannot leak.

The manager's state is in memory and may be lost (its node fails, it is killed): Ray restarts it, it re-attaches the
detached workers by name and starts a new ``incarnation``. Weight versions are ``(incarnation, n)``, so a worker
never serves an old incarnation's weights under a new one's number; clients re-register their samplers and
re-publish their latest weights (a re-published version older than the one known is ignored) and re-send the
requests whose results they had not received (``cluster.pool.SharedPool``).
"""
from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import time
import uuid
from collections import OrderedDict, defaultdict, deque
from dataclasses import asdict
from typing import Any, AsyncIterator

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from cluster.connect import NAMESPACE
from cluster.echo_sampler import BUILTIN_SAMPLERS
from cluster.pool_config import DEFAULT_GROUP, PoolConfig, WorkerGroup
from cluster.pool_metrics import PoolMetrics
from cluster.pool_worker import PoolWorker, RequestTimeout, SamplerError

log = logging.getLogger(__name__)

ALIVE, REVIVING, DEAD = "alive", "reviving", "dead"
MAX_BACKOFF_S = 300.0  # a dead worker is tried again at most this long after its last failed revive
DRIVER_CHECK_S = 1.0  # how often a running map checks that its driver still lives


class UnknownName(KeyError):
    """A sampler type or weights key this manager incarnation does not know (lost with a restart, or never made)."""


class Slots:
    """Who may use which worker's slots now: per-worker state and busy slots, and the requests waiting per client.

    Pure bookkeeping (no Ray), so its turn-taking can be read and checked on its own. A request asks for one slot of
    a worker (its preferred worker while that one is alive), or for a whole worker (``whole``: every slot, for a
    request that runs alone)."""

    def __init__(self, num_workers: int, slots_per_worker: int) -> None:
        self.per_worker = slots_per_worker
        self.state = [ALIVE] * num_workers
        self.inflight = [0] * num_workers
        self.waiting: dict[str, deque[tuple[int | None, bool, asyncio.Future]]] = {}
        self.turns: deque[str] = deque()  # clients with waiting requests, in the order they are served
        # A worker kept for a waiting whole-worker request: it gets no new single requests until it is empty, so
        # a stream of small requests cannot starve a request that must run alone.
        self.reserved: int | None = None

    def pick(self, preferred: int | None, whole: bool = False) -> int | None:
        """The least busy worker a request may use now (its pinned worker while that one is alive), or None."""
        n = len(self.state)
        pin = preferred % n if preferred is not None else None
        candidates = (pin,) if pin is not None and self.state[pin] == ALIVE else range(n)
        room = self.per_worker if whole else 1
        free = [i for i in candidates if self.state[i] == ALIVE and self.inflight[i] + room <= self.per_worker
                and (whole or i != self.reserved)]
        return min(free, key=self.inflight.__getitem__) if free else None

    def _reserve_for_whole(self) -> None:
        """Keep the least busy alive worker for the whole-worker requests waiting (none waiting: keep none)."""
        if not any(whole and not f.done() for q in self.waiting.values() for _, whole, f in q):
            self.reserved = None
        elif self.reserved is None or self.state[self.reserved] != ALIVE:
            alive = [i for i, st in enumerate(self.state) if st == ALIVE]
            self.reserved = min(alive, key=self.inflight.__getitem__) if alive else None

    def _take(self, w: int, whole: bool) -> int:
        self.inflight[w] += self.per_worker if whole else 1
        return w

    def dispatch(self) -> None:
        """Hand free slots to waiting requests: clients take turns, each client's oldest servable request first; only
        a request that gets a worker wakes up. Ends once every client still waiting was visited without being
        served, so no waiting request could use a free slot afterwards (a new request that finds one may take it
        without overtaking anyone). A client that had only cancelled requests leaves without counting as a visit."""
        self._reserve_for_whole()
        unserved = 0
        while self.turns and unserved < len(self.turns):
            client = self.turns.popleft()
            queue = self.waiting[client]
            served = False
            for entry in list(queue):
                preferred, whole, future = entry
                if future.done():  # cancelled while waiting
                    queue.remove(entry)
                    continue
                w = self.pick(preferred, whole)
                if w is None:  # pinned to a busy worker, or needs a whole one: keeps its place
                    continue
                queue.remove(entry)
                future.set_result(self._take(w, whole))
                served = True
                if whole:
                    self.reserved = None
                    self._reserve_for_whole()
                break
            if queue:
                self.turns.append(client)
                unserved = 0 if served else unserved + 1
            else:
                del self.waiting[client]

    async def acquire(self, client: str, preferred: int | None, whole: bool = False) -> int:
        if not self.turns:  # nobody waits: a free slot may be taken at once
            w = self.pick(preferred, whole)
            if w is not None:
                return self._take(w, whole)
        future = asyncio.get_running_loop().create_future()
        entry = (preferred, whole, future)
        if client not in self.waiting:
            self.waiting[client] = deque()
            self.turns.append(client)
        self.waiting[client].append(entry)
        self.dispatch()  # a slot may be free that the waiting requests ahead of this one cannot use
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # handed a worker just as the request was cancelled
                self.release(future.result(), whole)
            elif client in self.waiting and entry in self.waiting[client]:
                self.waiting[client].remove(entry)
                self.dispatch()
            raise

    def release(self, w: int, whole: bool = False) -> None:
        self.inflight[w] -= self.per_worker if whole else 1
        self.dispatch()

    def set_state(self, w: int, state: str) -> None:
        self.state[w] = state
        if state == ALIVE:
            self.dispatch()


class Slot:
    """One held slot (or whole worker); given back exactly once, when its call has ended."""

    def __init__(self, slots: Slots, worker: int, whole: bool) -> None:
        self.slots, self.worker, self.whole = slots, worker, whole
        self.alone = whole or slots.per_worker == 1  # no other request runs on the worker meanwhile
        self.call: asyncio.Future | None = None
        self.given_back = False

    def give_back(self) -> None:
        if not self.given_back:
            self.given_back = True
            self.slots.release(self.worker, self.whole)


class Group:
    """One worker group: its workers (Ray actors) and their slots."""

    def __init__(self, pool: str, name: str, cfg: WorkerGroup, max_samplers: int, max_weights: int) -> None:
        self.pool, self.name, self.cfg = pool, name, cfg
        self.max_samplers, self.max_weights = max_samplers, max_weights
        self.workers = [self.make_worker(i) for i in range(cfg.num_workers)]
        self.slots = Slots(cfg.num_workers, cfg.slots_per_worker)
        self.failed_revives = [0] * cfg.num_workers

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
        return PoolWorker.options(**opts).remote(self.name, i, c.torch_threads, self.max_samplers, self.max_weights,
                                                 c.max_cache_bytes)

    @contextlib.asynccontextmanager
    async def slot(self, client: str, preferred: int | None, whole: bool = False) -> AsyncIterator[Slot]:
        """Hold a slot for the body: given back on leaving it, or, when the body leaves while the slot's call still
        runs on the worker (the map was abandoned), when that call ends, not before and not never."""
        slot = Slot(self.slots, await self.slots.acquire(client, preferred, whole), whole)
        try:
            yield slot
        finally:
            if slot.call is not None and not slot.call.done():
                slot.call.add_done_callback(lambda _: slot.give_back())
            else:
                slot.give_back()


class _WorkerLost(Exception):
    """A call's worker died (or was killed for a timeout) before the call ended."""

    def __init__(self, cause: str, timed_out: bool = False) -> None:
        super().__init__(cause)
        self.cause, self.timed_out = cause, timed_out


class _Map:
    """One ``run`` call: its request chunks (refs the driver put), the lanes of the requests not started yet (per
    preferred worker; None: any worker), the launchers serving each lane, the deaths each request was charged, and
    the queue its finished calls arrive on."""

    def __init__(self, sampler: str, factory: str, digest: str, config: dict, chunks: list, bounds: list[int],
                 weights: tuple | None, client: str, scope: str | None, group: str, timeout_s: float) -> None:
        self.sampler, self.factory, self.digest, self.config = sampler, factory, digest, config
        self.chunks, self.bounds = chunks, bounds  # chunk c holds requests bounds[c] .. bounds[c + 1] - 1
        self.weights, self.client, self.scope, self.group, self.timeout_s = weights, client, scope, group, timeout_s
        self.key = f"{factory}#{digest}"
        self.lanes: dict[int | None, deque[int]] = {}
        self.launchers: dict[int | None, int] = {}  # preferred worker -> launchers serving its lane
        self.deaths: dict[int, int] = {}
        self.solo: set[int] = set()  # requests whose call died or timed out: from then on they run alone
        self.done: asyncio.Queue = asyncio.Queue()

    def __len__(self) -> int:
        return self.bounds[-1]

    def queued(self) -> int:
        return sum(len(lane) for lane in self.lanes.values())

    def parts(self, batch: list[int]) -> list[tuple[list, list[int]]]:
        """The batch as ``([chunk ref], offsets in it)`` per chunk, the refs boxed so Ray passes them on unfetched."""
        out: list[tuple[list, list[int]]] = []
        last = -1
        for i in batch:
            c = bisect.bisect_right(self.bounds, i) - 1
            if c != last:
                out.append(([self.chunks[c]], []))
                last = c
            out[-1][1].append(i - self.bounds[c])
        return out


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=10_000)
class PoolManager:
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
        return {"name": self.cfg.name, "config": asdict(self.cfg), "incarnation": self.incarnation}

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

    # -- worker states ---------------------------------------------------------------------------------------------
    def _worker_down(self, g: Group, w: int, kill: ray.ObjectRef | None = None) -> None:
        """Worker ``w`` died, or is killed now (``kill``: a call it runs past its time limit): no request goes to it
        until it answers again."""
        if kill is not None:
            ray.kill(g.workers[w], no_restart=False)  # Ray restarts it: same name, fresh process
        if g.slots.state[w] == ALIVE:
            g.slots.set_state(w, REVIVING)
            self.counts["restarts"] += 1
            self.metrics.restart()
            asyncio.get_running_loop().create_task(self._revive(g, w, kill))

    async def _revive(self, g: Group, w: int, killed_call: ray.ObjectRef | None = None) -> None:
        """Wait for Ray to restart worker ``w`` (re-create it if it was killed for good). A worker that does not
        answer within ``pool.revive_timeout_s`` is ``dead``: it gets no requests and is tried again after a backoff
        that doubles with each failed revive. After a kill, the killed call's end shows the old process is gone (a
        ping before that could be answered by it)."""
        if killed_call is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(killed_call, timeout=self.cfg.revive_timeout_s)
        while True:
            deadline = time.monotonic() + self.cfg.revive_timeout_s
            while time.monotonic() < deadline:
                try:
                    await asyncio.wait_for(g.workers[w].ping.remote(), timeout=10)
                    g.failed_revives[w] = 0
                    g.slots.set_state(w, ALIVE)
                    return
                except ActorDiedError:
                    await asyncio.sleep(0.2)  # the name is released asynchronously
                    try:
                        g.workers[w] = g.make_worker(w)
                    except ValueError:
                        pass
                except (RayActorError, ActorUnavailableError, asyncio.TimeoutError):
                    await asyncio.sleep(0.2)
            g.failed_revives[w] += 1
            g.slots.set_state(w, DEAD)
            backoff = min(MAX_BACKOFF_S, 2.0 ** g.failed_revives[w])
            log.warning("pool worker %s/%d did not come back within %.0f s: dead, next try in %.0f s",
                        g.name, w, self.cfg.revive_timeout_s, backoff)
            await asyncio.sleep(backoff)
            g.slots.set_state(w, REVIVING)

    # -- running requests ------------------------------------------------------------------------------------------
    def _batch_size(self, m: _Map, preferred: int | None) -> int:
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

    def _take_batch(self, m: _Map, lane: deque, preferred: int | None) -> list[int]:
        """The next call's requests: a request that must run alone goes alone; otherwise up to the batch size of
        requests that may share a call."""
        batch = [lane.popleft()]
        if batch[0] not in m.solo:
            for _ in range(self._batch_size(m, preferred) - 1 if lane else 0):
                if not lane or lane[0] in m.solo:
                    break
                batch.append(lane.popleft())
        self._set_queued()
        return batch

    async def _call(self, m: _Map, g: Group, w: int, batch: list[int]) -> tuple[int, float, ray.ObjectRef]:
        """One worker call within the map's time limit. A worker that dies (or is killed here for running past the
        limit) is marked down before the call ends, so its slot, given back when the call ends, goes to no one."""
        try:
            meta_ref, data_ref = g.workers[w].run.remote(m.factory, m.digest, m.config, m.parts(batch), m.weights,
                                                         m.scope)
            n, seconds = await asyncio.wait_for(meta_ref, timeout=m.timeout_s)
        except asyncio.TimeoutError:
            self.counts["timeouts"] += 1
            self._worker_down(g, w, kill=meta_ref)
            raise _WorkerLost(f"ran past {m.timeout_s:g} s", timed_out=True) from None
        except (RayActorError, ActorUnavailableError) as err:
            self._worker_down(g, w)
            raise _WorkerLost(type(err).__name__) from None
        except ray.exceptions.RayTaskError as err:
            self.counts["failed"] += 1
            raise (err.cause if isinstance(err.cause, SamplerError) else SamplerError(str(err))) from None
        return n, seconds, data_ref

    async def _launcher(self, m: _Map, g: Group, preferred: int | None) -> None:
        """Serve the map's lane for ``preferred`` (its requests for that worker; None: for any) one slot at a time until
        it is empty; each call's ``(request indices, result ref)`` goes to the map's ``done`` queue, an error ends the
        map. A call runs as its own task, shielded: when the map is abandoned, the call still ends (within its time
        limit) and only then gives its slot back."""
        lane = m.lanes[preferred]
        try:
            while lane:
                alone = lane[0] in m.solo
                async with g.slot(m.client, preferred, whole=alone) as slot:
                    if not lane or (lane[0] in m.solo and not slot.alone):  # taken meanwhile / needs a whole worker
                        continue
                    batch = self._take_batch(m, lane, preferred)
                    slot.call = asyncio.ensure_future(self._call(m, g, slot.worker, batch))
                    try:
                        n, seconds, data_ref = await asyncio.shield(slot.call)
                    except _WorkerLost as lost:
                        self._requeue(m, g, slot, batch, lane, lost)
                        continue
                self._record(m, len(batch), n, seconds)
                m.done.put_nowait((batch, data_ref))
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # noqa: BLE001 - the map's generator re-raises it to the caller
            m.done.put_nowait(err)

    def _requeue(self, m: _Map, g: Group, slot: Slot, batch: list[int], lane: deque, lost: _WorkerLost) -> None:
        """A call's worker died or ran past the time limit. Its requests go back to the front of their lane to run
        alone, uncharged, unless the call was one request alone on its worker: then that request is the cause. A
        lone request that timed out fails the map; one that killed its worker fails it after ``max_retries`` + 1
        such deaths."""
        self.counts["retries"] += 1
        self.metrics.retry()
        if len(batch) > 1:
            self.counts["batch_deaths"] += 1
        if len(batch) == 1 and (slot.alone or lost.timed_out):
            i = batch[0]
            m.deaths[i] = m.deaths.get(i, 0) + 1
            if lost.timed_out or m.deaths[i] > self.cfg.max_retries:
                self.counts["failed"] += 1
            if lost.timed_out:
                raise RequestTimeout(
                    f"ran longer than its time limit of {m.timeout_s:g} s (pool.request_timeout_s, or timeout_s "
                    f"at register); its worker {g.name}/{slot.worker} was killed and is replaced", request=i)
            if m.deaths[i] > self.cfg.max_retries:
                raise SamplerError(
                    f"was running alone on a worker that died {m.deaths[i]} times (last: {lost.cause}); "
                    f"pool.max_retries={self.cfg.max_retries}, so it is not run again (a request that kills its "
                    f"worker: out of memory, a crash in native code)", request=i)
        m.solo.update(batch)
        lane.extendleft(reversed(batch))
        self._set_queued()
        log.warning("pool worker %s/%d lost during requests %s of %s (%s): running them again, each alone",
                    g.name, slot.worker, batch, m.sampler, lost.cause)

    def _record(self, m: _Map, requests: int, n: int, seconds: float) -> None:
        self.counts["requests"] += requests
        self.counts["calls"] += 1
        self.counts["samples"] += n
        stats = self.per_sampler[m.sampler]
        stats["requests"] += requests
        stats["samples"] += n
        stats["busy_s"] += seconds
        self._learn_speed(m.key, requests, seconds)
        self.metrics.served(m.sampler, requests, n, seconds)

    async def _watch_driver(self, m: _Map, token: ray.ObjectRef) -> None:
        """End the map once its driver has exited, which takes its objects (``token``) with it: Ray does not cancel
        a dead caller's stream, and the map's small requests travel inline, independent of the driver."""
        while True:
            await asyncio.sleep(DRIVER_CHECK_S)
            try:
                await token
            except ray.exceptions.ObjectLostError as err:  # OwnerDiedError: the driver is gone
                m.done.put_nowait(SamplerError(f"the map's driver is gone ({type(err).__name__})"))
                return

    async def run(self, sampler: str, digest: str, config: dict, chunks: list, bounds: list[int],
                  weights_key: str | None = None, affinity: list[int] | None = None, client: str = "anonymous",
                  scope: str | None = None, driver: list | None = None):
        """Streaming generator: yields ``(request indices, ObjectRef of their results)`` as each call finishes.

        ``chunks``: the lists of requests, pickled (small ones) or put by the driver (chunk c holds requests
        ``bounds[c]`` to ``bounds[c + 1] - 1``); ``digest``: the exact hash of ``config``
        (``cluster.pool_worker.config_digest``); ``driver``: ``[ref]`` of an object the driver owns, to notice its
        exit. Cancelling the stream (the driver abandoned the map) or the driver's exit stops launching requests."""
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
        if driver:
            launchers.append(asyncio.ensure_future(self._watch_driver(m, driver[0])))
        self.maps[id(m)] = m
        self._set_queued()
        remaining = len(m)
        try:
            while remaining:
                item = await m.done.get()
                if isinstance(item, BaseException):
                    raise item
                remaining -= len(item[0])
                yield item
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
