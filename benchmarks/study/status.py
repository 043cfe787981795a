"""What a study's records say: its status row (done, pending, runnable, core-hours spent and left) and its report
(``REPORT.md`` in its folder, and its section of ``benchmarks/RESULTS.md``), from the JSON records alone."""
from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path

from benchmarks.results_md import rebase_links, remove_section, replace_section
from benchmarks.study.core import Study, StudyError, expected_core_s, measured_costs
from benchmarks.study.records import RESULTS, ROOT, atomic_write_bytes, load_records
from benchmarks.study.runner import Paths, load_study, runnable, start_sha, study_refs

log = logging.getLogger("benchmarks.study")

def status_rows(which: str, paths: Paths) -> list[dict]:
    rows = []
    for ref in study_refs(which):
        try:
            study = load_study(ref)
        except ImportError as e:
            rows.append({"study": ref, "error": f"not built ({e})"})
            continue
        out = paths.results(study.name)
        records = load_records(out)
        by_name = {r["unit"]: r for r in records}
        plan = study.plan()
        pending = [u for u in plan if u.name not in by_name]
        measured = measured_costs(records)
        left = 0.0
        in_progress = []
        for u in pending:
            cost = expected_core_s(u, measured)
            sidecar = paths.stage_sidecar(study.name, u.name)
            if sidecar.exists():
                spent_so_far = json.loads(sidecar.read_text())
                cost = max(0.0, cost - spent_so_far["cpu_s"])
                in_progress.append(f"{u.name}: {spent_so_far['calls']} call(s), "
                                   f"{spent_so_far['cpu_s'] / 3600:.2f} core-h so far")
            left += cost
        ready, waiting = runnable(study, paths, set())
        stopped = study.why_stopped(records)
        if stopped:
            left = 0.0  # its pending units never run
        failed = [u.name for u in pending if paths.failure(study.name, u.name).exists()]
        reported = [u for u in plan if u.role == "report"]
        rows.append({"study": study.name, "done": len(plan) - len(pending), "units": len(plan),
                     "pending": len(pending), "runnable": len(ready), "waiting": waiting,
                     "failed_here": failed, "failure_logs": str(paths.failure(study.name, "-").parent),
                     "core_h_left": left / 3600,
                     "core_h_spent": sum(r["cpu_s"] for r in records) / 3600,
                     "report_done": sum(u.name in by_name for u in reported), "report_units": len(reported),
                     "start_sha": (start_sha(study, paths) or "-")[:12], "stages": in_progress, "stopped": stopped})
    return rows


def _failed_note(row: dict) -> str:
    """The units that failed on this machine, short enough for one status line (their logs say why)."""
    names = row["failed_here"]
    if not names:
        return ""
    shown = ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")
    return f"  failed here: {shown} (logs: {row['failure_logs']})"


def format_status(rows: list[dict]) -> str:
    w = max([15, *(len(r["study"]) + 1 for r in rows)])  # the longest name sets the first column
    head = (f"{'study':<{w}}{'done':>10}{'pending':>9}{'runnable':>10}{'reported':>10}{'core-h spent':>14}"
            f"{'core-h left':>13}  start model")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['study']:<{w}}{r['error']}")
            continue
        lines.append(f"{r['study']:<{w}}{r['done']:>5}/{r['units']:<4}{r['pending']:>9}{r['runnable']:>10}"
                     f"{r['report_done']:>5}/{r['report_units']:<4}{r['core_h_spent']:>14.2f}{r['core_h_left']:>13.2f}"
                     f"  {r['start_sha']}" + (f"  stopped: {r['stopped']}" if r.get("stopped") else _failed_note(r))
                     + (f"  stage in progress: {'; '.join(r['stages'])}" if r["stages"] else ""))
    total = sum(r.get("core_h_left", 0.0) for r in rows)
    lines.append(f"core-hours left in all: {total:.2f} (measured cost per role and method where units of it finished, "
                 "declared estimates elsewhere)")
    return "\n".join(lines)


def pending_reports(study: Study, records: list[dict]) -> list[str]:
    """The plan's reported units that have no record yet."""
    reported = {r["unit"] for r in records if r["role"] == "report"}
    return [u.name for u in study.plan() if u.role == "report" and u.name not in reported]


def whole(study: Study, records: list[dict]) -> bool:
    """Every reported unit of the plan is recorded: the study's table exists."""
    return any(r["role"] == "report" for r in records) and not pending_reports(study, records)


def replaced_sections(paths: Paths) -> dict[str, str]:
    """Superseded study -> the study whose whole table now replaces its RESULTS.md section."""
    replaced = {}
    for ref in study_refs("all"):
        try:
            study = load_study(ref)
        except ImportError:
            continue
        if study.supersedes and whole(study, load_records(paths.results(study.name))):
            replaced.update({old: study.name for old in study.supersedes})
    return replaced


def _remove_study_section(results_md: Path, name: str, replacement: str = "") -> bool:
    """A study's section names the command that rewrites it (``python -m benchmarks.study <name> report``);
    ``replacement``: the section that takes its place."""
    return any(remove_section(results_md, f"benchmarks.study {name}{end}", replacement) for end in (" ", "`"))


def report(which: str, paths: Paths, results_md: Path | None = None) -> list[Path]:
    """Each study's RESULTS.md section and plots, from its JSON records alone. A study whose successor's table is
    whole (``Study.supersedes``) keeps its REPORT.md and records, and its section leaves RESULTS.md."""
    written = []
    target = results_md if results_md is not None else (
        ROOT / "benchmarks" / "RESULTS.md" if paths.results_root.resolve() == RESULTS.resolve() else None)
    replaced = replaced_sections(paths) if target is not None else {}
    for ref in study_refs(which):
        study = load_study(ref)
        out = paths.results(study.name)
        records = load_records(out)
        if not records:
            log.warning("%s: no records yet; nothing to report", study.name)
            continue
        shas = {r["start_sha"] for r in records if r["role"] != "stage" and r.get("start_sha")}
        if len(shas) > 1:
            a, b = sorted(shas)[:2]
            raise StudyError(f"{study.name}: records come from {len(shas)} start models ({a[:12]}, {b[:12]}, ...); "
                             "a report mixes none: move one set aside")
        module, fn_name = study.report.split(":")
        folder = paths.study_dir(study.name)
        section = getattr(importlib.import_module(module), fn_name)(records, folder)
        if not section.startswith("## "):
            raise StudyError(f"{study.name}: the report must start with a '## ' heading")
        atomic_write_bytes(folder / "REPORT.md", (section.rstrip("\n") + "\n").encode())
        written.append(folder / "REPORT.md")
        missing = pending_reports(study, records)
        if target is None:
            continue
        if study.name in replaced:
            if _remove_study_section(target, study.name):
                log.info("%s: its section left %s (%s's table replaces it; its REPORT.md and records stay)",
                         study.name, target.name, replaced[study.name])
        elif missing:  # RESULTS.md holds today's figures: a partial table stays in the study's REPORT.md
            log.info("%s: %d reported unit(s) pending; RESULTS.md keeps its section until the table is whole",
                     study.name, len(missing))
        else:
            section = rebase_links(section, folder, target.parent)  # its links and plots, from RESULTS.md
            heading = section.splitlines()[0]
            new = target.exists() and heading not in target.read_text()
            for old in study.supersedes:  # a new section takes the place of the first it supersedes
                if _remove_study_section(target, old, section if new else ""):
                    log.info("%s: %s's section left %s (this table replaces it%s)", study.name, old, target.name,
                             ", in its place" if new else "")
                    new = False
            replace_section(target, heading, section)
    return written
