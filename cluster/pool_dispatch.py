"""How the manager runs a map: its requests wait in lanes (per preferred worker), launchers take a slot at a time
and make one worker call per slot, carrying one request or several small ones (``pool.batch_target_s``: as many as
take ~50 ms at the sampler's recent speed, never more than a fair share of the map's remaining requests per slot).

Requests come in chunks the manager never opens: refs the driver put (or, for small chunks, pickled bytes); it hands
each worker the chunks and offsets of its batch and reads only the worker's small ``(samples, seconds)`` reply, so no
payload is unpickled here. A worker that dies mid-call has the call's requests run again alone on a whole worker (no
other request beside them), so a request that kills workers is isolated before it is charged: only a death while
running alone counts towards ``pool.max_retries``; past it the request fails with a SamplerError naming it. A call
that outlives its time limit has its worker killed (Ray restarts it): a lone request then fails its map with a
RequestTimeout, a batch's requests run again alone.
"""
from __future__ import annotations

import asyncio
import bisect
import logging
from collections import deque
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from cluster.pool_groups import Group
from cluster.pool_slots import Slot
from cluster.pool_worker import RequestTimeout, SamplerError

log = logging.getLogger(__name__)


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


class Dispatch:
    """The manager's map-running half (mixed into ``PoolManager``, whose ``cfg``, ``counts``, ``metrics`` and
    ``seconds_per_request`` it uses)."""

    cfg: Any
    counts: dict[str, Any]
    metrics: Any
    seconds_per_request: Any
    per_sampler: Any

    def _set_queued(self) -> None:
        raise NotImplementedError

    def _worker_down(self, g: Group, w: int, kill: ray.ObjectRef | None = None) -> None:
        """Worker ``w`` died, or is killed now for running past its time limit: count a restart if it was alive."""
        if g.down(w, self.cfg.revive_timeout_s, kill):
            self.counts["restarts"] += 1
            self.metrics.restart()

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
