"""Supervised pretraining of the policy on reference solutions, and greedy accuracy by difficulty.

RL needs a policy that is good but not perfect: pretraining stops as soon as every difficulty is in the training
mix and greedy accuracy on the shortest problems reaches ``target_short_accuracy``; long problems, seen briefly and
with per-step errors compounding, stay mostly unsolved. (Default task and model: about 500 updates, 30-60 s on one
core; greedy accuracy by difficulty 1-4 about 0.8 / 0.7 / 0.3-0.4 / 0.15-0.3.)
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from algos.attnrl.gpt import GPT, GPTConfig
from algos.attnrl.lm import GenerationRequest, Policy, generate
from algos.attnrl.scoring import forward_scores

log = logging.getLogger(__name__)


@dataclass
class SFTConfig:
    """Pretraining budget and stopping rule.

    With ``curriculum`` the largest difficulty sampled starts at the task's minimum and grows by one whenever greedy
    accuracy at the current largest difficulty reaches ``curriculum_threshold``: the value-lookup circuit forms on
    one-step problems within about 150 updates and transfers to longer ones, whereas on the full mix it had not
    appeared after 300 updates in our runs. Training stops once every difficulty is in the mix and short problems are
    solved at ``target_short_accuracy`` (so long problems remain mostly unsolved: room for RL).
    """

    max_steps: int = 1500
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 25
    eval_problems_per_difficulty: int = 32
    short_difficulty: int = 1  # problems with at most this many steps are "short"
    target_short_accuracy: float = 0.8  # stop once greedy accuracy on short problems reaches this
    curriculum: bool = True
    curriculum_threshold: float = 0.5
    # If set, stop on the per-step error instead (step_error at temperature 1 on the hardest difficulty's evaluation
    # problems, once every difficulty is in the mix): a fixed quality rather than a fixed step count.
    target_step_error: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "eval_every", "eval_problems_per_difficulty", "short_difficulty"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for name in ("target_short_accuracy", "curriculum_threshold"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.target_step_error is not None and not 0.0 < self.target_step_error < 1.0:
            raise ValueError(f"target_step_error must be in (0, 1) or None, got {self.target_step_error}")


@dataclass
class EvalResult:
    accuracy: float
    by_difficulty: dict[int, float] = field(default_factory=dict)
    generated_tokens: int = 0


def accuracy_by_difficulty(problems: Sequence, rewards: Sequence[float]) -> tuple[float, dict[int, float]]:
    """Mean reward overall and per difficulty (sorted by difficulty)."""
    per: dict[int, list[float]] = {}
    for p, r in zip(problems, rewards):
        per.setdefault(p.difficulty, []).append(float(r))
    acc = sum(map(float, rewards)) / max(len(rewards), 1)
    return acc, {d: sum(v) / len(v) for d, v in sorted(per.items())}


def evaluate_accuracy(policy: Policy, task, problems: Sequence, max_new_tokens: int | None = None,
                      temperature: float = 0.0, generator: torch.Generator | None = None,
                      max_batch_size: int = 256) -> EvalResult:
    """Accuracy (greedy by default) of ``policy`` on ``problems``, overall and per difficulty."""
    requests = [GenerationRequest(tuple(policy.codec.encode(p.prompt))) for p in problems]
    rollouts = generate(policy, requests, max_new_tokens or task.max_response_chars(), temperature, generator,
                        max_batch_size=max_batch_size)
    rewards = [task.reward(p, policy.codec.decode(r.response_ids), r.finished) for p, r in zip(problems, rollouts)]
    accuracy, by_difficulty = accuracy_by_difficulty(problems, rewards)
    return EvalResult(accuracy, by_difficulty, generated_tokens=sum(r.num_generated for r in rollouts))


def step_error(policy: Policy, problems: Sequence, temperature: float = 1.0) -> float:
    """Per-step error: 1 - the mean, over every line of the reference solutions (computation steps and answer), of
    the probability that the policy sampling at ``temperature`` writes that line exactly, given the reference lines
    before it (teacher forcing: exact, no sampling noise)."""
    codec = policy.codec
    responses = [codec.encode(p.solution) + [codec.eos_id] for p in problems]
    with torch.no_grad():
        scores = forward_scores(policy, [codec.encode(p.prompt) for p in problems], responses, temperature)
    line_probs = []
    for b, ids in enumerate(responses):
        lp = scores.logprobs[b, :len(ids)]
        start = 0
        for t, tok in enumerate(ids):  # a line ends at its delimiter; the last one (answer) ends at the end token
            if tok in codec.delimiter_ids or t == len(ids) - 1:
                line_probs.append(float(lp[start:t + 1].sum().exp()))
                start = t + 1
    return 1.0 - sum(line_probs) / max(len(line_probs), 1)


def sft_loss(policy: Policy, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> torch.Tensor:
    """Token-mean negative log-likelihood of the reference responses (prompt tokens are not trained)."""
    scores = forward_scores(policy, prompts, responses)
    return -(scores.logprobs.sum() / scores.mask.sum())


class SFTRun:
    """One pretraining run that can stop and resume: :meth:`advance` trains until the stopping rule fires or a time
    limit is reached, and :meth:`state_dict` / :meth:`load_state_dict` carry everything resuming needs (weights,
    optimizer and schedule, step, curriculum level, the problem sampler's and torch's RNG, the history), so a run
    cut into pieces trains exactly as one uninterrupted :func:`pretrain` does (same torch build)."""

    def __init__(self, policy: Policy, task, cfg: SFTConfig | None = None,
                 log_fn: Callable[[dict], None] | None = None) -> None:
        self.policy, self.task, self.cfg, self.log_fn = policy, task, cfg or SFTConfig(), log_fn
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        self.rng = random.Random(cfg.seed)
        self.lo, self.hi = task.cfg.min_steps, task.cfg.max_steps
        self.eval_sets: dict[int, list] = defaultdict(list)
        for p in task.evaluation_problems(cfg.eval_problems_per_difficulty, seed=cfg.seed + 1):
            self.eval_sets[p.difficulty].append(p)
        self.short = [p for d, ps in self.eval_sets.items() if d <= cfg.short_difficulty for p in ps]
        self.cap = self.lo if cfg.curriculum else self.hi
        self.opt = torch.optim.AdamW(policy.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps))
        self.history: list[dict] = []
        self.step = 0
        self.done = False

    def advance(self, until: float | None = None, steps: int | None = None) -> bool:
        """Train until the stopping rule fires or ``max_steps`` is reached (True), or until ``time.monotonic()``
        passes ``until`` or ``steps`` more steps are done (False: call again, possibly after a save and a resume)."""
        cfg, model, codec = self.cfg, self.policy.model, self.policy.codec
        eos = [codec.eos_id]
        stop_at = None if steps is None else self.step + steps
        while not self.done:
            if self.step >= cfg.max_steps:
                self.done = True
                break
            if (until is not None and time.monotonic() >= until) or (stop_at is not None and self.step >= stop_at):
                model.eval()
                return False
            self.step += 1
            model.train()
            batch = [self.task.sample(self.rng, 1, difficulty=self.rng.randint(self.lo, self.cap))[0]
                     for _ in range(cfg.batch_size)]
            loss = sft_loss(self.policy, [codec.encode(p.prompt) for p in batch],
                            [codec.encode(p.solution) + eos for p in batch])
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            self.opt.step()
            self.sched.step()
            if self.step % cfg.eval_every == 0:
                self.done = self._evaluate(float(loss.detach()))
        model.eval()
        return True

    def _evaluate(self, loss: float) -> bool:
        """One evaluation record (curriculum level, or the stopping quantity); True when training should stop."""
        cfg = self.cfg
        record = {"step": self.step, "loss": loss, "difficulty_cap": self.cap}
        if self.cap < self.hi:
            record["cap_accuracy"] = evaluate_accuracy(self.policy, self.task, self.eval_sets[self.cap]).accuracy
            if record["cap_accuracy"] >= cfg.curriculum_threshold:
                self.cap += 1
        elif cfg.target_step_error is not None:
            record["step_error"] = step_error(self.policy, self.eval_sets[self.hi])
        else:
            record["short_accuracy"] = evaluate_accuracy(self.policy, self.task, self.short).accuracy
        self.history.append(record)
        log.info("sft %s", record)
        if self.log_fn:
            self.log_fn(record)
        return (record.get("short_accuracy", 0.0) >= cfg.target_short_accuracy
                or record.get("step_error", 1.0) <= (cfg.target_step_error or 0.0))

    def result(self) -> dict:
        """Steps, history and greedy accuracy by difficulty on the SFT evaluation set (the ``pretrain`` info)."""
        self.policy.model.eval()
        final = evaluate_accuracy(self.policy, self.task, [p for ps in self.eval_sets.values() for p in ps])
        return {"steps": self.step, "history": list(self.history), "accuracy": final.accuracy,
                "by_difficulty": final.by_difficulty}

    def state_dict(self) -> dict:
        return {"model": self.policy.model.state_dict(), "optimizer": self.opt.state_dict(),
                "scheduler": self.sched.state_dict(), "step": self.step, "cap": self.cap, "done": self.done,
                "rng": self.rng.getstate(), "torch_rng": torch.get_rng_state(), "history": list(self.history),
                "config": repr(self.cfg)}

    def load_state_dict(self, state: dict) -> None:
        if state["config"] != repr(self.cfg):
            raise ValueError(f"SFT checkpoint was made with {state['config']}, not {self.cfg!r}")
        self.policy.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.step, self.cap, self.done = state["step"], state["cap"], state["done"]
        self.rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        self.history = list(state["history"])


def pretrain(policy: Policy, task, cfg: SFTConfig | None = None,
             log_fn: Callable[[dict], None] | None = None) -> dict:
    """AdamW on freshly sampled problems (difficulty curriculum optional) until the stopping rule fires."""
    run = SFTRun(policy, task, cfg, log_fn)
    run.advance()
    return run.result()


CACHE_VERSION = 1  # bump when the model, task or training code changes what a given config produces


def default_cache_dir() -> Path:
    """``$ORRERY_CACHE_DIR`` or ``<tmp>/orrery_cache``: where pretrained tiny policies are kept between runs."""
    return Path(os.environ.get("ORRERY_CACHE_DIR", Path(tempfile.gettempdir()) / "orrery_cache"))


def pretrained_policy(task, model_cfg: GPTConfig, sft_cfg: SFTConfig | None = None, init_seed: int = 0,
                      cache_dir: str | Path | None = None) -> tuple[Policy, dict]:
    """A freshly initialised :class:`~algos.attnrl.gpt.GPT` pretrained with :func:`pretrain`.

    With ``cache_dir`` the result is stored under a hash of all configs and reused, so several test modules or
    benchmark runs share one SFT model; training is deterministic for fixed seeds, so a cache hit is the same
    model a fresh run would produce (on the same torch build).
    """
    sft_cfg = sft_cfg or SFTConfig()
    key = hashlib.sha1(repr((CACHE_VERSION, task.cfg, model_cfg, sft_cfg, init_seed, torch.__version__)).encode()
                       ).hexdigest()[:16]
    path = Path(cache_dir) / f"sft_{key}.pt" if cache_dir is not None else None
    torch.manual_seed(init_seed)
    model = GPT(model_cfg)
    policy = Policy(model, task.tokenizer)
    if path is not None and path.exists():
        saved = torch.load(path, weights_only=True, map_location="cpu")
        model.load_state_dict(saved["state_dict"])
        model.eval()
        return policy, saved["info"]
    info = pretrain(policy, task, sft_cfg)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"state_dict": model.state_dict(), "info": info}, tmp)
        tmp.replace(path)  # atomic: a concurrent reader never sees a half-written file
    return policy, info
