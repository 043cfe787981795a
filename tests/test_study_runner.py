"""The study runner on a real toy study (tests/study_toy.py): records written atomically as units end, a killed lane
loses only the unit in progress, a long stage resumes from its checkpoint, records from another start model are
refused, and the report needs nothing but the committed JSON."""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.study.core import Study, StudyError, Unit
from benchmarks.study.records import load_records
from benchmarks.study.runner import commit_results, Paths, run_unit_inline
from benchmarks.study.status import format_status, report, status_rows
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[1]
TOY = "tests.study_toy:STUDY"


def lane(results: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "benchmarks.study", TOY, "run", "--results", str(results),
                             "--no-commit", *extra], cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_plan_rules():
    with pytest.raises(StudyError, match="reported seeds are 10-14"):
        Unit("a", "report", "m", 3, "x:y")
    with pytest.raises(StudyError, match="tuning seeds are >= 100"):
        Unit("a", "tune", "m", 1, "x:y")
    with pytest.raises(StudyError, match="letters, digits"):
        Unit("a/b", "tune", "m", 100, "x:y")
    dup = Study("d", "d", lambda: [Unit("a", "tune", "m", 100, "x:y")] * 2, lambda a: [], "x:y")
    with pytest.raises(StudyError, match="listed twice"):
        dup.plan()
    later = Study("d", "d", lambda: [Unit("a", "tune", "m", 100, "x:y", after=("b",)),
                                     Unit("b", "tune", "m", 101, "x:y")], lambda a: [], "x:y")
    with pytest.raises(StudyError, match="runs after b"):
        later.plan()


@pytest.mark.slow
def test_killed_lane_loses_only_the_unit_in_progress_and_the_study_resumes(tmp_path):
    results = tmp_path / "results"
    first = lane(results, env={"TOY_UNIT_S": "1.0", "TOY_STEP_S": "0.01"})
    toy = results / "toy" / "records"
    # wait until two method units are recorded and a third has started, then kill the lane mid-unit
    wait_until(lambda: len([r for r in load_records(toy) if r["role"] != "stage"]) >= 2, 60, "two records")
    done_before = {r["unit"] for r in load_records(toy)}
    started = {p.parent.name for p in (tmp_path / "results-work" / "work" / "toy").glob("*/started")}
    wait_until(lambda: len({p.parent.name for p in (tmp_path / "results-work" / "work" / "toy").glob("*/started")})
               > len(started) or len(load_records(toy)) > len(done_before), 60, "the next unit to start")
    first.send_signal(signal.SIGKILL)
    first.wait()
    time.sleep(2.0)  # the unit process dies with its lane (PR_SET_PDEATHSIG); it must not write a record later
    after_kill = load_records(toy)
    assert not list(toy.glob(".*.tmp")), "a killed write left a partial file"
    for r in after_kill:
        assert {"study", "unit", "role", "method", "seed", "start_sha", "metrics", "commit", "cpu", "wall_s",
                "cpu_s"} <= set(r), r
    assert len(after_kill) < 7, "the lane was killed before the study ended"
    # a new lane finishes the rest, and the finished records are untouched
    second = lane(results, env={"TOY_UNIT_S": "0.05"})
    out, _ = second.communicate(timeout=120)
    assert second.returncode == 0, out
    records = {r["unit"]: r for r in load_records(toy)}
    assert set(records) == {"stage", "tune-s100", *(f"toy-s{s}" for s in range(10, 15))}
    for r in after_kill:
        assert records[r["unit"]]["finished_at"] == r["finished_at"]
    shas = {r["start_sha"] for r in records.values() if r["role"] != "stage"}
    assert len(shas) == 1 and None not in shas
    assert records["toy-s12"]["metrics"]["score"] == pytest.approx(2.0 * 12 + 0.5)
    assert records["toy-s12"]["cpu"]["model"] and isinstance(records["toy-s12"]["cpu"]["flags"], list)


@pytest.mark.slow
def test_long_stage_resumes_from_its_checkpoint(tmp_path):
    results = tmp_path / "results"
    checkpoint = results / "toy" / "records" / "artifacts" / "stage" / "checkpoint.pt"
    # calls of ~0.3 s: the stage returns "checkpointed" several times; the lane is killed in the middle of it
    first = lane(results, env={"ORRERY_STUDY_CALL_S": "0.3", "TOY_STEP_S": "0.05"})
    import torch
    wait_until(lambda: checkpoint.exists() and torch.load(checkpoint, weights_only=False)["step"] >= 12, 60,
               "a checkpoint at step 12")
    first.send_signal(signal.SIGKILL)
    first.wait()
    time.sleep(1.0)
    reached = torch.load(checkpoint, weights_only=False)["step"]
    assert 12 <= reached < 40 and not (results / "toy" / "records" / "stage.json").exists()
    second = lane(results, "--max-units", "1", env={"ORRERY_STUDY_CALL_S": "0.3", "TOY_STEP_S": "0.05"})
    out, _ = second.communicate(timeout=120)
    assert second.returncode == 0, out
    stage = json.loads((results / "toy" / "records" / "stage.json").read_text())
    starts = stage["starts"]
    assert starts[0] == 0 and starts == sorted(starts) and len(starts) >= 3
    # the second lane began where the killed one had checkpointed, not from scratch
    assert any(reached - 1 <= s <= reached + 1 for s in starts[1:]), (reached, starts)
    assert stage["metrics"]["steps"] == 40 and stage["calls"] >= 2


def test_records_from_another_start_model_are_refused(tmp_path):
    for name in ("stage", "tune-s100", "toy-s10"):
        assert run_unit_inline(TOY, name, tmp_path, overrides={"sleep_s": 0.0}) is not None
    model = tmp_path / "toy" / "records" / "artifacts" / "stage" / "model.json"
    model.write_text(json.dumps({"weight": 3.0}))  # a different start model, e.g. re-trained on a new machine
    with pytest.raises(StudyError, match=r"starts from model sha [0-9a-f]{12} but 2 record\(s\).*made from sha "
                                         r"[0-9a-f]{12}"):
        run_unit_inline(TOY, "toy-s11", tmp_path, overrides={"sleep_s": 0.0})
    # a report refuses records of two start models (one copied in from another machine's run)
    mixed = json.loads((tmp_path / "toy" / "records" / "toy-s10.json").read_text())
    mixed.update(unit="toy-s13", seed=13, start_sha="f" * 64)
    (tmp_path / "toy" / "records" / "toy-s13.json").write_text(json.dumps(mixed))
    with pytest.raises(StudyError, match="2 start models"):
        report(TOY, Paths(tmp_path), results_md=tmp_path / "RESULTS.md")


def test_report_from_the_committed_json_alone(tmp_path):
    made = tmp_path / "made"
    for name in ["stage", "tune-s100", *(f"toy-s{s}" for s in range(10, 15))]:
        run_unit_inline(TOY, name, made, overrides={"sleep_s": 0.0})
    fresh = tmp_path / "fresh-clone"  # only the records travel: no work dirs, no artifacts
    (fresh / "toy" / "records").mkdir(parents=True)
    for path in (made / "toy" / "records").glob("*.json"):
        shutil.copy(path, fresh / "toy" / "records" / path.name)
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("# Benchmarks\n\n## Other\n\nkept\n")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.study", TOY, "report", "--results", str(fresh)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    section = (fresh / "toy" / "REPORT.md").read_text()
    assert section.startswith("## Toy study") and "| 12 | 24.5 |" in section and "5 seeds" in section
    assert (fresh / "toy" / "toy.png").stat().st_size > 1000
    (fresh / "toy" / "records" / "toy-s14.json").rename(tmp_path / "held-back.json")  # a partial table
    report(TOY, Paths(fresh), results_md=results_md)
    assert "Toy study" not in results_md.read_text(), "a partial table stays in the study's REPORT.md"
    assert "4 seeds" in (fresh / "toy" / "REPORT.md").read_text()
    (tmp_path / "held-back.json").rename(fresh / "toy" / "records" / "toy-s14.json")
    report(TOY, Paths(fresh), results_md=results_md)
    text = results_md.read_text()
    assert "## Other\n\nkept" in text and "| 14 | 28.5 |" in text
    # the plot's link is the study folder's in REPORT.md and points at the same file from RESULTS.md's folder
    assert "![the curves](toy.png)" in (fresh / "toy" / "REPORT.md").read_text()
    link = text.split("![the curves](", 1)[1].split(")", 1)[0]
    assert (results_md.parent / link).resolve() == (fresh / "toy" / "toy.png").resolve()


def test_a_whole_successor_replaces_the_superseded_section(tmp_path, monkeypatch):
    from benchmarks.study import runner
    monkeypatch.setattr(runner, "STUDIES", {"toy": TOY, "toy_next": "tests.study_toy:STUDY_NEXT"})
    for name in ["stage", "tune-s100", *(f"toy-s{s}" for s in range(10, 15))]:
        run_unit_inline(TOY, name, tmp_path, overrides={"sleep_s": 0.0})
    shutil.copytree(tmp_path / "toy" / "records", tmp_path / "toy_next" / "records")
    held = tmp_path / "toy_next" / "records" / "toy-s14.json"
    held.rename(tmp_path / "held-back.json")
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("# Benchmarks\n\n## Other\n\nkept\n")
    report("all", Paths(tmp_path), results_md=results_md)
    text = results_md.read_text()
    assert "## Toy study" in text and "Toy successor" not in text, "a partial successor replaces nothing"
    results_md.write_text(text + "\n## Last\n\nkept too\n")
    (tmp_path / "held-back.json").rename(held)
    report("toy_next", Paths(tmp_path), results_md=results_md)
    text = results_md.read_text()
    assert "## Toy successor" in text and "| 14 | 28.5 |" in text
    assert "## Toy study" not in text and "## Other\n\nkept" in text and text.endswith("## Last\n\nkept too\n")
    assert text.index("## Other") < text.index("## Toy successor") < text.index("## Last"), "in the old one's place"
    for which in ("toy", "all"):  # reporting the superseded study again does not bring its section back
        report(which, Paths(tmp_path), results_md=results_md)
        assert results_md.read_text().count("## Toy") == 1
    assert "| 14 | 28.5 |" in (tmp_path / "toy" / "REPORT.md").read_text(), "its own report and records stay"


def test_status_counts_done_pending_and_cost(tmp_path):
    run_unit_inline(TOY, "stage", tmp_path)
    run_unit_inline(TOY, "tune-s100", tmp_path, overrides={"sleep_s": 0.0})
    (row,) = status_rows(TOY, Paths(tmp_path))
    assert (row["done"], row["pending"], row["runnable"], row["report_done"]) == (2, 5, 5, 0)
    assert 0 < row["core_h_left"] < 1
    # the report units are not measured yet: their declared estimates, whatever the tuning unit cost
    from benchmarks.study.runner import load_study
    pending = [u for u in load_study(TOY).plan() if u.role == "report"]
    assert row["core_h_left"] == pytest.approx(sum(u.est_core_s for u in pending) / 3600)
    # ... also when a report unit of another method was measured (an hour): its cost says nothing of theirs
    other = Paths(tmp_path).results("toy") / "other-s10.json"
    other.write_text(json.dumps({"unit": "other-s10", "role": "report", "method": "other", "cpu_s": 3600.0}))
    (row,) = status_rows(TOY, Paths(tmp_path))
    assert row["core_h_left"] == pytest.approx(sum(u.est_core_s for u in pending) / 3600)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.study", "all", "status", "--results", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    from benchmarks.study import STUDIES
    for study in STUDIES:  # every registered study has a row
        assert f"\n{study} " in proc.stdout


def test_status_names_units_that_failed_here_in_one_short_line(tmp_path):
    """Many refused units (AttnRL's after a failed gate) are counted, not listed: the line stays readable."""
    row = {"study": "toy", "done": 0, "units": 9, "pending": 9, "runnable": 0, "report_done": 0, "report_units": 5,
           "core_h_spent": 0.0, "core_h_left": 1.0, "start_sha": "-", "stages": [], "failure_logs": "/x/toy",
           "failed_here": [f"tune-m{i}-s100" for i in range(18)]}
    line = format_status([row]).splitlines()[2]
    assert line.endswith("failed here: tune-m0-s100, tune-m1-s100 and 16 more (logs: /x/toy)"), line
    assert "failed here" not in format_status([{**row, "failed_here": []}])


def test_commit_results_commits_only_the_study_folder(tmp_path, caplog):
    repo = tmp_path / "repo"
    run = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True)  # noqa: E731
    repo.mkdir()
    run("init", "-q")
    run("config", "user.email", "t@t")
    run("config", "user.name", "t")
    (repo / "code.py").write_text("x = 1\n")
    run("add", "code.py")
    run("commit", "-q", "-m", "init")
    (repo / "code.py").write_text("x = 2\n")  # someone's work in progress, staged
    run("add", "code.py")
    results = repo / "benchmarks" / "studies" / "toy" / "records"
    run_unit_inline(TOY, "stage", repo / "benchmarks" / "studies")
    assert commit_results(results, "study toy: stage", repo=repo)
    files = run("show", "--name-only", "--format=", "HEAD").stdout.split()
    assert "benchmarks/studies/toy/records/stage.json" in files and "code.py" not in files
    assert "code.py" in run("diff", "--cached", "--name-only").stdout  # still staged, not committed
    # a second lane whose record the first lane's commit already took: nothing to commit, and no error logged
    (repo / "other.py").write_text("y = 1\n")  # an untracked file elsewhere: git's message then lacks "nothing"
    with caplog.at_level(logging.ERROR, logger="benchmarks.study"):
        assert not commit_results(results, "study toy: stage again", repo=repo)
    assert not caplog.records, caplog.text


def test_a_background_lane_yields_the_cpu_and_its_units_inherit_it():
    """`yield_the_cpu` puts the process on Linux's idle policy, and a unit it starts afterwards inherits it (a lane
    started with nice >= 10 calls it before its first unit)."""
    script = ("import os, subprocess, sys\n"
              "from benchmarks.study.runner import yield_the_cpu\n"
              "before = os.sched_getscheduler(0)\n"
              "applied = yield_the_cpu()\n"
              "child = subprocess.run([sys.executable, '-c', 'import os; print(os.sched_getscheduler(0))'],\n"
              "                       capture_output=True, text=True).stdout.strip()\n"
              "print(before, applied, os.sched_getscheduler(0), child)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    before, applied, after, child = proc.stdout.split()
    assert int(before) != os.SCHED_IDLE and applied == "True"
    assert int(after) == int(child) == os.SCHED_IDLE


def test_rebase_links_moves_relative_links_and_leaves_urls_and_anchors():
    from benchmarks.results_md import rebase_links
    root = Path("/repo/benchmarks")
    section = ("![plot](a.png) [older](../lift/REPORT.md) [web](https://example.org/x.png) [here](#top) "
               "[abs](/etc/x.md)")
    out = rebase_links(section, root / "studies" / "s", root)
    assert out == ("![plot](studies/s/a.png) [older](studies/lift/REPORT.md) [web](https://example.org/x.png) "
                   "[here](#top) [abs](/etc/x.md)")
