"""AttnRL on the real cluster: LM rollouts (with FCI and rewards) on the pool's "lm" samplers, the learner under Ray
Train, and AttnRL's one-step off-policy order kept through the pool (continuations of batch m sampled with the
weights version published after update m-1, i.e. after m updates)."""
from __future__ import annotations

import functools
import random
import uuid

import pytest
import torch

from algos.attnrl.fci import fci_scores
from algos.attnrl.gpt import GPT, GPTConfig
from algos.attnrl.lm import GenerationRequest, Policy, generate
from cluster.metrics import read_metrics
from cluster.pool import SharedPool
from cluster.store import ParquetStore
from envs.reasoning.task import ReasoningTask
from experiments.attnrl.sampler import LMSampler
from experiments.attnrl.weights import gpt_weights


def _shutdown_pool(name: str) -> None:
    try:
        SharedPool.attach({"name": name}, create=False).shutdown()
    except ValueError:
        pass


def _items(task, policy, problems, prefix=()):
    return [{"prompt_ids": policy.codec.encode(p.prompt), "prefix_ids": list(prefix), "max_new_tokens": None,
             "tag": ("init", i, 0), "problem": p} for i, p in enumerate(problems)]


def test_lm_sampler_matches_local_generation_and_scores_rewards():
    """The worker's rollouts equal local generate() with the same seed (same weights, same FCI), rewards are the
    task's exact match, and a new weights version is loaded in place."""
    task = ReasoningTask()
    torch.manual_seed(0)
    gpt_cfg = GPTConfig(vocab_size=task.tokenizer.vocab_size, n_embd=32)
    policy = Policy(GPT(gpt_cfg), task.tokenizer)
    sampler = LMSampler({"task": {}, "seed": 0})
    sampler.load_weights(gpt_weights(policy, gpt_cfg), 3)
    problems = task.sample(random.Random(0), 4)
    request = {"items": _items(task, policy, problems), "max_new_tokens": 24, "temperature": 1.0,
               "fci": {"delta": 1}, "seed": 7}
    out = sampler.sample(request)
    local = generate(policy, [GenerationRequest(tuple(it["prompt_ids"]), tag=it["tag"]) for it in request["items"]],
                     24, 1.0, torch.Generator().manual_seed(7), functools.partial(fci_scores, delta=1))
    assert out["num_samples"] == 4 and out["weights_version"] == 3
    assert out["generated_tokens"] == sum(r.num_generated for r in local)
    for r, ref, p in zip(out["rollouts"], local, problems):
        assert r.generated_ids == ref.generated_ids and r.step_scores == pytest.approx(ref.step_scores)
        assert r.meta["reward"] == task.reward(p, task.tokenizer.decode(r.response_ids), r.finished)
    for v in policy.model.parameters():
        v.data.zero_()
    sampler.load_weights(gpt_weights(policy, gpt_cfg), 4)
    assert sampler.version == 4
    assert all(float(v.detach().abs().sum()) == 0 for v in sampler.policy.model.parameters())


def test_attnrl_run_on_the_pool_keeps_the_off_policy_order(tmp_path, ray_cluster):
    from experiments.run import main
    pool = f"attnrl-{uuid.uuid4().hex[:6]}"
    try:
        summary = main(["experiment=attnrl", f"output_dir={tmp_path}", "run_name=smoke", f"pool.name={pool}",
                        "experiment.methods=[]", "experiment.method=attnrl", "experiment.task.max_steps=3",
                        "experiment.sft.max_steps=60", "experiment.sft.eval_every=30",
                        "experiment.sft.eval_problems_per_difficulty=4", "experiment.rl.prompts_per_batch=2",
                        "experiment.rl.token_budget=1500", "experiment.rl.max_prompts_per_batch=4",
                        "experiment.eval_problems_per_difficulty=4",
                        "experiment.eval_every_updates=2", "experiment.checkpoint_every_updates=2"])
        stats = SharedPool.attach({"name": pool}, create=False).stats()
    finally:
        _shutdown_pool(pool)
    run = tmp_path / "attnrl" / "smoke"

    assert set(summary) == {"sft", "methods", "token_budget", "plots"}
    assert set(summary["sft"]) == {"accuracy", "accuracy_by_difficulty"}
    assert set(summary["sft"]["accuracy_by_difficulty"]) == {"1", "2", "3"}
    m = summary["methods"]["attnrl"]
    assert set(m) == {"accuracy", "accuracy_by_difficulty", "generated_tokens", "steps", "valid_ratio", "wall_s"}
    # the run stops where it lands nearest the budget: within about half an update cycle (~500 tokens here)
    assert summary["token_budget"] == 1500 and abs(m["generated_tokens"] - 1500) < 0.4 * 1500 and m["steps"] >= 2
    assert set(m["accuracy_by_difficulty"]) == {"1", "2", "3"} and 0.0 <= m["accuracy"] <= 1.0
    for p in summary["plots"]:
        assert (run / "plots").joinpath(p.rsplit("/", 1)[-1]).stat().st_size > 5_000
    assert (run / "sft_model.pt").exists() and (run / "policy-attnrl.pt").exists()
    assert list((run / "checkpoints" / "learner-attnrl").glob("checkpoint_*/done"))

    df = read_metrics(run)
    updates = df[df["step"] > 0].dropna(subset=["valid_prompt_ratio"])
    assert list(updates["policy_version"]) == list(range(1, m["steps"] + 1))
    for col in ("generated_tokens", "batch_size", "init_all_correct_ratio", "init_all_wrong_ratio"):
        assert col in updates and updates[col].notna().all(), col
    train_acc = updates[[c for c in updates.columns if c.startswith("train_acc_d")]]
    assert train_acc.notna().any(axis=1).all(), "every batch reports accuracy for the difficulties it holds"
    assert ((updates["init_all_correct_ratio"] + updates["init_all_wrong_ratio"]) <= 1.0).all()
    assert {"eval_acc_d1", "eval_acc_d3"} <= set(df.dropna(subset=["eval_accuracy"]).columns)

    calls = ParquetStore(run / "data" / "generation-attnrl").read().to_pandas()
    assert int(calls["generated_tokens"].sum()) == m["generated_tokens"]
    lm = stats["per_sampler"]["lm"]
    assert lm["samples"] >= int(calls["init_requests"].sum() + calls["cont_requests"].sum())
    assert lm["requests"] >= 2 * len(calls), "each generation call is split over both pool workers"
    # every call was sampled with the version published for the weights it was issued with
    assert (calls["weights_version"] == calls["published_version"]).all()
    cont = calls[calls["cont_batch"] >= 0]
    assert len(cont) == m["steps"]
    # one-step off-policy: call m carries the continuations of batch m (sampled after m updates = after update
    # m-1) together with the initial samples of batch m+1 (except the last call, which only drains)
    assert list(cont["cont_batch"]) == list(range(m["steps"]))
    assert (cont["updates_before"] == cont["cont_batch"]).all()
    assert (cont["init_batch"].iloc[:-1] == cont["cont_batch"].iloc[:-1] + 1).all()
    assert calls.iloc[0]["init_batch"] == 0 and calls.iloc[0]["cont_batch"] == -1
    # versions advance with updates: batch m's continuations use a newer version than batch m's originals
    first_version = dict(zip(calls["init_batch"], calls["weights_version"]))
    for _, c in cont.iloc[1:].iterrows():
        assert c["weights_version"] > first_version[c["cont_batch"]]


class _InProcessPool:
    """The pool's interface (publish by version, map over "lm" requests) with the real LMSampler, no Ray."""

    def __init__(self) -> None:
        self.published: dict[str, tuple[int, dict]] = {}
        self.sampler: LMSampler | None = None
        self.requests = 0

    def publish(self, key: str, weights: dict) -> int:
        version = self.published.get(key, (0, None))[0] + 1
        self.published[key] = (version, weights)
        return version

    def map(self, name: str, requests: list, config: dict, weights: str) -> list:
        assert name == "lm"
        self.sampler = self.sampler or LMSampler(config)
        version, w = self.published[weights]
        if self.sampler.version != version:
            self.sampler.load_weights(w, version)
        self.requests += len(requests)
        return [self.sampler.sample(r) for r in requests]


def test_pool_generator_keeps_the_off_policy_order_without_ray():
    """algos.attnrl.train.train through PoolGenerator: call m samples batch m's continuations and batch m+1's originals
    with the weights published after m updates; rewards and FCI come back from the sampler."""
    from algos.attnrl.config import RLConfig
    from algos.attnrl.train import train
    from envs.reasoning.task import ReasoningTaskConfig
    from experiments.attnrl.pool_generation import PoolGenerator, RecordingTask
    task = ReasoningTask(ReasoningTaskConfig(max_steps=2))
    torch.manual_seed(0)
    gpt_cfg = GPTConfig(vocab_size=task.tokenizer.vocab_size, n_embd=32)
    policy = Policy(GPT(gpt_cfg), task.tokenizer)
    ref = Policy(GPT(gpt_cfg), task.tokenizer)
    ref.model.load_state_dict(policy.model.state_dict())
    pool = _InProcessPool()
    recording = RecordingTask(task, task.tokenizer.encode)
    gen = PoolGenerator(pool, "run/policy", policy, lambda p: gpt_weights(p, gpt_cfg), recording, num_chunks=2,
                        sampler_config={"task": {"max_steps": 2}})
    seen_fci = []

    def log_fn(m):
        gen.updates += 1

    real_call = gen.__call__

    def spy(*args, **kwargs):
        rollouts = real_call(*args, **kwargs)
        seen_fci.extend(r.step_scores is not None for r in rollouts)
        return rollouts

    out = train("attnrl", policy, ref, recording, RLConfig(prompts_per_batch=2, max_prompts_per_batch=2,
                                                            token_budget=1200, seed=0), generate_fn=spy,
                log_fn=log_fn)
    calls = gen.calls
    assert out["updates"] >= 2 and gen.generated_tokens == out["generated_tokens"] and all(seen_fci)
    assert pool.requests == 2 * len(calls)
    conts = [c for c in calls if c["cont_batch"] >= 0]
    assert [c["cont_batch"] for c in conts] == list(range(out["updates"]))
    for c in conts:
        assert c["updates_before"] == c["cont_batch"]
        assert c["weights_version"] == gen.version_of_updates[c["updates_before"]]
    assert all(c["init_batch"] == c["cont_batch"] + 1 for c in conts[:-1]) and conts[-1]["init_batch"] == -1
