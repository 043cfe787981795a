"""The study runner: which unit runs next, running it in its own process, keeping its record, committing it.

A lane (``python -m benchmarks.study all run``) repeats: pick a runnable unit (its dependencies recorded, its start
model present, not claimed by another lane), run it in a fresh process with one thread, which writes the unit's record
atomically, then ``git commit`` the record and the study's artifacts. A killed lane loses only the unit in progress;
a long stage loses at most the time since its last checkpoint (<= 15 min).
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from benchmarks.study import STUDIES
from benchmarks.study.core import STAGE_CALL_S, Study, StudyError, Unit, UnitContext, threads_one
from benchmarks.study.records import (RESULTS, ROOT, atomic_write_bytes, cpu_info, git_commit, load_records,
                                      sha256_files, write_record)

log = logging.getLogger("benchmarks.study")
STAGE_MORE = 3           # exit code of a unit process whose stage checkpointed and has more to do
UNIT_CPU_LIMIT_S = 45 * 60  # a unit that used this much CPU is stuck (units are <= ~20 core-min): killed, logged
UNIT_WALL_LIMIT_S = 8 * 3600  # and one that has run this long on a starved lane too
MAX_ARTIFACT_BYTES = 20 * 2**20  # per file: artifacts travel in git to every later machine; keep them small
WAIT_S = 30.0


def load_study(ref: str, fresh: bool = False) -> Study:
    """A registered study name (``lift``) or ``module:ATTR`` (tests use their own small studies). ``fresh`` re-reads
    the study's module, so a lane that runs for hours follows a plan edited (and committed) meanwhile."""
    target = STUDIES.get(ref, ref)
    if ":" not in target:
        raise StudyError(f"unknown study {ref!r}; known: {', '.join(STUDIES)} (or module:ATTR)")
    module, attr = target.split(":")
    if fresh and module in sys.modules:
        return getattr(importlib.reload(sys.modules[module]), attr)
    return getattr(importlib.import_module(module), attr)


def study_refs(which: str) -> list[str]:
    return list(STUDIES) if which == "all" else [which]


@dataclass
class Paths:
    """Where a study's records live (committed) and where lanes keep their claims and logs (not committed)."""

    results_root: Path = RESULTS

    @property
    def work_root(self) -> Path:
        if self.results_root.resolve() == RESULTS.resolve():
            return ROOT / "runs" / "study"
        return self.results_root.parent / f"{self.results_root.name}-work"

    def study_dir(self, study: str) -> Path:
        """The study's folder: its REPORT.md and figures (and, for a study in ``benchmarks/studies/``, its code)."""
        return self.results_root / study

    def results(self, study: str) -> Path:
        """The study's records: one ``<unit>.json`` per finished unit, long stages' checkpoints in ``artifacts/``."""
        return self.study_dir(study) / "records"

    def claim(self, study: str, unit: str) -> Path:
        return self.work_root / "claims" / study / f"{unit}.claim"

    def failure(self, study: str, unit: str) -> Path:
        return self.work_root / "failures" / study / f"{unit}.log"

    def work(self, study: str, unit: str) -> Path:
        return self.work_root / "work" / study / unit

    def stage_sidecar(self, study: str, unit: str) -> Path:
        return self.results(study) / "artifacts" / f"{unit}.stage.json"


# ---------------------------------------------------------------------------------------------- the start model

def start_sha(study: Study, paths: Paths) -> str | None:
    return sha256_files(study.start_files(paths.results(study.name) / "artifacts"))


def check_same_start(study: Study, records: list[dict], sha: str | None, what: str) -> None:
    """Refuse to run or report beside records made from another start model: one line naming both shas."""
    others = [r for r in records if r.get("start_sha") and r["start_sha"] != sha and r["role"] != "stage"]
    if others:
        ex = others[0]
        raise StudyError(f"{study.name}: {what} starts from model sha {str(sha)[:12]} but {len(others)} record(s) "
                         f"(e.g. {ex['unit']}) were made from sha {ex['start_sha'][:12]}; move those records out of "
                         f"benchmarks/studies/{study.name}/records/ or restore that start model")


# ---------------------------------------------------------------------------------------------- running one unit

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim(path: Path) -> bool:
    """Take a unit for this lane (an exclusive file with our pid); a claim whose lane died is taken over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(path.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and _alive(pid):
                return False
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def claimed(path: Path) -> bool:
    try:
        pid = int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return False
    return bool(pid) and pid != os.getpid() and _alive(pid)


def run_unit_inline(study: Study | str, unit_name: str, results_root: Path | None = None,
                    overrides: dict | None = None, call_s: float = STAGE_CALL_S) -> dict | None:
    """Run one unit in this process and write its record (None: a stage checkpointed and has more to do).

    Records go to ``<results_root>/<study>/records/`` (default ``benchmarks/studies/<study>/records/``); ``overrides`` shrink the
    unit's sizes (``ctx.size``), which tests use to run a unit in seconds."""
    study = load_study(study) if isinstance(study, str) else study
    paths = Paths(results_root) if results_root is not None else Paths()
    units = {u.name: u for u in study.plan()}
    if unit_name not in units:
        raise StudyError(f"{study.name}: no unit named {unit_name!r}")
    unit = units[unit_name]
    out = paths.results(study.name)
    records = load_records(out)
    done = {r["unit"] for r in records}
    waiting = [a for a in unit.after if a not in done]
    if waiting:
        raise StudyError(f"{study.name}/{unit.name}: runs after {waiting[0]}, which has no record yet")
    sha = start_sha(study, paths) if unit.uses_start_model else None
    if unit.uses_start_model:
        if sha is None:
            raise StudyError(f"{study.name}/{unit.name}: the start model is not there yet "
                             f"({', '.join(str(p) for p in study.start_files(out / 'artifacts'))}); run the stage first")
        check_same_start(study, records, sha, f"unit {unit.name}")
    ctx = UnitContext(study=study.name, unit=unit, results_dir=out, work_dir=paths.work(study.name, unit.name),
                      start_sha=sha, deadline=time.monotonic() + call_s, overrides=dict(overrides or {}))
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    module, fn_name = unit.fn.split(":")
    fn = getattr(importlib.import_module(module), fn_name)
    wall0, cpu0 = time.perf_counter(), _cpu_seconds()
    body = fn(ctx)
    wall, cpu = time.perf_counter() - wall0, _cpu_seconds() - cpu0
    sidecar = paths.stage_sidecar(study.name, unit.name)
    spent = json.loads(sidecar.read_text()) if sidecar.exists() else {"calls": 0, "wall_s": 0.0, "cpu_s": 0.0}
    spent = {"calls": spent["calls"] + 1, "wall_s": spent["wall_s"] + wall, "cpu_s": spent["cpu_s"] + cpu}
    if body is None:
        if unit.role != "stage":
            raise StudyError(f"{study.name}/{unit.name}: only a stage may return None (checkpointed); a {unit.role} "
                             "unit returns its record")
        atomic_write_bytes(sidecar, (json.dumps(spent) + "\n").encode())
        return None
    if not isinstance(body, dict):
        raise StudyError(f"{study.name}/{unit.name}: fn returned {type(body).__name__}, not a dict")
    sidecar.unlink(missing_ok=True)
    record = {"study": study.name, "unit": unit.name, "role": unit.role, "method": unit.method, "seed": unit.seed,
              "setting": unit.setting, "start_sha": sha, "metrics": {}, **body,
              "commit": git_commit(), "cpu": cpu_info(), "wall_s": spent["wall_s"], "cpu_s": spent["cpu_s"],
              "calls": spent["calls"], "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "versions": _versions()}
    if overrides:
        record["overrides"] = dict(overrides)
    json.dumps(record)  # fail here, before the write, on anything JSON cannot hold
    write_record(out, record)
    return record


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "numpy", "mujoco", "ray"):
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = getattr(mod, "__version__", "?")
    return out


def unit_main(study_ref: str, unit_name: str, results_root: Path) -> int:
    """The unit process: one thread, dies with its lane, runs the unit, exits 0 (record written) or STAGE_MORE."""
    threads_one()
    lane = os.environ.get("ORRERY_STUDY_LANE_PID")
    if lane:
        _die_with_parent(int(lane))
    study = load_study(study_ref)
    call_s = float(os.environ.get("ORRERY_STUDY_CALL_S", STAGE_CALL_S))  # tests make a stage call short
    record = run_unit_inline(study, unit_name, results_root, call_s=call_s)
    return 0 if record is not None else STAGE_MORE


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel sends us SIGTERM when the lane dies (even by SIGKILL), so no orphan keeps a unit's core."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent:  # the lane died before prctl took effect
        os._exit(1)


# ---------------------------------------------------------------------------------------------- the lane

@dataclass
class Pending:
    study: Study
    unit: Unit


def runnable(study: Study, paths: Paths, skip: set[tuple[str, str]]) -> tuple[list[Unit], int]:
    """(units that can start now, how many pending units wait on something another lane is doing)."""
    out_dir = paths.results(study.name)
    records = load_records(out_dir)
    if study.why_stopped(records):
        return [], 0  # a declared rule ended the study: nothing after it runs
    done = {r["unit"] for r in records}
    has_start = start_sha(study, paths) is not None
    ready, waiting = [], 0
    for unit in study.plan():
        if unit.name in done or (study.name, unit.name) in skip:
            continue
        if claimed(paths.claim(study.name, unit.name)):
            waiting += 1
            continue
        if any(a not in done for a in unit.after) or (unit.uses_start_model and not has_start):
            waiting += 1
            continue
        ready.append(unit)
    return ready, waiting


def yield_the_cpu() -> bool:
    """Run this process (and the units it starts, which inherit it) only on CPU that nothing else wants: Linux's
    SCHED_IDLE. `nice -n 19` is not enough for a background lane: a nice-19 unit still delays the wake-ups of the many
    short processes of a Ray test (beside two nice-19 lanes the suite's Ray tests ran 15-60 % slower, its in-process
    tests no slower); a task of the idle policy is preempted as soon as another wakes. Returns whether it applied."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return True
    except (AttributeError, OSError) as e:  # not Linux, or refused: the lane keeps its nice level
        log.info("the lane keeps its nice level (SCHED_IDLE unavailable: %s)", e)
        return False


def run_lane(which: str, paths: Paths, max_units: int | None = None, commit: bool = True) -> int:
    """Take runnable units until none remain (or ``max_units`` ran). Studies with the least CPU spent go first, so
    every study moves; within a study the plan's order holds (stages, gates, tuning, reported seeds). A lane started
    at low priority (nice >= 10, as `nice -n 19 ... run &` starts a background lane) takes the idle policy too."""
    if os.nice(0) >= 10 and yield_the_cpu():
        log.info("background lane: SCHED_IDLE (runs only on CPU nothing else wants)")
    skip: set[tuple[str, str]] = set()
    unbuilt: set[str] = set()
    ran = 0
    child: list[subprocess.Popen] = []

    def stop(signum, frame):  # noqa: ARG001
        for p in child:
            if p.poll() is None:
                p.terminate()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    while max_units is None or ran < max_units:
        studies = []
        for ref in study_refs(which):
            try:
                studies.append((ref, load_study(ref, fresh=True)))
            except ImportError as e:
                if ref not in unbuilt:
                    log.warning("study %s is not built yet (%s); skipped", ref, e)
                    unbuilt.add(ref)
        choice, waiting = None, 0
        spent = []
        for ref, study in studies:
            ready, wait = runnable(study, paths, skip)
            waiting += wait
            if ready:
                cost = sum(r.get("cpu_s", 0.0) for r in load_records(paths.results(study.name)))
                spent.append((cost, ref, study, ready[0]))
        if spent:
            _, ref, study, unit = min(spent, key=lambda s: s[0])
            choice = (ref, study, unit)
        if choice is None:
            # only a unit of one of this lane's studies can unblock them (another study's claim would keep it here)
            mine = [p for _, st in studies for p in (paths.work_root / "claims" / st.name).glob("*.claim")]
            if waiting and any(claimed(p) for p in mine):
                time.sleep(WAIT_S)  # another lane is making what the rest waits on
                continue
            log.info("nothing left to run here (%d unit(s) wait on units that failed or are not runnable)", waiting)
            return 0
        ref, study, unit = choice
        claim_path = paths.claim(study.name, unit.name)
        if not claim(claim_path):
            continue
        try:
            code, tail = _run_in_process(ref, unit, paths, child)
        finally:
            claim_path.unlink(missing_ok=True)
        if code in (0, STAGE_MORE):
            ran += code == 0
            if commit:
                commit_results(paths.results(study.name),
                               f"study {study.name}: {unit.name} ({unit.role}{', checkpoint' if code else ''})")
        else:
            skip.add((study.name, unit.name))
            log_path = paths.failure(study.name, unit.name)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.write_text(tail)
            log.error("%s/%s failed (exit %s); log: %s; this lane skips it", study.name, unit.name, code, log_path)
    return 0


def _run_in_process(ref: str, unit: Unit, paths: Paths, child: list) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "benchmarks.study", "_unit", ref, unit.name, "--results", str(paths.results_root)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "ORRERY_STUDY_LANE_PID": str(os.getpid()),
           "PYTHONUNBUFFERED": "1"}
    log.info("running %s/%s (%s, %s, seed %s, ~%.0f core-min)", ref, unit.name, unit.role, unit.method, unit.seed,
             unit.est_core_s / 60)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    child.append(proc)
    tail: list[str] = []

    def pump() -> None:  # pass progress through, keep the end for the failure log
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line)
            del tail[:-200]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        # A unit is stuck when it has used far more CPU than a unit may, not when it is slow: a lane at nice 19 on a
        # busy machine gets little of a core, so wall time says nothing.
        while True:
            try:
                proc.wait(timeout=5.0)
                break
            except subprocess.TimeoutExpired:
                pass
            used = _process_cpu_s(proc.pid)
            if used > UNIT_CPU_LIMIT_S or time.perf_counter() - t0 > UNIT_WALL_LIMIT_S:
                proc.kill()
                tail.append(f"killed: {used:.0f} CPU-s / {time.perf_counter() - t0:.0f} s wall, past the limits "
                            f"({UNIT_CPU_LIMIT_S} CPU-s, {UNIT_WALL_LIMIT_S} s)\n")
        code = proc.wait()
        reader.join(timeout=10)
    finally:
        child.remove(proc)
    log.info("%s/%s exit %s after %.0f s", ref, unit.name, code, time.perf_counter() - t0)
    return code, "".join(tail)


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc), 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def commit_results(results_dir: Path, message: str, repo: Path = ROOT, tries: int = 10) -> bool:
    """Commit this study's records and artifacts (only those paths, whatever else is staged), so a new machine starts
    from them. Skipped when the results are not inside ``repo``."""
    try:
        rel = results_dir.resolve().relative_to(repo.resolve())
    except ValueError:
        return False
    big = [p for p in results_dir.rglob("*") if p.is_file() and p.stat().st_size > MAX_ARTIFACT_BYTES]
    if big:
        raise StudyError(f"{big[0]} is {big[0].stat().st_size / 2**20:.0f} MiB; study artifacts are committed and "
                         f"must stay under {MAX_ARTIFACT_BYTES / 2**20:.0f} MiB a file (keep a slice, not the whole)")
    def nothing_staged() -> bool:  # another lane's commit of this folder took these files with its own
        return subprocess.run(["git", "-C", str(repo), "diff", "--cached", "--quiet", "--", str(rel)]).returncode == 0

    for attempt in range(tries):
        add = subprocess.run(["git", "-C", str(repo), "add", "--", str(rel)], capture_output=True, text=True)
        if add.returncode == 0:
            if nothing_staged():
                return False
            done = subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", message, "--", str(rel)],
                                  capture_output=True, text=True)
            if done.returncode == 0 or nothing_staged():
                return done.returncode == 0
            err = done.stderr or done.stdout
        else:
            err = add.stderr
        if "index.lock" not in err:
            log.error("git commit of %s failed: %s", rel, err.strip())
            return False
        time.sleep(2 + attempt)
    return False


def print_exc_line(e: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(e), e)).strip()
