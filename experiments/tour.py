"""The main job: every method at once, as separate drivers on one cluster sharing one named pool, then a report.

    python -m experiments.run                      # = experiment=tour scale=smoke cluster=local

The tour starts (or joins) the cluster, creates the shared pool, and launches one driver process per method, each
``python -m experiments.run experiment=... cluster=remote`` joined to this cluster and attached to the same pool.
The tour names no method: every method package that declares ``TOUR = "experiments.<m>.tour:TOUR"`` (a
:class:`TourPart`: its stages with their laptop budgets, its report section, its paper-scale command) takes part,
in the order ``experiments.registry.method_packages()`` finds them. A method's stages run one after the other (a
later stage may read an earlier one's run directory through ``<run_dir:stage>``); methods run concurrently.

    experiment.methods=[<method>,<method>]                   # some methods only (default: every declared one)
    '+experiment.overrides.<stage>=["<key>=<value>"]'        # extra overrides of one stage (the + adds the key)
    experiment.tiny=true                                     # every stage's declared test budget

A stage's overrides are its declared ones, then its ``tiny`` ones (with ``experiment.tiny=true``), then those in
``experiment.overrides.<stage>``; a later override of the same key replaces an earlier one.

A method that fails does not stop the others; the report says what failed and where its log is. The report folder
holds report.md, the PNG plots and the per-method run directories (metrics Parquet, configs, checkpoints).
"""
from __future__ import annotations

import functools
import importlib
import logging
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
RUN_DIR = re.compile(r"<run_dir:([\w.-]+)>")  # in a stage's overrides: the run directory of an earlier stage


@dataclass(frozen=True)
class TourStage:
    """One driver run of a method in the tour."""
    experiment: str
    overrides: tuple[str, ...] = ()   # the laptop budget (the tour's 20-minute limit is for all methods together)
    tiny: tuple[str, ...] = ()        # the test budget (experiment.tiny=true): seconds to a minute or two
    name: str = ""                    # stage name (run directory, log, experiment.overrides key); default experiment

    @property
    def stage_name(self) -> str:
        return self.name or self.experiment


@dataclass(frozen=True)
class TourPart:
    """What a method package declares for the tour (``TOUR`` in its ``__init__.py`` names it as module:attribute)."""
    title: str                        # the report section's heading
    stages: tuple[TourStage, ...]
    section: str                      # "module:function", called as fn(stages, out_dir) -> (lines, claims, plots)
    paper_scale: str                  # the command that reruns this part at paper scale
    check: str = ""                   # "module:function", fn(tour_run_dir, report_md, report_json): the tests' check


def _load_attr(path: str) -> Any:
    module, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"expected 'package.module:attribute', got {path!r}")
    return getattr(importlib.import_module(module), attr)


@functools.cache
def tour_parts() -> dict[str, TourPart]:
    """Method name (its package's last name) -> the TourPart it declares; methods without ``TOUR`` stay out."""
    from experiments.registry import method_packages
    parts = {}
    for package in method_packages():
        declared = getattr(importlib.import_module(package), "TOUR", None)
        if declared:
            part = _load_attr(declared) if isinstance(declared, str) else declared
            if not isinstance(part, TourPart):
                raise TypeError(f"{package}.TOUR must name a TourPart, got {type(part).__name__}")
            parts[package.rsplit(".", 1)[-1]] = part
    return parts


def section_fn(part: TourPart) -> Callable:
    return _load_attr(part.section)


def _override_key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def merge_overrides(*layers: list[str] | tuple[str, ...]) -> list[str]:
    """Overrides in order; a later one for the same key replaces the earlier one in place (hydra refuses two)."""
    merged: dict[str, str] = {}
    for layer in layers:
        for o in layer:
            merged[_override_key(o)] = o
    return list(merged.values())


@dataclass
class Config:
    methods: list[str] = field(default_factory=list)  # default: every method package that declares TOUR
    report_dir: str | None = None  # default: <run dir>/report
    overrides: dict[str, list[str]] = field(default_factory=dict)  # stage name -> extra hydra overrides
    tiny: bool = False  # every stage's declared test budget (the tour test)
    train_cpus_per_worker: float = 0.25  # every method's learners + the pool must fit two cores
    timeout_s: float = 3600.0
    status_every_s: float = 20.0

    def __post_init__(self) -> None:
        parts = tour_parts()
        unknown = sorted(set(self.methods) - set(parts))
        if unknown:
            raise ValueError(f"experiment.methods: choose from {', '.join(parts)} (got {self.methods})")
        chosen = self.methods or list(parts)
        stages = {st.stage_name for m in chosen for st in parts[m].stages}
        if sorted(set(self.overrides) - stages):
            raise ValueError(f"experiment.overrides: unknown stage(s) {sorted(set(self.overrides) - stages)} "
                             f"(stages of the chosen methods: {', '.join(sorted(stages))})")
        if self.timeout_s <= 0:
            raise ValueError(f"experiment.timeout_s: must be > 0, got {self.timeout_s}")

    def method_list(self) -> list[str]:
        return self.methods or list(tour_parts())


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
    parts = tour_parts()
    stages: dict[str, list[Stage]] = {}
    for method in exp.method_list():
        made: dict[str, Stage] = {}
        for st in parts[method].stages:
            name = st.stage_name
            overrides = merge_overrides(st.overrides, st.tiny if exp.tiny else (), exp.overrides.get(name, []))

            def run_dir_of(match: re.Match) -> str:
                if match.group(1) not in made:
                    raise ValueError(f"tour stage {name}: <run_dir:{match.group(1)}> names no earlier stage of "
                                     f"{method}")
                return str(made[match.group(1)].run_dir)

            made[name] = Stage(method, st.experiment, [RUN_DIR.sub(run_dir_of, o) for o in overrides],
                               runs / st.experiment / name, logs / f"{name}.log")
        stages[method] = list(made.values())
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
    while alive := [t for t in threads.values() if t.is_alive()]:
        alive[0].join(timeout=min(exp.status_every_s, 2.0))  # returns as soon as that method's chain ends
        _print_status(stages, start, exp)
    _print_status(stages, start, exp, force=True)
    pool_stats = pool.stats()
    from experiments.tour_report import write_report
    report_dir = Path(exp.report_dir) if exp.report_dir else ctx.run_dir.path / "report"
    summary = write_report(report_dir, stages, pool_stats, cfg, time.perf_counter() - start,
                           {method: section_fn(part) for method, part in tour_parts().items()},
                           {method: part.paper_scale for method, part in tour_parts().items()})
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
