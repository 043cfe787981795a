"""What the three parts of the SAC benchmark share: the repository root, the child processes' environment, the
machine note and the small formatting helpers."""
from __future__ import annotations

import logging
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# Child processes: no token file in ~/.ray (ray.md P1), no usage stats (P8), one thread per process (P4).
CHILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled",
             "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
log = logging.getLogger("benchmarks.sac")


def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def machine_note() -> str:
    import gymnasium
    import mujoco
    import torch
    cpu = "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} cores; python {platform.python_version()}, torch {torch.__version__}, "
            f"gymnasium {gymnasium.__version__}, mujoco {mujoco.__version__}")


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) spent in ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def fmt(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:,.{digits}f}"


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or not den or not all(map(math.isfinite, (num, den))):
        return None
    return num / den


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


BATCH, HIDDEN, FILL = 1024, (256, 256), 50_000
