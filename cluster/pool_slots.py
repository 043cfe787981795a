"""The pool's slots: which worker's slots may be used now, and who waits for them (pure bookkeeping, no Ray).

Each worker is ``alive``, ``reviving`` (dead or killed; the manager waits for Ray to restart it, or re-creates it) or
``dead`` (it did not come back within ``pool.revive_timeout_s``); only an alive worker gets requests. Clients (drivers)
take turns for free slots, each client's oldest request first, so a driver with 10,000 queued requests does not starve
one with 10. Every slot is held through a :class:`Slot`, given back exactly once, when the call it served has ended.
"""
from __future__ import annotations

import asyncio
from collections import deque

ALIVE, REVIVING, DEAD = "alive", "reviving", "dead"


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
