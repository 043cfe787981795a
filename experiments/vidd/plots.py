"""The VIDD experiment's figures: median reward against oracle queries, against the trajectory KL to the pretrained
model (the reward-closeness frontier), and sample quality (NLL, diversity)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from algos.vidd.config import METHODS


def plot_results(df, methods: list[str], pretrained: dict, summary: dict[str, dict | None], plots: Path,
                 title: str) -> list[str]:
    """``df``: the run's metrics; ``summary``: per method the final figures (driver.summarise). Returns the paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, m in enumerate(methods):
        ev = df[df["method_id"] == METHODS.index(m)].dropna(subset=["reward_median"]).sort_values("queries")
        ax.plot(ev["queries"], ev["reward_median"], marker="o", ms=3, label=m, color=f"C{i}")
    ax.axhline(pretrained["median_reward"], color="gray", ls="--", label="pretrained")
    ax.set_xlabel("oracle queries")
    reward_plot = _save_reward_figure(fig, ax, title, plots / "vidd_reward_vs_queries.png")

    kl_plot = _reward_vs_kl(df, methods, pretrained, plots, title)
    names = ["pretrained", *[m for m in methods if summary.get(m)]]
    values = [pretrained, *[summary[m] for m in names[1:]]]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, label in ((axes[0], "nll", "NELBO under the pretrained model (nats, lower = more natural)"),
                           (axes[1], "diversity", "diversity (higher = more diverse)")):
        ax.bar(range(len(names)), [v[key] if v[key] is not None else np.nan for v in values],
               color=[f"C{i}" if i else "gray" for i in range(len(names))])
        ax.set_xticks(range(len(names)), names, rotation=20)
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    quality_plot = plots / "vidd_quality.png"
    fig.savefig(quality_plot, dpi=110)
    plt.close(fig)
    return [str(reward_plot), *([str(kl_plot)] if kl_plot else []), str(quality_plot)]


def _reward_vs_kl(df, methods: list[str], pretrained: dict, plots: Path, title: str) -> Path | None:
    """Each method's evaluations on the reward-closeness plane (best-of-N at its KL bound); None without a KL column
    (a run from before the KL was measured)."""
    import matplotlib.pyplot as plt
    if "kl" not in df.columns:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, m in enumerate(methods):
        ev = df[df["method_id"] == METHODS.index(m)].dropna(subset=["reward_median", "kl"]).sort_values("queries")
        ax.plot(ev["kl"], ev["reward_median"], marker="o", ms=3, label=m, color=f"C{i}",
                ls="--" if m == "best_of_n" else "-")
    ax.scatter([0.0], [pretrained["median_reward"]], color="gray", zorder=3, label="pretrained")
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("KL(model || pretrained) along its own trajectories, nats (best-of-N: bound)")
    return _save_reward_figure(fig, ax, title, plots / "vidd_reward_vs_kl.png")


def _save_reward_figure(fig, ax, title: str, path: Path) -> Path:
    """The reward axis, title, grid and legend both reward figures share; written to ``path`` and closed."""
    import matplotlib.pyplot as plt
    ax.set_ylabel("median reward of samples")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
