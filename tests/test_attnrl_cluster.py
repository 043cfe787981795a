"""AttnRL on the real cluster: LM rollouts (with FCI and rewards) on the pool's "lm" samplers, the learner under Ray
Train on two data-parallel ranks, AttnRL's one-step off-policy order kept through the pool (continuations of batch m
sampled with the weights version published after update m-1, i.e. after m updates), a run killed mid-way and
resumed, and a Hugging Face model through SFT and an update."""
from __future__ import annotations

import functools
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import ray
import torch

from algos.attnrl.fci import fci_scores
from algos.attnrl.gpt import GPT, GPTConfig
from algos.attnrl.lm import GenerationRequest, Policy, generate
from cluster.metrics import read_metrics
from cluster.pool import SharedPool
from cluster.rundir import RunDir
from cluster.store import ParquetStore
from envs.reasoning.task import ReasoningTask
from experiments.attnrl.sampler import LMSampler
from experiments.attnrl.weights import gpt_weights
from tests.helpers import InProcessPool, registered_checkpoint, write_tiny_qwen2

ROOT = Path(__file__).resolve().parents[1]


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
        # the same tokens; FCI to float rounding, which differs between the two paths on some CPUs (8e-6 on AVX512)
        assert r.generated_ids == ref.generated_ids and r.step_scores == pytest.approx(ref.step_scores, rel=1e-4)
        assert r.meta["reward"] == task.reward(p, task.tokenizer.decode(r.response_ids), r.finished)
    for v in policy.model.parameters():
        v.data.zero_()
    sampler.load_weights(gpt_weights(policy, gpt_cfg), 4)
    assert sampler.version == 4
    assert all(float(v.detach().abs().sum()) == 0 for v in sampler.policy.model.parameters())


def _args(tmp_path, pool: str, run_name: str, *extra: str) -> list[str]:
    return ["experiment=attnrl", f"output_dir={tmp_path}", f"run_name={run_name}", f"pool.name={pool}",
            "experiment.methods=[]", "experiment.method=attnrl", "experiment.task.max_steps=3",
            "experiment.sft.max_steps=60", "experiment.sft.eval_every=30",
            "experiment.sft.eval_problems_per_difficulty=4", "experiment.rl.prompts_per_batch=2",
            # a batch starts only if its worst case (2 x 6 x 54 x 5 = 3240 tokens) fits in what is left: 5400 buy
            # >= 3 updates of fixed size 2 (~2000 tokens spent)
            "experiment.rl.token_budget=5400", "experiment.rl.max_prompts_per_batch=2",
            "experiment.eval_problems_per_difficulty=4", "experiment.eval_every_updates=2",
            "experiment.checkpoint_every_updates=2", "train.num_workers=2", *extra]


def _check_run(run: Path, summary: dict, stats: dict) -> tuple:
    """A finished AttnRL run: summary, plots, files, one metrics row per update, the off-policy order of the
    generation calls, and both learner ranks with the same parameters. Returns (update rows, calls, digest)."""
    assert set(summary) == {"sft", "methods", "token_budget", "plots"}
    assert set(summary["sft"]) == {"accuracy", "accuracy_by_difficulty"}
    assert set(summary["sft"]["accuracy_by_difficulty"]) == {"1", "2", "3"}
    m = summary["methods"]["attnrl"]
    assert set(m) == {"accuracy", "accuracy_by_difficulty", "generated_tokens", "budget_share", "steps",
                      "valid_ratio", "wall_s"}
    # the budget is a cap: the run ends at or below it, and the summary says which share it spent
    assert summary["token_budget"] == 5400 and 0 < m["generated_tokens"] <= 5400 and m["steps"] >= 3
    assert m["budget_share"] == m["generated_tokens"] / 5400
    assert set(m["accuracy_by_difficulty"]) == {"1", "2", "3"} and 0.0 <= m["accuracy"] <= 1.0
    for p in summary["plots"]:
        assert (run / "plots").joinpath(p.rsplit("/", 1)[-1]).stat().st_size > 5_000
    assert (run / "policy-attnrl.pt").exists()
    (final,) = [c for c in RunDir(run).learner_checkpoints("learner-attnrl") if (c / "done").exists()]
    shards = [json.loads((final / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert shards[0] == shards[1] and shards[0]["updates"] == m["steps"], "ranks hold the same parameters"

    df = read_metrics(run)
    assert not df.duplicated(subset=["step", "eval_accuracy", "generated_tokens"]).any()
    updates = df[df["step"] > 0].dropna(subset=["valid_prompt_ratio"])
    assert list(updates["policy_version"]) == list(range(1, m["steps"] + 1)), "every update once, in order"
    assert updates["generated_tokens"].is_monotonic_increasing and updates["wall_s"].is_monotonic_increasing
    for col in ("generated_tokens", "batch_size", "init_all_correct_ratio", "init_all_wrong_ratio"):
        assert col in updates and updates[col].notna().all(), col
    train_acc = updates[[c for c in updates.columns if c.startswith("train_acc_d")]]
    assert train_acc.notna().any(axis=1).all(), "every batch reports accuracy for the difficulties it holds"
    assert ((updates["init_all_correct_ratio"] + updates["init_all_wrong_ratio"]) <= 1.0).all()
    assert {"eval_acc_d1", "eval_acc_d3"} <= set(df.dropna(subset=["eval_accuracy"]).columns)

    calls = ParquetStore(run / "data" / "generation-attnrl").read().to_pandas()
    assert int(calls["generated_tokens"].sum()) == m["generated_tokens"] == updates["generated_tokens"].max()
    assert len(ParquetStore(run / "data" / "rollouts-attnrl").parts()) == len(calls), "one log part per call"
    lm = stats["per_sampler"]["lm"]
    assert lm["samples"] >= int(calls["init_requests"].sum() + calls["cont_requests"].sum())
    sampled = calls[calls["init_requests"] + calls["cont_requests"] > 0]
    assert lm["requests"] >= 2 * len(sampled), "each generation call is split over both pool workers"
    # every call was sampled with the version published for the weights it was issued with
    assert (sampled["weights_version"] == sampled["published_version"]).all()
    cont = calls[calls["cont_batch"] >= 0]
    assert len(cont) == m["steps"]
    # one-step off-policy: the call that carries batch m's continuations (sampled after m updates = after update
    # m-1) carries batch m+1's initial samples too, except where the pipeline drains (the budget rule may start it
    # again: a warm-up call with initial samples only)
    assert list(cont["cont_batch"]) == list(range(m["steps"]))
    assert (cont["updates_before"] == cont["cont_batch"]).all()
    both = cont[cont["init_batch"] >= 0]
    assert len(both) >= 1 and (both["init_batch"] == both["cont_batch"] + 1).all()
    assert calls.iloc[0]["init_batch"] == 0 and calls.iloc[0]["cont_batch"] == -1
    # versions advance with updates: the continuations of a batch whose initial samples rode along with the previous
    # batch's continuations come from a newer version than those initial samples
    piggyback = dict(zip(both["init_batch"], both["weights_version"]))
    for _, c in cont.iterrows():
        if c["cont_batch"] in piggyback and c["cont_requests"]:
            assert c["weights_version"] > piggyback[c["cont_batch"]]
    return updates, calls, shards[0]["param_digest"]


def _registered_update(run: Path) -> int:
    """The latest update whose checkpoint Ray Train has registered (a resumed run restarts from it)."""
    latest = registered_checkpoint(run / "checkpoints" / "learner-attnrl")
    return int(latest["metrics"].get("policy_version", 0)) if latest else 0


@pytest.mark.slow
def test_attnrl_on_two_learner_ranks_killed_and_resumed_ends_as_uninterrupted(tmp_path, module_pool_name):
    """The learner on 2 Ray Train workers (DDP): both ranks keep identical parameters. The same run with its driver
    SIGKILLed after its checkpoint of update 2 and resumed (resume=true) replays up to that checkpoint and ends
    exactly as the uninterrupted run: the same metric rows, once each, the same calls, the same final weights."""
    from experiments.run import main
    pool = module_pool_name  # one pool for the module's runs (conftest)
    gcs = ray.get_runtime_context().gcs_address
    summary = main(_args(tmp_path, pool, "ref"))
    ref_updates, ref_calls, ref_digest = _check_run(tmp_path / "attnrl" / "ref", summary,
                                                    SharedPool.attach({"name": pool}, create=False).stats())

    run = tmp_path / "attnrl" / "killed"
    args = _args(tmp_path, pool, "killed", f"experiment.sft_model={tmp_path / 'attnrl' / 'ref' / 'sft_model.pt'}")
    proc = subprocess.Popen([sys.executable, "-m", "experiments.run", *args, f"cluster.address={gcs}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while _registered_update(run) < 2:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no checkpoint of update 2:\n{proc.stdout.read()[-3000:]}")
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        kill_time = time.time()
    finally:
        proc.kill()
        proc.wait()
    killed_at = _registered_update(run)
    assert killed_at < summary["methods"]["attnrl"]["steps"], "the run finished before it could be killed"
    resumed = main(args + ["resume=true"])
    updates, calls, digest = _check_run(run, resumed, SharedPool.attach({"name": pool}, create=False).stats())
    # resumed, not restarted: the calls up to the checkpoint (at least one per update) were sampled before the kill
    parts = ParquetStore(run / "data" / "rollouts-attnrl").parts()
    assert sum(p.stat().st_mtime < kill_time for p in parts) > killed_at
    assert digest == ref_digest, "the resumed run ends with the uninterrupted run's weights"
    same = [c for c in ref_updates.columns if c not in ("time", "wall_s", "seconds")]
    pd.testing.assert_frame_equal(updates[same].reset_index(drop=True), ref_updates[same].reset_index(drop=True))
    versions = [c for c in calls.columns if "version" in c]
    pd.testing.assert_frame_equal(calls.drop(columns=versions), ref_calls.drop(columns=versions))


@pytest.mark.slow
def test_tiny_hf_model_through_sft_and_an_rl_update_on_the_pool(tmp_path, module_pool_name):
    """A 2-layer Qwen2 with a character tokenizer, built here: SFT, one AttnRL update (the learner's passes in
    chunks of 64 tokens) with rollouts (and FCI) from the pool's samplers loading the same local model, evaluation."""
    from experiments.run import main
    model_dir = write_tiny_qwen2(tmp_path / "qwen2")
    pool = module_pool_name  # one pool for the module's runs (conftest)
    summary = main(["experiment=attnrl", f"output_dir={tmp_path}", "run_name=hf", f"pool.name={pool}",
                    f"experiment.hf_model={model_dir}", "experiment.methods=[]", "experiment.method=attnrl",
                    "experiment.task.max_steps=2", "experiment.sft.max_steps=3", "experiment.sft.eval_every=3",
                    "experiment.sft.eval_problems_per_difficulty=2", "experiment.eval_problems_per_difficulty=2",
                    "experiment.rl.prompts_per_batch=2", "experiment.rl.max_updates=1",
                    "experiment.rl.max_response_tokens=24", "experiment.max_tokens_per_forward=64",
                    # an untrained model solves nothing: keep its zero-advantage paths, so the update trains
                    "experiment.rl.ads.zero_advantage_filter=false", "experiment.autocast_bf16=auto"])
    run = tmp_path / "attnrl" / "hf"
    m = summary["methods"]["attnrl"]
    assert m["steps"] == 1 and m["generated_tokens"] > 0 and 0.0 <= m["accuracy"] <= 1.0
    sft = torch.load(run / "sft_model.pt", weights_only=True)
    assert sft["weights"]["kind"] == "hf" and sft["weights"]["path"] == str(model_dir) and sft["info"]["steps"] == 3
    assert set(torch.load(run / "policy-attnrl.pt", weights_only=True)["weights"]["state_dict"]) == \
        set(sft["weights"]["state_dict"])
    (update,) = read_metrics(run).dropna(subset=["valid_prompt_ratio"]).to_dict("records")
    assert update["train_sequences"] > 0 and update["optimizer_steps"] >= 1, "PPO ran on the HF model"
    calls = ParquetStore(run / "data" / "generation-attnrl").read().to_pandas()
    assert list(calls["cont_batch"]) == [-1, 0] and int(calls["generated_tokens"].sum()) == m["generated_tokens"]


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
    pool = InProcessPool()
    recording = RecordingTask(task, task.tokenizer.encode)
    gen = PoolGenerator(pool, "run/policy", policy, lambda p: gpt_weights(p, gpt_cfg), recording, num_chunks=2,
                        sampler_config={"task": {"max_steps": 2}})
    seen_fci = []

    def log_fn(m):
        gen.on_update()

    real_call = gen.__call__

    def spy(*args, **kwargs):
        rollouts = real_call(*args, **kwargs)
        seen_fci.extend(r.step_scores is not None for r in rollouts)
        return rollouts

    # a batch's worst case is 2 x 6 x 16 x (1 + 2 x 2) = 960 tokens: the budget reserves it before each batch
    out = train("attnrl", policy, ref, recording, RLConfig(prompts_per_batch=2, max_prompts_per_batch=2,
                                                            max_response_tokens=16, token_budget=2000, seed=0),
                generate_fn=spy, log_fn=log_fn)
    calls = gen.calls
    assert out["updates"] >= 2 and gen.generated_tokens == out["generated_tokens"] <= 2000 and all(seen_fci)
    # two pool requests per call, fewer only for a call with fewer items (a batch cut to fit the budget, a drain)
    assert pool.requests == sum(min(2, c["init_requests"] + c["cont_requests"]) for c in calls)
    conts = [c for c in calls if c["cont_batch"] >= 0]
    assert [c["cont_batch"] for c in conts] == list(range(out["updates"]))
    for c in conts:
        assert c["updates_before"] == c["cont_batch"]
        if c["init_requests"] + c["cont_requests"]:  # a call with nothing to sample publishes no weights
            assert c["weights_version"] == gen.version_of_updates[c["updates_before"]]
    # every batch started once, in order; a call with continuations carries the next batch's initial samples
    # unless the budget could not hold both (the pipeline drains; a warm-up call may start it again)
    assert [c["init_batch"] for c in calls if c["init_batch"] >= 0] == list(range(out["updates"]))
    assert all(c["init_batch"] in (-1, c["cont_batch"] + 1) for c in conts) and conts[-1]["init_batch"] == -1
    assert sum(c["init_batch"] == c["cont_batch"] + 1 for c in conts) >= 1
