"""A pool worker: hosts samplers built from registered factories and caches the weights they run with.

Samplers are cached per (run scope, factory, exact hash of the config) so stateful ones (vectorised envs mid-episode)
keep their state between a run's requests, and no run ever samples with another run's sampler or closes it; weights
per (key, manager incarnation) at their latest version. Both caches are bounded, by count and by bytes (least
recently used first out), and a run's entries are dropped when the run releases its scope, so a long-lived pool
serving many runs and trials does not grow. With ``slots`` > 1 the worker serves that many requests at once in
threads (useful for samplers that release the GIL); requests for the same sampler still run one at a time.

``run`` takes a batch of requests by reference (the driver put them into the object store; the manager only passes
the refs on) and returns two objects: a small ``(num_samples, seconds)`` that the manager reads to schedule, and the
list of results, which only the driver fetches (the manager never deserialises a payload). ``ping``, ``stats`` and
``release`` run in their own concurrency group, so they answer at once however long the requests in flight take.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import pickle
import threading
import time
import traceback
from collections import OrderedDict
from typing import Any, Callable

import numpy as np
import ray

HEALTH = "health"  # the concurrency group of ping/stats/release: never queued behind a request


class SamplerError(RuntimeError):
    """A sampler raised (a bug or a bad request, not a dead worker, so it is not retried), or a request killed its
    worker more often than the pool's retry bound. ``request``: the index of the request in its map, when the error
    is about one request (the driver then names it with its fields)."""

    def __init__(self, message: str, request: int | None = None) -> None:
        super().__init__(message, request)  # both in args: the error crosses processes by pickle
        self.message, self.request = message, request

    def __str__(self) -> str:
        return self.message


class RequestTimeout(SamplerError):
    """A request ran longer than its time limit (``pool.request_timeout_s`` or the sampler's ``timeout_s``); its
    worker was killed and replaced."""


def import_factory(path: str) -> Callable[..., Any]:
    module, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"sampler factory must look like 'package.module:callable', got {path!r}")
    return getattr(importlib.import_module(module), attr)


def config_digest(config: Any) -> str:
    """An exact hash of a sampler config's content: two configs share a sampler only if they are equal, element for
    element (numpy arrays by dtype, shape and bytes, never by their elided ``str``). Only plain data is accepted."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, config, "config")
    return h.hexdigest()


def _feed(h: Any, x: Any, where: str) -> None:
    if x is None or isinstance(x, (bool, int, float, str)):
        h.update(f"{type(x).__name__}:{x!r};".encode())
    elif isinstance(x, dict):
        h.update(f"dict:{len(x)};".encode())
        for k in sorted(x, key=repr):
            if not isinstance(k, str):
                raise TypeError(f"sampler {where}: keys must be str, got {k!r}")
            _feed(h, k, where)
            _feed(h, x[k], f"{where}.{k}")
    elif isinstance(x, (list, tuple)):
        h.update(f"{type(x).__name__}:{len(x)};".encode())
        for i, v in enumerate(x):
            _feed(h, v, f"{where}[{i}]")
    elif isinstance(x, (np.ndarray, np.generic)):
        a = np.asarray(x)
        if a.dtype == object:
            raise TypeError(f"sampler {where}: numpy arrays of objects are not plain data")
        h.update(f"ndarray:{a.dtype.str}:{a.shape};".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    else:
        raise TypeError(f"sampler {where}: {type(x).__name__} is not plain data (a sampler config holds dicts, "
                        f"lists, str, numbers, bool, None and numpy arrays, so that equal configs share a sampler)")


def approx_nbytes(x: Any, depth: int = 3) -> int:
    """Bytes held by arrays and tensors reachable from ``x`` (a sampler's attributes, a weights dict): what a
    cache entry costs, to bound caches by bytes. Plain Python objects count as nothing."""
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, (bytes, bytearray)):
        return len(x)
    torch = _torch()
    if torch is not None:
        if isinstance(x, torch.Tensor):
            return int(x.element_size() * x.nelement())
        if isinstance(x, torch.nn.Module):
            return sum(int(t.element_size() * t.nelement()) for t in [*x.parameters(), *x.buffers()])
    if depth <= 0:
        return 0
    if isinstance(x, dict):
        return sum(approx_nbytes(v, depth - 1) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(approx_nbytes(v, depth - 1) for v in x)
    if hasattr(x, "__dict__") and not isinstance(x, type):
        return sum(approx_nbytes(v, depth - 1) for v in vars(x).values())
    return 0


def _torch() -> Any:
    import sys
    return sys.modules.get("torch")  # never import torch just to measure: a sampler holding tensors imported it


def limit_torch_threads(n: int) -> None:
    try:
        import torch
        torch.set_num_threads(n)
    except ImportError:
        pass


class _Cached:
    __slots__ = ("sampler", "lock", "scope", "weights", "nbytes")

    def __init__(self, sampler: Any, scope: str | None) -> None:
        self.sampler, self.lock, self.scope = sampler, threading.Lock(), scope
        self.weights: tuple | None = None  # (key, incarnation, version) loaded into this sampler
        self.nbytes = approx_nbytes(sampler)


@ray.remote(max_restarts=-1, max_task_retries=0, concurrency_groups={HEALTH: 2})
class PoolWorker:
    def __init__(self, group: str, index: int, torch_threads: int, max_samplers: int, max_weights: int,
                 max_cache_bytes: int = 2**62) -> None:
        self.group, self.index, self.torch_threads = group, index, torch_threads
        self.max_samplers, self.max_weights, self.max_cache_bytes = max_samplers, max_weights, max_cache_bytes
        self.samplers: OrderedDict[tuple, _Cached] = OrderedDict()
        self.weights: OrderedDict[tuple[str, str], tuple[int, Any, str | None, int]] = OrderedDict()
        self.building: dict[tuple, threading.Lock] = {}  # one build per sampler key, however many threads ask
        self.lock = threading.Lock()
        self.weight_fetches = self.requests = self.evicted = self.builds = 0
        os.environ.setdefault("OMP_NUM_THREADS", str(torch_threads))

    @ray.method(concurrency_group=HEALTH)
    def ping(self) -> int:
        return os.getpid()

    @ray.method(concurrency_group=HEALTH)
    def stats(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        with self.lock:
            return {"group": self.group, "index": self.index, "pid": os.getpid(), "node_id": ctx.get_node_id(),
                    "requests": self.requests, "resources": ctx.get_assigned_resources(),
                    "weight_fetches": self.weight_fetches, "samplers": len(self.samplers), "builds": self.builds,
                    "cached_weights": {f"{k}@{inc}": v for (k, inc), (v, *_) in self.weights.items()},
                    "cache_bytes": self._cache_bytes(), "evicted": self.evicted}

    # -- caches ----------------------------------------------------------------------------------------------------
    def _cache_bytes(self) -> int:
        return sum(c.nbytes for c in self.samplers.values()) + sum(w[3] for w in self.weights.values())

    def _evict(self) -> list[_Cached]:
        """Least recently used out until both caches are within their count and byte bounds (the newest entry of
        each stays: it is about to be used; a sampler running a request in another slot stays too). Called with the
        lock held; returns the samplers to close."""
        closed = []
        while len(self.samplers) > self.max_samplers or (
                len(self.samplers) > 1 and self._cache_bytes() > self.max_cache_bytes):
            idle = [k for k, c in list(self.samplers.items())[:-1] if not c.lock.locked()]
            if not idle:
                break
            closed.append(self.samplers.pop(idle[0]))
            self.evicted += 1
        while len(self.weights) > self.max_weights or (
                len(self.weights) > 1 and self._cache_bytes() > self.max_cache_bytes):
            self.weights.popitem(last=False)
            self.evicted += 1
        return closed

    def _sampler(self, factory: str, digest: str, config: dict, scope: str | None) -> _Cached:
        key = (scope, factory, digest)
        with self.lock:
            build_lock = self.building.setdefault(key, threading.Lock())
        with build_lock:  # a second thread asking for the same sampler waits for the first one's build
            with self.lock:
                cached = self.samplers.get(key)
                if cached is not None:
                    self.samplers.move_to_end(key)
                    return cached
            limit_torch_threads(self.torch_threads)
            cached = _Cached(import_factory(factory)(config), scope)
            with self.lock:
                self.builds += 1
                self.samplers[key] = cached
                self.building.pop(key, None)
                closed = self._evict()
        for old in closed:
            _close(old.sampler)
        return cached

    def _weights(self, key: str, incarnation: str, version: int, boxed: list, scope: str | None) -> Any:
        with self.lock:
            cached = self.weights.get((key, incarnation))
            if cached is not None and cached[0] == version:
                self.weights.move_to_end((key, incarnation))
                return cached[1]
        value = ray.get(boxed[0])
        with self.lock:
            self.weight_fetches += 1
            self.weights[(key, incarnation)] = (version, value, scope, approx_nbytes(value))
            self.weights.move_to_end((key, incarnation))
            closed = self._evict()
        for old in closed:
            _close(old.sampler)
        return value

    @ray.method(concurrency_group=HEALTH)
    def release(self, scope: str) -> dict[str, int]:
        """Drop the samplers and weights of a finished run (``scope``)."""
        with self.lock:
            samplers = [k for k, c in self.samplers.items() if c.scope == scope]
            weights = [k for k, (_, _, s, _) in self.weights.items() if s == scope]
            dropped = [self.samplers.pop(k) for k in samplers]
            for k in weights:
                del self.weights[k]
        for cached in dropped:
            _close(cached.sampler)
        return {"samplers": len(samplers), "weights": len(weights)}

    # -- requests --------------------------------------------------------------------------------------------------
    @ray.method(num_returns=2)
    def run(self, factory: str, digest: str, config: dict, parts: list[tuple[list, list[int]]],
            weights: tuple | None, scope: str | None = None) -> tuple[tuple[int, float], list[Any]]:
        """Run a batch of requests one after the other on one sampler; returns ``((samples, seconds), results)``.
        ``parts``: ``([chunk], offsets)`` per chunk of the map's requests (pickled bytes, or a ref the driver put): the batch is those
        chunks' requests at those offsets (fetched here, so no payload passes through the manager)."""
        chunks = _unpack([boxed[0] for boxed, _ in parts])
        requests = [chunk[o] for chunk, (_, offsets) in zip(chunks, parts) for o in offsets]
        with self.lock:
            self.requests += len(requests)
        results, request = [], None
        try:
            cached = self._sampler(factory, digest, config, scope)
            with cached.lock:
                if weights is not None:
                    key, incarnation, version, boxed, weights_scope = weights
                    if cached.weights != (key, incarnation, version):
                        value = self._weights(key, incarnation, version, boxed, weights_scope)
                        cached.sampler.load_weights(value, version)
                        cached.weights = (key, incarnation, version)
                start = time.perf_counter()  # sampling only: the manager sizes batches by it, not by a build or fetch
                for request in requests:
                    results.append(cached.sampler.sample(request))
        except Exception as err:  # noqa: BLE001 - reported to the caller with the sampler's own traceback
            raise SamplerError(f"sampler {factory} failed on worker {self.group}/{self.index}"
                               f"{'' if request is None else ' on request ' + request_summary(request)}: {err!r}\n"
                               f"{traceback.format_exc()}") from None
        n = sum(r.get("num_samples", 1) if isinstance(r, dict) else 1 for r in results)
        return (int(n), time.perf_counter() - start), results


def _unpack(chunks: list) -> list[list]:
    """Chunks of requests: pickled bytes (small ones, passed inline) or refs the driver put (the driver left:
    OwnerDiedError, which ends the map)."""
    refs = [c for c in chunks if isinstance(c, ray.ObjectRef)]
    fetched = iter(ray.get(refs) if refs else [])
    return [next(fetched) if isinstance(c, ray.ObjectRef) else pickle.loads(c) for c in chunks]


def request_summary(request: dict, limit: int = 160) -> str:
    """A request as an error message shows it: its small fields, cut at ``limit`` characters."""
    text = repr({k: v for k, v in request.items() if not isinstance(v, (bytes, bytearray))})
    return text if len(text) <= limit else text[:limit] + "...}"


def _close(sampler: Any) -> None:
    close = getattr(sampler, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - an evicted sampler must not take the worker down
            pass
