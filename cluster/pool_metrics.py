"""The pool's Ray metrics (Prometheus: ``ray_orrery_pool_*``, tagged ``pool=<name>``) and its samples/s window."""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Callable

import ray


class RateWindow:
    """Samples per second over the last ``seconds``: a queue of (time, samples) with a running total, so adding
    and reading cost O(1) amortised however many requests the window holds."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.events: deque[tuple[float, int]] = deque()
        self.total = 0

    def _expire(self, now: float) -> None:
        while self.events and now - self.events[0][0] >= self.seconds:
            self.total -= self.events.popleft()[1]

    def add(self, now: float, samples: int) -> None:
        self.events.append((now, samples))
        self.total += samples
        self._expire(now)

    def rate(self, now: float) -> float:
        """Samples in the window / its span (at least 1 s, so one early request does not read as a burst)."""
        self._expire(now)
        span = max(now - self.events[0][0], 1.0) if self.events else 1.0
        return self.total / span



class PoolMetrics:
    """Counters, gauges and a latency histogram of one pool, kept fresh while the pool is idle."""

    def __init__(self, pool: str) -> None:
        from ray.util import metrics
        tags = ("pool",)
        self.requests = metrics.Counter("orrery_pool_requests", "requests served", tag_keys=tags + ("sampler",))
        self.samples = metrics.Counter("orrery_pool_samples", "samples produced", tag_keys=tags + ("sampler",))
        self.retries = metrics.Counter("orrery_pool_retries", "requests re-run after a worker died", tag_keys=tags)
        self.restarts = metrics.Counter("orrery_pool_restarts", "workers restarted or replaced", tag_keys=tags)
        self.queue = metrics.Gauge("orrery_pool_queue_depth", "requests waiting for a worker", tag_keys=tags)
        self.rate = metrics.Gauge("orrery_pool_samples_per_second", "samples/s over the last 30 s", tag_keys=tags)
        self.version = metrics.Gauge("orrery_pool_weights_version", "latest published version",
                                     tag_keys=tags + ("key",))
        self.latency = metrics.Histogram("orrery_pool_request_seconds", "request latency",
                                         boundaries=[0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120],
                                         tag_keys=tags + ("sampler",))
        self.tags = {"pool": pool}
        # A counter never incremented is absent from Prometheus, so `increase(..._restarts_total[10m])` reads "no
        # data" instead of 0. Record 0 once; Counter.inc refuses 0, the base class's _record takes it.
        for counter in (self.retries, self.restarts):
            counter._record(0, tags=self.tags)
        self.window = RateWindow(30.0)
        self.refresher: asyncio.Task | None = None

    def served(self, sampler: str, requests: int, n: int, seconds: float) -> None:
        """One call of ``requests`` requests (a batch shares its call's seconds) that produced ``n`` samples."""
        now = time.time()
        self.window.add(now, n)
        tags = {**self.tags, "sampler": sampler}
        self.requests.inc(requests, tags=tags)
        self.samples.inc(n, tags=tags)
        for _ in range(requests):  # a request's latency is its call's, so the histogram counts requests too
            self.latency.observe(seconds, tags=tags)
        self.rate.set(self.window.rate(now), tags=self.tags)

    def retry(self) -> None:
        self.retries.inc(1, tags=self.tags)

    def restart(self) -> None:
        self.restarts.inc(1, tags=self.tags)

    def queue_depth(self, n: int) -> None:
        self.queue.set(n, tags=self.tags)

    def weights_version(self, key: str, version: int) -> None:
        self.version.set(version, tags={**self.tags, "key": key})

    def keep_fresh(self, queued: Callable[[], int], versions: Callable[[], dict[str, int]]) -> None:
        """Re-set the gauges periodically (from the running event loop): Ray's metrics agent drops a gauge not
        refreshed within two export intervals, so an idle pool would otherwise vanish from Prometheus (and samples/s
        would never decay to 0)."""
        if self.refresher is not None:
            return

        async def refresh() -> None:
            period = max(0.5, ray._config.metrics_report_interval_ms() / 2000)
            while True:
                self.rate.set(self.window.rate(time.time()), tags=self.tags)
                self.queue_depth(queued())
                for key, version in versions().items():
                    self.weights_version(key, version)
                await asyncio.sleep(period)
        self.refresher = asyncio.get_running_loop().create_task(refresh())
