"""AttnRL vs GRPO vs entropy-based tree branching at an equal generated-token budget (tiny GPT, DAG arithmetic).

    OMP_NUM_THREADS=1 python -m benchmarks.attnrl --seeds 0 1 2 --record benchmarks/RESULTS.md
    OMP_NUM_THREADS=1 python -m benchmarks.attnrl --quick           # minutes: smaller budget and eval set

Every method starts from the same SFT model (algos.sft, cached under --cache) and trains with algos.attnrl.train
(in-process sampler: the algorithm is what is compared here; the cluster wiring is experiments/attnrl.py) until
the same number of generated tokens (every generation call counted: initial samples, continuations). Greedy
accuracy on a fixed evaluation set (per difficulty) is measured every --eval-every updates and at the end.
Reported per method (mean ± std over seeds): final accuracy, accuracy by difficulty, updates (training steps),
wall time, valid-prompt ratio, and the number of updates needed to reach GRPO's final accuracy.
"""
from __future__ import annotations

import argparse
import copy
import json
import logging
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from algos.attnrl import METHODS, RLConfig, train
from algos.gpt import GPTConfig
from algos.sft import SFTConfig, evaluate_accuracy, pretrained_policy
from envs.reasoning import ReasoningTask

log = logging.getLogger("benchmarks.attnrl")


def run_one(method: str, seed: int, sft, task, problems, budget: int, eval_every: int,
            prompts_per_batch: int) -> dict:
    policy, ref = copy.deepcopy(sft), copy.deepcopy(sft)
    curve = [(0, 0, evaluate_accuracy(policy, task, problems).accuracy)]
    state = {"updates": 0}

    def log_fn(m: dict) -> None:
        state["updates"] += 1
        if state["updates"] % eval_every == 0:
            curve.append((state["updates"], m["generated_tokens"], evaluate_accuracy(policy, task, problems).accuracy))

    t0 = time.perf_counter()
    out = train(method, policy, ref, task, RLConfig(token_budget=budget, seed=seed,
                                                    prompts_per_batch=prompts_per_batch), log_fn=log_fn)
    wall = time.perf_counter() - t0
    final = evaluate_accuracy(policy, task, problems)
    if curve[-1][0] != out["updates"]:
        curve.append((out["updates"], out["generated_tokens"], final.accuracy))
    hist = out["history"]
    return {"method": method, "seed": seed, "accuracy": final.accuracy,
            "by_difficulty": {str(d): a for d, a in final.by_difficulty.items()},
            "updates": out["updates"], "generated_tokens": out["generated_tokens"], "wall_s": wall,  # includes the periodic evaluations
            "valid_ratio": statistics.fmean(h["valid_prompt_ratio"] for h in hist) if hist else float("nan"),
            "curve": curve}


def updates_to_reach(curve: list, target: float) -> int | None:
    for updates, _, acc in curve:
        if acc >= target:
            return updates
    return None


def mean_std(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def summarise(results: list[dict], sft_eval, seeds: list[int]) -> tuple[str, dict]:
    by_method = {m: [r for r in results if r["method"] == m] for m in METHODS}
    diffs = sorted(sft_eval.by_difficulty)
    grpo_final = {r["seed"]: r["accuracy"] for r in by_method["grpo"]}
    lines = ["| method | accuracy | " + " | ".join(f"d={d}" for d in diffs) +
             " | updates | updates to GRPO's final acc | generated tokens | wall s | valid ratio |",
             "|---" * (len(diffs) + 7) + "|",
             f"| SFT | {sft_eval.accuracy:.3f} | " + " | ".join(f"{sft_eval.by_difficulty[d]:.3f}" for d in diffs) +
             " | 0 | - | - | - | - |"]
    key = {}
    for m, rs in by_method.items():
        reach = [updates_to_reach(r["curve"], grpo_final[r["seed"]]) for r in rs]
        key[m] = {"accuracy": statistics.fmean(r["accuracy"] for r in rs),
                  "grpo_final": [grpo_final[r["seed"]] for r in rs],
                  "updates": statistics.fmean(r["updates"] for r in rs),
                  "updates_to_grpo_final": reach}
        lines.append(f"| {m} | {mean_std([r['accuracy'] for r in rs])} | " +
                     " | ".join(mean_std([r["by_difficulty"][str(d)] for r in rs]) for d in diffs) +
                     f" | {mean_std([r['updates'] for r in rs])} | "
                     f"{', '.join('-' if x is None else str(x) for x in reach)} | "
                     f"{mean_std([r['generated_tokens'] for r in rs])} | {mean_std([r['wall_s'] for r in rs])} | "
                     f"{mean_std([r['valid_ratio'] for r in rs])} |")
    return "\n".join(lines), key


def plot(results: list[dict], sft_eval, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, m in enumerate(METHODS):
        for j, r in enumerate(r for r in results if r["method"] == m):
            tok = [c[1] for c in r["curve"]]
            acc = [c[2] for c in r["curve"]]
            axes[0].plot(tok, acc, color=f"C{i}", alpha=0.8, marker=".", label=m if j == 0 else None)
    axes[0].set_xlabel("generated tokens")
    axes[0].set_ylabel("greedy accuracy")
    axes[0].grid(alpha=0.3)
    axes[0].legend()
    diffs = sorted(sft_eval.by_difficulty)
    names = ["sft", *METHODS]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        if name == "sft":
            vals = [sft_eval.by_difficulty[d] for d in diffs]
        else:
            rs = [r for r in results if r["method"] == name]
            vals = [statistics.fmean(r["by_difficulty"][str(d)] for r in rs) for d in diffs]
        axes[1].bar([k + i * width for k in range(len(diffs))], vals, width, label=name)
    axes[1].set_xticks([k + width * (len(names) - 1) / 2 for k in range(len(diffs))], [str(d) for d in diffs])
    axes[1].set_xlabel("difficulty (steps)")
    axes[1].set_ylabel("greedy accuracy (mean over seeds)")
    axes[1].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget", type=int, default=60_000, help="generated tokens per method and seed")
    ap.add_argument("--eval-per-difficulty", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=4, help="updates between evaluations")
    ap.add_argument("--prompts-per-batch", type=int, default=8)
    ap.add_argument("--sft-steps", type=int, default=None, help="cap on SFT steps (default: SFTConfig's)")
    ap.add_argument("--quick", action="store_true",
                    help="budget 8k tokens, 12 eval problems per difficulty, SFT capped at 400 steps")
    ap.add_argument("--cache", default="/tmp/orrery-attnrl-bench", help="SFT model cache directory")
    ap.add_argument("--plot", default="benchmarks/attnrl.png")
    ap.add_argument("--json", default=None, help="write all results here")
    ap.add_argument("--record", default=None, help="append the table to this Markdown file")
    args = ap.parse_args(argv)
    if args.quick:
        args.budget, args.eval_per_difficulty = 8_000, 12
        args.sft_steps = args.sft_steps or 400
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)

    task = ReasoningTask()
    t0 = time.perf_counter()
    sft_cfg = SFTConfig() if args.sft_steps is None else SFTConfig(max_steps=args.sft_steps)
    sft, info = pretrained_policy(task, GPTConfig(vocab_size=task.tokenizer.vocab_size), sft_cfg,
                                  cache_dir=args.cache)
    sft_s = time.perf_counter() - t0
    problems = [p for d in range(task.cfg.min_steps, task.cfg.max_steps + 1)
                for p in task.sample(random.Random(2024), args.eval_per_difficulty, difficulty=d)]
    sft_eval = evaluate_accuracy(sft, task, problems)
    print(f"SFT ({info['steps']} steps, {sft_s:.0f} s incl. cache): accuracy {sft_eval.accuracy:.3f} "
          f"{sft_eval.by_difficulty}", flush=True)
    results = []
    for seed in args.seeds:  # interleaved: machine-load drift hits every method alike
        for method in METHODS:
            r = run_one(method, seed, sft, task, problems, args.budget, args.eval_every, args.prompts_per_batch)
            results.append(r)
            print(f"{method} seed {seed}: accuracy {r['accuracy']:.3f} after {r['updates']} updates, "
                  f"{r['generated_tokens']} tokens, {r['wall_s']:.0f} s, valid {r['valid_ratio']:.2f}", flush=True)
    table, key = summarise(results, sft_eval, args.seeds)
    plot(results, sft_eval, Path(args.plot))
    print(table)
    verdict = _verdict(key, sft_eval.accuracy, len(problems))
    print(verdict)
    if args.json:
        Path(args.json).write_text(json.dumps({"sft": sft_eval.__dict__, "results": results}, indent=1, default=str))
    if args.record:
        _record(Path(args.record), args, table, verdict, info, sft_s)
    return {"results": results, "key": key}


def _verdict(key: dict, sft_accuracy: float, num_eval: int) -> str:
    """Plain-language reading; gaps below two evaluation problems are called ties (the eval set's resolution)."""
    a, g, e = key["attnrl"], key["grpo"], key["entropy_tree"]
    tie = 2.0 / num_eval
    best_other = max(g["accuracy"], e["accuracy"])
    standing = ("ahead of both" if a["accuracy"] - best_other >= tie else
                "behind" if best_other - a["accuracy"] >= tie else "tied with the baselines (gap < 2 eval problems)")
    lines = [f"- mean greedy accuracy at equal generated tokens: AttnRL {a['accuracy']:.3f}, GRPO {g['accuracy']:.3f}, "
             f"entropy_tree {e['accuracy']:.3f} (SFT {sft_accuracy:.3f}; one eval problem = {1 / num_eval:.3f}): "
             f"AttnRL {standing}."]
    reach = a["updates_to_grpo_final"]
    useful = [x for x, gf in zip(reach, a["grpo_final"]) if gf > sft_accuracy]
    if not useful:
        lines.append("- steps target (AttnRL reaching GRPO's final accuracy in <= 0.7x GRPO's updates): not measurable "
                     "here, GRPO did not improve over SFT in any seed.")
    else:
        got = [x for x in useful if x is not None]
        ratio = f"{statistics.fmean(got) / g['updates']:.2f}x" if got else "never"
        lines.append(f"- AttnRL updates to reach GRPO's final accuracy, seeds where GRPO improved over SFT: {useful} "
                     f"vs {g['updates']:.1f} GRPO updates -> {ratio} (target <= 0.7x)")
    return "\n".join(lines)


def _record(path: Path, args, table: str, verdict: str, info: dict, sft_s: float) -> None:
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:
        load = ["?"] * 3
    cmd = "OMP_NUM_THREADS=1 python -m benchmarks.attnrl " + " ".join(sys.argv[1:])
    section = f"""

## AttnRL vs GRPO vs entropy branching at equal generated tokens (`benchmarks/attnrl.py`)

Command (repo root): `{cmd}`

Machine: 2 cores shared with other jobs (load average {'/'.join(load)} at the end); torch {torch.__version__}, 1 thread.
Task: envs.reasoning default (1-6 steps, mod 10, ops +-); model: algos.gpt default (2 layers, 4 heads, d=64) after
SFT ({info['steps']} steps; SFTConfig defaults{'' if args.sft_steps is None else f', capped at {args.sft_steps} steps'}). RL: algos.attnrl.RLConfig defaults
(n=6, N=2, T=2, rho=0.2, Delta=2, lr 1e-4, clip 0.2/0.28, KL 1e-3), {args.prompts_per_batch} prompts per batch,
{args.budget} generated tokens per run (all calls counted), seeds {args.seeds}{' (--quick)' if args.quick else ''}.
Greedy accuracy on {args.eval_per_difficulty} fixed problems per difficulty; mean ± std over seeds. Wall time
includes the periodic evaluations (every {args.eval_every} updates, same for all methods). "updates to GRPO's final
acc": first evaluated update at which the run reached the final accuracy of GRPO with the same seed.

{table}

{verdict}

Plot: `{args.plot}`.
"""
    with open(path, "a") as f:
        f.write(section)


if __name__ == "__main__":
    main()
