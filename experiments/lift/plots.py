"""The LIFT runs' figures: the pretraining learning curve and the finetuning recovery per method."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only: no display on cluster nodes
    import matplotlib.pyplot as plt
    return plt


def plot_learning_curve(df, out: Path, title: str) -> Path | None:
    """Evaluation return against env steps and against wall time (None when the run never evaluated)."""
    if "eval_return" not in df:
        return None
    ev = df.dropna(subset=["eval_return"])
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    axes[0].plot(ev["env_steps"], ev["eval_return"], marker="o")
    axes[0].set_xlabel("env steps")
    axes[1].plot(ev["wall_s"], ev["eval_return"], marker="o", color="C1")
    axes[1].set_xlabel("wall time (s)")
    for ax in axes:
        ax.set_ylabel("eval return (deterministic)")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_recovery(rows_by_method: Mapping[str, object], pre_change: float, zero_shot: float, out: Path,
                  title: str) -> Path:
    """Eval return vs real env steps per method (with the pre-change and zero-shot lines) and falls per method;
    ``rows_by_method``: each method's metric rows in order of real env steps."""
    plt = _pyplot()
    methods = list(rows_by_method)
    fig, (ax, ax_falls) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [2, 1]})
    for i, m in enumerate(methods):
        rows = rows_by_method[m].dropna(subset=["eval_return"])
        ax.plot(rows["real_env_steps"], rows["eval_return"], marker="o", color=f"C{i}", label=m)
        ax_falls.bar(i, float(rows["falls_total"].max()) if len(rows) else 0.0, color=f"C{i}")
    ax.axhline(pre_change, color="k", ls="--", lw=1, label="pre-change")
    ax.axhline(zero_shot, color="grey", ls=":", lw=1, label="zero-shot")
    ax.axhline(zero_shot + 0.8 * (pre_change - zero_shot), color="k", ls="-.", lw=0.7, alpha=0.5, label="80% recovery")
    ax.set_xlabel("real env steps")
    ax.set_ylabel("eval return (deterministic, changed env)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax_falls.set_xticks(range(len(methods)), methods)
    ax_falls.set_ylabel("real-env falls during finetuning")
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
