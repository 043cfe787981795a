"""The GPU check: on a machine with one NVIDIA GPU (and ~16 cores), run what only a GPU can show.

    OMP_NUM_THREADS=1 python -m benchmarks.gpu_check [--tier all] [--minutes 16] [--record benchmarks/RESULTS.md]
    python -m benchmarks.gpu_check --tier device [--device cpu]   # the device tier alone (benchmarks/gpu)

Tier ``device`` is ``benchmarks/gpu`` (torch, transformers, tokenizers and numpy only; a lent GPU machine runs it
alone with ``benchmarks/first_gpu_run.sh``): device info and matmul, real multi-process collectives, AttnRL
generation with FCI, one PPO update at lr 1e-6, the learner's state saved on the GPU and resumed on the CPU, the
learner's log-prob call's peak memory, VIDD's stage 0 and sampler, LIFT's physics prior against MuJoCo's terms.

Tier ``ray`` (needs orrery's whole environment: Ray, MuJoCo, rdkit): runs at ``scale=paper`` on a Ray head started
here with the GPU, each driver under ``CUDA_VISIBLE_DEVICES=""`` (a head without a GPU), mostly with every learner as
two Ray Train workers sharing the GPU (0.4 GPU each, gloo on CUDA tensors: NCCL refuses two ranks on one GPU):
  lift_pretrain -> one learner on ``cpu:gloo,cuda:nccl`` (the backend scale=paper uses; the learner logs the group
  it got) -> the two-learner run resumed from its GPU checkpoint -> resumed again with the learners on the CPU
  (GPU -> CPU through the same code path) -> lift_finetune (asserts the learners said they compute on the GPU) ->
  vidd_molecule (stage 0 reports from inside its Ray task that it ran on the GPU) -> attnrl on the bf16 Qwen2.
  Every row asserts exit 0, the DDP replicas identical (``param_max_abs_diff`` 0; AttnRL fails by itself when its
  ranks' digests differ), the precision ``bf16: auto`` chose on the learners' GPU, and what it is there to show.
Each row prints one line; the exit status is 1 if any row failed (or, on a GPU, did not run), 2 without CUDA for
``--device cuda`` (nothing checked). ``tests/test_gpu_check.py`` puts known bugs back and sees rows fail;
``tests/test_readme_commands.py`` validates the configs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private head: no ~/.ray/auth_token left behind
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu.hf_model import HF_VOCAB, build_hf_model  # noqa: E402,F401 - the Ray tier's AttnRL model

SECTION = "## GPU check (`benchmarks/gpu_check.py`)"

# scale=paper placed on one GPU and 16 CPUs: 2 learners x (0.4 GPU, 2 CPUs) + 2 model samplers x 0.1 GPU
POOL = ["pool.num_workers=4", "pool.num_cpus=1", "pool.groups.gpu.num_workers=2", "pool.groups.gpu.num_cpus=1",
        "pool.groups.gpu.num_gpus=0.1"]
ONE_GPU = ["scale=paper", "train.num_workers=2", "train.gpus_per_worker=0.4", "train.cpus_per_worker=2",
           "train.backend=gloo", *POOL]
# one learner on the GPU with scale=paper's own backend, cpu:gloo,cuda:nccl (world size 1: all one GPU allows NCCL)
ONE_GPU_NCCL = ["scale=paper", "train.num_workers=1", "train.gpus_per_worker=0.8", "train.cpus_per_worker=2", *POOL]
# the same two learners on the CPU (the resume onto another device)
TWO_CPU_LEARNERS = ["scale=paper", "train.num_workers=2", "train.use_gpu=false", "train.cpus_per_worker=2",
                    "train.backend=gloo", *POOL]
PRETRAIN = ["experiment=lift_pretrain", "env=humanoid_state", "experiment.num_shards=2",
            "experiment.eval_every_steps=40000", "experiment.eval_episodes=4",
            "experiment.checkpoint_every_updates=180"]


@dataclass
class Step:
    """One run of ``experiments.run``: its overrides, time cap and what must hold afterwards."""

    name: str
    experiment: str
    overrides: list[str]
    timeout_s: float
    run_name: str
    checks: list[str] = field(default_factory=list)  # extra check names (CHECKS)
    needs_hf: bool = False
    placement: list[str] = field(default_factory=lambda: list(ONE_GPU))
    precision: bool = True  # the learners choose bf16/fp32 by ``bf16: auto`` (LIFT finetuning runs fp32 by design)
    replicas_in_metrics: bool = True  # AttnRL compares its ranks' parameter digests itself and fails if they differ


def steps(runs: Path, hf_dir: Path | None) -> list[Step]:
    pretrain_run = runs / "lift_pretrain" / "lift"
    hf = [f"experiment.hf_model={hf_dir}"] if hf_dir is not None else []
    return [
        Step("lift_pretrain", "lift_pretrain", [*PRETRAIN, "experiment.total_env_steps=60000"], 170, "lift"),
        Step("lift_pretrain cuda:nccl (1 learner)", "lift_pretrain",
             [*PRETRAIN, "experiment.total_env_steps=20000"], 110, "nccl",
             ["nccl_backend", "learner_on_gpu"], placement=list(ONE_GPU_NCCL)),
        Step("lift_pretrain resume", "lift_pretrain", [*PRETRAIN, "experiment.total_env_steps=80000", "resume=true"],
             110, "lift", ["resumed"]),
        Step("lift_pretrain resume GPU -> CPU", "lift_pretrain",
             [*PRETRAIN, "experiment.total_env_steps=90000", "resume=true"], 110, "lift", ["resumed", "learner_on_cpu"],
             precision=False, placement=list(TWO_CPU_LEARNERS)),
        Step("lift_finetune", "lift_finetune",
             ["experiment=lift_finetune", "env=humanoid_state", f"experiment.pretrain_run={pretrain_run}",
              "experiment.method=lift", "experiment.epochs=2", "experiment.real_steps_per_epoch=400",
              "experiment.prefill_steps=400", "experiment.hupt_schedule=[0,1,2,4]",
              "experiment.horizon_schedule=[0,1,1,3]",
              "experiment.wm_hidden=[200,200]", "experiment.wm_pretrain_steps=300", "experiment.wm_pretrain_rows=20000",
              "experiment.wm_retrain_steps=100", "experiment.wm_eval_every=50", "experiment.eval_episodes=2"],
             170, "finetune", ["learner_on_gpu"], precision=False),
        Step("vidd_molecule", "vidd_molecule",
             ["experiment=vidd_molecule", "experiment.method=vidd", "experiment.pretrain_steps=300",
              "experiment.query_budget=4096", "experiment.refresh_interval=1", "experiment.eval_samples=128",
              "experiment.best_of_n_outputs=128"], 130, "vidd", ["stage0_on_gpu"]),
        Step("attnrl (HF, 150k vocab)", "attnrl",
             ["experiment=attnrl", "experiment.methods=[attnrl]", *hf, "experiment.sft.max_steps=10",
              "experiment.rl.token_budget=451200", "experiment.rl.max_updates=4", "experiment.eval_every_updates=2",
              "experiment.eval_problems_per_difficulty=4", "experiment.sft.eval_problems_per_difficulty=4"],
             130, "attnrl", ["stage0_on_gpu"], needs_hf=True, replicas_in_metrics=False),
    ]


# ---------------------------------------------------------------------------------------------------- the runs

def replicas_identical(run_dir: Path) -> str | None:
    """None if the run's metrics report ``param_max_abs_diff`` and it is 0 everywhere, else what is wrong."""
    from cluster.metrics import read_metrics
    try:
        df = read_metrics(run_dir)
    except Exception as err:  # noqa: BLE001
        return f"no metrics ({err!r})"[:200]
    if "param_max_abs_diff" not in df or df["param_max_abs_diff"].dropna().empty:
        return "param_max_abs_diff not reported"
    worst = float(df["param_max_abs_diff"].dropna().abs().max())
    return None if worst == 0.0 else f"DDP replicas differ by {worst:g}"


def precision_as_expected(log: str, expect_bf16: bool) -> str | None:
    """None if the learners logged the precision ``bf16: auto`` should choose on this GPU, else what is wrong."""
    lines = [ln for ln in log.splitlines() if "precision on cuda:" in ln]
    if not lines:
        return "no 'precision on cuda' line: the learners did not compute on the GPU (or did not say)"
    want = "bf16" if expect_bf16 else "fp32"
    wrong = [ln for ln in lines if f"precision on cuda: {want}" not in ln]
    return None if not wrong else f"expected {want}: {wrong[0][-160:]}"


def resumed(run_dir: Path, log: str) -> str | None:
    from cluster.metrics import read_metrics
    df = read_metrics(run_dir)
    if "resumed_from" not in df or not (df["resumed_from"] > 0).any():
        return "the rerun did not resume from its checkpoint (resumed_from never > 0)"
    return None


def stage0_on_gpu(run_dir: Path, log: str) -> str | None:
    """Stage 0 ran as a Ray task and the task itself found a GPU to compute on (``cluster.train.stage0``): a task
    that asked for a GPU but computed on the CPU (CUDA unusable there) fails."""
    lines = [ln for ln in log.splitlines() if "stage 0 (" in ln and "ran on" in ln]
    if not lines:
        return "stage 0 did not run as a Ray task (no 'stage 0 (...) ran on' line)"
    return None if all("ran on cuda" in ln for ln in lines) else f"stage 0 computed off the GPU: {lines[0][-120:]}"


def _learners_on(log: str, device_type: str) -> str | None:
    lines = [ln for ln in log.splitlines() if "learner rank" in ln and "computes on" in ln]
    if not lines:
        return "the learners did not say where they compute (no 'learner rank N computes on' line)"
    wrong = [ln for ln in lines if f"computes on {device_type}" not in ln]
    return None if not wrong else f"a learner computes off {device_type}: {wrong[0][-120:]}"


def learner_on_gpu(run_dir: Path, log: str) -> str | None:
    return _learners_on(log, "cuda")


def learner_on_cpu(run_dir: Path, log: str) -> str | None:
    return _learners_on(log, "cpu")


def nccl_backend(run_dir: Path, log: str) -> str | None:
    """The learner's process group is ``cpu:gloo,cuda:nccl`` as the learner reports it (cluster.train)."""
    lines = [ln for ln in log.splitlines() if "process group backend" in ln]
    if not lines:
        return "the learners did not report their process group"
    return None if all("nccl" in ln for ln in lines) else f"not NCCL: {lines[0][-120:]}"


CHECKS: dict[str, Callable[[Path, str], str | None]] = {
    "resumed": resumed, "stage0_on_gpu": stage0_on_gpu, "learner_on_gpu": learner_on_gpu,
    "learner_on_cpu": learner_on_cpu, "nccl_backend": nccl_backend}


def run_step(step: Step, head, runs: Path, left_s: float, expect_bf16: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "experiments.run", *step.overrides, *step.placement, "cluster=remote",
           f"cluster.address={head.gcs_address}", f"output_dir={runs}", f"run_name={step.run_name}", "log_level=INFO"]
    env = {**head.env, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # the driver: a head without a GPU
    start = time.perf_counter()
    failures: list[str] = []
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=min(step.timeout_s, left_s))
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            failures.append(f"exit {proc.returncode}: {proc.stderr[-400:]!r}")
    except subprocess.TimeoutExpired as err:
        log = (err.stdout or b"").decode(errors="replace") + (err.stderr or b"").decode(errors="replace")
        failures.append(f"stopped at the {min(step.timeout_s, left_s):.0f} s cap")
    run_dir = runs / step.experiment / step.run_name
    if not failures:
        checks = [CHECKS[c] for c in step.checks]
        if step.replicas_in_metrics:
            checks.append(lambda d, lg: replicas_identical(d))
        if step.precision:
            checks.append(lambda d, lg: precision_as_expected(lg, expect_bf16))
        for check in checks:
            problem = check(run_dir, log)
            if problem:
                failures.append(problem)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return {"step": step.name, "ok": not failures, "status": "ok" if not failures else "; ".join(failures)[:600],
            "wall_s": round(time.perf_counter() - start, 1), "summary": _headline(summary)}


def run_all(minutes: float, workdir: Path, expect_bf16: bool) -> list[dict[str, Any]]:
    from cluster.deploy.local import LocalNode
    hf_dir = build_hf_model(workdir / "qwen2-150k")
    runs = workdir / "runs"
    head = LocalNode.head(Path(tempfile.mkdtemp(prefix="orr-gpu-", dir="/tmp")), num_cpus=os.cpu_count() or 16,
                          num_gpus=1)
    deadline = time.monotonic() + 60 * minutes
    rows = []
    try:
        for step in steps(runs, hf_dir):
            left = deadline - time.monotonic()
            if left < 30:
                rows.append({"step": step.name, "ok": False, "status": "skipped: out of time"})
                continue
            rows.append(run_step(step, head, runs, left, expect_bf16))
            print(f"[gpu_check] {rows[-1]}", flush=True)
    finally:
        head.stop()
    return rows


def _headline(summary: dict) -> str:
    keys = ("env_steps", "updates", "final_eval_return", "query_budget", "train_workers", "wall_s")
    return ", ".join(f"{k}={summary[k]}" for k in keys if summary.get(k) is not None)[:200]


def report(info: dict, device_rows: list, rows: list[dict]) -> str:
    from benchmarks.gpu.rows import table
    lines = [SECTION, "", f"Command: `python -m benchmarks.gpu_check {' '.join(sys.argv[1:])}`",
             "", f"Device: {json.dumps(info)}", ""]
    if device_rows:
        lines += [table(device_rows)]
    if rows:
        lines += ["| step (scale=paper on one GPU) | status | wall s | summary |", "|---|---|---|---|"]
        lines += [f"| {r['step']} | {r['status']} | {r.get('wall_s', '')} | {r.get('summary', '')} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tier", choices=("device", "ray", "all"), default="all",
                   help="device: no Ray needed (benchmarks/gpu); ray: the scale=paper runs; all: both")
    p.add_argument("--device", default="cuda", help="cuda; cpu rehearses the device tier (no GPU figures)")
    p.add_argument("--minutes", type=float, default=16.0, help="time budget for the Ray runs")
    p.add_argument("--record", type=Path, default=None, help="write the section into this RESULTS.md")
    args = p.parse_args(argv)
    from benchmarks.gpu import tier
    from benchmarks.gpu.device import describe
    on_cuda = args.device.startswith("cuda")
    import torch
    if on_cuda and not torch.cuda.is_available():
        print("[gpu_check] no CUDA device: nothing checked (the CPU paths are the test suite's)", flush=True)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="orrery-gpu-check-"))
    info: dict = {}
    device_rows, rows = [], []
    try:
        if args.tier in ("device", "all"):
            device_rows, info = tier.run(args.device, workdir)
        else:
            info = describe(args.device)
        if args.tier in ("ray", "all"):
            if on_cuda:
                rows = run_all(args.minutes, workdir, bool(info.get("bf16_auto")))
            else:
                print("[gpu_check] the Ray tier needs a GPU: skipped", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    section = report(info, device_rows, rows)
    print(section)
    if args.record:
        from benchmarks.results_md import replace_section
        replace_section(args.record, SECTION, section)
    device_ok = tier.passed(device_rows, args.device)
    failed = [r.name for r in device_rows if not r.ok] + [r["step"] for r in rows if not r["ok"]]
    if not device_ok or any(not r["ok"] for r in rows):
        print(f"[gpu_check] FAILED: {', '.join(failed)}", flush=True)
        return 1
    print(f"[gpu_check] all {len(device_rows) + len(rows)} rows passed"
          + (f" ({', '.join(failed)} not run: CUDA only)" if failed else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
