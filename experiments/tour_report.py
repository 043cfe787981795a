"""The tour's report: ``report.md`` + PNG plots, built only from the runs' own ``summary.json`` and metrics files.

Every number in the report is read from a run directory that the report names, so a reader can check it (the tour
test does) and rerun any part with the command shown next to it. Each method writes its own section (the
``section`` of the TourPart it declares, experiments/<method>/tour.py) with the helpers here; this module names no
method.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any


def load_summary(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


STUDY = "benchmarks/RESULTS.md"  # where each method's multi-seed study says whether its claim holds


def paired_verdict(differences: list[float], higher_is_better: bool = True) -> str:
    """Whether a comparative claim holds, from seed-paired differences (method minus baseline): "yes" only when the
    95 % t-interval of their mean excludes zero in the claimed direction, "no (reversed)" when it excludes zero the
    other way, else "not shown at this budget". One seed has no interval: never "yes"."""
    import math
    import statistics
    diffs = [d if higher_is_better else -d for d in differences if d is not None and math.isfinite(d)]
    if len(diffs) < 2:
        return f"not shown at this budget ({len(diffs)} seed; the multi-seed study is in {STUDY})"
    from scipy import stats
    mean, sem = statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))
    half = stats.t.ppf(0.975, len(diffs) - 1) * sem
    if mean - half > 0:
        return "yes"
    if mean + half < 0:
        return "no (reversed)"
    return f"not shown at this budget ({len(diffs)} seeds, 95 % interval {mean - half:+.3g} .. {mean + half:+.3g})"


def copy_plots(paths: list[str | None], out: Path, prefix: str) -> list[str]:
    copied = []
    for p in paths:
        if p and Path(p).exists():
            target = out / f"{prefix}_{Path(p).name}"
            shutil.copyfile(p, target)
            copied.append(target.name)
    return copied


def pool_load_plot(pool_stats: dict, out: Path) -> str | None:
    per = pool_stats.get("per_sampler", {})
    if not per:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = sorted(per)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, key, label in zip(axes, ("requests", "samples", "busy_s"), ("requests", "samples", "worker busy (s)")):
        ax.bar(names, [per[n][key] for n in names], color=["C0", "C1", "C2", "C3"][:len(names)])
        ax.set_title(label)
    fig.suptitle("shared pool load per sampler type")
    fig.tight_layout()
    fig.savefig(out / "pool_load.png", dpi=110)
    plt.close(fig)
    return "pool_load.png"


def write_report(out: Path, stages: dict, pool_stats: dict, cfg: dict, wall_s: float,
                 sections_of: dict, paper_scale: dict) -> dict[str, Any]:
    """``stages``: method -> its Stages (experiments.tour.plan); ``sections_of``: method -> its TourPart's section
    function, fn(stages, out_dir) -> (lines, claims, plots); ``paper_scale``: method -> the command that reruns it
    at paper scale."""
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# orrery tour report", "",
             f"{len(stages)} method(s) ({', '.join(stages)}) ran concurrently as separate drivers on one Ray cluster, "
             f"sharing the pool "
             f"`{pool_stats.get('name')}` ({pool_stats.get('num_workers')} workers). Wall time {wall_s:.0f} s, "
             f"seed {cfg['seed']}, scale `{cfg['scale']['name']}`.", ""]
    claims: list[dict] = []
    plots: list[str] = []
    failures = []
    status_rows = ["| method | stage | status | seconds | run directory | log |", "|---|---|---|---|---|---|"]
    for method, sts in stages.items():
        for st in sts:
            status = "ok" if st.ok else ("not run" if st.returncode is None else f"FAILED: {st.error}")
            status_rows.append(f"| {method} | {st.experiment} | {status} | {st.seconds:.0f} | `{st.run_dir}` | "
                               f"`{st.log_path}` |")
            if st.returncode is not None and not st.ok:
                failures.append({"method": method, "stage": st.experiment, "error": st.error, "log": str(st.log_path)})
    sections = {}
    for method, sts in stages.items():
        sec_lines, sec_claims, sec_plots = sections_of[method](sts, out)
        if not any(st.ok for st in sts):
            sec_lines += [f"**Failed** — see `{sts[0].log_path}`.", ""]
        sections[method] = sec_lines
        claims += sec_claims
        plots += sec_plots
    pool_plot = pool_load_plot(pool_stats, out)
    if pool_plot:
        plots.append(pool_plot)

    lines += ["## What each paper claims, and what this run shows", "",
              "| paper | claim (direction) | this run | holds here |", "|---|---|---|---|"]
    lines += [f"| {c['paper']} | {c['claim']} | {c['observed']} | {c['holds']} |" for c in claims]
    lines += ["", "Smoke-scale budgets are tiny: a 'no' here says the direction did not show at this budget, "
              "not that the paper is wrong. Rerun any part at paper scale with the commands below.", ""]
    for method in stages:
        lines += sections[method]
        lines += [f"Rerun at paper scale: `{paper_scale[method]}`", ""]
    lines += ["## Shared pool", "",
              f"{pool_stats.get('requests')} requests, {pool_stats.get('samples')} samples, "
              f"{pool_stats.get('retries')} retries, {pool_stats.get('restarts')} restarts.", "",
              "| sampler | requests | samples | worker busy s |", "|---|---|---|---|"]
    for name, st in sorted(pool_stats.get("per_sampler", {}).items()):
        lines.append(f"| {name} | {st['requests']} | {st['samples']} | {st['busy_s']:.1f} |")
    lines += ["", "## Runs", ""] + status_rows + [""]
    if failures:
        lines += ["## Failures", ""] + [f"- {f['method']} / {f['stage']}: {f['error']} (log: `{f['log']}`)"
                                        for f in failures] + [""]
    lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    lines += ["## Config", "", "```", json.dumps({k: v for k, v in cfg.items() if not k.startswith("_")},
                                                  indent=1, default=str)[:4000], "```", ""]
    (out / "report.md").write_text("\n".join(lines))
    summary = {"report": str(out / "report.md"), "claims": claims, "failures": failures, "plots": plots,
               "pool": {k: v for k, v in pool_stats.items() if k not in ("workers",)}, "wall_s": wall_s}
    (out / "report.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
