"""Tables, seed-paired statistics, curves and the RESULTS.md section of benchmarks/attnrl.py's study.

Numbers are taken at the matched token count of each seed (the smallest final total among its methods); the
primary metric is the sampled accuracy on the longest problems, averaged over the last quarter of the matched range
(the interpolated curve at six points in [0.75, 1] x tokens) so that one evaluation's jitter does not decide.
Differences are seed-paired: mean, 95 % t-interval and 95 % bootstrap percentile interval over seeds; a claim
holds only when the t-interval excludes zero in the claimed direction.
"""
from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

from algos.attnrl.config import METHODS

PRIMARY = "sampled_longest"
SECTION_TITLE = "## AttnRL and its controls on programs where attention can choose (`benchmarks/attnrl.py`)"
OLD_TITLES = ("## AttnRL vs GRPO vs entropy branching at equal generated tokens (`benchmarks/attnrl.py`)",)
# (a, b, claim): "a - b > 0" is the claimed direction
COMPARISONS = [("attnrl", "grpo", "AttnRL ahead of GRPO"),
               ("attnrl", "entropy_tree", "AttnRL ahead of entropy branching (TreeRL)"),
               ("attn_tree", "entropy_tree", "attention branching alone ahead of entropy branching"),
               ("attnrl", "attn_tree", "ADS + off-policy add to attention branching"),
               ("attn_tree", "earliest_tree", "FCI ahead of the two earliest steps"),
               ("attn_tree", "random_tree", "FCI ahead of random steps"),
               ("oracle_tree", "random_tree", "the cone oracle ahead of random steps"),
               ("oracle_tree", "attn_tree", "the cone oracle ahead of FCI"),
               ("entropy_tree", "grpo", "entropy branching ahead of GRPO")]
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 14: 2.145, 19: 2.093, 29: 2.045}


def t_quantile(df: int) -> float:
    return T_975.get(df) or T_975[max(k for k in T_975 if k <= df)] if df >= 1 else float("nan")


def interpolate(curve: list[dict], tokens: float, key: str) -> float:
    """``key`` of the curve at ``tokens`` generated tokens (linear between evaluations)."""
    for a, b in zip(curve, curve[1:]):
        if a["tokens"] <= tokens <= b["tokens"]:
            w = (tokens - a["tokens"]) / max(b["tokens"] - a["tokens"], 1)
            return (1 - w) * a[key] + w * b[key]
    return curve[-1][key] if tokens >= curve[-1]["tokens"] else curve[0][key]


def late_mean(curve: list[dict], tokens: float, key: str, points: int = 6) -> float:
    """Mean of the interpolated curve over [0.75, 1] x ``tokens``."""
    return statistics.fmean(interpolate(curve, tokens * (0.75 + 0.25 * i / (points - 1)), key)
                            for i in range(points))


def paired(a: list[float], b: list[float], resamples: int = 10_000, seed: int = 0) -> dict:
    """Seed-paired differences a - b: mean, 95 % t-interval and bootstrap percentile interval."""
    d = [x - y for x, y in zip(a, b)]
    n = len(d)
    mean = statistics.fmean(d)
    half = t_quantile(n - 1) * statistics.stdev(d) / n ** 0.5 if n > 1 else float("inf")
    rng = random.Random(seed)
    boot = sorted(statistics.fmean(rng.choices(d, k=n)) for _ in range(resamples))
    return {"diffs": d, "mean": mean, "t_low": mean - half, "t_high": mean + half,
            "boot_low": boot[int(0.025 * resamples)], "boot_high": boot[int(0.975 * resamples) - 1]}


def ms(values: list[float], fmt: str = ".3f") -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:{fmt}}"
    return f"{statistics.fmean(values):{fmt}} ± {statistics.stdev(values):{fmt}}"


def select(runs: list[dict], tag: str, seeds: list[int] | None) -> dict[str, dict[int, dict]]:
    """runs[method][seed] for one tag; only seeds that every present method has (pairing needs them)."""
    by: dict[str, dict[int, dict]] = {}
    for r in runs:
        if r.get("tag", "") == tag and (not seeds or r["seed"] in seeds):
            by.setdefault(r["method"], {})[r["seed"]] = r
    common = set.intersection(*(set(v) for v in by.values())) if by else set()
    return {m: {s: r for s, r in v.items() if s in common} for m, v in by.items()}


def tables(saved: dict, tag: str = "", seeds: list[int] | None = None) -> tuple[list[str], dict]:
    by = select(saved["runs"], tag, seeds)
    methods = [m for m in METHODS if m in by]
    seed_list = sorted(next(iter(by.values()))) if by else []
    matched = {s: min(by[m][s]["generated_tokens"] for m in methods) for s in seed_list}
    sft = saved["sft"]
    diffs = sorted(sft["by_difficulty"], key=int)
    per_seed = {m: [late_mean(by[m][s]["curve"], matched[s], PRIMARY) for s in seed_list] for m in methods}
    lines = ["| method | **sampled acc., longest** (last quarter) | greedy acc., longest | greedy acc., all | " +
             " | ".join(f"greedy d={d}" for d in diffs) + " | updates | optimizer steps | generated tokens |",
             "|---" * (len(diffs) + 7) + "|",
             f"| SFT | {sft[PRIMARY]:.3f} | {sft['greedy_longest']:.3f} | {sft['greedy']:.3f} | " +
             " | ".join(f"{sft['by_difficulty'][d]:.3f}" for d in diffs) + " | 0 | 0 | 0 |"]
    for m in methods:
        rs = [by[m][s] for s in seed_list]
        late = lambda key: [late_mean(r["curve"], matched[r["seed"]], key) for r in rs]  # noqa: E731
        by_d = [ms([late_mean([{**c, "v": c["by_difficulty"][d]} for c in r["curve"]], matched[r["seed"]], "v")
                    for r in rs]) for d in diffs]
        lines.append(f"| {m} | {ms(per_seed[m])} | {ms(late('greedy_longest'))} | {ms(late('greedy'))} | " +
                     " | ".join(by_d) + f" | {ms(late('updates'), '.0f')} | {ms(late('optimizer_steps'), '.0f')} | "
                     f"{ms([r['generated_tokens'] for r in rs], '.0f')} |")
    lines += ["", "| comparison (a - b) | claim | per seed | mean | 95 % t-interval | 95 % bootstrap | holds |",
              "|---|---|---|---|---|---|---|"]
    stats = {}
    for a, b, claim in COMPARISONS:
        if a not in per_seed or b not in per_seed or len(seed_list) < 2:
            continue
        p = paired(per_seed[a], per_seed[b])
        stats[(a, b)] = p
        holds = "yes" if p["t_low"] > 0 else ("no (reversed)" if p["t_high"] < 0 else "no (interval spans 0)")
        lines.append(f"| {a} - {b} | {claim} | {', '.join(f'{x:+.3f}' for x in p['diffs'])} | {p['mean']:+.3f} | "
                     f"[{p['t_low']:+.3f}, {p['t_high']:+.3f}] | [{p['boot_low']:+.3f}, {p['boot_high']:+.3f}] | "
                     f"{holds} |")
    lines += ["", "| method | updates to reach GRPO's final accuracy (per seed) | train wall s | generated tokens per "
                  "train CPU-s | valid-prompt ratio | valid trained tokens per generated token | max prompts/batch |",
              "|---|---|---|---|---|---|---|"]
    for m in methods:
        rs = [by[m][s] for s in seed_list]
        reach = []
        for r in rs:
            target = per_seed["grpo"][seed_list.index(r["seed"])] if "grpo" in per_seed else None
            hit = next((c for c in r["curve"][1:] if target is not None and c[PRIMARY] >= target), None)
            reach.append("never" if hit is None else f"{hit['updates']} / {hit['tokens'] / 1000:.0f}k")
        lines.append(f"| {m} | {', '.join(reach)} | {ms([r['train_wall_s'] for r in rs], '.0f')} | "
                     f"{ms([r['generated_tokens'] / r['train_cpu_s'] for r in rs], '.0f')} | "
                     f"{ms([r['valid_ratio'] for r in rs], '.2f')} | {ms([r['valid_token_ratio'] for r in rs], '.2f')} | "
                     f"{ms([r['max_prompts'] for r in rs], '.0f')} |")
    return lines, {"per_seed": per_seed, "matched": matched, "seeds": seed_list, "stats": stats, "by": by}


def diagnostic_lines(diag: dict) -> list[str]:
    s = diag["summary"]
    lines = [f"Branching the SFT model at every step ({s['responses']} sampled responses with the program's line "
             f"count, reward {s['reward']:.3f}; candidates = computation steps after the first):", "",
             "| steps | n | in cone | outcome-flip rate | mixed-outcome groups |", "|---|---|---|---|---|"]
    for name in ("all", "cone", "distractor"):
        x = s[name]
        lines.append(f"| {name} | {x['n']} | {x['in_cone']:.2f} | {x['flip']:.3f} | {x['mixed']:.3f} |")
    lines += ["", "| rank correlation (mean per response) | Spearman | responses |", "|---|---|---|"]
    for k, v in s["spearman"].items():
        lines.append(f"| {k} | {v:+.3f} | {s['spearman_n'][k]} |")
    lines += ["", "| branch points picked by (N = 2) | in cone | flip rate | mixed groups |", "|---|---|---|---|"]
    for k, v in s["rules"].items():
        lines.append(f"| {k} | {v['in_cone']:.2f} | {v['flip']:.3f} | {v['mixed']:.3f} |")
    lines.append("")
    lines.append("ATB picks exactly the two earliest steps after the first in " + ", ".join(
        f"{100 * v:.0f} % (delta {d})" for d, v in s["atb_equals_earliest"].items()) + " of the responses.")
    return lines


def plot(info: dict, sft: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by, matched = info["by"], info["matched"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for i, m in enumerate(by):
        rs = list(by[m].values())
        top = min(matched.values())
        grid = [top * k / 20 for k in range(21)]
        mean_curve = [statistics.fmean(interpolate(r["curve"], t, PRIMARY) for r in rs) for t in grid]
        axes[0].plot(grid, mean_curve, color=f"C{i}", lw=2 if m in ("attnrl", "grpo") else 1.2, label=m)
        ups = max(r["curve"][-1]["updates"] for r in rs)
        ugrid = [ups * k / 20 for k in range(21)]
        upd_curve = [statistics.fmean(_by_updates(r["curve"], u) for r in rs) for u in ugrid]
        axes[1].plot(ugrid, upd_curve, color=f"C{i}", lw=2 if m in ("attnrl", "grpo") else 1.2, label=m)
    for ax, xl in zip(axes, ("generated tokens", "updates (policy-update rounds)")):
        ax.axhline(sft[PRIMARY], color="0.5", ls=":", lw=1, label="SFT")
        ax.set_xlabel(xl)
        ax.set_ylabel("sampled accuracy, longest problems (mean over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[1].set_xscale("symlog", linthresh=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _by_updates(curve: list[dict], updates: float) -> float:
    for a, b in zip(curve, curve[1:]):
        if a["updates"] <= updates <= b["updates"]:
            w = (updates - a["updates"]) / max(b["updates"] - a["updates"], 1)
            return (1 - w) * a[PRIMARY] + w * b[PRIMARY]
    return curve[-1][PRIMARY]


def report(saved: dict, args) -> str:
    lines, info = tables(saved, args.tag, args.seeds or None)
    text = "\n".join(lines)
    if "diagnostic" in saved:
        text = "\n".join(diagnostic_lines(saved["diagnostic"])) + "\n\n" + text
    print(text)
    if info["by"]:
        plot(info, saved["sft"], Path(args.plot))
    if args.record:
        record(Path(args.record), text, args, info)
    return text


def record(path: Path, body: str, args, info: dict) -> None:
    """Replace this benchmark's section of ``path`` (re-read right before writing: others edit their sections)."""
    cmd = "OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.attnrl " + " ".join(sys.argv[1:])
    reading = Path(args.reading).read_text() if getattr(args, "reading", None) else ""
    section = f"{SECTION_TITLE}\n\nCommand (repo root): `{cmd}`\n\n{body}\n\nPlot: `{args.plot}`.\n\n{reading}".rstrip()
    text = path.read_text()
    titles = (SECTION_TITLE, *OLD_TITLES)
    start = next((text.index(t) for t in titles if t in text), None)
    if start is None:
        text = text.rstrip() + "\n\n" + section + "\n"
    else:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + "\n" + ("\n" + text[end + 1:] if end != -1 else "")
    path.write_text(text)
