"""The pool's worker groups and their workers' lifecycle: create (by name, detached, from the manager, so no job owns
them), mark down when one dies or is killed for running past its time limit, and revive.

A worker that dies is ``reviving``: the manager waits for Ray to restart it (or re-creates it if it was killed for
good). One that does not answer within ``pool.revive_timeout_s`` is ``dead``: it gets no requests and is tried again
after a backoff that doubles with each failed revive (at most ``MAX_BACKOFF_S``).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, AsyncIterator

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from cluster.connect import NAMESPACE
from cluster.pool_config import DEFAULT_GROUP, WorkerGroup
from cluster.pool_slots import ALIVE, DEAD, REVIVING, Slot, Slots
from cluster.pool_worker import PoolWorker

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 300.0  # a dead worker is tried again at most this long after its last failed revive


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

    def down(self, w: int, revive_timeout_s: float, kill: ray.ObjectRef | None = None) -> bool:
        """Worker ``w`` died, or is killed now (``kill``: a call it runs past its time limit): no request goes to it
        until it answers again. True when this marked it down (it was alive): a restart to count."""
        if kill is not None:
            ray.kill(self.workers[w], no_restart=False)  # Ray restarts it: same name, fresh process
        if self.slots.state[w] != ALIVE:
            return False
        self.slots.set_state(w, REVIVING)
        asyncio.get_running_loop().create_task(self.revive(w, revive_timeout_s, kill))
        return True

    async def revive(self, w: int, revive_timeout_s: float, killed_call: ray.ObjectRef | None = None) -> None:
        """Wait for Ray to restart worker ``w`` (re-create it if it was killed for good). After a kill, the killed
        call's end shows the old process is gone (a ping before that could be answered by it)."""
        if killed_call is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(killed_call, timeout=revive_timeout_s)
        while True:
            deadline = time.monotonic() + revive_timeout_s
            while time.monotonic() < deadline:
                try:
                    await asyncio.wait_for(self.workers[w].ping.remote(), timeout=10)
                    self.failed_revives[w] = 0
                    self.slots.set_state(w, ALIVE)
                    return
                except ActorDiedError:
                    await asyncio.sleep(0.2)  # the name is released asynchronously
                    try:
                        self.workers[w] = self.make_worker(w)
                    except ValueError:
                        pass
                except (RayActorError, ActorUnavailableError, asyncio.TimeoutError):
                    await asyncio.sleep(0.2)
            self.failed_revives[w] += 1
            self.slots.set_state(w, DEAD)
            backoff = min(MAX_BACKOFF_S, 2.0 ** self.failed_revives[w])
            log.warning("pool worker %s/%d did not come back within %.0f s: dead, next try in %.0f s",
                        self.name, w, revive_timeout_s, backoff)
            await asyncio.sleep(backoff)
            self.slots.set_state(w, REVIVING)
