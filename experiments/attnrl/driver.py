"""AttnRL vs GRPO vs entropy branching on step-delimited DAG arithmetic; LM rollouts on the shared pool.

    python -m experiments.run experiment=attnrl                                    # compare mode (attnrl, grpo)
    python -m experiments.run experiment=attnrl experiment.methods=[] experiment.method=entropy_tree
    python -m experiments.run experiment=attnrl scale=paper experiment.hf_model=/models/<local HF dir>

One run:
    1. SFT: pretrain the policy on reference solutions (algos.attnrl.sft; cached as ``<run>/sft_model.pt``, or loaded from
       ``experiment.sft_model``), so RL starts good on short problems and poor on long ones;
    2. for each method (compare mode: one after another, every one from the same SFT model) one Ray Train fit runs
       ``algos.attnrl.attnrl.train`` whose ``generate_fn`` sends every generation call to the pool's "lm" samplers
       (split over the workers), with the weights published by version: call m of AttnRL's one-step off-policy
       pipeline carries the initial samples of batch m+1 and the continuations of batch m and is sampled by the
       weights after m updates. Workers compute FCI from the decoding pass and score rewards;
    3. greedy evaluation through the pool every ``eval_every_updates``; metrics per update to Parquet; the driver
       plots accuracy vs generated tokens and accuracy by difficulty afterwards.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import math
import random
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

log = logging.getLogger(__name__)

METHODS = ("attnrl", "grpo", "entropy_tree")


@dataclass
class Config:
    method: str = "attnrl"  # single-method run (used when ``methods`` is empty)
    methods: list[str] = field(default_factory=list)  # compare mode: each method in turn from the same SFT model
    task: dict = field(default_factory=dict)  # envs.reasoning.task.ReasoningTaskConfig fields
    model: dict = field(default_factory=dict)  # algos.attnrl.gpt.GPTConfig fields (vocab_size comes from the task)
    sft: dict = field(default_factory=dict)  # algos.attnrl.sft.SFTConfig fields
    rl: dict = field(default_factory=dict)  # algos.attnrl.attnrl.RLConfig fields; rl.ads: AdaptiveSamplingConfig fields
    hf_model: str | None = None  # local Hugging Face causal-LM dir (eager attention) instead of the char GPT
    sft_model: str | None = None  # a saved SFT model (<run>/sft_model.pt) to start from, skipping SFT
    eval_problems_per_difficulty: int = 16
    eval_every_updates: int = 5
    checkpoint_every_updates: int = 20
    requests_per_worker: int = 1  # each generation call is split into pool.num_workers * this pool requests
    sampler_max_batch: int | None = None  # rollouts decoded together in a worker (None: the whole request)
    autocast_bf16: bool = False
    eval_seed: int = 12345

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"experiment.method: must be one of {list(METHODS)}, got {self.method!r}")
        bad = [m for m in self.methods if m not in METHODS]
        if bad or len(set(self.methods)) != len(self.methods):
            raise ValueError(f"experiment.methods: distinct entries of {list(METHODS)}, got {self.methods}")
        for key in ("eval_problems_per_difficulty", "eval_every_updates", "checkpoint_every_updates",
                    "requests_per_worker"):
            if getattr(self, key) < 1:
                raise ValueError(f"experiment.{key}: must be >= 1, got {getattr(self, key)}")
        if self.sampler_max_batch is not None and self.sampler_max_batch < 1:
            raise ValueError(f"experiment.sampler_max_batch: must be >= 1 or null, got {self.sampler_max_batch}")
        for key in ("hf_model", "sft_model"):
            path = getattr(self, key)
            if path is not None and not Path(path).exists():
                raise FileNotFoundError(f"experiment.{key}: {path} does not exist")

    @property
    def run_methods(self) -> list[str]:
        return list(self.methods) or [self.method]

    def task_config(self):
        from envs.reasoning.task import ReasoningTaskConfig
        return _typed(ReasoningTaskConfig, self.task, "experiment.task")

    def gpt_config(self, vocab_size: int):
        from algos.attnrl.gpt import GPTConfig
        return _typed(GPTConfig, {**self.model, "vocab_size": vocab_size}, "experiment.model")

    def sft_config(self):
        from algos.attnrl.sft import SFTConfig
        return _typed(SFTConfig, self.sft, "experiment.sft")

    def rl_config(self, method: str, seed: int):
        """RLConfig for ``method``; rl.ads keys left null keep the method's default (AttnRL: all ADS parts on)."""
        from algos.attnrl.attnrl import AdaptiveSamplingConfig, RLConfig
        rl = {k: v for k, v in self.rl.items() if v is not None and k != "ads"}
        cfg = _typed(RLConfig, {"seed": seed, **rl}, "experiment.rl")
        ads_over = {k: v for k, v in (self.rl.get("ads") or {}).items() if v is not None}
        if ads_over:
            base = cfg.resolved(method).ads
            cfg.ads = _typed(AdaptiveSamplingConfig, {**dataclasses.asdict(base), **ads_over}, "experiment.rl.ads")
        return cfg


def _typed(cls, data: dict, prefix: str):
    from experiments.config import from_dict
    return from_dict(cls, {k: v for k, v in (data or {}).items() if v is not None}, prefix)


def check(exp: Config, raw: dict) -> None:
    from experiments.config import ConfigError
    exp.task_config(), exp.sft_config()
    for m in exp.run_methods:
        exp.rl_config(m, 0)
    if exp.hf_model is None:
        from envs.reasoning.task import CharTokenizer
        exp.gpt_config(CharTokenizer().vocab_size)
    train = raw.get("train") or {}
    if int(train.get("num_workers", 1)) != 1:
        # algos.attnrl.attnrl.train is one sequential pipeline (tree building, adaptive batch, off-policy schedule);
        # splitting its PPO mini-batches over DDP ranks would give ranks different numbers of backward passes.
        raise ConfigError("train.num_workers: the AttnRL learner runs on one Train worker (got "
                          f"{train.get('num_workers')}); scale rollouts with pool.num_workers instead")


# ------------------------------------------------------------------------------------------------ policies

def gpt_weights(policy, gpt_cfg) -> dict:
    return {"kind": "gpt", "gpt": dataclasses.asdict(gpt_cfg), "state_dict": _cpu_state(policy.model)}


def hf_weights(policy, path: str) -> dict:
    return {"kind": "hf", "path": path, "state_dict": _cpu_state(policy.model)}


def _cpu_state(model) -> dict:
    return {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}


def load_sft(path: str | Path):
    """(weights dict for the pool, info) of a saved SFT model."""
    import torch
    saved = torch.load(path, weights_only=False)
    return saved["weights"], saved["info"]


def pretrain_sft(exp: Config, run_path: Path, seed: int) -> tuple[Path, dict]:
    """SFT (or reuse ``<run>/sft_model.pt`` / ``experiment.sft_model``); returns the model file and SFT info."""
    import torch

    from algos.attnrl.sft import pretrain, pretrained_policy
    from envs.reasoning.task import ReasoningTask
    if exp.sft_model is not None:
        return Path(exp.sft_model), load_sft(exp.sft_model)[1]
    out = run_path / "sft_model.pt"
    if out.exists():
        return out, load_sft(out)[1]
    task = ReasoningTask(exp.task_config())
    t0 = time.perf_counter()
    if exp.hf_model is None:
        gpt_cfg = exp.gpt_config(task.tokenizer.vocab_size)
        policy, info = pretrained_policy(task, gpt_cfg, exp.sft_config(), init_seed=seed,
                                         cache_dir=run_path / "sft_cache")
        weights = gpt_weights(policy, gpt_cfg)
    else:
        from algos.attnrl.lm import load_hf_policy
        policy = load_hf_policy(exp.hf_model, autocast_bf16=exp.autocast_bf16)
        info = pretrain(policy, task, exp.sft_config())
        weights = hf_weights(policy, exp.hf_model)
    info = {**info, "wall_s": time.perf_counter() - t0}
    tmp = out.with_suffix(".tmp")
    torch.save({"weights": weights, "info": info}, tmp)
    tmp.replace(out)
    log.info("SFT: %d steps, greedy accuracy %.3f %s", info["steps"], info["accuracy"], info["by_difficulty"])
    return out, info


def policy_from_weights(weights: dict, autocast_bf16: bool = False):
    from experiments.attnrl.sampler import build_policy
    return build_policy(weights, {"autocast_bf16": autocast_bf16})


def eval_problems(task, per_difficulty: int, seed: int) -> list:
    rng = random.Random(seed)
    return [p for d in range(task.cfg.min_steps, task.cfg.max_steps + 1) for p in task.sample(rng, per_difficulty, d)]


def accuracy_by_difficulty(problems: Sequence, rewards: Sequence[float]) -> tuple[float, dict[int, float]]:
    per: dict[int, list[float]] = {}
    for p, r in zip(problems, rewards):
        per.setdefault(p.difficulty, []).append(float(r))
    acc = sum(map(float, rewards)) / max(len(rewards), 1)
    return acc, {d: sum(v) / len(v) for d, v in sorted(per.items())}


# ------------------------------------------------------------------------------------ pool-backed generation

class RecordingTask:
    """The task as ``algos.attnrl.attnrl.train`` sees it, remembering every sampled problem by its encoded prompt, so a
    generation request (token ids only) can carry its problem to the worker that scores it."""

    def __init__(self, task, encode) -> None:
        self.task, self.encode = task, encode
        self.cfg = task.cfg
        self.by_prompt: dict[tuple[int, ...], Any] = {}

    def sample(self, rng, n, difficulty=None):
        problems = self.task.sample(rng, n, difficulty)
        for p in problems:
            self.by_prompt[tuple(self.encode(p.prompt))] = p
        return problems

    def __getattr__(self, name):  # reward, max_response_chars, influence, tokenizer
        return getattr(self.task, name)


class PoolGenerator:
    """``generate_fn`` for :func:`algos.attnrl.attnrl.train` that samples on the shared pool.

    Before a call, the learner's current weights are published if an update happened since the last publication
    (one pool version per policy update); the call's requests are split into ``num_chunks`` pool requests. Every
    call is recorded (``calls``) with the number of updates before it, the weights version the workers used and,
    from the request tags, which batch's initial samples and which batch's continuations it carried.
    """

    def __init__(self, pool, key: str, policy, weights_fn, task: RecordingTask, num_chunks: int,
                 sampler_config: dict | None = None) -> None:
        self.pool, self.key, self.policy, self.weights_fn = pool, key, policy, weights_fn
        self.task, self.num_chunks = task, num_chunks
        self.sampler_config = sampler_config or {}
        self.updates = 0  # policy updates applied so far (advanced by the learner's log_fn)
        self.published_updates = -1
        self.version = 0  # pool version holding the weights after ``published_updates`` updates
        self.version_of_updates: dict[int, int] = {}
        self.calls: list[dict] = []
        self.pending_batches: deque[int] = deque()
        self.next_batch = 0
        self.batch_stats: dict[int, dict] = {}
        self.generated_tokens = 0

    def publish(self) -> int:
        if self.published_updates != self.updates:
            self.version = self.pool.publish(self.key, self.weights_fn(self.policy))
            self.published_updates = self.updates
            self.version_of_updates[self.updates] = self.version
        return self.version

    def run(self, items: list[dict], max_new_tokens: int, temperature: float, fci: dict | None,
            generator=None) -> list:
        import torch
        version = self.publish()
        chunks = _split(items, self.num_chunks)
        seeds = [int(torch.randint(0, 2**31 - 1, (1,), generator=generator)) if generator is not None else i
                 for i in range(len(chunks))]
        results = self.pool.map("lm", [{"items": c, "max_new_tokens": max_new_tokens, "temperature": temperature,
                                        "fci": fci, "seed": s} for c, s in zip(chunks, seeds)],
                                config=self.sampler_config, weights=self.key)
        used = {r["weights_version"] for r in results}
        if used != {version}:
            raise RuntimeError(f"pool sampled with weights versions {used}, expected {version}")
        return [r for res in results for r in res["rollouts"]]

    def __call__(self, policy, requests, max_new_tokens, temperature=1.0, generator=None, step_score_fn=None):
        import functools
        fci = None
        if step_score_fn is not None:
            if not isinstance(step_score_fn, functools.partial):
                raise TypeError("pool generation needs step_score_fn = functools.partial(fci_scores, ...)")
            fci = {k: step_score_fn.keywords[k] for k in ("delta", "zero_first_step") if k in step_score_fn.keywords}
        items = [{"prompt_ids": list(r.prompt_ids), "prefix_ids": list(r.prefix_ids),
                  "max_new_tokens": r.max_new_tokens, "tag": r.tag,
                  "problem": self.task.by_prompt.get(tuple(r.prompt_ids))} for r in requests]
        rollouts = self.run(items, max_new_tokens, temperature, fci, generator)
        self._record_call(rollouts)
        return rollouts

    def _record_call(self, rollouts: list) -> None:
        is_cont = [isinstance(r.tag, tuple) and r.tag and r.tag[0] == "cont" for r in rollouts]
        init = [r for r, c in zip(rollouts, is_cont) if not c]
        tokens = sum(r.num_generated for r in rollouts)
        self.generated_tokens += tokens
        init_batch = cont_batch = -1
        if any(is_cont):
            cont_batch = self.pending_batches.popleft()  # the oldest batch still waiting for its continuations
        if init:
            init_batch = self.next_batch
            self.next_batch += 1
            self.pending_batches.append(init_batch)
            self.batch_stats[init_batch] = _initial_sample_stats(init, self.task)
        self.calls.append({"call": len(self.calls), "updates_before": self.updates,
                           "weights_version": int(rollouts[0].meta["weights_version"]) if rollouts else -1,
                           "published_version": self.version, "init_batch": init_batch, "cont_batch": cont_batch,
                           "init_requests": len(init), "cont_requests": int(sum(is_cont)),
                           "generated_tokens": tokens})

    def evaluate(self, problems: Sequence, max_new_tokens: int) -> tuple[float, dict[int, float]]:
        """Greedy accuracy of the current weights on ``problems``, generated and scored on the pool."""
        items = [{"prompt_ids": self.policy.codec.encode(p.prompt), "prefix_ids": [], "max_new_tokens": None,
                  "tag": i, "problem": p} for i, p in enumerate(problems)]
        rollouts = self.run(items, max_new_tokens, 0.0, None)
        return accuracy_by_difficulty(problems, [r.meta["reward"] for r in rollouts])


def _split(items: list, n: int) -> list[list]:
    n = max(1, min(n, len(items)))
    size = math.ceil(len(items) / n)
    return [items[i:i + size] for i in range(0, len(items), size)]


def _initial_sample_stats(init: list, task: RecordingTask) -> dict[str, float]:
    """All-correct / all-wrong prompt ratios and accuracy by difficulty of one batch's initial samples."""
    groups: dict[Any, list[float]] = {}
    for r in init:
        prompt = tuple(r.prompt_ids)
        groups.setdefault(prompt, []).append(float(r.meta["reward"] or 0.0))
    out = {"init_all_correct_ratio": sum(all(v > 0 for v in g) for g in groups.values()) / len(groups),
           "init_all_wrong_ratio": sum(not any(v > 0 for v in g) for g in groups.values()) / len(groups)}
    problems = [task.by_prompt[tuple(r.prompt_ids)] for r in init]
    _, by_d = accuracy_by_difficulty(problems, [r.meta["reward"] or 0.0 for r in init])
    out |= {f"train_acc_d{d}": a for d, a in by_d.items()}
    return out


# ------------------------------------------------------------------------------------------ learner (Train worker)

def train_fn(config: dict) -> None:
    import torch

    from algos.attnrl.attnrl import METHODS as ALGO_METHODS, train
    from cluster import ddp
    from cluster.metrics import MetricsLogger, Progress
    from cluster.store import ParquetStore
    from envs.reasoning.task import ReasoningTask
    from experiments.registry import attach_pool

    ddp.set_threads(config["torch_threads"])
    ddp.quiet_logs()
    if ddp.world_size() != 1:
        raise RuntimeError("the AttnRL learner runs on one Train worker")
    exp = Config(**config["experiment"])
    method, seed = config["method"], config["seed"]
    run_path = Path(config["run_path"])
    with ddp.latest_checkpoint() as ckpt:
        if ckpt is not None and (ckpt / "done").exists():
            log.info("%s already finished in this run (checkpoint %s): nothing to do", method, ckpt)
            ddp.report({"resumed_done": 1.0})
            return
        if ckpt is not None:
            # algos.attnrl.attnrl.train keeps its optimizer, RNGs and pipeline state inside; it restarts from SFT
            log.warning("%s: unfinished run found; algos.attnrl.attnrl.train cannot resume mid-run, restarting", method)

    weights, _ = load_sft(config["sft_path"])
    policy = policy_from_weights(weights, exp.autocast_bf16)
    ref = copy.deepcopy(policy)
    weights_fn = lambda p: {**weights, "state_dict": _cpu_state(p.model)}  # noqa: E731 - same model, new version
    base_task = ReasoningTask(exp.task_config())
    task = RecordingTask(base_task, policy.codec.encode)
    rl_cfg = exp.rl_config(method, seed)
    pool_cfg = config["pool"]
    pool = attach_pool(pool_cfg)
    sampler_cfg = {"task": dataclasses.asdict(exp.task_config()), "seed": seed, "run": config["run_id"],
                   "autocast_bf16": exp.autocast_bf16, "max_batch_size": exp.sampler_max_batch}
    gen = PoolGenerator(pool, f"{config['run_id']}/{method}/policy", policy, weights_fn, task,
                        int(pool_cfg["num_workers"]) * exp.requests_per_worker, sampler_config=sampler_cfg)
    problems = eval_problems(base_task, exp.eval_problems_per_difficulty, exp.eval_seed)
    max_tokens = rl_cfg.max_response_tokens or base_task.max_response_chars()
    metrics_log = MetricsLogger(run_path, flush_every=10)
    progress = Progress(f"attnrl {method}", rl_cfg.token_budget, "tokens")
    method_id = ALGO_METHODS.index(method)
    t_start = time.perf_counter()

    def eval_row() -> dict:
        acc, by_d = gen.evaluate(problems, max_tokens)
        return {"eval_accuracy": acc, **{f"eval_acc_d{d}": a for d, a in by_d.items()}}

    def checkpoint(row: dict, done: bool) -> None:
        with ddp.checkpoint_dir() as d:
            torch.save({"weights": weights_fn(policy), "updates": gen.updates}, d / "policy.pt")
            if done:
                (d / "done").write_text("1")
            metrics_log.flush()
            ddp.report(_reportable(row), checkpoint_dir=d)

    first = {"method_id": method_id, "update": 0, "generated_tokens": 0, "policy_version": 0, "wall_s": 0.0,
             **eval_row()}
    metrics_log.log(0, first)
    last_row = first

    def log_fn(m: dict) -> None:
        nonlocal last_row
        gen.updates += 1  # train() calls this right after each update
        row = {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        row |= {"method_id": method_id, "policy_version": gen.updates, "batch_size": m.get("prompts"),
                "wall_s": time.perf_counter() - t_start, **gen.batch_stats.pop(gen.updates - 1, {})}
        if gen.updates % exp.eval_every_updates == 0:
            row |= eval_row()
        metrics_log.log(gen.updates, row)
        progress.update(m["generated_tokens"], update=gen.updates, reward=m.get("mean_reward", float("nan")))
        last_row = row
        if gen.updates % exp.checkpoint_every_updates == 0:
            checkpoint(row, done=False)
        else:
            ddp.report(_reportable(row))

    out = train(method, policy, ref, task, rl_cfg, generate_fn=gen, log_fn=log_fn)
    if "eval_accuracy" not in last_row:
        final = {"method_id": method_id, "update": gen.updates, "generated_tokens": out["generated_tokens"],
                 "policy_version": gen.updates, "wall_s": time.perf_counter() - t_start, **eval_row()}
        metrics_log.log(gen.updates, final)  # same step as the last update: a separate evaluation row
        last_row = final
    ParquetStore(run_path / "data" / f"generation-{method}").append(
        {k: [c[k] for c in gen.calls] for k in gen.calls[0]} if gen.calls else {"call": []})
    torch.save({"weights": weights_fn(policy), "updates": gen.updates}, run_path / f"policy-{method}.pt")
    checkpoint(last_row, done=True)
    metrics_log.close()


def _reportable(row: dict) -> dict:
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}


# ------------------------------------------------------------------------------------------------------ driver

def loop_config(cfg: dict, ctx, method: str, sft_path: Path) -> dict:
    return {"experiment": dataclasses.asdict(ctx.typed["experiment"]), "pool": dataclasses.asdict(ctx.typed["pool"]),
            "run_path": str(ctx.run_dir.path), "run_id": f"{cfg['experiment']['name']}/{ctx.run_dir.name}",
            "method": method, "seed": cfg["seed"], "torch_threads": cfg["torch_threads"], "sft_path": str(sft_path)}


def evaluate_sft(exp: Config, sft_path: Path) -> tuple[float, dict[int, float]]:
    from algos.attnrl.sft import evaluate_accuracy
    from envs.reasoning.task import ReasoningTask
    task = ReasoningTask(exp.task_config())
    policy = policy_from_weights(load_sft(sft_path)[0], exp.autocast_bf16)
    res = evaluate_accuracy(policy, task, eval_problems(task, exp.eval_problems_per_difficulty, exp.eval_seed))
    return res.accuracy, res.by_difficulty


def method_summary(df, method: str) -> dict[str, Any]:
    from algos.attnrl.attnrl import METHODS as ALGO_METHODS
    rows = df[df["method_id"] == ALGO_METHODS.index(method)]
    ev = rows.dropna(subset=["eval_accuracy"])
    last = ev.iloc[-1]
    diff_cols = sorted((c for c in ev.columns if c.startswith("eval_acc_d")), key=lambda c: int(c[10:]))
    updates = rows[rows["step"] > 0]
    valid = updates["valid_prompt_ratio"].dropna() if "valid_prompt_ratio" in updates else []
    return {"accuracy": float(last["eval_accuracy"]),
            "accuracy_by_difficulty": {c[10:]: float(last[c]) for c in diff_cols if not math.isnan(last[c])},
            "generated_tokens": int(rows["generated_tokens"].max()), "steps": int(rows["policy_version"].max()),
            "valid_ratio": float(valid.mean()) if len(valid) else float("nan"),
            "wall_s": float(rows["wall_s"].max())}


def plot_results(run_path: Path, df, summary: dict) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from algos.attnrl.attnrl import METHODS as ALGO_METHODS
    out = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in summary["methods"]:
        ev = df[df["method_id"] == ALGO_METHODS.index(m)].dropna(subset=["eval_accuracy"])
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


def run(cfg: dict, ctx) -> dict[str, Any]:
    from cluster.metrics import read_metrics
    from cluster.train import fit

    exp: Config = ctx.typed["experiment"]
    run_path = ctx.run_dir.path
    sft_path, sft_info = pretrain_sft(exp, run_path, cfg["seed"])
    sft_acc, sft_by_d = evaluate_sft(exp, sft_path)
    print(f"AttnRL SFT ({sft_info.get('steps')} steps, {sft_path}): greedy accuracy {sft_acc:.3f} {sft_by_d}",
          flush=True)
    ctx.pool  # create the pool (named) before the learners attach to it
    for method in exp.run_methods:
        fit(train_fn, loop_config(cfg, ctx, method, sft_path), name=f"learner-{method}",
            storage_path=ctx.run_dir.checkpoints, train=ctx.typed["train"])
    df = read_metrics(run_path)
    summary: dict[str, Any] = {
        "sft": {"accuracy": sft_acc, "accuracy_by_difficulty": {str(d): a for d, a in sft_by_d.items()}},
        "methods": {m: method_summary(df, m) for m in exp.run_methods},
        "token_budget": exp.rl_config(exp.run_methods[0], cfg["seed"]).token_budget,
    }
    summary["plots"] = plot_results(run_path, df, summary)
    for m, s in summary["methods"].items():
        print(f"AttnRL {m}: accuracy {s['accuracy']:.3f} (SFT {sft_acc:.3f}) after {s['steps']} updates, "
              f"{s['generated_tokens']} generated tokens, valid ratio {s['valid_ratio']:.2f}, {s['wall_s']:.0f} s",
              flush=True)
    return summary
