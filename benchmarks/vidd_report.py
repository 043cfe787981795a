"""Tables and plots of a VIDD study (benchmarks/vidd_study.py records): tuning grid, the paper's protocol at the full
budget, the equal-budget view at each oracle-query milestone, and seed-paired differences with their verdicts."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks import vidd_study as study

CLAIMS = [  # (variant, baseline, metric, claimed direction): the paper's VIDD > DDPO / DDPP / standard FT on reward,
    # with lower NLL under the pretrained model
    *[(v, b, m, d) for v in ("vidd_alg1", "vidd_released", "vidd_hybrid")
      for b in ("ddpo", "ddpp", "standard_ft") for m, d in (("reward_median", +1), ("nll", -1))],
    ("vidd_hybrid", "vidd_hybrid_nodenom", "reward_median", +1),
]


def _fmt(mean: float, lo: float, hi: float, p: int = 3) -> str:
    return "-" if not np.isfinite(mean) else f"{mean:.{p}f} [{lo:.{p}f}, {hi:.{p}f}]"


def _point_at(record: dict, queries: int) -> dict | None:
    """The run's first evaluation at or after ``queries`` training queries (None if it never got there)."""
    for point in record["curve"]:
        if point["queries"] >= queries:
            return point
    return None


def _bon(report_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(report_dir.glob("best_of_n__seed*.json"))]


def tuning_table(tune_dir: Path) -> list[str]:
    records = study.load_records(tune_dir)
    if not records:
        return []
    chosen = study.select_setting(records)
    lines = ["| variant | grid | median reward / NLL per value (tuning seeds) | chosen |", "|---|---|---|---|"]
    for name, v in study.VARIANTS.items():
        rows = [r for r in records if r["variant"] == name]
        if not rows:
            continue
        cells = []
        for value in v.grid:
            finals = [r["final"] for r in rows if r["value"] == value]
            if finals:
                cells.append(f"{value:g}: {np.mean([f['reward_median'] for f in finals]):.3f} / "
                             f"{np.mean([f['nll'] for f in finals]):.1f}")
        lines.append(f"| {v.label} | {v.grid_key} | {'; '.join(cells)} | {chosen.get(name, '-'):g} |")
    return lines


def report_tables(out: Path, budgets: dict, reward_name: str, amortise_over: int = 10_000,
                  extra_metrics: tuple[str, ...] = ()) -> str:
    report_dir = out / "report"
    records = study.load_records(report_dir)
    bon = _bon(report_dir)
    lines = ["### Tuning (grid of 3 per variant, tuning seeds only)", "", *tuning_table(out / "tune"), ""]
    n_out = budgets["eval_samples"]
    budget = budgets["budget"]
    metric_cols = ["reward_median", "nll", "diversity", "validity", *extra_metrics]
    header = (f"| method | median {reward_name} | NLL (nats) | diversity | validity | "
              + "".join(f"{m} | " for m in extra_metrics)
              + "training queries | roll-in traj. | refreshes | queries / output sample | wall s |")
    lines += [f"### Paper protocol: fine-tuned to {budget} oracle queries, {n_out} fresh samples per seed "
              f"(mean over seeds [bootstrap 95 %]); queries per output sample = training / {amortise_over:,} + "
              f"inference", "", header, "|" + "---|" * (len(metric_cols) + 6)]

    def row(label: str, finals: list[dict], queries: str, traj: str, refresh: str, per_sample: str, wall: str) -> str:
        cells = [_fmt(*study.bootstrap_ci([f.get(m) for f in finals]), p=1 if m == "nll" else 3) for m in metric_cols]
        return f"| {label} | " + " | ".join(cells) + f" | {queries} | {traj} | {refresh} | {per_sample} | {wall} |"

    by_n = {}
    for rec in bon:
        for p in rec["points"]:
            by_n.setdefault(p["N"], []).append(p)
    if 1 in by_n:
        lines.append(row("pretrained", by_n[1], "0", "-", "-", "0", "-"))
    if 32 in by_n:
        lines.append(row("best-of-32 (inference time)", by_n[32], "0", "-", "-", "32", "-"))
    finals_of: dict[str, dict[int, dict]] = {}
    for name, v in study.VARIANTS.items():
        rows = [r for r in records if r["variant"] == name]
        if not rows:
            continue
        finals_of[name] = {r["seed"]: r["final"] for r in rows}
        q = np.mean([r["queries"] for r in rows])
        lines.append(row(f"{v.label} ({v.grid_key} {rows[0]['value']:g})", [r["final"] for r in rows], f"{q:.0f}",
                         f"{np.mean([r['trajectories'] for r in rows]):.0f}",
                         f"{np.mean([r['teacher_refreshes'] for r in rows]):.0f}",
                         f"{q / amortise_over:.2f}", f"{np.mean([r['wall_s'] for r in rows]):.0f}"))
    lines += ["", f"### Equal oracle budget: median {reward_name} after Q training queries; best-of-N with "
                  f"N = Q / {n_out} for {n_out} outputs (mean over seeds [bootstrap 95 %])", ""]
    milestones = [m for m in budgets["milestones"] if m >= n_out]
    lines += ["| method | " + " | ".join(f"Q = {m}" for m in milestones) + " |", "|---|" + "---|" * len(milestones)]
    cells = []
    for m in milestones:
        pts = by_n.get(m // n_out, [])
        cells.append(_fmt(*study.bootstrap_ci([p["reward_median"] for p in pts])) if pts else "-")
    lines.append("| best-of-N | " + " | ".join(cells) + " |")
    for name, v in study.VARIANTS.items():
        rows = [r for r in records if r["variant"] == name]
        if rows:
            cells = [_fmt(*study.bootstrap_ci([(_point_at(r, m) or {}).get("reward_median") for r in rows]))
                     for m in milestones]
            lines.append(f"| {v.label} | " + " | ".join(cells) + " |")
    lines += ["", "### Seed-paired differences at the full budget (mean [t 95 %], n seeds); a claim holds when the "
                  "interval excludes 0 in the claimed direction", "",
              "| claim | difference | verdict |", "|---|---|---|"]
    for a, b, metric, direction in CLAIMS:
        if a in finals_of and b in finals_of:
            mean, lo, hi, n = study.paired({s: f[metric] for s, f in finals_of[a].items()},
                                           {s: f[metric] for s, f in finals_of[b].items()})
            what = "higher median reward" if metric == "reward_median" else "lower NLL"
            p = 1 if metric == "nll" else 3
            lines.append(f"| {a} {what} than {b} | {mean:+.{p}f} [{lo:+.{p}f}, {hi:+.{p}f}], n={n} | "
                         f"{study.verdict(lo, hi, direction)} |")
    if 32 in by_n:
        bon32 = {p_seed["seed"]: next(p for p in p_seed["points"] if p["N"] == 32) for p_seed in bon}
        for a in ("vidd_alg1", "vidd_released", "vidd_hybrid", "ddpo"):
            if a in finals_of:
                mean, lo, hi, n = study.paired({s: f["reward_median"] for s, f in finals_of[a].items()},
                                               {s: p["reward_median"] for s, p in bon32.items()})
                lines.append(f"| {a} higher median reward than best-of-32 | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}], "
                             f"n={n} | {study.verdict(lo, hi, +1)} |")
    return "\n".join(lines)


def plot_curves(out: Path, budgets: dict, ylabel: str, title: str) -> list[str]:
    """Median reward vs training oracle queries and vs roll-in trajectories (mean over seeds, one line per variant),
    and NLL against median reward at the full budget (one point per seed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    report_dir = out / "report"
    records = study.load_records(report_dir)
    bon = _bon(report_dir)
    if not records:
        return []
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for i, (name, v) in enumerate(study.VARIANTS.items()):
        rows = [r for r in records if r["variant"] == name]
        if not rows:
            continue
        color = f"C{i}"
        for ax, x_key in ((axes[0], "queries"), (axes[1], "trajectories")):
            xs = sorted({p[x_key] for r in rows for p in r["curve"]})
            grid = np.array(budgets["milestones"]) if x_key == "queries" else None
            if grid is None:
                for j, r in enumerate(rows):
                    ax.plot([p[x_key] for p in r["curve"]], [p["reward_median"] for p in r["curve"]], color=color,
                            alpha=0.35, lw=1, label=v.label if j == 0 else None)
            else:
                ys = [np.mean([(_point_at(r, m) or {}).get("reward_median", np.nan) for r in rows]) for m in grid]
                ax.plot(grid, ys, marker="o", ms=3, color=color, label=v.label)
            del xs
        axes[2].scatter([r["final"]["reward_median"] for r in rows], [r["final"]["nll"] for r in rows], color=color,
                        s=18, label=v.label)
    if bon:
        ns = [p["N"] for p in bon[0]["points"]]
        ys = [np.mean([next(p for p in rec["points"] if p["N"] == n)["reward_median"] for rec in bon]) for n in ns]
        qs = [n * bon[0]["n_outputs"] for n in ns]
        axes[0].plot(qs, ys, ls="--", color="k", marker="s", ms=3, label=f"best-of-N ({bon[0]['n_outputs']} outputs, "
                                                                          "inference queries)")
        axes[0].axhline(ys[0], color="gray", ls=":", label="pretrained")
        axes[1].axhline(ys[0], color="gray", ls=":")
        pts32 = [next((p for p in rec["points"] if p["N"] == 32), None) for rec in bon]
        pts32 = [p for p in pts32 if p]
        axes[2].scatter([p["reward_median"] for p in pts32], [p["nll"] for p in pts32], color="k", marker="s", s=18,
                        label="best-of-32")
        pts1 = [rec["points"][0] for rec in bon]
        axes[2].scatter([p["reward_median"] for p in pts1], [p["nll"] for p in pts1], color="gray", marker="x", s=18,
                        label="pretrained")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("oracle queries (training; best-of-N: inference)")
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("roll-in / sampled trajectories (one line per seed)")
    axes[2].set_xlabel(f"{ylabel} (full budget)")
    axes[2].set_ylabel("NLL under p_pre (nats)")
    for ax in axes[:2]:
        ax.set_ylabel(ylabel)
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6.5)
    axes[2].legend(fontsize=6.5)
    fig.suptitle(title)
    fig.tight_layout()
    path = out / "vidd_curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]
