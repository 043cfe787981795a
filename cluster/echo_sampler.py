"""Samplers every pool knows: diagnostics that exercise the pool without any method's code.

Method samplers live next to their experiments (``experiments/*_sampler.py``) and are registered by name.
"""
from __future__ import annotations

import os
import time
from typing import Any

BUILTIN_SAMPLERS = {"echo": "cluster.echo_sampler:EchoSampler"}


class EchoSampler:
    """Returns its request plus who served it; ``sleep_s`` makes a request slow enough to kill a worker mid-way,
    ``wait_for`` holds it until that file exists (at most ``wait_timeout_s``, so a test can order completions
    without racing the clock), ``fail`` makes it raise (after the sleep), ``exit`` kills the worker process."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.version = 0
        self.weights: Any = None

    def load_weights(self, weights: Any, version: int) -> None:
        self.weights, self.version = weights, version

    def sample(self, request: dict) -> dict:
        time.sleep(float(request.get("sleep_s", 0.0)))
        if request.get("wait_for"):
            deadline = time.monotonic() + float(request.get("wait_timeout_s", 60.0))
            while not os.path.exists(request["wait_for"]) and time.monotonic() < deadline:
                time.sleep(0.02)
        if request.get("fail"):
            raise RuntimeError(f"echo asked to fail: {request['fail']}")
        if request.get("exit"):  # a request that kills its worker process (a segfault, the OOM killer)
            os._exit(1)
        return {"request": request, "pid": os.getpid(), "weights_version": self.version,
                "weights": self.weights if request.get("echo_weights") else None,
                "num_samples": int(request.get("num_samples", 1))}
