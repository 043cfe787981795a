"""Real process groups of separate processes: what two learners sharing one GPU use (gloo over tensors on the device,
2 ranks), and NCCL as far as one GPU can show it.

NCCL refuses two ranks on one GPU, so on one GPU the ``cpu:gloo,cuda:nccl`` row (scale=paper's backend) checks NCCL's
start-up and a one-rank all_reduce only: no traffic between ranks or GPUs, which needs two GPUs.
"""
from __future__ import annotations

import functools
import multiprocessing as mp
import os
import queue as queue_module
import socket
import time

import torch

from benchmarks.gpu.rows import NotRun, Row, run_row


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collective_worker(rank: int, world: int, backend: str, device: str, port: int, queue) -> None:
    """One rank: join the group, all-reduce ``rank + 1`` on the device (and on the CPU where the backend is mixed),
    gather every rank's process id; put (rank, device sum, cpu sum, pids, error) on ``queue``."""
    import torch.distributed as dist
    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        on_device = torch.full((4,), float(rank + 1), device=device)
        dist.all_reduce(on_device)
        cpu_sum = None
        if "cpu:" in backend:
            on_cpu = torch.full((4,), float(rank + 1))
            dist.all_reduce(on_cpu)
            cpu_sum = float(on_cpu[0])
        pids: list = [None] * dist.get_world_size()
        dist.all_gather_object(pids, os.getpid())
        queue.put((rank, float(on_device[0]), cpu_sum, pids, None))
        dist.destroy_process_group()
    except Exception as err:  # noqa: BLE001 - reported by the parent
        queue.put((rank, None, None, [], f"{type(err).__name__}: {err}"[:300]))


def run_group(backend: str, device: str, world: int, start_method: str = "spawn",
              timeout_s: float = 60.0) -> list[tuple]:
    """``world`` processes in one process group; each rank's report, by rank."""
    ctx = mp.get_context(start_method)  # spawn: a parent that already used CUDA cannot fork CUDA children
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_collective_worker, args=(r, world, backend, device, port, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    reports: list[tuple] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(reports) < world and time.monotonic() < deadline:
            try:
                reports.append(queue.get(timeout=1.0))
            except queue_module.Empty:
                # a rank that died before reporting (killed, failed import) leaves the others waiting: stop here
                dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    reports.append((dead[0][0], None, None, [], f"rank {dead[0][0]} exited with {dead[0][1]}"))
                    break
    finally:
        complete = len(reports) == world and not any(r[4] for r in reports)
        for p in procs:
            p.join(timeout=30 if complete else 1)  # a rank whose peer failed waits in a collective forever
            if p.is_alive():
                p.kill()
                p.join()
    return sorted(reports, key=lambda r: r[0])  # by rank alone: a failed rank's Nones do not order against floats


def group_problem(reports: list[tuple], world: int, mixed: bool) -> str | None:
    """None if every rank of ``world`` separate processes saw the sum over all ranks, else what is wrong."""
    want = world * (world + 1) / 2
    errors = [r[4] for r in reports if r[4]]
    if errors:
        return errors[0]
    if len(reports) != world:
        return f"{len(reports)} of {world} ranks reported"
    wrong = [(r[0], r[1]) for r in reports if r[1] != want]
    if wrong:
        return f"device all_reduce gave {wrong} (rank, sum), want {want:g} on every rank"
    if mixed and any(r[2] != want for r in reports):
        return f"cpu all_reduce gave {[r[2] for r in reports]}, want {want:g}"
    pids = {p for r in reports for p in r[3]}
    if len(pids) != world or any(len(r[3]) != world for r in reports):
        return f"the group held {len(pids)} distinct processes, want {world}"
    return None


def collective_row(name: str, backend: str, device: str, world: int, start_method: str = "spawn",
                   scope: str = "") -> Row:
    """``world`` separate processes in one ``backend`` group; every rank must see the sum over all ranks."""
    def check():
        reports = run_group(backend, device, world, start_method)
        problem = group_problem(reports, world, mixed="cpu:" in backend)
        sums = sorted({r[1] for r in reports if r[1] is not None})
        return problem is None, problem or (f"{world} processes, all_reduce on {device}: sum {sums} on every rank "
                                            f"(want {world * (world + 1) / 2:g}), {world} distinct pids{scope}")
    return run_row(name, check)


def nccl(device: str, start_method: str = "spawn") -> Row:
    """``cpu:gloo,cuda:nccl`` (scale=paper's backend) as far as one GPU shows it; not run without CUDA."""
    name = "collectives cpu:gloo,cuda:nccl x1 (start-up + one-rank all_reduce)"
    if not device.startswith("cuda"):
        return run_row(name, functools.partial(_not_run, "NCCL needs a CUDA device: a CPU rehearsal cannot start it"))
    return collective_row(name, "cpu:gloo,cuda:nccl", device, 1, start_method,
                          "; one GPU: NCCL start-up and a one-rank all_reduce only, no traffic between ranks (NCCL "
                          "refuses two ranks on one GPU)")


def collectives(device: str, world: int = 2, start_method: str = "spawn") -> list[Row]:
    """gloo with ``world`` ranks over tensors on the device; then NCCL as one GPU allows."""
    return [collective_row(f"collectives gloo x{world}", "gloo", device, world, start_method),
            nccl(device, start_method)]


def _not_run(reason: str):
    raise NotRun(reason)
