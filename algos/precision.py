"""bf16 or fp32: a property of the hardware, decided once per process.

bf16 autocast pays where the hardware multiplies bf16 natively: CUDA GPUs of compute capability >= 8.0 (Ampere and
later; V100/T4 emulate it), CPUs with AMX (~7x fp32 matmul) or AVX512-BF16 (~2x). Elsewhere it is a disaster: an
AVX2-only CPU runs a 1024x256 @ 256x256 bf16 matmul at ~1 GFLOP/s against ~84 in fp32. So configs say ``bf16: auto`` and the code asks :func:`use_bf16`.
An explicit ``true``/``false`` still wins.
"""
from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

NATIVE_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags (Linux), or None where /proc/cpuinfo is not readable. ``ORRERY_CPU_FLAGS`` (a
    space-separated list) stands in for them: to take the fp32 path on a bf16 CPU (``ORRERY_CPU_FLAGS=avx2``, with
    ``ATEN_CPU_CAPABILITY=avx2`` for torch's kernels, runs an AVX2-only machine's path on another CPU), or where a
    virtual machine hides its flags."""
    if (given := os.environ.get("ORRERY_CPU_FLAGS")) is not None:
        return set(given.split())
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def _timed_matmul(dtype: torch.dtype, repeats: int = 5) -> float:
    a = torch.randn(256, 256).to(dtype)
    b = torch.randn(256, 256).to(dtype)
    a @ b  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return time.perf_counter() - start


def cpu_bf16_native(flags: set[str] | None = None) -> bool:
    """True if this CPU multiplies bf16 natively: by its flags where known, else by a short timed probe (bf16 at least
    0.8x as fast as fp32 on a 256x256 matmul)."""
    flags = cpu_flags() if flags is None else flags
    if flags is not None:
        return any(f in flags for f in NATIVE_CPU_FLAGS)
    return _timed_matmul(torch.float32) / max(_timed_matmul(torch.bfloat16), 1e-9) >= 0.8


def cuda_bf16_native(capability: tuple[int, int]) -> bool:
    """True for GPUs whose tensor cores multiply bf16 (compute capability 8.0 and later: Ampere, Hopper, ...).
    ``torch.cuda.is_bf16_supported()`` also says yes on V100/T4 (7.x), where bf16 is emulated and slower than fp32."""
    return tuple(capability) >= (8, 0)


@functools.cache
def bf16_native(device_type: str) -> bool:
    """Probed once per process and device type ("cuda" or "cpu"); the choice is logged."""
    if device_type == "cuda":
        capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
        native = torch.cuda.is_available() and cuda_bf16_native(capability)
        why = (f"{torch.cuda.get_device_name()}, compute capability {capability[0]}.{capability[1]}"
               if torch.cuda.is_available() else "no CUDA device")
    else:
        native = cpu_bf16_native()
        flags = cpu_flags()
        why = ("CPU flags: " + ", ".join(f for f in NATIVE_CPU_FLAGS if f in flags) if flags and native else
               "CPU without AMX/AVX512-BF16" if flags is not None else "timed probe")
    log.info("precision on %s: %s (%s)", device_type, "bf16" if native else "fp32", why)
    return native


def use_bf16(setting: bool | str | None, device: torch.device | str = "cpu") -> bool:
    """Resolve a ``bf16`` setting: ``True``/``False`` as given, ``"auto"``/``None`` by the hardware of ``device``."""
    if isinstance(setting, bool):
        return setting
    if setting in (None, "auto"):
        return bf16_native(torch.device(device).type)
    raise ValueError(f"bf16 must be true, false or auto, got {setting!r}")
