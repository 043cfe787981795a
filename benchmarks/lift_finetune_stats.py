"""Statistics and figures of the LIFT finetuning benchmark (``benchmarks/lift_finetune.py``): per-method means with
95 % t-intervals over seeds, seed-paired differences against a baseline, the markdown table, and the plots (return
vs real steps, falls, the world model's held-out error per epoch)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

# (summary key, column title, format, lower is better)
METRICS = (
    ("real_steps_to_recover", "real steps to 80 %", "{:.0f}", True),
    ("falls_per_1000", "falls / 1000 real steps", "{:.2f}", True),
    ("max_joint_excursion", "worst joint past stop (rad)", "{:.3f}", True),
    ("max_joint_speed", "worst joint speed (rad/s)", "{:.1f}", True),
    ("final_return", "final return", "{:.0f}", False),
)


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of the mean with a Student-t interval; NaN interval below 2 values."""
    from scipy import stats
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(x.mean())
    if len(x) < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def metric_values(results: list[dict], method: str, key: str, censor: float | None = None) -> list[float | None]:
    """One value per seed (None if the method is missing); never-recovered seeds count as ``censor`` if given."""
    out = []
    for r in results:
        s = r["methods"].get(method)
        value = None if s is None else s.get(key)
        if value is None and key == "real_steps_to_recover" and s is not None and censor is not None:
            value = censor
        out.append(None if value is None else float(value))
    return out


def paired(results: list[dict], method: str, baseline: str, key: str, censor: float | None) -> tuple[float, ...]:
    """Seed-paired difference method − baseline: (mean, low, high) of the t-interval, over seeds with both."""
    a, b = metric_values(results, method, key, censor), metric_values(results, baseline, key, censor)
    return t_interval([x - y for x, y in zip(a, b) if x is not None and y is not None])


def fmt_interval(stat: tuple[float, float, float], pattern: str) -> str:
    mean, low, high = stat
    if not math.isfinite(mean):
        return "-"
    if not math.isfinite(low):
        return pattern.format(mean)
    return f"{pattern.format(mean)} [{pattern.format(low)}, {pattern.format(high)}]"


def verdict(stat: tuple[float, float, float], lower_is_better: bool) -> str:
    """'better'/'worse' when the paired interval excludes zero, else 'n.s.'."""
    _, low, high = stat
    if not (math.isfinite(low) and math.isfinite(high)):
        return "n.s."
    if high < 0:
        return "better" if lower_is_better else "worse"
    if low > 0:
        return "worse" if lower_is_better else "better"
    return "n.s."


def table(results: list[dict], methods: list[str], baseline: str, budget: float) -> str:
    """Markdown: per method mean [95 % t-interval] over seeds of each metric, the recovered count, and the seed-paired
    difference to ``baseline`` with its interval and whether it excludes zero. Never-recovered runs count as
    ``budget`` real steps (censored: a lower bound of the true cost)."""
    head = ["method", "recovered"] + [title for _, title, _, _ in METRICS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    diffs = ["| method − " + baseline + " (paired) | " + " | ".join(title for _, title, _, _ in METRICS) + " |",
             "|" + "---|" * (len(METRICS) + 1)]
    for m in methods:
        if not any(m in r["methods"] for r in results):
            continue
        rec = metric_values(results, m, "real_steps_to_recover")
        n = sum(r["methods"].get(m) is not None for r in results)
        cells = [m, f"{sum(v is not None for v in rec)}/{n}"]
        cells += [fmt_interval(t_interval(metric_values(results, m, key, budget)), pat) for key, _, pat, _ in METRICS]
        lines.append("| " + " | ".join(cells) + " |")
        if m != baseline:
            row = []
            for key, _, pat, lower in METRICS:
                stat = paired(results, m, baseline, key, budget)
                row.append(f"{fmt_interval(stat, pat)} {verdict(stat, lower)}" if math.isfinite(stat[0]) else "-")
            diffs.append(f"| {m} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n\n" + "\n".join(diffs)


def curves(results: list[dict], key: str = "eval_return") -> dict[str, dict[str, np.ndarray]]:
    """Per method: real steps (the shared evaluation schedule) and ``key`` (seeds, epochs), seeds cut to the shortest."""
    from cluster.metrics import read_metrics
    from experiments.lift.finetune import method_rows
    out: dict[str, dict[str, np.ndarray]] = {}
    frames = {r["run_dir"]: read_metrics(r["run_dir"]) for r in results}
    methods = list(dict.fromkeys(m for r in results for m in r["methods"]))
    for m in methods:
        per_seed = []
        for r in results:
            df = frames[r["run_dir"]]
            if m not in r["methods"] or key not in df:
                continue
            rows = method_rows(df, m).dropna(subset=[key])
            if len(rows):
                per_seed.append((rows["real_env_steps"].to_numpy(), rows[key].to_numpy()))
        if per_seed:
            n = min(len(steps) for steps, _ in per_seed)
            out[m] = {"steps": per_seed[0][0][:n], "values": np.stack([v[:n] for _, v in per_seed])}
    return out


def plot(results: list[dict], out: Path, title: str) -> None:
    """Return vs real env steps (mean and 95 % t-band over seeds) with the 80 % line; falls per 1000 real steps per
    method and seed; the world model's error on each epoch's fresh real data (1 step, stage-2 units)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax_falls, ax_wm) = plt.subplots(1, 3, figsize=(15, 4), gridspec_kw={"width_ratios": [2, 1, 1.3]})
    pre = float(np.mean([r["pre_change_return"] for r in results]))
    zero = float(np.mean([r["zero_shot_return"] for r in results]))
    methods = list(dict.fromkeys(m for r in results for m in r["methods"]))
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    for m, c in curves(results).items():
        band = np.array([t_interval(list(col)) for col in c["values"].T])
        ax.plot(c["steps"], band[:, 0], marker="o", ms=2, color=colors[m], label=m)
        if len(c["values"]) > 1:
            ax.fill_between(c["steps"], band[:, 1], band[:, 2], color=colors[m], alpha=0.12)
    ax.axhline(pre, color="k", ls="--", lw=1, label="pre-change (reference env)")
    ax.axhline(zero + 0.8 * (pre - zero), color="k", ls="-.", lw=0.7, alpha=0.6, label="80 % recovery")
    ax.set(xlabel="real env steps", ylabel="deterministic eval return")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    for i, m in enumerate(methods):
        falls = [v for v in metric_values(results, m, "falls_per_1000") if v is not None]
        ax_falls.bar(i, np.mean(falls) if falls else 0, color=colors[m], alpha=0.8)
        ax_falls.scatter([i] * len(falls), falls, color="k", s=8, zorder=3)
    ax_falls.set_xticks(range(len(methods)), methods, fontsize=6, rotation=30, ha="right")
    ax_falls.set_ylabel("real-env falls per 1000 steps")
    ax_falls.grid(alpha=0.3, axis="y")
    for key, style in (("wm_heldout_error_1step", "-"), ("wm_stage2_heldout_error_1step", ":")):
        for m, c in curves(results, key).items():
            label = m if style == "-" else f"{m} (stage-2 model, frozen)"
            ax_wm.plot(c["steps"], np.nanmean(c["values"], 0), style, color=colors[m], label=label)
    ax_wm.set(xlabel="real env steps", ylabel="1-step error on the epoch's fresh real data", yscale="log")
    ax_wm.legend(fontsize=5)
    ax_wm.grid(alpha=0.3)
    fig.suptitle(f"{title}, {len(results)} seed(s) (bands: 95 % t-interval over seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def wm_table(results: list[dict]) -> str:
    """Markdown: per model-based method, the world model's 1- and 10-step error on each epoch's fresh real data
    (mean over seeds; stage-2 units) at the first and the last epoch, against the frozen stage-2 model's."""
    lines = ["| method | 1-step error, first epoch | last epoch | frozen stage-2 model, last epoch | 10-step error, "
             "first epoch | last epoch | frozen stage-2 model, last epoch |", "|---|---|---|---|---|---|---|"]
    ones, stage2_ones = curves(results, "wm_heldout_error_1step"), curves(results, "wm_stage2_heldout_error_1step")
    tens, stage2_tens = curves(results, "wm_heldout_error_10step"), curves(results, "wm_stage2_heldout_error_10step")
    for m, c in ones.items():
        one = np.nanmean(c["values"], 0)
        ten = np.nanmean(tens[m]["values"], 0) if m in tens else [np.nan]
        s_one = np.nanmean(stage2_ones[m]["values"], 0)[-1] if m in stage2_ones else np.nan
        s_ten = np.nanmean(stage2_tens[m]["values"], 0)[-1] if m in stage2_tens else np.nan
        lines.append(f"| {m} | {one[0]:.4f} | {one[-1]:.4f} | {s_one:.4f} | {ten[0]:.3f} | {ten[-1]:.3f} | "
                     f"{s_ten:.3f} |")
    return "\n".join(lines)
