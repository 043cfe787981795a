"""What the pool-throughput measurements share: the task, one measurement and one table row, and the CPU clock over a
process tree (user + system seconds of every process involved, from /proc)."""
from __future__ import annotations

import logging
import os
import platform
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TASK_ID, TASK = "Humanoid-v5", "humanoid"
SECTION = "## Pool throughput: Humanoid-v5 env steps/s (`python -m benchmarks.pool_throughput`)"
RESULTS_HEADER = "# Benchmarks\n\nBenchmarks — each section gives the command, the machine, the table.\n"
log = logging.getLogger("benchmarks.pool_throughput")


@dataclass
class Measurement:
    """One timed run: env steps per wall-clock second, per CPU-second of every process involved, and the mean
    episode length it saw (a check that all rows simulate the same kind of states)."""

    steps_per_s: float
    steps_per_cpu_s: float
    episode_length: float
    worker_steps_per_cpu_s: float = float("nan")  # pool rows: per CPU-second of the worker processes alone
    manager_ms_per_request: float = float("nan")  # pool rows: the manager's CPU per request
    rest_ms_per_request: float = float("nan")  # pool rows: driver + Ray's own processes, CPU per request
    requests_per_call: float = float("nan")  # pool rows: the manager's batches (pool.batch_target_s)
    result_mb_per_request: float = float("nan")  # pool rows: pickled size of one result


@dataclass
class Row:
    key: str
    label: str
    cores: int
    request: str = "-"
    runs: list[Measurement] = field(default_factory=list)

    def median_of(self, name: str) -> float:
        """The median over repeats of one Measurement field."""
        return statistics.median(getattr(m, name) for m in self.runs)

    @property
    def median(self) -> float:
        return self.median_of("steps_per_s")

    @property
    def per_core(self) -> float:
        return self.median / self.cores

    @property
    def per_cpu_s(self) -> float:
        return self.median_of("steps_per_cpu_s")


# -- CPU accounting ------------------------------------------------------------------------------------------------
def _cpu_seconds_of_tree(root: int) -> dict[int, float]:
    """User + system CPU seconds of ``root`` and all its descendants (Ray's processes and workers, env processes)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid ... utime(11) stime(12)
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    tree, frontier = {root}, [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in tree:
                tree.add(child)
                frontier.append(child)
    return {pid: cpu[pid] for pid in tree if pid in cpu}


class CpuClock:
    """CPU seconds this process and its descendants spend between construction and ``seconds()``.

    Wall-clock rates on a shared machine measure how much of a core the other jobs left us; CPU seconds measure
    what the work itself costs. (Resolution 1/SC_CLK_TCK per process; processes that exit meanwhile are missed.)
    """

    def __init__(self) -> None:
        self.start = _cpu_seconds_of_tree(os.getpid())

    def seconds(self) -> float:
        end = _cpu_seconds_of_tree(os.getpid())
        return sum(t - self.start.get(pid, 0.0) for pid, t in end.items())


def _cpu_seconds_of(pids: list[int]) -> float:
    return sum(sum(_cpu_seconds_of_tree(pid).values()) for pid in pids)


def frame_skip() -> int:
    import gymnasium as gym
    return int(gym.make(TASK_ID).unwrapped.frame_skip)


# -- the run -------------------------------------------------------------------------------------------------------
def machine() -> dict[str, str]:
    import gymnasium
    import mujoco
    import ray
    model = platform.processor() or "?"
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": f"{model}, {os.cpu_count()} cores", "python": platform.python_version(),
            "versions": f"mujoco {mujoco.__version__}, gymnasium {gymnasium.__version__}, ray {ray.__version__}, "
                        f"numpy {np.__version__}"}
