"""E-CIT in the tour: calibration/power/time of one CI question (experiment ``ecit``) and PC with E-CIT against PC
with KCI on all rows (``ecit_pc``); its report section and the tour test's check. About 4 CPU-minutes at the tour's
budget (measured alone on 2 cores; see the README's E-CIT section)."""
from __future__ import annotations

from pathlib import Path

from experiments.tour import TourPart, TourStage
from experiments.tour_report import copy_plots, fmt, load_summary, paired_verdict, ratio

TOUR = TourPart(
    title="E-CIT",
    stages=(
        TourStage("ecit",
                  overrides=("experiment.ns=[1000,4000]", "experiment.reps=20", "experiment.full_max_n=1000"),
                  tiny=("experiment.ns=[400]", "experiment.reps=3", "experiment.subset_size=100",
                        "experiment.full_max_n=400")),
        TourStage("ecit_pc",
                  overrides=("experiment.data={kind:sem,n:1200,d:5,degree:2.0,sem:nonlinear,noise:t3}",
                             "experiment.graphs=1", "experiment.subset_size=300", "experiment.max_k=1",
                             "experiment.full_max_n=1200"),
                  tiny=("experiment.data={kind:sem,n:400,d:4,degree:1.5,sem:nonlinear,noise:t3}",
                        "experiment.subset_size=100", "experiment.full_max_n=400")),
    ),
    section="experiments.ecit.tour:section",
    paper_scale="python -m experiments.run experiment=ecit \"experiment.ns=[1000,4000,16000,100000]\" "
                "experiment.reps=200 cluster=remote; python -m experiments.run experiment=ecit_pc "
                "\"experiment.data={kind:sem,n:20000,d:10,sem:nonlinear,noise:t3}\" experiment.graphs=10 "
                "cluster=remote",
    check="experiments.ecit.tour:check",
)

METHOD_ROWS = ("stable", "cauchy", "fisher", "bonferroni", "one_subset", "full")


def level_verdict(rate: dict, level: float) -> str:
    """"no" when the type-I error's exact 95 % interval lies above the level, "yes" when it lies below twice the
    level, else too few nulls to tell."""
    if rate["low"] > level:
        return "no"
    if rate["high"] <= 2 * level:
        return "yes"
    return f"not shown at this budget ({rate['n']} nulls: interval up to {fmt(rate['high'])})"


def _ci(r: dict) -> str:
    return f"{fmt(r['rate'])} [{fmt(r['low'])}, {fmt(r['high'])}]"


def section(stages, out: Path) -> tuple[list[str], list[dict], list[str]]:
    cal, pcs = stages
    lines, claims, plots = ["## E-CIT (ensemble conditional independence tests, PC causal discovery)", ""], [], []
    s = load_summary(cal.run_dir) if cal.ok else None
    if s:
        plots += copy_plots(s.get("plots", []), out, "ecit")
        lines += [f"One CI question (post-nonlinear triplet, t3 noise), base test **{s['base']}**, subsets of "
                  f"{s['subset_size']} rows, {s['reps']} null and {s['reps']} alternative datasets per n, level "
                  f"{s['level']}; `full` = the base test on all rows, `one_subset` = the first subset alone. "
                  f"Source: `{cal.run_dir}/summary.json`.", "",
                  "| n | method | type-I error [95 % CI] | power [95 % CI] | CPU s per test |", "|---|---|---|---|---|"]
        for row in s["rows"]:
            for m in METHOD_ROWS:
                if m in row:
                    cpu = row["full_cpu_s"] if m == "full" else row["ecit_cpu_s"]
                    lines.append(f"| {row['n']} | {m} | {_ci(row[m]['type1'])} | {_ci(row[m]['power'])} | "
                                 f"{fmt(cpu)} |")
        lines.append("")
        last = s["rows"][-1]
        t1 = last[s["combine"]]["type1"]
        claims.append({"paper": "E-CIT", "claim": f"holds its level ({s['combine']} combination, type-I error "
                                                  f"<= {s['level']})",
                       "observed": f"{_ci(t1)} at n={last['n']} over {t1['n']} nulls",
                       "holds": level_verdict(t1, s["level"])})
        with_full = [r for r in s["rows"] if r.get("full_cpu_s")]
        if with_full:
            r = with_full[-1]
            claims.append({"paper": "E-CIT", "claim": "cheaper than the base test on all rows",
                           "observed": f"{fmt(r['ecit_cpu_s'])} vs {fmt(r['full_cpu_s'])} CPU s per test at n={r['n']} "
                                       f"({ratio(r['ecit_cpu_s'], r['full_cpu_s'])})",
                           "holds": "yes" if r["ecit_cpu_s"] < r["full_cpu_s"] else "no"})
            a, b = r[s["combine"]]["power"]["rate"], r["full"]["power"]["rate"]
            claims.append({"paper": "E-CIT", "claim": "power competitive with the base test on all rows",
                           "observed": f"{fmt(a)} vs {fmt(b)} at n={r['n']}", "holds": paired_verdict([a - b])})
    p = load_summary(pcs.run_dir) if pcs.ok else None
    if p:
        plots += copy_plots(p.get("plots", []), out, "ecit")
        lines += [f"PC on {p['graphs']} random DAG(s) (n={p['n']}, {p['data'].get('sem', '')} SEM), base "
                  f"**{p['base']}**; every E-CIT subset test ran on the pool's `cit` sampler. "
                  f"Source: `{pcs.run_dir}/summary.json`.", "",
                  "| PC with | SHD | skeleton F1 | CI tests | CPU s of tests |", "|---|---|---|---|---|"]
        for m, v in p["mean"].items():
            lines.append(f"| {m} | {fmt(v['shd'])} | {fmt(v['f1'])} | {fmt(v['tests'])} | {fmt(v['cpu_s'])} |")
        lines.append("")
        if "full" in p["methods"]:
            diffs = [e["shd"] - f["shd"] for e, f in zip(p["methods"]["ecit"], p["methods"]["full"])]
            claims.append({"paper": "E-CIT", "claim": "PC with E-CIT: SHD no worse than with the base test on all rows",
                           "observed": f"SHD {fmt(p['mean']['ecit']['shd'])} vs {fmt(p['mean']['full']['shd'])} at "
                                       f"{ratio(p['mean']['ecit']['cpu_s'], p['mean']['full']['cpu_s'])} the CPU",
                           "holds": paired_verdict(diffs, higher_is_better=False)})
    return lines, claims, plots


def check(tour_run: Path, report: str, data: dict) -> None:
    """The E-CIT tables' numbers are the runs' own, and the subset tests went through the pool."""
    import json
    assert "## E-CIT" in report and "cit" in data["pool"]["per_sampler"], data["pool"]["per_sampler"]
    s = json.loads((tour_run / "runs" / "ecit" / "ecit" / "summary.json").read_text())
    for row in s["rows"]:
        for m in METHOD_ROWS:
            if m in row:
                assert f"| {row['n']} | {m} | {_ci(row[m]['type1'])} | {_ci(row[m]['power'])} |" in report, (row, m)
    p = json.loads((tour_run / "runs" / "ecit_pc" / "ecit_pc" / "summary.json").read_text())
    for m, v in p["mean"].items():
        assert f"| {m} | {fmt(v['shd'])} | {fmt(v['f1'])} |" in report
    assert len([c for c in data["claims"] if c["paper"] == "E-CIT"]) >= 2
