"""Issue 39's GPU-path bugs, each checked on a CPU-only machine with a test that fails when its bug is put back:
device placement through ``meta`` tensors (an op mixing a cpu and a meta tensor raises, as cpu with cuda does),
fp32 master weights of a bf16-saved Hugging Face model, bounded log-prob temporaries, the deploy files and the
GPU nodes' pinned environment."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from algos.attnrl.fci import fci_scores, later_attention
from algos.attnrl.lm import StepAttentionAccumulator

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------- 1. FCI's mask on the sums' device

def test_fci_runs_where_the_attention_sums_are():
    """The sampler accumulates step attention on its GPU; FCI's comparison mask must be built there too (a cpu mask
    times cuda sums raises on a GPU; meta stands in for cuda here)."""
    alpha = torch.zeros(2, 3, 5, 5, device="meta")
    assert later_attention(alpha, 1).device.type == "meta"
    assert fci_scores(alpha, 1, zero_first_step=True).device.type == "meta"


def test_fci_of_the_samplers_accumulator_on_its_device():
    """The path of ``generate(..., step_score_fn=fci)``: the accumulator's sums live on the model's device, and
    ``step_score_fn(acc.step_attention(b, steps))`` must not leave it."""
    from algos.attnrl.tree_rl import fci_step_score_fn
    from algos.attnrl.config import RLConfig
    acc = StepAttentionAccumulator(batch=2, num_layers=2, num_heads=2, num_steps=8, device="meta")
    alpha = acc.step_attention(1, [0, 0, 0, 1, 1, 2, 3, 3])
    assert fci_step_score_fn(RLConfig().resolved("attnrl"))(alpha).shape == (4,)


# ------------------------------------------------------------- 4. fp32 master weights of a bf16-saved HF model

def test_a_bf16_saved_hf_model_loads_fp32_and_learns_at_lr_1e_6(tmp_path):
    """DeepSeek-R1-Distill-Qwen-1.5B is stored in bf16 and transformers 5 keeps a checkpoint's dtype: in bf16 an
    Adam step of lr 1e-6 rounds away for almost every weight. Loaded as fp32 master weights, one step moves them."""
    pytest.importorskip("transformers")
    from algos.attnrl.lm import load_hf_policy
    from benchmarks.gpu_check import build_hf_model
    build_hf_model(tmp_path, vocab_size=300, embedding_size=300, hidden=32, save_dtype="bfloat16")
    policy = load_hf_policy(str(tmp_path))
    model = policy.model
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.Adam(model.parameters(), lr=1e-6)
    ids = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    moved = sum(int((p.detach() != b).sum()) for p, b in zip(model.parameters(), before))
    total = sum(b.numel() for b in before)
    assert moved / total > 0.9, f"{moved}/{total} weights moved"


# ---------------------------------------------------------------- 6. log-probs through bounded temporaries

class _LargestTemporary(TorchDispatchMode):
    """Records the largest tensor (numel) any op allocates."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            # a view (reshape, expand) of an input allocates nothing
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.numel())
        return out


def _direct_scores(logits, gather_pos, targets, mask, temperature):
    """The computation the chunked one replaces, in float64: full gather, then log-softmax."""
    x = logits.double().gather(1, gather_pos[..., None].expand(-1, -1, logits.shape[-1]))
    x = x / temperature if temperature > 0 else x
    logp = x.log_softmax(-1)
    return (logp.gather(-1, targets[..., None]).squeeze(-1) * mask,
            -(logp.exp() * logp).sum(-1) * mask)


def _logprob_inputs(B=4, T=20, R=12, V=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g) * 3
    lengths = [12, 7, 1, 0]
    gather_pos = torch.zeros(B, R, dtype=torch.long)
    targets = torch.zeros(B, R, dtype=torch.long)
    mask = torch.zeros(B, R)
    for b, n in enumerate(lengths):
        gather_pos[b, :n] = torch.arange(T - n - 1, T - 1)
        targets[b, :n] = torch.randint(0, V, (n,), generator=g)
        mask[b, :n] = 1
    return logits, gather_pos, targets, mask


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_chunked_logprobs_equal_the_direct_computation_with_gradients(temperature):
    from algos.attnrl.scoring import token_logprobs
    logits, gather_pos, targets, mask = _logprob_inputs()
    want_lp, want_ent = _direct_scores(logits, gather_pos, targets, mask, temperature)
    x = logits.clone().requires_grad_(True)
    lp, ent = token_logprobs(x, gather_pos, targets, mask, temperature, chunk_rows=5)
    assert torch.allclose(lp.double(), want_lp, atol=1e-5) and torch.allclose(ent.double(), want_ent, atol=1e-5)
    (lp.sum() + 0.3 * ent.sum()).backward()
    ref = logits.double().clone().requires_grad_(True)
    a, b = _direct_scores(ref, gather_pos, targets, mask, temperature)
    (a.sum() + 0.3 * b.sum()).backward()
    assert torch.allclose(x.grad.double(), ref.grad, atol=1e-5)


def test_logprob_temporaries_are_bounded_by_chunk_times_vocab():
    """Every tensor made while scoring (forward with and without gradients, and the backward's recomputation) is at
    most chunk x vocab, besides the logits' own gradient; the direct computation makes (B, R, V) copies."""
    from algos.attnrl.scoring import token_logprobs
    logits, gather_pos, targets, mask = _logprob_inputs()
    B, R, V = gather_pos.shape[0], gather_pos.shape[1], logits.shape[-1]
    chunk = 3
    with torch.no_grad(), _LargestTemporary() as probe:
        token_logprobs(logits, gather_pos, targets, mask, 1.0, chunk_rows=chunk)
    assert probe.largest <= chunk * V < B * R * V
    x = logits.clone().requires_grad_(True)
    with _LargestTemporary() as probe:
        lp, ent = token_logprobs(x, gather_pos, targets, mask, 1.0, chunk_rows=chunk)
    assert probe.largest <= chunk * V
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        lp, ent = token_logprobs(x, gather_pos, targets, mask, 1.0, chunk_rows=chunk)
    big = [t for t in saved if t.numel() > chunk * V and t.data_ptr() != x.data_ptr()]
    assert not big, [tuple(t.shape) for t in big]
    with _LargestTemporary() as probe:
        (lp.sum() + ent.sum()).backward()
    assert probe.largest <= max(chunk * V, x.numel())  # the gradient of the logits is as large as they are


class _LogitsOnly(torch.nn.Module):
    """The HF call convention with logits only: each token's logits are its embedding row (V wide)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(vocab, vocab)

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, output_attentions=False):
        from types import SimpleNamespace
        return SimpleNamespace(logits=self.table(input_ids), past_key_values=None, attentions=None)


def _learner_logprob_peak(monkeypatch, B=4, P=8, R=64, V=512, chunk=16) -> tuple[int, int]:
    """Peak bytes allocated by the learner's log-prob call (``forward_scores``, as PPO's old and reference
    log-probs run it) and what it must hold: the logits plus one chunk's three (rows, V) fp32 arrays."""
    from types import SimpleNamespace

    from algos.attnrl import scoring
    from algos.attnrl.lm import Policy
    from algos.attnrl.scoring import forward_scores
    from benchmarks.gpu.memory import PeakMemory
    monkeypatch.setattr(scoring, "LOGPROB_CHUNK_ROWS", chunk)
    codec = SimpleNamespace(pad_id=0, eos_id=1, delimiter_ids=frozenset({2}))
    policy = Policy(_LogitsOnly(V), codec)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, V, (B, P), generator=g).tolist()
    responses = torch.randint(3, V, (B, R), generator=g).tolist()
    with torch.no_grad(), PeakMemory() as probe:
        scores = forward_scores(policy, prompts, responses)
    assert torch.isfinite(scores.logprobs).all() and scores.logprobs.shape == (B, R)
    return probe.peak, B * (P + R) * V * 4 + 3 * chunk * V * 4


def test_the_learners_logprob_call_holds_the_logits_and_one_chunk(monkeypatch):
    """The call site in ``algos.attnrl.scoring._forward_scores`` (every learner's teacher-forced log-probs): its peak
    memory stays within 1.5x the logits plus one chunk. Reverting that call to a gather of all positions and a full
    log-softmax (the code before issue 39 #6) holds ~4 more fp32 copies of (B, R, V) and fails here."""
    peak, must_hold = _learner_logprob_peak(monkeypatch)
    assert peak <= 1.5 * must_hold, f"peak {peak} B, must hold {must_hold} B: {peak / must_hold:.2f}x"


def test_the_logprob_bound_fails_on_the_old_full_softmax(monkeypatch):
    from algos.attnrl import scoring

    def full_softmax(logits, gather_pos, targets, resp_mask, temperature):
        x = logits.float().gather(1, gather_pos[..., None].expand(-1, -1, logits.shape[-1]))
        logp = (x / temperature if temperature > 0 else x).log_softmax(-1)
        return logp.gather(-1, targets[..., None]).squeeze(-1) * resp_mask, -(logp.exp() * logp).sum(-1) * resp_mask
    monkeypatch.setattr(scoring, "score_logits", full_softmax)
    peak, must_hold = _learner_logprob_peak(monkeypatch)
    assert peak > 2 * must_hold


# ------------------------------------------------------------------ 5. GPU nodes keep every pin but torch's

def test_a_gpu_torch_choice_keeps_every_other_pin():
    from experiments.venv import CONSTRAINTS, constraint_lines
    pins = [ln for ln in CONSTRAINTS.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert "torch==2.13.0" in pins and any(ln.startswith("ray==") for ln in pins)
    assert constraint_lines("torch==2.13.0", "") == pins  # the CPU build: everything
    gpu = constraint_lines("torch==2.13.0", "https://download.pytorch.org/whl/cu126")
    assert gpu == [ln for ln in pins if ln != "torch==2.13.0"]
    assert constraint_lines("torch>=2.11", "") == gpu  # another torch, e.g. a machine's own build


# ------------------------------------------------------------------------------------- 2, 3. the deploy files

DEPLOY = Path(__file__).resolve().parents[1] / "cluster" / "deploy"


def test_the_aws_head_installs_boto3_into_the_python_that_runs_its_autoscaler():
    """The AWS autoscaler lives in the head's ``ray start`` process and launches nodes with boto3: it must be
    installed into the environment that ``ray`` comes from (the venv), after that venv is built."""
    spec = yaml.safe_load((DEPLOY / "ray-cluster.yaml").read_text())
    assert spec["provider"]["type"] == "aws"
    starts = [c for c in spec["head_start_ray_commands"] if "ray start" in c]
    ray_bin = re.search(r"(\S*/)ray start", starts[0]).group(1)
    installs = [c for c in (spec.get("head_setup_commands") or []) + (spec.get("setup_commands") or [])
                if re.search(r"pip install .*boto3", c)]
    assert installs and all(c.startswith(f"{ray_bin}python -m pip") or c.startswith(f"{ray_bin}pip")
                            for c in installs), installs


def test_the_image_copies_every_file_the_venv_setup_reads():
    """``python3 -m experiments.venv`` in the Dockerfile reads pyproject.toml (and the README it names) and the
    constraints: each must be COPYed before that RUN line."""
    from experiments.venv import CONSTRAINTS
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    run = next(i for i, ln in enumerate(lines) if ln.startswith("RUN") and "experiments.venv" in ln)
    copied = {src for ln in lines[:run] if ln.startswith("COPY")
              for src in [w for w in ln.split()[1:] if not w.startswith("--")][:-1]}
    readme = re.search(r'^readme = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert {"pyproject.toml", readme, CONSTRAINTS.name, "experiments"} <= copied, copied


def test_logprobs_of_no_response_token_are_zeros_in_the_graph():
    from algos.attnrl.scoring import token_logprobs
    logits, gather_pos, targets, mask = _logprob_inputs()
    x = logits.clone().requires_grad_(True)
    lp, ent = token_logprobs(x, gather_pos, targets, torch.zeros_like(mask), 1.0, chunk_rows=5)
    assert not lp.any() and not ent.any() and lp.requires_grad
    lp.sum().backward()
    assert not x.grad.any()
