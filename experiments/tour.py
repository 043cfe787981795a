"""The main job: all three methods at once, as separate drivers on one cluster sharing one named pool, then a report.

    python -m experiments.run                      # = experiment=tour scale=smoke cluster=local

The tour starts (or joins) the cluster, creates the shared pool, and launches one driver process per method, each
``python -m experiments.run experiment=... cluster=remote`` joined to this cluster and attached to the same pool:

    lift   : lift_pretrain on a fast MuJoCo task -> lift_finetune (world model from the pretraining replay, then
             finetuning in a changed version of the task, against stochastic-SAC finetuning)
    vidd   : vidd_molecule in compare mode (VIDD vs best-of-N, standard fine-tuning, DDPO-style)
    attnrl : attnrl in compare mode (AttnRL vs GRPO)

A method that fails does not stop the others; the report says what failed and where its log is. The report folder
holds report.md, the PNG plots and the per-method run directories (metrics Parquet, configs, checkpoints).
"""
from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Config:
    methods: list[str] = field(default_factory=lambda: ["lift", "vidd", "attnrl"])
    report_dir: str | None = None  # default: <run dir>/report
    # Extra overrides per driver (hydra syntax); the defaults give a laptop run of about 11 minutes (limit 20).
    lift_pretrain: list[str] = field(default_factory=list)
    lift_finetune: list[str] = field(default_factory=list)
    vidd: list[str] = field(default_factory=list)
    attnrl: list[str] = field(default_factory=list)
    lift_env: str = "inverted_pendulum"
    train_cpus_per_worker: float = 0.25  # three learners + the pool must fit two cores
    timeout_s: float = 3600.0
    status_every_s: float = 20.0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.methods) - {"lift", "vidd", "attnrl"})
        if unknown or not self.methods:
            raise ValueError(f"experiment.methods: choose from lift, vidd, attnrl (got {self.methods})")
        if self.timeout_s <= 0:
            raise ValueError(f"experiment.timeout_s: must be > 0, got {self.timeout_s}")


@dataclass
class Stage:
    method: str
    experiment: str
    overrides: list[str]
    run_dir: Path
    log_path: Path
    returncode: int | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _driver_cmd(stage: Stage, cfg: dict, ctx, exp: Config) -> list[str]:
    pool = ctx.typed["pool"]
    # the drivers join the tour's cluster and pool, at the tour's scale (placement of learners and samplers)
    return [sys.executable, "-m", "experiments.run", f"experiment={stage.experiment}", "cluster=remote",
            f"scale={cfg['scale']['name']}", f"cluster.address={ctx.cluster['address']}", f"pool.name={pool.name}",
            f"pool.num_workers={pool.num_workers}", f"pool.num_cpus={pool.num_cpus}",
            f"train.cpus_per_worker={exp.train_cpus_per_worker}", f"seed={cfg['seed']}",
            f"output_dir={stage.run_dir.parent.parent}", f"run_name={stage.run_dir.name}",
            f"torch_threads={cfg['torch_threads']}", *stage.overrides]


def _run_stage(stage: Stage, cfg: dict, ctx, exp: Config, deadline: float) -> None:
    cmd = _driver_cmd(stage, cfg, ctx, exp)
    stage.log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(stage.log_path, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        try:
            stage.returncode = proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            stage.returncode = proc.wait()
            stage.error = f"timed out after {exp.timeout_s:.0f} s"
    stage.seconds = time.perf_counter() - start
    if stage.returncode != 0 and stage.error is None:
        stage.error = f"exited with code {stage.returncode}; last lines: " + " / ".join(_tail(stage.log_path, 3))


def _tail(path: Path, n: int) -> list[str]:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return []
    return lines[-n:]


_ANSI = re.compile(r"\x1b\[[0-9;]*m|\[[0-9;]*m")


# a Progress line, possibly behind Ray's "(RayTrainWorker pid=…)" prefix: "[name] 1368/8192 queries (17%) …"
_PROGRESS = re.compile(r"\[[^\]]+\] (\d+/\d+ .*(?:%|ETA).*)$")


def _last_progress(path: Path) -> str:
    for line in reversed([_ANSI.sub("", ln) for ln in _tail(path, 40)]):
        m = _PROGRESS.search(line)
        if m:
            return m.group(1)[:100]
    return "starting"


def plan(cfg: dict, ctx, exp: Config) -> dict[str, list[Stage]]:
    runs = ctx.run_dir.path / "runs"
    logs = ctx.run_dir.path / "logs"

    def stage(method: str, experiment: str, name: str, overrides: list[str]) -> Stage:
        return Stage(method, experiment, overrides, runs / experiment / name, logs / f"{name}.log")

    stages: dict[str, list[Stage]] = {}
    if "lift" in exp.methods:
        pre = stage("lift", "lift_pretrain", "lift_pretrain", [f"env={exp.lift_env}", *exp.lift_pretrain])
        fin = stage("lift", "lift_finetune", "lift_finetune",
                    [f"env={exp.lift_env}", f"experiment.pretrain_run={pre.run_dir}", *exp.lift_finetune])
        stages["lift"] = [pre, fin]
    if "vidd" in exp.methods:
        stages["vidd"] = [stage("vidd", "vidd_molecule", "vidd_molecule", exp.vidd)]
    if "attnrl" in exp.methods:
        stages["attnrl"] = [stage("attnrl", "attnrl", "attnrl", exp.attnrl)]
    return stages


def run(cfg: dict, ctx) -> dict[str, Any]:
    exp: Config = ctx.typed["experiment"]
    pool = ctx.pool  # created here, before the drivers attach to it by name
    stages = plan(cfg, ctx, exp)
    deadline = time.time() + exp.timeout_s
    print(f"[tour] cluster {ctx.cluster['address']}; dashboard {ctx.cluster.get('dashboard_url') or 'off'}; "
          f"pool '{pool.name}' ({ctx.typed['pool'].num_workers} workers); methods: {', '.join(stages)}",
          file=sys.stderr, flush=True)

    def chain(method: str) -> None:
        for st in stages[method]:
            _run_stage(st, cfg, ctx, exp, deadline)
            if not st.ok:
                break  # later stages of this method need this one

    threads = {m: threading.Thread(target=chain, args=(m,), daemon=True) for m in stages}
    start = time.perf_counter()
    for t in threads.values():
        t.start()
    while any(t.is_alive() for t in threads.values()):
        time.sleep(min(exp.status_every_s, 2.0))
        _print_status(stages, start, exp)
    _print_status(stages, start, exp, force=True)
    pool_stats = pool.stats()
    from experiments.tour_report import write_report
    report_dir = Path(exp.report_dir) if exp.report_dir else ctx.run_dir.path / "report"
    summary = write_report(report_dir, stages, pool_stats, cfg, time.perf_counter() - start)
    print(f"[tour] report: {report_dir / 'report.md'}", flush=True)
    return summary


_last_status = [0.0]


def _print_status(stages: dict[str, list[Stage]], start: float, exp: Config, force: bool = False) -> None:
    now = time.perf_counter()
    if not force and now - _last_status[0] < exp.status_every_s:
        return
    _last_status[0] = now
    parts = []
    for method, sts in stages.items():
        current = next((s for s in sts if s.returncode is None), None)
        if current is None:
            state = "done" if all(s.ok for s in sts) else f"FAILED ({next(s for s in sts if not s.ok).experiment})"
        else:
            state = f"{current.experiment}: {_last_progress(current.log_path)}"
        parts.append(f"{method} {state}")
    print(f"[tour {now - start:5.0f}s] " + " | ".join(parts), file=sys.stderr, flush=True)
