"""One AttnRL-family run at an equal generated-token budget from the study's SFT model (``run_one``), the fixed
evaluation set it is scored on (``Evaluator``), and how a run's curve is read at a token count (``interpolate``,
``late_mean``). Every method trains with algos.attnrl.train.train (in-process sampler: the algorithm is what is
compared; the cluster wiring is in experiments/attnrl/); runs stop at an update boundary, so comparisons are made at
the matched token count of each seed (the smallest final total among its methods; curves interpolated)."""
from __future__ import annotations

import copy
import logging
import statistics
import time

import torch

from algos.attnrl.config import RLConfig
from algos.attnrl.sft import evaluate_accuracy
from algos.attnrl.train import train
from envs.reasoning.task import ReasoningTask


log = logging.getLogger("benchmarks.attnrl")

# Task, model, SFT and RL settings per study. ``sft_min_steps``: SFT draws programs from this many steps up (the
# curriculum needs short programs to start from); RL and evaluation use the task's own range.
PRIMARY = "sampled_longest"  # the primary metric: sampled accuracy on the longest problems


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
