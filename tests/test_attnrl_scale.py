"""AttnRL at scale, without Ray: bounded-memory teacher forcing, the data-parallel update (two gloo processes), the
replay that resumes a run mid-way, the pool path's bookkeeping (issue 17), the sampler's device and precision, and
the paper-scale config's model path."""
from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch

from algos.attnrl.config import METHODS, RLConfig
from algos.attnrl.gpt import GPT, GPTConfig
from algos.attnrl.lm import GenerationRequest, Policy
from algos.attnrl.scoring import chunk_by_tokens, forward_scores
from algos.attnrl.ppo import TrainSequence, UpdateContext, follow_updates, ppo_update, stop_followers
from envs.reasoning.task import CharTokenizer, ReasoningTask, ReasoningTaskConfig
from experiments.attnrl.pool_generation import PoolGenerator, RecordingTask
from experiments.attnrl.rollout_log import RolloutLog
from experiments.attnrl.weights import gpt_weights
from tests.helpers import InProcessPool, write_tiny_qwen2

TOK = CharTokenizer()


def _policy(seed: int = 0, **kw) -> Policy:
    torch.manual_seed(seed)
    return Policy(GPT(GPTConfig(vocab_size=TOK.vocab_size, n_layer=2, n_head=2, n_embd=32, block_size=64)), TOK,
                  **kw)


def _sequences(n: int, seed: int = 0) -> list[TrainSequence]:
    g = random.Random(seed)
    out = []
    for _ in range(n):
        p = [g.randrange(2, TOK.vocab_size) for _ in range(g.randint(3, 12))]
        r = [g.randrange(2, TOK.vocab_size) for _ in range(g.randint(1, 20))]
        out.append(TrainSequence(p, r, [-3 * g.random() for _ in r], [g.gauss(0, 1) for _ in r], 1.0))
    return out


class _CountingModel(torch.nn.Module):
    """Records the padded size (batch x length) of every forward pass of the model it wraps."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.sizes: list[int] = []

    def forward(self, input_ids, **kwargs):
        self.sizes.append(input_ids.numel())
        return self.model(input_ids, **kwargs)


# -- bounded-memory teacher forcing ----------------------------------------------------------------------------------

def test_chunk_by_tokens_bounds_every_chunk():
    lengths = [5, 9, 3, 30, 2, 2, 8]
    chunks = chunk_by_tokens(lengths, 18)
    assert [i for c in chunks for i in c] == list(range(len(lengths)))
    for c in chunks:
        assert len(c) == 1 or len(c) * max(lengths[i] for i in c) <= 18
    assert chunk_by_tokens(lengths, None) == [list(range(len(lengths)))] and chunk_by_tokens([], 4) == []


def test_chunked_forward_equals_one_pass_and_never_exceeds_its_budget():
    policy = _policy()
    seqs = _sequences(11)
    prompts, responses = [s.prompt_ids for s in seqs], [s.response_ids for s in seqs]
    with torch.no_grad():
        whole = forward_scores(policy, prompts, responses, 0.7, output_step_attention=True)
        counting = _CountingModel(policy.model)
        chunked = forward_scores(Policy(counting, TOK, max_tokens_per_forward=40), prompts, responses, 0.7,
                                 output_step_attention=True)
    longest = max(len(p) + len(r) for p, r in zip(prompts, responses))
    assert len(counting.sizes) > 3 and max(counting.sizes) <= max(40, longest)
    for name in ("logprobs", "entropy", "mask"):
        assert getattr(chunked, name).shape == getattr(whole, name).shape
        assert torch.allclose(getattr(chunked, name), getattr(whole, name), atol=1e-5), name
    for a, b in zip(chunked.step_attention, whole.step_attention):
        assert torch.allclose(a, b, atol=1e-6)


def test_update_in_micro_batches_equals_one_pass():
    """The reference pass in chunks and the mini-batches in micro-batches (gradients summed, normalised by the
    mini-batch's tokens) give the update of one pass per mini-batch; no pass exceeds the token budget."""
    seqs = _sequences(13)
    cfg = RLConfig(ppo_minibatch=5, ppo_epochs=2)
    runs = []
    for budget in (None, 45):
        policy, ref = _policy(max_tokens_per_forward=budget), _policy(max_tokens_per_forward=budget)
        counting = _CountingModel(policy.model)
        policy.model = counting
        ref.model = _CountingModel(ref.model)
        opt = torch.optim.SGD(counting.parameters(), lr=0.1)
        rng = random.Random(1)
        stats = ppo_update(policy, ref, opt, seqs, cfg, rng)
        runs.append((counting, ref.model, stats, rng.random()))
    (one, one_ref, s1, r1), (micro, micro_ref, s2, r2) = runs
    longest = max(len(s.prompt_ids) + len(s.response_ids) for s in seqs)
    assert max(micro.sizes + micro_ref.sizes) <= max(45, longest) < max(one.sizes)
    assert len(micro.sizes) > len(one.sizes) == s1["optimizer_steps"] == 6 and r1 == r2
    for k in s1:
        assert s2[k] == pytest.approx(s1[k], rel=1e-4, abs=1e-6), k
    for a, b in zip(one.parameters(), micro.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


# -- data parallel: rank 0 sends the sequences, every rank trains its share, gradients summed ------------------------

def _data_parallel_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    policy, ref = _policy(max_tokens_per_forward=60), _policy()
    policy.update_context = UpdateContext(rank=rank, world_size=world, control_group=dist.new_group(backend="gloo"))
    cfg = RLConfig(ppo_minibatch=4, ppo_epochs=2)
    stats: list = []
    if rank == 0:
        opt = torch.optim.SGD(policy.model.parameters(), lr=0.1)
        rng = random.Random(3)
        # 9 sequences in mini-batches of 4: the last mini-batch (1 sequence) leaves rank 1 without a share
        for seqs in (_sequences(9, 1), [], _sequences(6, 2)):
            stats.append(ppo_update(policy, ref, opt, seqs, cfg, rng))
        stop_followers(policy.update_context)
        stats.append(rng.random())
    else:
        follow_updates(policy, ref, cfg, stats.append)
    torch.save({"params": policy.model.state_dict(), "stats": stats}, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_data_parallel_update_keeps_ranks_identical_and_equals_one_process(tmp_path):
    # fork: the ranks need nothing but this module's functions, and spawning would import torch twice more
    torch.multiprocessing.start_processes(_data_parallel_worker, args=(2, str(tmp_path / "init"), str(tmp_path)),
                                          nprocs=2, start_method="fork")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert all(torch.equal(r0["params"][k], r1["params"][k]) for k in r0["params"])
    assert len(r1["stats"]) == 3 and r1["stats"][1] == {}  # every update reached rank 1, the empty one too

    policy, ref = _policy(), _policy()
    opt = torch.optim.SGD(policy.model.parameters(), lr=0.1)
    rng = random.Random(3)
    single = [ppo_update(policy, ref, opt, seqs, RLConfig(ppo_minibatch=4, ppo_epochs=2), rng)
              for seqs in (_sequences(9, 1), [], _sequences(6, 2))]
    assert r0["stats"][-1] == rng.random()  # rank 0 drew the same shuffles
    for k, v in policy.model.state_dict().items():
        assert torch.allclose(r0["params"][k], v, atol=1e-6), k
    for got, want in zip(r0["stats"], single):
        assert set(got) == set(want) and all(got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6) for k in want)


# -- resume: replaying the rollout log rebuilds the training loop's state exactly ---------------------------------

def _pool_run(method: str, log_dir: Path, stop_at: int | None = None, resume: dict | None = None):
    """algos.attnrl.train.train through PoolGenerator on an in-process pool, as the learner runs it: with
    ``stop_at`` the state at that update is kept (as a checkpoint would); with ``resume`` the run replays that
    checkpoint's rollouts and updates, then continues live."""
    from algos.attnrl.train import train
    task = ReasoningTask(ReasoningTaskConfig(max_steps=3))
    gpt_cfg = GPTConfig(vocab_size=TOK.vocab_size, n_layer=2, n_head=2, n_embd=32, block_size=256)
    torch.manual_seed(0)
    policy = Policy(GPT(gpt_cfg), TOK)
    ref = copy.deepcopy(policy)
    context = UpdateContext()
    if resume is not None:
        context.replay_updates, context.optimizer_state = resume["updates"], resume["optimizer"]
    policy.update_context = context
    log = RolloutLog(log_dir)
    gen = PoolGenerator(InProcessPool(), "run/policy", policy, lambda p: gpt_weights(p, gpt_cfg),
                        RecordingTask(task, TOK.encode), 2, sampler_config={"task": {"max_steps": 3}}, log=log,
                        replay=resume["log"] if resume is not None else ())
    rows: list[dict] = []
    saved: dict = {}

    def log_fn(m):
        gen.on_update()
        if resume is not None and gen.updates <= resume["updates"]:
            if gen.updates == resume["updates"]:
                assert not gen.replaying and gen.generated_tokens == resume["tokens"]
                policy.model.load_state_dict(resume["weights"])
            return
        rows.append({k: v for k, v in m.items() if k != "seconds"})
        if gen.updates == stop_at:
            saved.update(weights=copy.deepcopy(policy.model.state_dict()), updates=gen.updates,
                         optimizer=copy.deepcopy(context.optimizer.state_dict()), calls=len(gen.calls),
                         tokens=gen.generated_tokens, rows=len(rows))

    # short responses: a batch's worst case (what the budget reserves) stays small, so 3000 tokens buy >= 4 updates
    cfg = RLConfig(prompts_per_batch=2, max_prompts_per_batch=4, token_budget=3000, max_response_tokens=12, seed=0,
                   lr=3e-3)
    train(method, policy, ref, gen.task, cfg, generate_fn=gen, log_fn=log_fn)
    return rows, saved, policy, gen


@pytest.mark.parametrize("method", [m for m in ("attnrl", "entropy_tree", "grpo", "random_tree") if m in METHODS])
def test_replaying_the_rollout_log_resumes_exactly(tmp_path, monkeypatch, method):
    """A run resumed from its state after update 2 (weights, optimizer, the log of its generation calls) makes the
    same later updates as the uninterrupted run: same metrics, same calls, same final weights."""
    # an untrained model never solves a problem: a reward of the text's parity gives the updates something to learn
    monkeypatch.setattr(ReasoningTask, "reward", lambda self, problem, text, finished=True: float(len(text) % 2))
    rows, saved, policy, gen = _pool_run(method, tmp_path / "a", stop_at=2)
    assert saved and len(rows) >= 4, "the run must go on after the checkpoint"
    assert sum(bool(r.get("optimizer_steps")) for r in rows[saved["rows"]:]) >= 2, "updates after it train"
    logged = RolloutLog(tmp_path / "a").read()
    assert len(logged) == len(gen.calls)
    resumed_rows, _, resumed, regen = _pool_run(method, tmp_path / "b",
                                                resume={**saved, "log": logged[:saved["calls"]]})
    assert resumed_rows == rows[saved["rows"]:]  # every metric of every later update, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(policy.model.parameters(), resumed.model.parameters()))
    strip = [{k: v for k, v in c.items() if "version" not in k} for c in gen.calls]
    assert [{k: v for k, v in c.items() if "version" not in k} for c in regen.calls] == strip
    assert len(RolloutLog(tmp_path / "b").read()) == len(gen.calls) - saved["calls"]  # live calls only


# -- the pool path's bookkeeping (issue 17) --------------------------------------------------------------------------

def _generator():
    task = ReasoningTask(ReasoningTaskConfig(max_steps=2))
    gpt_cfg = GPTConfig(vocab_size=TOK.vocab_size, n_layer=1, n_head=2, n_embd=16, block_size=256)
    torch.manual_seed(0)
    policy = Policy(GPT(gpt_cfg), TOK)
    pool = InProcessPool()
    recording = RecordingTask(task, TOK.encode)
    return PoolGenerator(pool, "run/policy", policy, lambda p: gpt_weights(p, gpt_cfg), recording, 2,
                         sampler_config={"task": {"max_steps": 2}}), pool, recording


def test_an_empty_generation_call_samples_nothing():
    """Every prompt filtered out: the call has no requests; it used to crash (``_split([], n)``: range() arg 3)."""
    gen, pool, _ = _generator()
    assert gen(gen.policy, [], 16, 1.0, torch.Generator().manual_seed(0)) == []
    assert pool.requests == 0 and gen.calls[-1]["init_requests"] == gen.calls[-1]["cont_requests"] == 0


def test_a_call_without_continuations_keeps_the_batch_labels():
    """Off-policy calls: m carries batch m's initial samples and batch m-1's continuations; when every response of
    batch 0 is filtered, call 1 carries none of them, yet it is batch 0 that update 1 trains. The labels written to
    the generation Parquet used to shift by one from there on."""
    gen, _, recording = _generator()
    problems = recording.sample(random.Random(0), 6)
    g = torch.Generator().manual_seed(0)

    def init(batch):
        return [GenerationRequest(tuple(TOK.encode(p.prompt)), tag=("init", i, 0))
                for i, p in enumerate(problems[2 * batch:2 * batch + 2])]

    def cont(batch):
        prompt = tuple(TOK.encode(problems[2 * batch].prompt))
        return [GenerationRequest(prompt, tuple(TOK.encode("c")), tag=("cont", 0, 0, 1))]

    gen(gen.policy, init(0), 16, 1.0, g)  # warm-up call: batch 0's initial samples
    gen(gen.policy, init(1), 16, 1.0, g)  # batch 1's initial samples; batch 0's continuations: none
    gen.on_update()  # trains batch 0
    gen(gen.policy, init(2) + cont(1), 16, 1.0, g)
    gen.on_update()  # trains batch 1
    gen(gen.policy, cont(2), 16, 1.0, g)  # drains
    gen.on_update()  # trains batch 2
    assert [c["init_batch"] for c in gen.calls] == [0, 1, 2, -1]
    assert [c["cont_batch"] for c in gen.calls] == [-1, 0, 1, 2]
    assert [c["updates_before"] for c in gen.calls] == [0, 0, 1, 2]


# -- devices, precision and the paper-scale model path ---------------------------------------------------------------

def test_lm_sampler_uses_the_assigned_device_and_precision_by_hardware(monkeypatch):
    from algos.precision import use_bf16
    from experiments.attnrl import sampler as sampler_module
    picked = []

    def assigned_device():
        picked.append(True)
        return torch.device("cpu")

    monkeypatch.setattr(sampler_module, "assigned_device", assigned_device)
    gpt_cfg = GPTConfig(vocab_size=TOK.vocab_size, n_layer=1, n_head=2, n_embd=16, block_size=64)
    torch.manual_seed(0)
    weights = gpt_weights(Policy(GPT(gpt_cfg), TOK), gpt_cfg)
    s = sampler_module.LMSampler({"task": {}, "seed": 0, "autocast_bf16": "auto"})
    s.load_weights(weights, 1)
    assert picked and s.generator.device == s.device == next(s.policy.model.parameters()).device
    assert s.policy.autocast_bf16 == use_bf16("auto", "cpu")
    explicit = sampler_module.LMSampler({"task": {}, "seed": 0, "autocast_bf16": False})
    explicit.load_weights(weights, 1)
    assert explicit.policy.autocast_bf16 is False
    from experiments.registry import sampler_factories
    assert sampler_factories()["lm"][1] == "gpu"


def test_lm_requests_are_split_over_the_group_the_sampler_runs_in():
    from experiments.attnrl.learner import lm_workers
    assert lm_workers({"num_workers": 3}) == 3
    assert lm_workers({"num_workers": 3, "groups": {"gpu": {"num_workers": 5, "num_gpus": 0.25}}}) == 5


def test_paper_scale_needs_an_explicit_local_model(tmp_path, capsys):
    from experiments.config import ConfigError, load
    from experiments.run import main
    with pytest.raises(SystemExit) as exit_info:
        main(["experiment=attnrl", "scale=paper", f"output_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "\n" not in err
    assert err.startswith("config error: experiment.hf_model: scale=paper") and "experiment.hf_model=<" in err
    with pytest.raises(ConfigError, match=r"^experiment.hf_model: /nowhere is not a local Hugging Face model"):
        load(["experiment=attnrl", "scale=paper", "experiment.hf_model=/nowhere"])
    cfg = load(["experiment=attnrl", "scale=paper", f"experiment.hf_model={write_tiny_qwen2(tmp_path / 'm')}"])
    assert cfg["train"]["num_workers"] == 4 and cfg["_typed"]["experiment"].max_tokens_per_forward == 16384
