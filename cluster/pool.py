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
- Small requests travel in batches (``pool.batch_target_s``), so a map of many ms-long requests pays Ray's per-call
  cost once per batch; a batch's results arrive together.
- Results and weights never pass through the manager: results go from the worker to the driver by ObjectRef, and
  weights are put once by the publisher, which owns them (they live as long as the publishing process).
- Clients take turns for free workers, so a driver with a long queue does not starve a small one.
What it does not: persist anything. A restarted manager starts a new incarnation, re-attaches the workers and learns
samplers and weights again from its clients (each client re-registers and re-publishes what it knows).
"""
from __future__ import annotations

import concurrent.futures
import logging
import time
import uuid
from dataclasses import asdict
from typing import Any, Iterator, Sequence

import ray
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError

from cluster.connect import NAMESPACE
from cluster.pool_config import DEFAULT_GROUP, PoolConfig
from cluster.pool_manager import PoolManager, UnknownName
from cluster.pool_worker import SamplerError

log = logging.getLogger(__name__)

HEAD_NODE_RESOURCE = "node:__internal_head__"  # every Ray head node has 1 of it
_MANAGER_GONE = (RayActorError, ObjectLostError)  # the manager died or restarted: its streams and result refs are lost


class SharedPool:
    """Driver-side handle to the named pool; any number of drivers/jobs may hold one at once.

    ``scope`` names what this client's samplers and weights belong to (a run): :meth:`release` drops them from every
    worker when the run ends.
    """

    def __init__(self, manager: Any, cfg: PoolConfig, scope: str | None = None) -> None:
        self.manager, self.cfg, self.name, self.scope = manager, cfg, cfg.name, scope
        self.client_id = f"{scope or 'client'}:{uuid.uuid4().hex[:8]}"
        self.registered: dict[str, tuple[str, str]] = {}
        self.latest: dict[str, tuple[int, ray.ObjectRef]] = {}  # key -> (version, ref) this client published last

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
        if create and info["config"] != asdict(cfg):
            log.warning("pool %r already exists with %s; attaching to it as is (asked for %s)",
                        cfg.name, info["config"], asdict(cfg))
        return cls(manager, PoolConfig(**info["config"]), scope)

    # -- registry and weights --------------------------------------------------------------------------------------
    def register(self, name: str, factory: str, group: str = DEFAULT_GROUP) -> None:
        self.registered[name] = (factory, group)
        self._call(lambda: self.manager.register.remote(name, factory, group))

    def publish(self, key: str, weights: Any) -> int:
        """Publish a new version of ``weights`` under ``key``; returns the version number (1, 2, ...).

        The weights are put into the object store once, by this process, which owns them: they live as long as the
        publisher (a run's learner or driver) and never pass through the manager. A request for a key whose publisher
        has exited fails with a SamplerError."""
        ref = ray.put(weights)
        _, version = self._call(lambda: self.manager.publish.remote(key, [ref], self.scope))
        self.latest[key] = (version, ref)
        return version

    def _recover(self, err: Exception) -> None:
        """After a manager restart: wait until it answers, then teach it this client's samplers and weights."""
        log.warning("pool %r: manager unavailable (%s); waiting for its restart", self.name, type(err).__name__)
        deadline = time.monotonic() + self.cfg.revive_timeout_s + self.cfg.ready_timeout_s
        while True:
            try:
                ray.get(self.manager.ready.remote(self.cfg.ready_timeout_s), timeout=30)
                break
            except (*_MANAGER_GONE, GetTimeoutError):
                if time.monotonic() > deadline:
                    raise SamplerError(f"pool {self.name!r}: its manager did not come back after {err!r}") from None
                time.sleep(0.5)
        for name, (factory, group) in self.registered.items():
            ray.get(self.manager.register.remote(name, factory, group))
        for key, (version, ref) in self.latest.items():  # our refs survived the manager: same objects, same versions
            ray.get(self.manager.publish.remote(key, [ref], self.scope, version))

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

    # -- requests --------------------------------------------------------------------------------------------------
    def imap(self, sampler: str, requests: Sequence[dict], *, config: dict | None = None,
             weights: str | None = None, affinity: Sequence[int] | None = None) -> Iterator[tuple[int, Any]]:
        """Yield ``(index, result)`` for every request, in completion order, each exactly once."""
        if affinity is not None and len(affinity) != len(requests):
            raise ValueError(f"affinity has {len(affinity)} entries for {len(requests)} requests")
        pending = dict(enumerate(requests))
        recoveries = 0
        while pending:
            order = sorted(pending)
            try:
                stream = self.manager.run.options(num_returns="streaming").remote(
                    sampler, config or {}, [pending[i] for i in order], weights,
                    None if affinity is None else [affinity[i] for i in order], self.client_id, self.scope)
                for ref in stream:
                    batch, results_ref = ray.get(ref)  # one worker call: several small requests, or one
                    for j, result in zip(batch, ray.get(results_ref)):
                        i = order[j]
                        del pending[i]
                        yield i, result
            except _MANAGER_GONE as err:
                recoveries += 1
                if recoveries > 3:
                    raise
                self._recover(err)
            except ray.exceptions.RayTaskError as err:
                cause = err.cause
                if isinstance(cause, UnknownName) and recoveries < 3 and (
                        sampler in self.registered or weights in self.latest):
                    recoveries += 1  # a restarted manager that has not heard from this client yet
                    self._recover(cause)
                    continue
                # what went wrong: a SamplerError with the worker's traceback, an unknown sampler, ...
                raise (cause if isinstance(cause, Exception) else err) from None

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
        return self._call(lambda: self.manager.stats.remote())

    def workers(self, group: str = DEFAULT_GROUP) -> list:
        return self._call(lambda: self.manager.worker_handles.remote(group))

    def shutdown(self) -> None:
        """Kill the workers and the manager (other drivers attached to the pool lose it too)."""
        try:
            ray.get(self.manager.shutdown_workers.remote())
        finally:
            ray.kill(self.manager, no_restart=True)


class PendingMap:
    """A map running in a background thread of the driver; ``result()`` blocks and returns results in order."""

    def __init__(self, pool: SharedPool, sampler: str, requests: list[dict], kwargs: dict) -> None:
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
