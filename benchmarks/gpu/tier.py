"""Every row of the device tier in order, each written out as it ends, and the command line.

    python -m benchmarks.gpu --device cuda --out DIR     # DIR/first_gpu_run.md (the table) and DIR/rows.json

The table is rewritten after every row, so a run cut short still leaves the rows it finished. Exit status: 0 when
every row is ok (on a CPU rehearsal the NCCL row may say "not run": NCCL needs CUDA), 1 otherwise, 2 when
``--device cuda`` finds no CUDA device (nothing else checked).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.gpu.rows import NOT_RUN, OK, NotRun, Row, run_row, table

CUDA_ONLY = "needs a CUDA device"


def _sizes(device: str) -> dict:
    """The GPU's sizes, and a CPU rehearsal's: the same code at sizes a 2-core machine runs in about a minute."""
    if device.startswith("cuda"):
        return {"matmul": {"n": 4096, "repeats": 20}, "logprob": {}, "vidd": {"steps": 300}}
    return {"matmul": {"n": 256, "repeats": 2},
            "logprob": {"sequences": 4, "response": 128, "prompt": 12, "chunk_rows": 64},
            "vidd": {"steps": 30, "vocab": 16, "length": 16, "samples": 32, "d_model": 32, "bf16": False}}


def run(device: str, workdir: Path, out: Path | None = None) -> tuple[list[Row], dict]:
    """Every row, in order; each printed, and the table in ``out`` rewritten, as it ends."""
    from benchmarks.gpu import attnrl, collectives, device as device_rows, physics, vidd
    info: dict = {}
    rows: list[Row] = []
    sizes = _sizes(device)
    start = time.perf_counter()

    def emit(*new: Row) -> None:
        for r in new:
            print(r, flush=True)
        rows.extend(new)
        if out is not None:
            write(out, device, info, rows, time.perf_counter() - start)
    emit(device_rows.device_info(device, info))
    emit(device_rows.matmul(device, into=info, **sizes["matmul"]))
    emit(*collectives.collectives(device))
    setup: list = []
    emit(run_row("attnrl local Qwen2 (bf16-saved)", lambda: _build(setup, workdir, device)))
    if setup:
        emit(attnrl.attnrl_generate(setup[0], device))
        emit(*attnrl.attnrl_update(setup[0], device, workdir))
        emit(attnrl.logprob_call(setup[0], device, **sizes["logprob"]))
    else:
        for name in ("attnrl FCI generation", "attnrl update, learner state, resume", "attnrl log-prob call"):
            emit(run_row(name, lambda: _raise(NotRun("the local Qwen2 could not be built (row above)"))))
    emit(vidd.vidd_stage0_and_sampler(device, **sizes["vidd"]))
    emit(physics.physics_prior(device))
    return rows, info


def _build(setup: list, workdir: Path, device: str) -> tuple[bool, str]:
    from benchmarks.gpu.hf_model import hf_setup
    setup.append(hf_setup(workdir, device))
    s = setup[0]
    return True, f"vocab {s.vocab} (embedding {s.embedding}), hidden {s.hidden}, saved in bf16 at {s.path.name}"


def _raise(err: Exception):
    raise err


def passed(rows: list[Row], device: str) -> bool:
    """Every row ok; on a CPU rehearsal a row may say "not run" only because it needs CUDA."""
    cpu = not device.startswith("cuda")
    return all(r.status == OK or (cpu and r.status == NOT_RUN and CUDA_ONLY in r.line) for r in rows)


def write(out: Path, device: str, info: dict, rows: list[Row], wall_s: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    head = [f"# Device tier on {device} ({len(rows)} rows, {wall_s:.0f} s)", "",
            f"Command: `python -m benchmarks.gpu {' '.join(sys.argv[1:])}`", "", f"Device: {json.dumps(info)}", ""]
    (out / "first_gpu_run.md").write_text("\n".join(head) + table(rows))
    (out / "rows.json").write_text(json.dumps({"device": device, "info": info, "wall_s": round(wall_s, 1),
                                               "rows": [vars(r) for r in rows]}, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda on the lent machine; cpu rehearses the rows")
    p.add_argument("--out", type=Path, required=True, help="folder for first_gpu_run.md and rows.json")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"[gpu] no CUDA device (torch {torch.__version__}): nothing checked", flush=True)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="orrery-gpu-"))
    start = time.perf_counter()
    try:
        rows, info = run(args.device, workdir, args.out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - start
    write(args.out, args.device, info, rows, wall)
    print(table(rows), flush=True)
    ok = passed(rows, args.device)
    bad = [r.name for r in rows if r.status != OK]
    print(f"[gpu] {'PASSED' if ok else 'FAILED'} in {wall:.0f} s: {sum(r.ok for r in rows)} of {len(rows)} rows ok"
          + (f"; not ok: {', '.join(bad)}" if bad else ""), flush=True)
    return 0 if ok else 1
