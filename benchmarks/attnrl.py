"""AttnRL vs GRPO vs entropy-based tree branching at an equal generated-token budget (tiny GPT, DAG arithmetic).

    OMP_NUM_THREADS=1 python -m benchmarks.attnrl --seeds 0 1 2 --budget 500000 --record out.md
    OMP_NUM_THREADS=1 python -m benchmarks.attnrl --quick           # about a minute: small budget, one seed

Every method starts from the same SFT model (algos.attnrl.sft, cached under --cache) and trains with
algos.attnrl.train.train (in-process sampler: the algorithm is what is compared here; the cluster wiring is
experiments/attnrl/) for about the same number of generated tokens (every generation call counted: initial
samples, continuations). A run
can only stop at an update boundary, and a tree update costs several thousand tokens, so runs end at slightly
different totals: all comparisons are made at a *matched* token count, the smallest final total among the methods
of a seed, with every accuracy curve linearly interpolated there.

Greedy accuracy on a fixed evaluation set (--eval-per-difficulty problems per difficulty) is measured about every
--eval-tokens generated tokens (at the first update past each mark) and at the end. Reported per method (mean ± std
over seeds): accuracy and accuracy by difficulty at matched tokens, final avg@4 at temperature 0.6, updates and
optimizer steps, training wall time (evaluations excluded), valid-prompt ratio, valid-token ratio, and the updates
and tokens each method needs to reach GRPO's accuracy at the matched token count.
"""
from __future__ import annotations

import argparse
import copy
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import torch

from algos.attnrl.config import METHODS, RLConfig
from algos.attnrl.train import train
from algos.attnrl.gpt import GPTConfig
from algos.attnrl.sft import SFTConfig, evaluate_accuracy, pretrained_policy
from envs.reasoning.task import ReasoningTask

log = logging.getLogger("benchmarks.attnrl")


def run_one(method: str, seed: int, sft, task, problems, budget: int, eval_tokens: int,
            prompts_per_batch: int) -> dict:
    """One RL run; the accuracy curve is a list of (updates, optimizer steps, generated tokens, accuracy,
    accuracy by difficulty) points, starting at the SFT model."""
    policy, ref = copy.deepcopy(sft), copy.deepcopy(sft)

    def point(updates: int, opt_steps: int, tokens: int) -> tuple:
        ev = evaluate_accuracy(policy, task, problems)
        return updates, opt_steps, tokens, ev.accuracy, {str(d): a for d, a in ev.by_difficulty.items()}

    curve = [point(0, 0, 0)]
    state = {"next_eval": eval_tokens, "eval_s": 0.0, "opt_steps": 0}

    def log_fn(m: dict) -> None:
        state["opt_steps"] += m.get("optimizer_steps", 0)
        if m["generated_tokens"] >= state["next_eval"]:
            t = time.perf_counter()
            curve.append(point(m["update"], state["opt_steps"], m["generated_tokens"]))
            state["eval_s"] += time.perf_counter() - t
            while state["next_eval"] <= m["generated_tokens"]:
                state["next_eval"] += eval_tokens

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    out = train(method, policy, ref, task, RLConfig(token_budget=budget, seed=seed,
                                                    prompts_per_batch=prompts_per_batch), log_fn=log_fn)
    wall = time.perf_counter() - t0 - state["eval_s"]
    cpu = time.process_time() - cpu0 - state["eval_s"]  # evaluations are single-threaded, so wall ~ CPU there
    if curve[-1][0] != out["updates"]:
        curve.append(point(out["updates"], state["opt_steps"], out["generated_tokens"]))
    sampled = evaluate_accuracy(policy, task, problems * 4, temperature=0.6,
                                generator=torch.Generator().manual_seed(0)).accuracy
    hist = out["history"]
    return {"method": method, "seed": seed, "updates": out["updates"], "optimizer_steps": state["opt_steps"],
            "generated_tokens": out["generated_tokens"], "train_wall_s": wall, "train_cpu_s": cpu,
            "avg4_t06": sampled, "max_prompts": max((h["prompts"] for h in hist), default=0),
            "valid_ratio": statistics.fmean(h["valid_prompt_ratio"] for h in hist) if hist else float("nan"),
            "valid_token_ratio": sum(h["valid_train_tokens"] for h in hist) / max(out["generated_tokens"], 1),
            "curve": curve}


def interpolate(curve: list, tokens: float, key=lambda c: c[3]):
    """Value of ``key`` on the accuracy curve at ``tokens`` generated tokens (linear between evaluations)."""
    for a, b in zip(curve, curve[1:]):
        if a[2] <= tokens <= b[2]:
            w = (tokens - a[2]) / max(b[2] - a[2], 1)
            return (1 - w) * key(a) + w * key(b)
    return key(curve[-1]) if tokens >= curve[-1][2] else key(curve[0])


def late_accuracy(curve: list, tokens: float, key=lambda c: c[3], points: int = 6) -> float:
    """Mean of the interpolated curve over the last quarter of ``tokens`` ([0.75, 1] x tokens): the end-of-run
    accuracy with the evaluation-to-evaluation jitter of a single point averaged out."""
    return statistics.fmean(interpolate(curve, tokens * (0.75 + 0.25 * i / (points - 1)), key)
                            for i in range(points))


def smoothed(curve: list, window: int = 3) -> list:
    """The curve with each accuracy replaced by the trailing mean over ``window`` evaluations (SFT point kept)."""
    out = [curve[0]]
    for i in range(1, len(curve)):
        accs = [c[3] for c in curve[max(1, i - window + 1):i + 1]]
        out.append((*curve[i][:3], statistics.fmean(accs), *curve[i][4:]))
    return out


def first_reach(curve: list, target: float) -> tuple | None:
    """(updates, optimizer steps, tokens) at the first evaluation where the smoothed accuracy (trailing mean of
    three evaluations, so one lucky evaluation does not count) is >= target."""
    for c in smoothed(curve)[1:]:
        if c[3] >= target - 1e-9:
            return c[0], c[1], c[2]
    return None


def updates_at(curve: list, tokens: float, index: int = 0) -> float:
    """Updates (index 0) or optimizer steps (index 1) spent when ``tokens`` were generated (interpolated)."""
    return interpolate(curve, tokens, key=lambda c: c[index])


def mean_std(values: list, fmt: str = ".3f") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:{fmt}}"
    return f"{statistics.fmean(values):{fmt}} ± {statistics.stdev(values):{fmt}}"


def matched_tokens(results: list[dict]) -> dict[int, int]:
    """Per seed: the smallest final token count among the methods (every method has a curve up to there)."""
    out: dict[int, int] = {}
    for r in results:
        out[r["seed"]] = min(out.get(r["seed"], r["generated_tokens"]), r["generated_tokens"])
    return out


def summarise(results: list[dict], sft_eval) -> tuple[str, str, dict]:
    """Two Markdown tables (accuracy; cost) and the numbers the verdict needs."""
    matched = matched_tokens(results)
    by_method = {m: [r for r in results if r["method"] == m] for m in METHODS}
    diffs = sorted(sft_eval.by_difficulty)
    grpo_at = {r["seed"]: late_accuracy(r["curve"], matched[r["seed"]]) for r in by_method["grpo"]}
    acc_lines = ["| method | accuracy at matched tokens (point) | last-quarter mean | " +
                 " | ".join(f"d={d} (last quarter)" for d in diffs) +
                 " | final avg@4, T=0.6 | generated tokens (end of run) |",
                 "|---" * (len(diffs) + 5) + "|",
                 f"| SFT | {sft_eval.accuracy:.3f} | {sft_eval.accuracy:.3f} | " +
                 " | ".join(f"{sft_eval.by_difficulty[d]:.3f}" for d in diffs) + f" | {sft_eval.sampled:.3f} | 0 |"]
    cost_lines = ["| method | updates at matched tokens | optimizer steps at matched tokens | "
                  "updates / tokens to reach GRPO's last-quarter accuracy (per seed) | train wall s (whole run) | "
                  "generated tokens per train CPU-s | valid-prompt ratio | valid trained tokens per generated token | "
                  "max prompts per batch |",
                  "|---" * 9 + "|"]
    key = {}
    for m, rs in by_method.items():
        point = [interpolate(r["curve"], matched[r["seed"]]) for r in rs]
        acc = [late_accuracy(r["curve"], matched[r["seed"]]) for r in rs]
        reach = [first_reach(r["curve"], grpo_at[r["seed"]]) for r in rs]
        upd = [updates_at(r["curve"], matched[r["seed"]]) for r in rs]
        opt = [updates_at(r["curve"], matched[r["seed"]], 1) for r in rs]
        key[m] = {"accuracy": statistics.fmean(acc), "accuracy_per_seed": acc, "point_per_seed": point,
                  "reach": reach, "updates": upd, "optimizer_steps": opt, "matched": [matched[r["seed"]] for r in rs]}
        by_d = [mean_std([late_accuracy(r["curve"], matched[r["seed"]], key=lambda c, d=d: c[4][str(d)])
                          for r in rs]) for d in diffs]
        acc_lines.append(f"| {m} | {mean_std(point)} | {mean_std(acc)} | " + " | ".join(by_d) +
                         f" | {mean_std([r['avg4_t06'] for r in rs])} | "
                         f"{mean_std([r['generated_tokens'] for r in rs], '.0f')} |")
        reach_txt = ", ".join("never" if x is None else f"{x[0]} / {x[2] / 1000:.0f}k" for x in reach)
        cost_lines.append(f"| {m} | {mean_std(upd, '.1f')} | {mean_std(opt, '.1f')} | {reach_txt} | "
                          f"{mean_std([r['train_wall_s'] for r in rs], '.0f')} | "
                          f"{mean_std([r['generated_tokens'] / r['train_cpu_s'] for r in rs], '.0f')} | "
                          f"{mean_std([r['valid_ratio'] for r in rs], '.2f')} | "
                          f"{mean_std([r['valid_token_ratio'] for r in rs], '.2f')} | "
                          f"{mean_std([r['max_prompts'] for r in rs], '.0f')} |")
    key["grpo_at_matched"] = grpo_at
    return "\n".join(acc_lines), "\n".join(cost_lines), key


def plot(results: list[dict], sft_eval, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    matched = matched_tokens(results)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for i, m in enumerate(METHODS):
        for j, r in enumerate(r for r in results if r["method"] == m):
            c = r["curve"]
            axes[0].plot([x[2] for x in c], [x[3] for x in c], color=f"C{i}", alpha=0.7, lw=1,
                         label=m if j == 0 else None)
            axes[1].plot([x[0] for x in c], [x[3] for x in c], color=f"C{i}", alpha=0.7, lw=1,
                         label=m if j == 0 else None)
    axes[0].axvline(min(matched.values()), color="k", ls=":", lw=1, label="matched tokens (min over seeds)")
    axes[0].set_xlabel("generated tokens")
    axes[1].set_xlabel("updates (training steps)")
    for ax in axes[:2]:
        ax.set_ylabel("greedy accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    diffs = sorted(sft_eval.by_difficulty)
    names = ["sft", *METHODS]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        if name == "sft":
            vals = [sft_eval.by_difficulty[d] for d in diffs]
        else:
            rs = [r for r in results if r["method"] == name]
            vals = [statistics.fmean(late_accuracy(r["curve"], matched[r["seed"]], key=lambda c, d=d: c[4][str(d)])
                                     for r in rs) for d in diffs]
        axes[2].bar([k + i * width for k in range(len(diffs))], vals, width, label=name,
                    color="0.6" if name == "sft" else f"C{i - 1}")  # same colours as the curves
    axes[2].set_xticks([k + width * (len(names) - 1) / 2 for k in range(len(diffs))], [str(d) for d in diffs])
    axes[2].set_xlabel("difficulty (computation steps)")
    axes[2].set_ylabel("greedy acc., last quarter of matched tokens")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget", type=int, default=300_000, help="generated tokens per method and seed")
    ap.add_argument("--eval-per-difficulty", type=int, default=64)
    ap.add_argument("--eval-tokens", type=int, default=None, help="generated tokens between evaluations "
                                                                   "(default: budget / 30)")
    ap.add_argument("--prompts-per-batch", type=int, default=8)
    ap.add_argument("--sft-steps", type=int, default=None, help="cap on SFT steps (default: SFTConfig's)")
    ap.add_argument("--quick", action="store_true", help="budget 30k tokens, seed 0, 32 eval problems per difficulty")
    ap.add_argument("--cache", default="/tmp/orrery-attnrl-bench", help="SFT model cache directory")
    ap.add_argument("--plot", default="benchmarks/attnrl.png")
    ap.add_argument("--json", default=None, help="write all results here")
    ap.add_argument("--record", default=None, help="append the section to this Markdown file")
    ap.add_argument("--from-json", default=None, help="summarise the runs saved by --json instead of training")
    args = ap.parse_args(argv)
    if args.quick:
        args.budget, args.eval_per_difficulty, args.seeds = 30_000, 32, args.seeds[:1]
    args.eval_tokens = args.eval_tokens or max(args.budget // 30, 1)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)

    task = ReasoningTask()
    t0 = time.perf_counter()
    sft_cfg = SFTConfig() if args.sft_steps is None else SFTConfig(max_steps=args.sft_steps)
    sft, info = pretrained_policy(task, GPTConfig(vocab_size=task.tokenizer.vocab_size), sft_cfg,
                                  cache_dir=args.cache)
    sft_s = time.perf_counter() - t0
    # seeded afresh for each difficulty, as the recorded results were drawn
    problems = [p for d in range(task.cfg.min_steps, task.cfg.max_steps + 1)
                for p in task.evaluation_problems(args.eval_per_difficulty, seed=2024, difficulties=[d])]
    sft_eval = evaluate_accuracy(sft, task, problems)
    sft_eval.sampled = evaluate_accuracy(sft, task, problems * 4, temperature=0.6,
                                         generator=torch.Generator().manual_seed(0)).accuracy
    print(f"SFT ({info['steps']} steps, {sft_s:.0f} s incl. cache): greedy accuracy {sft_eval.accuracy:.3f} "
          f"{sft_eval.by_difficulty}, avg@4 T=0.6 {sft_eval.sampled:.3f}", flush=True)
    results = json.loads(Path(args.from_json).read_text())["results"] if args.from_json else []
    for seed in args.seeds if not args.from_json else ():  # interleaved: machine-load drift hits every method alike
        for method in METHODS:
            r = run_one(method, seed, sft, task, problems, args.budget, args.eval_tokens, args.prompts_per_batch)
            results.append(r)
            print(f"{method} seed {seed}: final greedy {r['curve'][-1][3]:.3f} after {r['updates']} updates "
                  f"({r['optimizer_steps']} optimizer steps), {r['generated_tokens']} tokens, "
                  f"{r['train_wall_s']:.0f} s, valid {r['valid_ratio']:.2f}", flush=True)
            if args.json:  # partial results survive an interrupted run
                Path(args.json).write_text(json.dumps({"sft": sft_eval.__dict__, "sft_info": info,
                                                       "args": vars(args), "results": results}, default=str))
    acc_table, cost_table, key = summarise(results, sft_eval)
    plot(results, sft_eval, Path(args.plot))
    verdict = _verdict(key, sft_eval.accuracy, len(problems))
    print(acc_table, cost_table, verdict, sep="\n\n")
    if args.record:
        task_desc = f"{task.cfg.min_steps}-{task.cfg.max_steps} steps, mod {task.cfg.modulus}, ops {task.cfg.ops}"
        _record(Path(args.record), args, acc_table, cost_table, verdict, info, task_desc)
    return {"results": results, "key": key}


def _verdict(key: dict, sft_accuracy: float, num_eval: int) -> str:
    """Plain-language reading. Per-seed differences decide: "ahead" needs a positive mean gap larger than the
    between-seed standard error of the paired difference and at least two evaluation problems."""
    a, g, e = key["attnrl"], key["grpo"], key["entropy_tree"]
    lines = [f"- greedy accuracy over the last quarter of the matched token range (matched tokens, mean over seeds "
             f"{statistics.fmean(a['matched']):.0f}): AttnRL {a['accuracy']:.3f}, GRPO {g['accuracy']:.3f}, "
             f"entropy_tree {e['accuracy']:.3f} (SFT {sft_accuracy:.3f}; one eval problem = {1 / num_eval:.4f})."]
    for name, other in (("GRPO", g), ("entropy_tree", e)):
        diffs = [x - y for x, y in zip(a["accuracy_per_seed"], other["accuracy_per_seed"])]
        mean = statistics.fmean(diffs)
        se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("inf")
        standing = ("ahead" if mean > max(2 * se, 2 / num_eval) else
                    "behind" if -mean > max(2 * se, 2 / num_eval) else
                    "tied (gap within 2 s.e. of the seed-paired difference, or < 2 eval problems)")
        lines.append(f"- AttnRL minus {name}, per seed: {', '.join(f'{d:+.3f}' for d in diffs)} "
                     f"(mean {mean:+.3f}, s.e. {se:.3f}): {standing}.")
    parts = []
    for s_a, s_g, upd_g, tok in zip(a["reach"], g["reach"], g["updates"], a["matched"]):
        if s_a is None:
            parts.append("never")
            continue
        own = f"{s_a[0] / s_g[0]:.2f}x / {s_a[2] / s_g[2]:.2f}x" if s_g else "n/a"
        parts.append(f"{s_a[0] / upd_g:.2f}x updates, {s_a[2] / tok:.2f}x tokens of GRPO's whole run "
                     f"({own} of GRPO's own first reach, updates / tokens)")
    lines.append("- steps target (AttnRL reaches GRPO's end-of-run accuracy in <= 0.7x GRPO's steps), per seed: "
                 + "; ".join(parts) + ".")
    return "\n".join(lines)


def _record(path: Path, args, acc_table: str, cost_table: str, verdict: str, info: dict, task_desc: str) -> None:
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:
        load = ["?"] * 3
    cmd = "OMP_NUM_THREADS=1 python -m benchmarks.attnrl " + " ".join(sys.argv[1:])
    section = f"""

## AttnRL vs GRPO vs entropy branching at equal generated tokens (`benchmarks/attnrl.py`)

Command (repo root): `{cmd}`

Machine: 2 cores shared with other jobs (load average {'/'.join(load)} at the end); torch {torch.__version__}, 1 thread.
Task: envs.reasoning.task default ({task_desc}); model: algos.attnrl.gpt default after SFT ({info['steps']} steps, SFTConfig defaults
{'' if args.sft_steps is None else f'capped at {args.sft_steps} steps'}). RL: algos.attnrl.config.RLConfig defaults, {args.prompts_per_batch}
prompts per batch, {args.budget} generated tokens per run (all calls counted), seeds {args.seeds}. Greedy accuracy on
{args.eval_per_difficulty} fixed problems per difficulty, evaluated every ~{args.eval_tokens} tokens; every number is
taken at the matched token count of its seed (smallest final total among the methods, curves interpolated).

{acc_table}

{cost_table}

{verdict}

Plot: `{args.plot}`.
"""
    with open(path, "a") as f:
        f.write(section)


if __name__ == "__main__":
    main()
