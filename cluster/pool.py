"""The shared actor pool: long-lived sampler workers that every job on the cluster attaches to by name.

Shape (one per cluster, in the ``orrery`` namespace, all detached so they outlive the driver that made them):

    PoolManager "<name>"                  async actor, 0 CPUs, on the head node: only schedules (cluster.pool_manager)
        ├── PoolWorker "<name>-worker-i"        the default group (cluster.pool_worker)
        └── PoolWorker "<name>-<group>-worker-i" other worker groups, e.g. fractional-GPU workers (pool.groups)

A sampler is any object built as ``factory(config: dict)`` with ``sample(request: dict) -> Any`` and, if it uses
weights, ``load_weights(weights, version: int)``; it is registered by name with its worker group.

What the pool guarantees (the README's pool section says the same):
- Delivery exactly once: ``imap``/``map`` return one result per request, whatever dies meanwhile (a worker, the
  manager); requests whose results had not arrived are sent again.
- Execution at least once: a request that was running when its worker (or the manager) died runs again, so a
  sampler's side effects (oracle calls, env steps) can happen twice. A request is run again after at most
  ``pool.max_retries`` worker deaths it was part of; then it fails with a :class:`SamplerError` naming it.
- A sampler that raises fails the map at once (no retry) and frees every slot the map held.
- Time limits: a request running past ``pool.request_timeout_s`` (or its sampler's ``timeout_s`` at :meth:`register`)
  fails its map with a :class:`RequestTimeout` naming it; its worker is killed and Ray restarts it.
- Health never waits: ``attach``, ``stats`` and ``release`` are answered while every worker runs long requests.
- Requests travel by reference: the driver puts them into the object store in chunks, the worker fetches its batch
  (chunks under 64 KiB travel as pickled bytes the manager never opens); a request bigger than
  ``pool.max_request_bytes`` is refused before anything is sent.
- An abandoned map (the ``imap`` consumer stops, ``PendingMap.result`` times out or ``cancel`` is called, the driver
  exits) stops launching requests; those already running end within their time limit.
- Small requests travel in batches (``pool.batch_target_s``), so a map of many ms-long requests pays Ray's per-call
  cost once per batch; a batch's results arrive together.
- Results and weights never pass through the manager: results go from the worker to the driver by ObjectRef, and
  weights are put once by the publisher, which owns them (they live as long as the publishing process). The manager
  owns each result (it made the worker call) and holds it until the client has fetched it, so no client's or job's
  exit can free what another job is about to fetch.
- Clients take turns for free workers, so a driver with a long queue does not starve a small one.
What it does not: persist anything. A restarted manager starts a new incarnation, re-attaches the workers and learns
samplers and weights again from its clients (each client re-registers and re-publishes what it knows).
"""
from __future__ import annotations

import concurrent.futures
import logging
import pickle
import threading
import time
import uuid
from dataclasses import asdict
from typing import Any, Iterator, Sequence

import ray
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError

from cluster.connect import NAMESPACE
from cluster.pool_config import DEFAULT_GROUP, POOL_PROTOCOL, PoolConfig
from cluster.pool_manager import PoolManager, UnknownName
from cluster.pool_worker import RequestTimeout, SamplerError, config_digest, request_summary

__all__ = ["PendingMap", "RequestTimeout", "SamplerError", "SharedPool"]

log = logging.getLogger(__name__)

HEAD_NODE_RESOURCE = "node:__internal_head__"  # every Ray head node has 1 of it
_MANAGER_GONE = (RayActorError, ObjectLostError)  # the manager died or restarted: its streams and result refs are lost
CHUNK_BYTES = 1 << 20  # requests are put in chunks of about this size (a bigger request is a chunk of its own)
INLINE_BYTES = 64 << 10  # a chunk this small travels as bytes in the call, not through the object store
ACK_EVERY = 4  # a map's items acknowledged to the manager in one call (the manager holds results until then)


def payload_bytes(request: Any) -> int:
    """A request's serialised size, without copying its arrays (pickle protocol 5 hands their buffers out)."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(request, protocol=5, buffer_callback=buffers.append)
    return len(head) + sum(b.raw().nbytes for b in buffers)


def put_requests(requests: Sequence[dict], max_request_bytes: int, max_chunk: int) -> tuple[list, list[int]]:
    """Put the requests into the object store in chunks (at most ``max_chunk`` requests or ~1 MiB each, so a worker
    fetches little beyond its batch); returns the chunk refs and their bounds (chunk c: ``bounds[c]:bounds[c+1]``).
    A request over ``max_request_bytes`` is refused here, before anything is sent."""
    refs, bounds, chunk, size = [], [0], [], 0
    for i, request in enumerate(requests):
        n = payload_bytes(request)
        if n > max_request_bytes:
            raise ValueError(f"request {i} ({request_summary(request) if isinstance(request, dict) else '...'}) is "
                             f"{n / 2**20:.1f} MiB, over pool.max_request_bytes={max_request_bytes} "
                             f"({max_request_bytes / 2**20:.1f} MiB): pass big inputs by reference (ray.put, a "
                             f"file) or raise the limit")
        if chunk and (size + n > CHUNK_BYTES or len(chunk) >= max_chunk):
            refs.append(_pack(chunk, size))
            bounds.append(bounds[-1] + len(chunk))
            chunk, size = [], 0
        chunk.append(request)
        size += n
    if chunk:
        refs.append(_pack(chunk, size))
        bounds.append(bounds[-1] + len(chunk))
    return refs, bounds


def _pack(chunk: list[dict], size: int) -> Any:
    """A chunk of requests as the worker receives it: small ones as pickled bytes, which the manager passes on
    without unpickling (a put and a fetch through the object store would cost each small call more than its
    requests), bigger ones as an ObjectRef, so no big payload ever reaches the manager."""
    return pickle.dumps(chunk, protocol=5) if size <= INLINE_BYTES else ray.put(chunk)


class SharedPool:
    """Driver-side handle to the named pool; any number of drivers/jobs may hold one at once.

    ``scope`` names what this client's samplers and weights belong to (a run): :meth:`release` drops them from every
    worker when the run ends.
    """

    def __init__(self, manager: Any, cfg: PoolConfig, scope: str | None = None) -> None:
        self.manager, self.cfg, self.name, self.scope = manager, cfg, cfg.name, scope
        self.client_id = f"{scope or 'client'}:{uuid.uuid4().hex[:8]}"
        self.registered: dict[str, tuple[str, str, float | None]] = {}
        self.latest: dict[str, tuple[int, ray.ObjectRef]] = {}  # key -> (version, ref) this client published last
        # publish and recover one at a time: a recovery never re-publishes a version older than one published since
        self.lock = threading.RLock()
        # how often this client recovered from a lost manager, and the requests it sent again after losing a map's
        # stream (at-least-once execution: the manager may have run a re-sent request already, so its request count
        # can exceed the requests asked for by at most "resent")
        self.counts = {"recoveries": 0, "resent": 0}
        self.told: list[ray.ObjectRef] = []  # acknowledgements sent, not yet answered

    @classmethod
    def attach(cls, cfg: PoolConfig | dict | None = None, *, create: bool = True, scope: str | None = None,
               timeout_s: float | None = None) -> "SharedPool":
        """Attach to the pool named ``cfg.name``, creating it (and its workers) if it does not exist yet. Fails with a
        SamplerError naming the missing resources when the workers cannot be placed within ``timeout_s``."""
        cfg = cfg if isinstance(cfg, PoolConfig) else PoolConfig(**(cfg or {}))
        timeout_s = cfg.ready_timeout_s if timeout_s is None else timeout_s
        if create:
            # The manager holds the pool's state: keep it on the head node, which outlives worker nodes. The
            # explicit strategy keeps it out of the caller's placement group (a Tune trial's, a Train worker's):
            # the pool belongs to the cluster, not to whoever happened to create it.
            manager = PoolManager.options(name=cfg.name, namespace=NAMESPACE, lifetime="detached",
                                          get_if_exists=True, resources={HEAD_NODE_RESOURCE: 0.001},
                                          scheduling_strategy="DEFAULT").remote(asdict(cfg))
        else:
            manager = ray.get_actor(cfg.name, namespace=NAMESPACE)
        try:
            info = ray.get(manager.ready.remote(timeout_s), timeout=timeout_s + 30)
        except GetTimeoutError:
            raise SamplerError(f"pool {cfg.name!r}: its manager did not start within {timeout_s + 30:.0f} s (it needs "
                               f"a slot on the head node; cluster resources: {ray.cluster_resources()})") from None
        except ray.exceptions.RayTaskError as err:
            raise (err.cause if isinstance(err.cause, SamplerError) else err) from None
        if info.get("protocol") != POOL_PROTOCOL:
            raise SamplerError(f"pool {cfg.name!r} runs other pool code (protocol {info.get('protocol', 1)}; this code "
                               f"speaks {POOL_PROTOCOL}): it was started before the code changed and outlives jobs. "
                               f"Restart the cluster, or end the pool: ray.kill(ray.get_actor({cfg.name!r}, "
                               f"namespace={NAMESPACE!r}))")
        if create and info["config"] != asdict(cfg):
            log.warning("pool %r already exists with %s; attaching to it as is (asked for %s)",
                        cfg.name, info["config"], asdict(cfg))
        return cls(manager, PoolConfig(**info["config"]), scope)

    # -- registry and weights --------------------------------------------------------------------------------------
    def register(self, name: str, factory: str, group: str = DEFAULT_GROUP, timeout_s: float | None = None) -> None:
        """Register a sampler type; ``timeout_s`` overrides ``pool.request_timeout_s`` for its requests (e.g. 3600 for
        long LM rollouts, 5 for env steps that must never stall)."""
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"sampler {name!r}: timeout_s must be > 0 seconds, got {timeout_s}")
        self.registered[name] = (factory, group, timeout_s)
        self._call(lambda: self.manager.register.remote(name, factory, group, timeout_s))

    def publish(self, key: str, weights: Any) -> int:
        """Publish a new version of ``weights`` under ``key``; returns the version number (1, 2, ...).

        The weights are put into the object store once, by this process, which owns them: they live as long as the
        publisher (a run's learner or driver) and never pass through the manager. A request for a key whose publisher
        has exited fails with a SamplerError."""
        ref = ray.put(weights)
        with self.lock:
            # this client numbers its own versions (the manager's count is lost with a restart); the first publish
            # of a key takes the manager's next number
            mine = self.latest[key][0] + 1 if key in self.latest else None
            _, version = self._call(lambda: self.manager.publish.remote(key, [ref], self.scope, mine))
            self.latest[key] = (version, ref)
        return version

    def _recover(self, err: Exception) -> None:
        """After a manager restart: wait until it answers, then teach it this client's samplers and weights."""
        with self.lock:
            self._recover_locked(err)

    def _recover_locked(self, err: Exception) -> None:
        log.warning("pool %r: manager unavailable (%s); waiting for its restart", self.name, type(err).__name__)
        self.counts["recoveries"] += 1
        deadline = time.monotonic() + self.cfg.revive_timeout_s + self.cfg.ready_timeout_s
        while True:
            try:
                ray.get(self.manager.ready.remote(self.cfg.ready_timeout_s), timeout=30)
                break
            except (*_MANAGER_GONE, GetTimeoutError):
                if time.monotonic() > deadline:
                    raise SamplerError(f"pool {self.name!r}: its manager did not come back after {err!r}") from None
                time.sleep(0.5)
        for name, (factory, group, timeout_s) in list(self.registered.items()):
            ray.get(self.manager.register.remote(name, factory, group, timeout_s))
        for key, (version, ref) in list(self.latest.items()):  # our refs outlived the manager: same versions
            ray.get(self.manager.publish.remote(key, [ref], self.scope, version))

    def _resend(self, sampler: str, pending: dict[int, dict]) -> None:
        self.counts["resent"] += len(pending)
        log.warning("pool %r: sending the %d requests of %r whose results had not arrived again",
                    self.name, len(pending), sampler)

    def _call(self, make_ref) -> Any:
        for attempt in range(3):
            try:
                return ray.get(make_ref())
            except _MANAGER_GONE as err:
                if attempt == 2:
                    raise
                self._recover(err)
            except ray.exceptions.RayTaskError as err:
                raise (err.cause if isinstance(err.cause, Exception) else err) from None

    def _tell(self, method: Any, *args: Any) -> None:
        """A call whose answer nobody waits for (acknowledgements): its ref is kept until it is done, so that a
        manager that died meanwhile is not reported as an unhandled error."""
        if len(self.told) > 64:
            done, self.told = ray.wait(self.told, num_returns=len(self.told), timeout=0)
        try:
            self.told.append(method.remote(*args))
        except Exception as err:  # noqa: BLE001 - the manager is gone: it holds nothing for us any more
            log.debug("pool %r: could not reach the manager: %r", self.name, err)

    # -- requests --------------------------------------------------------------------------------------------------
    def imap(self, sampler: str, requests: Sequence[dict], *, config: dict | None = None,
             weights: str | None = None, affinity: Sequence[int] | None = None,
             _streams: "_Streams | None" = None) -> Iterator[tuple[int, Any]]:
        """Yield ``(index, result)`` for every request, in completion order, each exactly once. Stopping early (a
        ``break``, an exception in the consumer) cancels the rest of the map."""
        if affinity is not None and len(affinity) != len(requests):
            raise ValueError(f"affinity has {len(affinity)} entries for {len(requests)} requests")
        config = config or {}
        digest = config_digest(config)  # a clear error here for a config that is not plain data
        for i, request in enumerate(requests):
            if not isinstance(request, dict):
                raise TypeError(f"request {i}: a request is a dict, got {type(request).__name__}")
        pending = dict(enumerate(requests))
        recoveries = 0
        while pending:
            order = sorted(pending)
            stream = map_id = None
            try:
                chunks, bounds = put_requests([pending[i] for i in order], self.cfg.max_request_bytes,
                                              self.cfg.max_batch)
                alive = ray.put(None)  # owned here: freed when this driver exits, which tells the manager
                map_id = uuid.uuid4().hex
                stream = self.manager.run.options(num_returns="streaming").remote(
                    sampler, digest, config, chunks, bounds, weights,
                    None if affinity is None else [affinity[i] for i in order], self.client_id, self.scope, [alive],
                    map_id)
                if _streams is not None:
                    _streams.add(stream)  # PendingMap.cancel reaches it there
                acks: list[int] = []
                for ref in stream:
                    # one worker call: several small requests, or one. The manager owns the results and holds them
                    # until acknowledged, so they cannot be freed before this fetch (ray-project/ray#58080)
                    item, batch, results_ref = ray.get(ref)
                    results = ray.get(results_ref)
                    acks.append(item)
                    if len(acks) >= ACK_EVERY:
                        self._tell(self.manager.ack, map_id, acks)
                        acks = []
                    for j, result in zip(batch, results):
                        i = order[j]
                        del pending[i]
                        yield i, result
                stream = None  # ran to its end: nothing to cancel
            except _MANAGER_GONE as err:
                recoveries += 1
                if recoveries > 3:
                    raise
                self._recover(err)
                self._resend(sampler, pending)
            except ray.exceptions.RayTaskError as err:
                cause = err.cause
                if isinstance(cause, UnknownName) and recoveries < 3 and (
                        sampler in self.registered or weights in self.latest):
                    recoveries += 1  # a restarted manager that has not heard from this client yet
                    self._recover(cause)
                    self._resend(sampler, pending)
                    continue
                if isinstance(cause, SamplerError) and cause.request is not None:
                    i = order[cause.request]  # the manager counts in the list it was sent: name it as the caller does
                    raise type(cause)(f"request {i} of sampler {sampler!r} ({request_summary(requests[i])}) "
                                      f"{cause.message}", i) from None
                # what went wrong: a SamplerError with the worker's traceback, an unknown sampler, ...
                raise (cause if isinstance(cause, Exception) else err) from None
            finally:
                if stream is not None:  # abandoned (consumer stopped, error) or about to be re-sent: stop it
                    _cancel(stream)
                if map_id is not None:  # every result fetched, or none will be: the manager may let them go
                    self._tell(self.manager.forget, map_id)
                    map_id = None

    def map(self, sampler: str, requests: Sequence[dict], **kwargs: Any) -> list[Any]:
        """Like :meth:`imap` but returns results in request order."""
        out: list[Any] = [None] * len(requests)
        for i, result in self.imap(sampler, requests, **kwargs):
            out[i] = result
        return out

    def submit(self, sampler: str, requests: Sequence[dict], **kwargs: Any) -> "PendingMap":
        """Start a map in the background (e.g. collect step k+1 while learning on step k)."""
        return PendingMap(self, sampler, list(requests), kwargs)

    # -- lifecycle and inspection ----------------------------------------------------------------------------------
    def release(self, scope: str | None = None) -> dict[str, int]:
        """Drop a finished run's samplers and weights from every worker (default: this client's scope)."""
        scope = scope or self.scope
        if scope is None:
            return {}
        for key in [k for k in self.latest]:
            del self.latest[key]
        return self._call(lambda: self.manager.release.remote(scope))

    def stats(self) -> dict[str, Any]:
        """The manager's counts (every client's), and under ``client`` this client's recoveries and re-sent requests."""
        return {**self._call(lambda: self.manager.stats.remote()), "client": dict(self.counts)}

    def workers(self, group: str = DEFAULT_GROUP) -> list:
        return self._call(lambda: self.manager.worker_handles.remote(group))

    def shutdown(self) -> None:
        """Kill the workers and the manager (other drivers attached to the pool lose it too)."""
        try:
            ray.get(self.manager.shutdown_workers.remote())
        finally:
            ray.kill(self.manager, no_restart=True)


def shutdown_pool(name: str) -> None:
    """Shut the named pool down if it exists (it may never have been created, or already be gone)."""
    try:
        SharedPool.attach({"name": name}, create=False).shutdown()
    except ValueError:  # Ray's "actor not found"
        pass


class _Streams:
    """The streams of a background map, so that another thread can cancel them (also one started after the cancel)."""

    def __init__(self) -> None:
        self.lock, self.streams, self.cancelled = threading.Lock(), [], False

    def add(self, stream: Any) -> None:
        with self.lock:
            self.streams.append(stream)
            if not self.cancelled:
                return
        _cancel(stream)

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            streams = list(self.streams)
        for stream in streams:
            _cancel(stream)


def _cancel(stream: Any) -> None:
    try:
        ray.cancel(stream, recursive=False)  # the manager's run ends: its launchers stop, running calls finish
    except Exception as err:  # noqa: BLE001 - a manager already gone has nothing left to stop
        log.debug("could not cancel a pool map: %r", err)


class PendingMap:
    """A map running in a background thread of the driver; ``result()`` blocks and returns results in order.

    ``result(timeout)`` that times out abandons the map: it is cancelled (no more of its requests start) and the
    ``TimeoutError`` is raised; so is :meth:`cancel`."""

    def __init__(self, pool: SharedPool, sampler: str, requests: list[dict], kwargs: dict) -> None:
        self._streams = _Streams()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self._future = self._executor.submit(self._run, pool, sampler, requests, kwargs)
        self.started = time.perf_counter()

    def _run(self, pool: SharedPool, sampler: str, requests: list[dict], kwargs: dict) -> list[Any]:
        out: list[Any] = [None] * len(requests)
        for i, result in pool.imap(sampler, requests, _streams=self._streams, **kwargs):
            if self._streams.cancelled:
                raise concurrent.futures.CancelledError("the map was cancelled")
            out[i] = result
        return out

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> None:
        """Stop the map: requests not started yet never start; running ones end within their time limit."""
        self._streams.cancel()
        self._executor.shutdown(wait=False)

    def result(self, timeout: float | None = None) -> list[Any]:
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            self.cancel()
            raise
        finally:
            self._executor.shutdown(wait=False)
