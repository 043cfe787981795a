"""A pool worker: hosts samplers built from registered factories and caches the weights they run with.

Samplers are cached per (factory, config) so stateful ones (vectorised envs mid-episode) keep their state between
requests; weights per (key, manager incarnation) at their latest version. Both caches are bounded (least recently
used first out) and a run's entries are dropped when the run releases its scope, so a long-lived pool serving many
runs and trials does not grow. With ``slots`` > 1 the worker serves that many requests at once in threads (useful
for samplers that release the GIL); requests for the same sampler still run one at a time.

``run`` takes a batch of requests (the manager batches small ones) and returns two objects: a small
``(num_samples, seconds)`` that the manager reads to schedule, and the list of results, which only the driver fetches
(the manager never deserialises a payload).
"""
from __future__ import annotations

import importlib
import json
import os
import threading
import time
import traceback
from collections import OrderedDict
from typing import Any, Callable

import ray


class SamplerError(RuntimeError):
    """A sampler raised (a bug or a bad request, not a dead worker, so it is not retried), or a request killed its
    worker more often than the pool's retry bound."""


def _import(path: str) -> Callable[..., Any]:
    module, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"sampler factory must look like 'package.module:callable', got {path!r}")
    return getattr(importlib.import_module(module), attr)


def sampler_key(factory: str, config: dict) -> str:
    return factory + json.dumps(config, sort_keys=True, default=str)


def limit_torch_threads(n: int) -> None:
    try:
        import torch
        torch.set_num_threads(n)
    except ImportError:
        pass


class _Cached:
    __slots__ = ("sampler", "lock", "scope", "weights")

    def __init__(self, sampler: Any, scope: str | None) -> None:
        self.sampler, self.lock, self.scope = sampler, threading.Lock(), scope
        self.weights: tuple | None = None  # (key, incarnation, version) loaded into this sampler


@ray.remote(max_restarts=-1, max_task_retries=0)
class PoolWorker:
    def __init__(self, group: str, index: int, torch_threads: int, max_samplers: int, max_weights: int) -> None:
        self.group, self.index, self.torch_threads = group, index, torch_threads
        self.max_samplers, self.max_weights = max_samplers, max_weights
        self.samplers: OrderedDict[str, _Cached] = OrderedDict()
        self.weights: OrderedDict[tuple[str, str], tuple[int, Any, str | None]] = OrderedDict()
        self.lock = threading.Lock()
        self.weight_fetches = self.requests = self.evicted = 0
        os.environ.setdefault("OMP_NUM_THREADS", str(torch_threads))

    def ping(self) -> int:
        return os.getpid()

    def stats(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        with self.lock:
            return {"group": self.group, "index": self.index, "pid": os.getpid(), "node_id": ctx.get_node_id(),
                    "requests": self.requests, "resources": ctx.get_assigned_resources(),
                    "weight_fetches": self.weight_fetches, "samplers": len(self.samplers),
                    "cached_weights": {f"{k}@{inc}": v for (k, inc), (v, _, _) in self.weights.items()},
                    "evicted": self.evicted}

    # -- caches ----------------------------------------------------------------------------------------------------
    def _sampler(self, factory: str, config: dict, scope: str | None) -> _Cached:
        key = sampler_key(factory, config)
        with self.lock:
            cached = self.samplers.get(key)
            if cached is not None:
                self.samplers.move_to_end(key)
                return cached
        limit_torch_threads(self.torch_threads)
        cached = _Cached(_import(factory)(config), scope)
        with self.lock:
            self.samplers[key] = cached
            while len(self.samplers) > self.max_samplers:
                _, old = self.samplers.popitem(last=False)
                self.evicted += 1
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
            self.weights[(key, incarnation)] = (version, value, scope)
            self.weights.move_to_end((key, incarnation))
            while len(self.weights) > self.max_weights:
                self.weights.popitem(last=False)
                self.evicted += 1
        return value

    def release(self, scope: str) -> dict[str, int]:
        """Drop the samplers and weights of a finished run (``scope``)."""
        with self.lock:
            samplers = [k for k, c in self.samplers.items() if c.scope == scope]
            weights = [k for k, (_, _, s) in self.weights.items() if s == scope]
            dropped = [self.samplers.pop(k) for k in samplers]
            for k in weights:
                del self.weights[k]
        for cached in dropped:
            _close(cached.sampler)
        return {"samplers": len(samplers), "weights": len(weights)}

    # -- requests --------------------------------------------------------------------------------------------------
    @ray.method(num_returns=2)
    def run(self, factory: str, config: dict, requests: list[dict], weights: tuple | None,
            scope: str | None = None) -> tuple[tuple[int, float], list[Any]]:
        """Run a batch of requests one after the other on one sampler; returns ``((samples, seconds), results)``."""
        start = time.perf_counter()
        with self.lock:
            self.requests += len(requests)
        results, request = [], None
        try:
            cached = self._sampler(factory, config, scope)
            with cached.lock:
                if weights is not None:
                    key, incarnation, version, boxed, weights_scope = weights
                    if cached.weights != (key, incarnation, version):
                        value = self._weights(key, incarnation, version, boxed, weights_scope)
                        cached.sampler.load_weights(value, version)
                        cached.weights = (key, incarnation, version)
                for request in requests:
                    results.append(cached.sampler.sample(request))
        except Exception as err:  # noqa: BLE001 - reported to the caller with the sampler's own traceback
            raise SamplerError(f"sampler {factory} failed on worker {self.group}/{self.index}"
                               f"{'' if request is None else ' on request ' + request_summary(request)}: {err!r}\n"
                               f"{traceback.format_exc()}") from None
        n = sum(r.get("num_samples", 1) if isinstance(r, dict) else 1 for r in results)
        return (int(n), time.perf_counter() - start), results


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
