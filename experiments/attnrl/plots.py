"""Plots of an AttnRL run: greedy accuracy against generated tokens, and accuracy by difficulty (SFT and methods)."""
from __future__ import annotations

from pathlib import Path

from algos.attnrl.config import METHODS


def plot_results(run_path: Path, df, summary: dict) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in summary["methods"]:
        ev = df[df["method_id"] == METHODS.index(m)].dropna(subset=["eval_accuracy"])
        ax.plot(ev["generated_tokens"], ev["eval_accuracy"], marker="o", label=m)
    ax.set_xlabel("generated tokens")
    ax.set_ylabel("greedy accuracy (eval set)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = run_path / "plots" / "attnrl_accuracy_vs_tokens.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    out.append(str(path))

    series = {"sft": summary["sft"]["accuracy_by_difficulty"]} | {
        m: s["accuracy_by_difficulty"] for m, s in summary["methods"].items()}
    diffs = sorted({d for v in series.values() for d in v}, key=int)
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(series)
    for i, (name, accs) in enumerate(series.items()):
        ax.bar([j + i * width for j in range(len(diffs))], [accs.get(d, 0.0) for d in diffs], width, label=name)
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(diffs))], diffs)
    ax.set_xlabel("difficulty (steps)")
    ax.set_ylabel("greedy accuracy")
    ax.legend()
    fig.tight_layout()
    path = run_path / "plots" / "attnrl_accuracy_by_difficulty.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    out.append(str(path))
    return out
