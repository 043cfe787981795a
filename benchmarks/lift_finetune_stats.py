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


# ------------------------------------------------------------------------------------------ the study's report
# (``benchmarks/study/lift.py``): everything below reads the JSON records alone.

MAIN = ("lift", "sac_finetune", "sac_finetune_matched", "lift_stochastic", "mbpo_wm", "sac_deterministic")
APPENDIX = ("lift_prior_only", "lift_residual_only")
BASELINE = "sac_finetune"
FIXED = ("250", "500", "1000", "2000", "4000")
# (metric getter key, title, format, lower is better); "return_at.N" reads the return at N real steps
STUDY_METRICS = (
    ("real_steps_to_recover_censored", "real steps to 80 %", "{:.0f}", True),
    *((f"return_at.{n}", f"return @{n}", "{:.0f}", False) for n in FIXED),
    ("falls_per_1000", "falls / 1000 real steps", "{:.2f}", True),
    ("max_joint_excursion", "worst joint past stop (rad)", "{:.3f}", True),
    ("final_return", "final return", "{:.0f}", False),
    ("wm_heldout_1step_mean", "WM held-out 1-step error", "{:.4f}", True),
)
PAIRED = ("real_steps_to_recover_censored", "return_at.1000", "falls_per_1000", "final_return")
# the 2x2 (world model?, deterministic real actions?) at LIFT's SAC steps per real step
CELLS = {(True, True): "lift", (True, False): "lift_stochastic", (False, True): "sac_deterministic",
         (False, False): "sac_finetune_matched"}


def _get(record: dict, key: str) -> float | None:
    value: object = record["metrics"]
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(float(value)) else None


def by_seed(records: list[dict], change: str, method: str, key: str) -> dict[int, float]:
    """{seed: value} of the reported units of one change and method."""
    out = {}
    for r in records:
        if r["role"] == "report" and r["method"] == method and r["setting"].get("change") == change:
            value = _get(r, key)
            if value is not None:
                out[int(r["seed"])] = value
    return out


def paired_seeds(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, float]:
    return t_interval([a[s] - b[s] for s in a if s in b])


def _cell(stat: tuple[float, float, float], pattern: str) -> str:
    return fmt_interval(stat, pattern)


def method_table(records: list[dict], change: str, methods: tuple[str, ...]) -> list[str]:
    head = ["method", "seeds", "recovered"] + [t for _, t, _, _ in STUDY_METRICS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in methods:
        seeds = by_seed(records, change, m, "final_return")
        if not seeds:
            continue
        rec = by_seed(records, change, m, "real_steps_to_recover")
        cells = [m, str(len(seeds)), f"{len(rec)}/{len(seeds)}"]
        cells += [_cell(t_interval(list(by_seed(records, change, m, k).values())), p) for k, _, p, _ in STUDY_METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def versus(records: list[dict], change: str, method: str, baseline: str,
           keys: tuple[str, ...] = ("real_steps_to_recover_censored", "falls_per_1000")
           ) -> dict[str, tuple[float, float, float]]:
    """Seed-paired ``method`` − ``baseline`` per metric key, under one change."""
    return {k: paired_seeds(by_seed(records, change, method, k), by_seed(records, change, baseline, k)) for k in keys}


def paired_table(records: list[dict], change: str, methods: tuple[str, ...], baseline: str) -> list[str]:
    titles = {k: t for k, t, _, _ in STUDY_METRICS}
    fmts = {k: (p, lower) for k, _, p, lower in STUDY_METRICS}
    lines = [f"| method − {baseline} (seed-paired) | " + " | ".join(titles[k] for k in PAIRED) + " |",
             "|" + "---|" * (len(PAIRED) + 1)]
    for m in methods:
        if m == baseline or not by_seed(records, change, m, "final_return"):
            continue
        row = []
        for k, stat in versus(records, change, m, baseline, PAIRED).items():
            pattern, lower = fmts[k]
            row.append(f"{fmt_interval(stat, pattern)} {verdict(stat, lower)}" if math.isfinite(stat[0]) else "-")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    return lines


def two_by_two(records: list[dict], change: str, key: str) -> dict[str, tuple[float, float, float]]:
    """Seed-paired main effects of the 2x2: model (with − without, averaged over the action kind), deterministic
    real actions (deterministic − stochastic, averaged over model) and their interaction."""
    cell = {c: by_seed(records, change, m, key) for c, m in CELLS.items()}
    seeds = sorted(set.intersection(*(set(v) for v in cell.values()))) if all(cell.values()) else []
    v = {c: [cell[c][s] for s in seeds] for c in cell}
    model = [((v[(True, True)][i] - v[(False, True)][i]) + (v[(True, False)][i] - v[(False, False)][i])) / 2
             for i in range(len(seeds))]
    det = [((v[(True, True)][i] - v[(True, False)][i]) + (v[(False, True)][i] - v[(False, False)][i])) / 2
           for i in range(len(seeds))]
    inter = [(v[(True, True)][i] - v[(False, True)][i]) - (v[(True, False)][i] - v[(False, False)][i])
             for i in range(len(seeds))]
    return {"model": t_interval(model), "deterministic": t_interval(det), "interaction": t_interval(inter),
            "seeds": (float(len(seeds)),) * 3}


def study_curves(records: list[dict], change: str, method: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(real steps, returns (seeds, points)) of the reported units, seeds cut to the shortest curve."""
    per_seed = [(np.asarray(r["curves"]["real_steps"]), np.asarray(r["curves"]["eval_return"], dtype=float))
                for r in records if r["role"] == "report" and r["method"] == method
                and r["setting"].get("change") == change]
    if not per_seed:
        return None
    n = min(len(s) for s, _ in per_seed)
    return per_seed[0][0][:n], np.stack([v[:n] for _, v in per_seed])


def band_plot(ax, steps, values: np.ndarray, color: str, label: str) -> None:
    """Mean return over seeds (rows of ``values``) with its 95 % t-band."""
    band = np.array([t_interval(list(col)) for col in np.asarray(values, dtype=float).T])
    ax.plot(steps, band[:, 0], marker="o", ms=2, color=color, label=f"{label} ({len(values)})")
    if len(values) > 1:
        ax.fill_between(steps, band[:, 1], band[:, 2], color=color, alpha=0.12)


def recovery_panel(ax, gate: dict | None, xlabel: str) -> None:
    """A return-vs-real-steps panel's pre-change and 80 %-recovery lines (from the change's gate record) and axes."""
    if gate:
        pre, zero = gate["metrics"]["pre_change_return"], gate["metrics"]["zero_shot_return"]
        ax.axhline(pre, color="k", ls="--", lw=1, label="pre-change")
        ax.axhline(zero + 0.8 * (pre - zero), color="k", ls="-.", lw=0.7, label="80 % recovery")
        ax.set_title(gate["chosen"]["label"], fontsize=9)
    ax.set(xlabel=xlabel, ylabel="deterministic eval return")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)


def study_plot(records: list[dict], gates: dict[str, dict], changes: list[str], out: Path) -> None:
    """Per change: return vs real steps (mean and 95 % t-band over seeds) of the main methods, the pre-change and 80 %
    lines; last panel: falls per 1000 real steps per method and change (dots: seeds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(changes) + 1, figsize=(5 * (len(changes) + 1), 4))
    colors = {m: f"C{i}" for i, m in enumerate(MAIN + APPENDIX)}
    for ax, change in zip(axes, changes):
        for m in MAIN:
            c = study_curves(records, change, m)
            if c is None:
                continue
            band_plot(ax, c[0], c[1], colors[m], m)
        recovery_panel(ax, gates.get(change), "real env steps")
    ax = axes[-1]
    width = 0.8 / max(len(changes), 1)
    for j, change in enumerate(changes):
        for i, m in enumerate(MAIN):
            falls = list(by_seed(records, change, m, "falls_per_1000").values())
            if falls:
                x = i + (j - (len(changes) - 1) / 2) * width
                ax.bar(x, np.mean(falls), width=width, color=f"C{j}", alpha=0.6, label=change if i == 0 else None)
                ax.scatter([x] * len(falls), falls, color="k", s=6, zorder=3)
    ax.set_xticks(range(len(MAIN)), MAIN, fontsize=6, rotation=30, ha="right")
    ax.set_ylabel("real-env falls per 1000 steps")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle("LIFT finetuning on Walker2d-v5 (bands: 95 % t-interval over seeds)", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)




def _word(stat: tuple[float, float, float], good: str, bad: str) -> str:
    return {"better": good, "worse": bad}.get(verdict(stat, True), "n.s.")


def _reading(records: list[dict], change: str, label: str, effects: dict, n: int, tally: dict[str, list[str]]) -> str:
    """One change's reading: LIFT against SAC finetuning, against the matched control (same SAC steps per real step,
    no model, stochastic real actions), and which factor of the 2x2 carries a difference. ``tally`` collects, per
    finding, the changes where it holds, for the closing line."""
    steps_key, falls_key = "real_steps_to_recover_censored", "falls_per_1000"
    recovered = {m: (len(by_seed(records, change, m, "real_steps_to_recover")),
                     len(by_seed(records, change, m, "final_return"))) for m in ("lift", BASELINE)}
    base, matched = versus(records, change, "lift", BASELINE), versus(records, change, "lift", "sac_finetune_matched")
    for name, stat in (("fewer steps than sac_finetune", base[steps_key]), ("fewer falls than sac_finetune",
                       base[falls_key]), ("fewer steps than the matched control", matched[steps_key]),
                       ("fewer falls than the matched control", matched[falls_key]),
                       ("the model helps (steps)", effects[steps_key]["model"]),
                       ("the model helps (falls)", effects[falls_key]["model"]),
                       ("deterministic real actions help (steps)", effects[steps_key]["deterministic"]),
                       ("deterministic real actions help (falls)", effects[falls_key]["deterministic"])):
        if verdict(stat, True) == "better":
            tally.setdefault(name, []).append(label)
        elif verdict(stat, True) == "worse":
            tally.setdefault(f"not: {name}", []).append(label)
    none = " (neither recovered on any seed: the 4000-step budget on both sides)" if not (
        recovered["lift"][0] or recovered[BASELINE][0]) else ""
    e = {k: {f: f"{fmt_interval(effects[k][f], p)} {_word(effects[k][f], 'helps', 'hurts')}"
             for f in ("model", "deterministic")} for k, p in ((steps_key, "{:.0f}"), (falls_key, "{:.2f}"))}
    return (f"- **{label}** (recovered within 4000 real steps: lift {recovered['lift'][0]}/{recovered['lift'][1]}, "
            f"sac_finetune {recovered[BASELINE][0]}/{recovered[BASELINE][1]}). LIFT − sac_finetune: real steps to 80 % "
            f"{fmt_interval(base[steps_key], '{:.0f}')} {_word(base[steps_key], 'LIFT better', 'LIFT worse')}{none}, "
            f"falls per 1000 {fmt_interval(base[falls_key], '{:.2f}')} "
            f"{_word(base[falls_key], 'LIFT better', 'LIFT worse')}. LIFT − sac_finetune_matched (LIFT's SAC steps per "
            f"real step, no model, stochastic actions): real steps {fmt_interval(matched[steps_key], '{:.0f}')} "
            f"{_word(matched[steps_key], 'LIFT better', 'LIFT worse')}, falls "
            f"{fmt_interval(matched[falls_key], '{:.2f}')} {_word(matched[falls_key], 'LIFT better', 'LIFT worse')}. "
            f"2×2 (n = {n}; negative helps): the model, real steps {e[steps_key]['model']}, falls "
            f"{e[falls_key]['model']}; deterministic real actions, real steps {e[steps_key]['deterministic']}, falls "
            f"{e[falls_key]['deterministic']}.").replace("n.s..", "n.s.")


def _against_zero_shot(records: list[dict], change: str, label: str, zero_shot: float,
                       tally: dict[str, list[str]]) -> str:
    """Did finetuning beat not finetuning? Each method's final return (t-interval over seeds) against the pretrained
    policy's zero-shot return in the changed env, and how far the return fell in the first evaluations."""
    below, above, dips = [], [], []
    for m in MAIN:
        final = t_interval(list(by_seed(records, change, m, "final_return").values()))
        if not math.isfinite(final[0]):
            continue
        if final[2] < zero_shot:
            below.append(m)
        elif final[1] > zero_shot:
            above.append(m)
        at_250 = list(by_seed(records, change, m, "return_at.250").values())
        dips.append(float(np.mean(at_250)) if at_250 else math.nan)
    tally.setdefault("zero-shot", []).append(
        f"{label}: {len(below)} of {len(dips)} below, " + (f"{len(above)} above ({', '.join(above)})" if above
                                                            else "none above"))
    return (f"  - Against not finetuning at all (the pretrained policy zero-shot in the changed env: {zero_shot:.0f}): "
            f"final return above it (interval wholly above) for {', '.join(above) or 'no method'}; below it for "
            f"{', '.join(below) or 'no method'}." + (
                f" Return after 250 real steps: {np.nanmin(dips):.0f} to {np.nanmax(dips):.0f} across methods (seed "
                f"means)." if any(math.isfinite(d) for d in dips) else ""))


def _overall(tally: dict[str, list[str]], changes: int) -> list[str]:
    if not changes:
        return []

    def where(name: str) -> str:
        got = tally.get(name, [])
        return f"{len(got)} of {changes}" + (f" ({', '.join(got)})" if got else "")
    return [f"- **Over the {changes} change{'s' if changes > 1 else ''}**: LIFT needs fewer real steps than SAC "
            f"finetuning in {where('fewer steps than sac_finetune')} and falls less in {where('fewer falls than sac_finetune')}; "
            f"against the matched control, fewer steps in {where('fewer steps than the matched control')} and fewer "
            f"falls in {where('fewer falls than the matched control')}. In the 2×2 the model shortens recovery in "
            f"{where('the model helps (steps)')} and cuts falls in {where('the model helps (falls)')}; deterministic "
            f"real actions shorten recovery in {where('deterministic real actions help (steps)')} and cut falls in "
            f"{where('deterministic real actions help (falls)')}. The opposite, with an interval excluding 0: LIFT "
            f"slower than SAC finetuning in {where('not: fewer steps than sac_finetune')}, falling more in "
            f"{where('not: fewer falls than sac_finetune')}, the model lengthening "
            f"recovery in {where('not: the model helps (steps)')} and raising falls in "
            f"{where('not: the model helps (falls)')}, deterministic real actions lengthening it in "
            f"{where('not: deterministic real actions help (steps)')} and raising falls in "
            f"{where('not: deterministic real actions help (falls)')}. Where LIFT beats SAC finetuning but not the "
            f"matched control, the difference comes with LIFT's extra SAC steps per real step, not with its model or its "
            f"deterministic real actions."] + ([
            f"- **Against not finetuning at all** (methods whose final-return interval lies wholly below or above the "
            f"pretrained policy's zero-shot return in the changed env): {'; '.join(tally['zero-shot'])}. Below it, "
            f"4000 real steps of finetuning left the policy worse than no update, whatever the method."]
            if tally.get("zero-shot") else [])


def study_report(records: list[dict], out_dir: Path) -> str:
    """The RESULTS.md section of the LIFT study, and its plot in ``out_dir``, from the records alone."""
    from benchmarks.study.lift import CHANGES, STUDY, TUNE_CHANGE
    plan = STUDY.plan()
    done = {r["unit"] for r in records}
    gates = {r["setting"]["change"]: r for r in records if r["role"] == "gate"}
    stage = next((r for r in records if r["role"] == "stage"), None)
    reported = [u for u in plan if u.role == "report"]
    cpu_h = sum(r.get("cpu_s", 0.0) for r in records) / 3600
    lines = ["## LIFT finetuning on Walker2d: real steps, falls and the 2×2 (`python -m benchmarks.study lift report`)",
             "",
             "**Superseded** by 'LIFT finetuning as its authors run it' (`lift_official`, issue 36). This study ran a "
             "second copy of the finetuning loop that ignored `prefill_steps`, `wm_retrain_first` and "
             "`model_buffer_flush`, rebuilt the model buffer every epoch without real transitions, stopped the "
             "model's refit on its NLL and let observation noise reach the critic's target; its start model did not "
             "hold. Its records and this section stay as they were written.",
             "",
             f"Records: `benchmarks/studies/lift/records/` ({len(done)} of {len(plan)} units; reported units "
             f"{sum(u.name in done for u in reported)} of {len(reported)}), {cpu_h:.2f} core-hours spent. Command: "
             "`nice -n 19 python -m benchmarks.study lift run` (units), then `python -m benchmarks.study lift report`.",
             ""]
    if stage:
        m = stage["metrics"]
        errors = ", ".join(f"{k} {v.get('error_1step', float('nan')):.4f} / {v.get('error_10step', float('nan')):.3f}"
                           for k, v in m["stage2"].items())
        sha = next((r["start_sha"] for r in records if r.get("start_sha")), None) or "-"
        lines += [f"Start model (sha {sha[:12]}): Walker2d-v5 with a velocity "
                  f"command v* ~ U(0, 1.5), {m['env_steps']:,} env steps of in-process SAC ({m['updates']:,} updates, "
                  f"{m['chunks']} chunk(s), {m['replay_refills']} replay refill(s)), final evaluation return "
                  f"{m['final_eval_return']:.0f}. Stage-2 world models on the newest pretraining transitions, held-out "
                  f"1-/10-step error: {errors}.", ""]
    if gates:
        lines += ["Changes (gate units: the pretrained policy in the reference env vs zero-shot in the changed env; "
                  "a change it keeps >= 80 % under is replaced by the next rung):", "",
                  "| change | chosen | pre-change return | zero-shot | kept | rungs tried |", "|---|---|---|---|---|---|"]
        for c in CHANGES:
            g = gates.get(c)
            if g:
                gm = g["metrics"]
                tried = "; ".join(f"{t['label']}: {t['kept']:.0%}" for t in g["ladder"])
                flag = " (**none hurt it enough: strongest rung kept**)" if gm["too_weak"] else ""
                lines.append(f"| {c} | {gm['chosen']}{flag} | {gm['pre_change_return']:.0f} | "
                             f"{gm['zero_shot_return']:.0f} | {gm['kept']:.0%} | {tried} |")
        lines.append("")
    tunes = [r for r in records if r["role"] == "tune"]
    if tunes:
        from benchmarks.study.lift import GRID
        lines += [f"Coefficients: each main method on the same grid (tuning seed(s) >= 100, change {TUNE_CHANGE}, "
                  "1500 real steps; score = mean evaluation return over the run; the reported seeds use the best, "
                  "the ablations LIFT's):", "",
                  "| method | " + " | ".join(f"temperature {g['temperature']}, tau {g['tau']}" for g in GRID)
                  + " | chosen |", "|" + "---|" * (len(GRID) + 2)]
        for m in MAIN:
            scores = {}
            for r in tunes:
                if r["method"] == m:
                    i = GRID.index(r["coefficients"])
                    scores.setdefault(i, []).append(r["metrics"]["mean_return"])
            if not scores:
                continue
            means = {i: float(np.mean(v)) for i, v in scores.items()}
            best = max(means, key=means.get) if len(means) == len(GRID) else None
            cells = [f"{means[i]:.0f}" if i in means else "-" for i in range(len(GRID))]
            chosen = "pending" if best is None else f"temperature {GRID[best]['temperature']}, tau {GRID[best]['tau']}"
            lines.append(f"| {m} | " + " | ".join(cells) + f" | {chosen} |")
        lines.append("")
    readings: list[str] = []
    tally: dict[str, list[str]] = {}
    changes_read = 0
    for c in CHANGES:
        if not any(r["role"] == "report" and r["setting"].get("change") == c for r in records):
            continue
        label = gates[c]["chosen"]["label"] if c in gates else c
        lines += [f"### {label}", "", *method_table(records, c, MAIN), "",
                  *paired_table(records, c, MAIN, BASELINE), ""]
        effects = {k: two_by_two(records, c, k) for k in ("real_steps_to_recover_censored", "falls_per_1000")}
        n = int(effects["falls_per_1000"]["seeds"][0])
        lines += [f"2×2 at LIFT's SAC steps per real step (lift, lift_stochastic, sac_deterministic, "
                  f"sac_finetune_matched; {n} seed(s) with all four), seed-paired main effects:", "",
                  "| effect | real steps to 80 % | falls / 1000 real steps |", "|---|---|---|"]
        for e in ("model", "deterministic", "interaction"):
            s, f = effects["real_steps_to_recover_censored"][e], effects["falls_per_1000"][e]
            lines.append(f"| {e} | {fmt_interval(s, '{:.0f}')} | {fmt_interval(f, '{:.2f}')} |")
        lines.append("")
        if by_seed(records, c, "lift_prior_only", "final_return") or by_seed(records, c, "lift_residual_only",
                                                                            "final_return"):
            lines += ["Appendix (LIFT's model ablations, seeds 10-11):", "",
                      *method_table(records, c, ("lift", *APPENDIX)), ""]
        changes_read += 1
        readings.append(_reading(records, c, label, effects, n, tally))
        if c in gates:
            readings.append(_against_zero_shot(records, c, label, gates[c]["metrics"]["zero_shot_return"], tally))
    plot = out_dir / "lift_study.png"
    if any(r["role"] == "report" for r in records):
        study_plot(records, gates, [c for c in CHANGES if c in gates], plot)
        lines += [f"Plot: `benchmarks/studies/lift/{plot.name}` (return vs real steps per change, falls per method).", ""]
    lines += ["Reading (generated from the intervals above; a claim holds only where the seed-paired 95 % interval "
              "excludes 0; never-recovered runs count as the 4000-step budget, so step differences are bounds):", "",
              *(readings or ["- no reported units yet: nothing is claimed."]), *_overall(tally, changes_read), "",
              f"Limits: Walker2d-v5 after {stage['metrics']['env_steps'] if stage else '?':,} pretraining steps stands in "
              "for LIFT's humanoids; LIFT's schedule is cut to "
              "0.3 -> 1.3 SAC steps per real step (the paper: 20) and 4000 real steps; evaluation is 3 deterministic "
              "episodes every 250 real steps; the coefficients were tuned on one change and one seed."]
    return "\n".join(lines)
