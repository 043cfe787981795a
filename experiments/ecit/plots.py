"""E-CIT figures: type-I error and power against n, CPU time per test against n (log axes), and PC's SHD / F1."""
from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_calibration(rows: list[dict], exp, plots: Path) -> list[str]:
    plt = _plt()
    plots.mkdir(parents=True, exist_ok=True)
    ns = [r["n"] for r in rows]
    methods = [*exp.combiners, "one_subset", "full"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, title in ((axes[0], "type1", "type-I error"), (axes[1], "power", "power")):
        for i, m in enumerate(methods):
            pts = [(r["n"], r[m][key]) for r in rows if m in r]
            if not pts:
                continue
            x = [p[0] for p in pts]
            y = [p[1]["rate"] for p in pts]
            err = [[p[1]["rate"] - p[1]["low"] for p in pts], [p[1]["high"] - p[1]["rate"] for p in pts]]
            ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2, label=m, color=f"C{i}",
                        ls="--" if m in ("one_subset", "full") else "-")
        if key == "type1":
            ax.axhline(exp.level, color="gray", ls=":", label=f"level {exp.level}")
        ax.set_xscale("log")
        ax.set_xlabel("n (rows)")
        ax.set_title(f"{title} at level {exp.level} ({exp.base}, m={exp.subset_size}, {exp.reps} reps)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    error_plot = plots / "ecit_error_power.png"
    fig.savefig(error_plot, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    ax.plot(ns, [r["ecit_cpu_s"] for r in rows], marker="o", label=f"E-CIT (m={exp.subset_size})")
    full = [(r["n"], r["full_cpu_s"]) for r in rows if r.get("full_cpu_s") is not None]
    if full:
        ax.plot([f[0] for f in full], [f[1] for f in full], marker="s", label=f"{exp.base} on all rows")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("n (rows)")
    ax.set_ylabel("CPU seconds per test")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    time_plot = plots / "ecit_time.png"
    fig.savefig(time_plot, dpi=110)
    plt.close(fig)
    return [str(error_plot), str(time_plot)]


def plot_pc(results: dict[str, list[dict]], plots: Path, title: str) -> str:
    """``results``: method -> one dict per graph with shd, f1, cpu_s."""
    plt = _plt()
    plots.mkdir(parents=True, exist_ok=True)
    names = list(results)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for ax, key, label in ((axes[0], "shd", "SHD to the true CPDAG (lower is better)"),
                           (axes[1], "f1", "skeleton F1 (higher is better)"),
                           (axes[2], "cpu_s", "CPU seconds of CI tests")):
        for i, name in enumerate(names):
            values = [g[key] for g in results[name]]
            ax.bar(i, sum(values) / len(values), color=f"C{i}")
            ax.scatter([i] * len(values), values, color="k", s=8, zorder=3)
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = plots / "ecit_pc.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
