"""The device itself: what it is (and which versions the image holds), and matmul speed with a checked product."""
from __future__ import annotations

import platform
import time
from typing import Any

import torch

from benchmarks.gpu.rows import Row, run_row

# relative error of a (n x n) @ (n x n) product of normal entries against fp64, by precision
MATMUL_TOLERANCE = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 3e-2}


def versions() -> dict[str, str]:
    import numpy
    import tokenizers
    import transformers
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "numpy": numpy.__version__}


def describe(device: str) -> dict[str, Any]:
    """The device (name, memory, capability, what ``bf16: auto`` picks there) and the image's versions."""
    from algos.precision import use_bf16
    info: dict[str, Any] = {"device": device, **versions()}
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"no CUDA device (torch {torch.__version__}, built for CUDA {torch.version.cuda})")
        props = torch.cuda.get_device_properties(torch.device(device))
        info.update(name=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count)
    info["bf16_auto"] = use_bf16("auto", device)
    return info


def device_info(device: str, into: dict) -> Row:
    """The device and versions (kept in ``into`` for the report); fails without the device or when a tensor made
    there does not compute."""
    def check():
        into.update(describe(device))
        probe = torch.arange(4.0, device=device) * 2
        works = probe.device.type == torch.device(device).type and probe.sum().item() == 12.0
        return works, ", ".join(f"{k} {v}" for k, v in into.items())
    return run_row("device info", check)


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


def matmul(device: str, n: int = 4096, repeats: int = 20, into: dict | None = None) -> Row:
    """TFLOP/s of (n x n) products in fp32, tf32 and bf16; each product's first rows are checked against fp64."""
    def check():
        figures, errors = {}, {}
        previous = torch.backends.cuda.matmul.allow_tf32
        try:
            for name, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                                      ("bf16", torch.bfloat16, False)):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                g = torch.Generator().manual_seed(0)
                a64, b64 = torch.randn(n, n, generator=g, dtype=torch.float64), torch.randn(n, n, generator=g,
                                                                                          dtype=torch.float64)
                a, b = a64.to(device, dtype), b64.to(device, dtype)
                out = _product(a, b)
                _sync(device)
                start = time.perf_counter()
                for _ in range(repeats):
                    _product(a, b)
                _sync(device)
                figures[name] = 2 * n ** 3 * repeats / (time.perf_counter() - start) / 1e12
                want = a.double().cpu()[:64] @ b.double().cpu()
                errors[name] = float((out[:64].double().cpu() - want).abs().max() / want.abs().max())
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
        if into is not None:
            into.update({f"{k}_tflops": round(v, 1) for k, v in figures.items()})
        ok = all(errors[k] < MATMUL_TOLERANCE[k] for k in errors)
        return ok, f"{n}^3 on {device}: " + ", ".join(
            f"{k} {figures[k]:.1f} TFLOP/s (rel. error {errors[k]:.0e} < {MATMUL_TOLERANCE[k]:g})" for k in figures)
    return run_row("matmul", check)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
