"""AttnRL and its controls at an equal generated-token budget (tiny GPT, step-delimited DAG arithmetic), and the
branching diagnostic that comes before any RL.

    # the committed, resumable study (issue 25) runs on the study runner, one unit at a time:
    #   python -m benchmarks.study attnrl {run,status,report}     (benchmarks/study/attnrl.py)
    # this script stays for quick looks; its results live in git-ignored files
    OMP_NUM_THREADS=1 python -m benchmarks.attnrl --preset cone --diagnostic --json runs/attnrl_cone.json
    OMP_NUM_THREADS=1 python -m benchmarks.attnrl --preset cone --seeds 0 1 2 3 4 --json runs/attnrl_cone.json
    OMP_NUM_THREADS=1 python -m benchmarks.attnrl --preset cone --json runs/attnrl_cone.json --report \
        --record benchmarks/RESULTS.md
    OMP_NUM_THREADS=1 python -m benchmarks.attnrl --quick           # a minute: default chain task, one seed

Every method starts from the same SFT model (algos.attnrl.sft, cached under --cache) and trains with
algos.attnrl.train.train (in-process sampler: the algorithm is what is compared; the cluster wiring is in
experiments/attnrl/) for about the same number of generated tokens (every generation call counted). Runs stop at an
update boundary, so comparisons are made at the matched token count of each seed (the smallest final total among
its methods; curves interpolated). Results are written to --json after every run, and a rerun skips the (method,
seed) pairs already there, so an interrupted study resumes. Tables and statistics: benchmarks/attnrl_report.py.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import statistics
import time
from pathlib import Path

import torch

from algos.attnrl.config import METHODS, RLConfig
from algos.attnrl.diagnostics import branch_every_step, summarize_branching
from algos.attnrl.gpt import GPTConfig
from algos.attnrl.sft import SFTConfig, evaluate_accuracy, pretrained_policy, step_error
from algos.attnrl.train import train
from envs.reasoning.task import ReasoningTask, ReasoningTaskConfig

log = logging.getLogger("benchmarks.attnrl")

# Task, model, SFT and RL settings per study. ``sft_min_steps``: SFT draws programs from this many steps up (the
# curriculum needs short programs to start from); RL and evaluation use the task's own range.
PRESETS = {
    "chain": {"task": {}, "model": {}, "sft": {}, "rl": {}, "sft_min_steps": None},
    "cone": {"task": {"layout": "cone", "min_steps": 6, "max_steps": 10, "num_inputs": 3},
             "model": {"n_layer": 3, "n_head": 4, "n_embd": 96},
             "sft": {"target_step_error": 0.05, "curriculum_threshold": 0.3, "max_steps": 5000, "eval_every": 50},
             "rl": {"delta": 2},
             "sft_min_steps": 2},
}
PRESETS["hub"] = copy.deepcopy(PRESETS["cone"]) | {"task": {**PRESETS["cone"]["task"], "layout": "hub"}}


def parse_overrides(items: list[str]) -> dict:
    """``key=value`` pairs (values parsed as JSON where possible) for RLConfig."""
    out = {}
    for item in items:
        key, value = item.split("=", 1)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


class Evaluator:
    """Greedy accuracy by difficulty on a fixed set, and the sampled accuracy (``samples`` per problem at
    ``temperature``) on its longest problems: the primary metric of the study."""

    def __init__(self, task: ReasoningTask, per_difficulty: int, longest_extra: int, samples: int,
                 temperature: float, seed: int = 2024) -> None:
        self.task, self.samples, self.temperature = task, samples, temperature
        self.longest = task.cfg.max_steps
        self.problems = task.evaluation_problems(per_difficulty, seed=seed)
        self.problems += task.evaluation_problems(longest_extra, seed=seed + 1, difficulties=[self.longest])
        self.longest_problems = [p for p in self.problems if p.difficulty == self.longest]

    def __call__(self, policy) -> dict:
        greedy = evaluate_accuracy(policy, self.task, self.problems)
        sampled = evaluate_accuracy(policy, self.task, self.longest_problems * self.samples,
                                    temperature=self.temperature, generator=torch.Generator().manual_seed(0))
        return {"greedy": greedy.accuracy, "by_difficulty": {str(d): a for d, a in greedy.by_difficulty.items()},
                "greedy_longest": greedy.by_difficulty[self.longest], "sampled_longest": sampled.accuracy}


def run_one(method: str, seed: int, sft, task, evaluator: Evaluator, rl: dict, eval_tokens: int) -> dict:
    """One RL run; the curve is a list of evaluations (with updates, optimizer steps and generated tokens so far),
    starting at the SFT model."""
    policy, ref = copy.deepcopy(sft), copy.deepcopy(sft)
    curve = [{"updates": 0, "optimizer_steps": 0, "tokens": 0, **evaluator(policy)}]
    state = {"next_eval": eval_tokens, "eval_s": 0.0, "eval_cpu_s": 0.0, "opt_steps": 0}

    def log_fn(m: dict) -> None:
        state["opt_steps"] += m.get("optimizer_steps", 0)
        if m["generated_tokens"] >= state["next_eval"]:
            t, c = time.perf_counter(), time.process_time()
            curve.append({"updates": m["update"], "optimizer_steps": state["opt_steps"],
                          "tokens": m["generated_tokens"], **evaluator(policy)})
            state["eval_s"] += time.perf_counter() - t
            state["eval_cpu_s"] += time.process_time() - c
            while state["next_eval"] <= m["generated_tokens"]:
                state["next_eval"] += eval_tokens

    t0, cpu0 = time.perf_counter(), time.process_time()
    out = train(method, policy, ref, task, RLConfig(seed=seed, **rl), log_fn=log_fn)
    wall = time.perf_counter() - t0 - state["eval_s"]
    cpu = time.process_time() - cpu0 - state["eval_cpu_s"]  # on a loaded machine wall >> CPU: subtract like with like
    if curve[-1]["updates"] != out["updates"]:
        curve.append({"updates": out["updates"], "optimizer_steps": state["opt_steps"],
                      "tokens": out["generated_tokens"], **evaluator(policy)})
    hist = out["history"]
    return {"method": method, "seed": seed, "rl": rl, "updates": out["updates"],
            "optimizer_steps": state["opt_steps"], "generated_tokens": out["generated_tokens"],
            "train_wall_s": wall, "train_cpu_s": cpu, "eval_cpu_s": state["eval_cpu_s"],
            "max_prompts": max((h["prompts"] for h in hist), default=0),
            "valid_ratio": statistics.fmean(h["valid_prompt_ratio"] for h in hist) if hist else float("nan"),
            "valid_token_ratio": sum(h["valid_train_tokens"] for h in hist) / max(out["generated_tokens"], 1),
            "mean_leaf_reward": [h.get("mean_leaf_reward", h["mean_reward"]) for h in hist],
            "curve": curve}


def build(args) -> tuple:
    """Task, SFT model (cached), its info and the evaluator for ``args.preset``."""
    preset = PRESETS[args.preset]
    task = ReasoningTask(ReasoningTaskConfig(**preset["task"]))
    sft_task = task if preset["sft_min_steps"] is None else ReasoningTask(
        dataclasses.replace(task.cfg, min_steps=preset["sft_min_steps"]))
    sft_cfg = SFTConfig(**preset["sft"], **({"max_steps": args.sft_steps} if args.sft_steps else {}))
    model_cfg = GPTConfig(vocab_size=task.tokenizer.vocab_size, **preset["model"])
    sft, info = pretrained_policy(sft_task, model_cfg, sft_cfg, cache_dir=args.cache)
    evaluator = Evaluator(task, args.eval_per_difficulty, args.eval_longest_extra, args.eval_samples,
                          args.eval_temperature)
    return task, sft, info, evaluator


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="chain")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--seeds", type=int, nargs="*", default=[])
    ap.add_argument("--budget", type=int, default=300_000, help="generated tokens per method and seed")
    ap.add_argument("--prompts-per-batch", type=int, default=8)
    ap.add_argument("--rl", nargs="*", default=[], help="RLConfig overrides key=value (after the preset's)")
    ap.add_argument("--tag", default="", help="label stored with the runs (e.g. a tuning setting)")
    ap.add_argument("--eval-per-difficulty", type=int, default=16)
    ap.add_argument("--eval-longest-extra", type=int, default=112, help="extra problems of the longest difficulty")
    ap.add_argument("--eval-samples", type=int, default=2, help="samples per longest problem (sampled accuracy)")
    ap.add_argument("--eval-temperature", type=float, default=1.0)
    ap.add_argument("--eval-tokens", type=int, default=None, help="tokens between evaluations (budget / 6)")
    ap.add_argument("--sft-steps", type=int, default=None, help="cap on SFT steps")
    ap.add_argument("--diagnostic", action="store_true", help="branch the SFT model at every step first")
    ap.add_argument("--diagnostic-problems", type=int, default=48, help="per difficulty")
    ap.add_argument("--diagnostic-continuations", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="budget 30k tokens, seed 0, small evaluation")
    ap.add_argument("--cache", default="/tmp/orrery-attnrl-bench", help="SFT model cache directory")
    ap.add_argument("--json", default=None, help="results file (resumed: finished runs are skipped)")
    ap.add_argument("--report", action="store_true", help="print the tables of the runs in --json")
    ap.add_argument("--record", default=None, help="with --report: replace this method's section of this file")
    ap.add_argument("--plot", default="benchmarks/attnrl.png")
    args = ap.parse_args(argv)
    if args.quick:
        args.budget, args.seeds, args.eval_per_difficulty, args.eval_longest_extra = 30_000, [0], 16, 16
    args.eval_tokens = args.eval_tokens or max(args.budget // 6, 1)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    logging.getLogger("algos.attnrl.sft").setLevel(logging.INFO)  # SFT progress (minutes on the larger presets)
    torch.set_num_threads(1)
    path = Path(args.json) if args.json else None
    saved = json.loads(path.read_text()) if path and path.exists() else {"runs": []}

    def save() -> None:
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(saved, default=str))
            tmp.replace(path)

    t0 = time.perf_counter()
    task, sft, info, evaluator = build(args)
    if "sft" not in saved or saved.get("preset") != args.preset:
        saved |= {"preset": args.preset, "sft_info": info, "sft": evaluator(sft),
                  "sft_step_error": step_error(sft, evaluator.longest_problems),
                  "sft_seconds": time.perf_counter() - t0}
        save()
    print(f"SFT ({info['steps']} steps): {json.dumps(saved['sft'])}, step error (T=1, longest) "
          f"{saved['sft_step_error']:.4f}", flush=True)
    if args.diagnostic and "diagnostic" not in saved:
        t = time.perf_counter()
        rl_cfg = RLConfig(**PRESETS[args.preset]["rl"])
        problems = task.evaluation_problems(args.diagnostic_problems, seed=777)
        records = branch_every_step(sft, task, problems, args.diagnostic_continuations, deltas=(1, 2, 4),
                                    zero_first_step=rl_cfg.zero_first_step,
                                    generator=torch.Generator().manual_seed(0))
        saved["diagnostic"] = {"summary": summarize_branching(records, (1, 2, 4), rl_cfg.branch_points, rl_cfg.rho),
                               "records": records, "seconds": time.perf_counter() - t}
        save()
        print(json.dumps(saved["diagnostic"]["summary"], indent=1), flush=True)
    rl = {"token_budget": args.budget, "prompts_per_batch": args.prompts_per_batch,
          **PRESETS[args.preset]["rl"], **parse_overrides(args.rl)}
    done = {(r["method"], r["seed"], r.get("tag", "")) for r in saved["runs"]}
    for seed in args.seeds:  # interleaved: machine-load drift hits every method alike
        for method in args.methods:
            if (method, seed, args.tag) in done:
                continue
            r = run_one(method, seed, sft, task, evaluator, rl, args.eval_tokens) | {"tag": args.tag}
            saved["runs"].append(r)
            save()
            end = r["curve"][-1]
            print(f"[{args.tag}] {method} seed {seed}: sampled@{evaluator.longest} {end['sampled_longest']:.3f}, "
                  f"greedy@{evaluator.longest} {end['greedy_longest']:.3f}, greedy {end['greedy']:.3f} after "
                  f"{r['updates']} updates, {r['generated_tokens']} tokens, {r['train_wall_s']:.0f} s", flush=True)
    if args.report:
        from benchmarks.attnrl_report import report
        report(saved, args)
    return saved


if __name__ == "__main__":
    main()
