"""AttnRL on the device: FCI generation, one learner update at lr 1e-6, the learner's checkpoint resumed on the CPU,
and the peak memory of the learner's own log-prob call.

Each row calls what the learner calls: ``generate`` with FCI step scores (the samplers), ``ppo_update`` with an
``UpdateContext`` (the learner's optimizer adoption), ``experiments.attnrl.learner_state`` (what ``Learner.state``
writes and ``ranks.saved_state`` reads, with ``map_location``), ``forward_scores`` (every learner's teacher-forced
log-probs, through ``algos.attnrl.scoring.score_logits``).
"""
from __future__ import annotations

import contextlib
import copy
import functools
import math
import random
from pathlib import Path

import torch

from benchmarks.gpu.hf_model import HFSetup, load_policy
from benchmarks.gpu.memory import PeakMemory, cuda_peak_of, size
from benchmarks.gpu.rows import Row, run_row

PEAK_BOUND = 1.5  # the log-prob call may hold at most 1.5x the temporaries it must hold


def _requests(policy, n: int = 4, continuations: bool = True):
    """Prompts, with ``continuations`` half of them continuations of a response with three steps already (a random
    model seldom samples the newline that ends a step, and FCI needs steps)."""
    from algos.attnrl.lm import GenerationRequest
    prompts = ["a=7;b=5;c=a+b;?c\n", "x=1;?x\n", "p=3;q=4;r=p*q;?r\n", "k=2;?k\n"]
    encode = policy.codec.encode
    return [GenerationRequest(tuple(encode(prompts[i % len(prompts)])),
                              tuple(encode("c=a+b\nc=7+5\nc=12\n")) if continuations and i % 2 else ())
            for i in range(n)]


def attnrl_generate(setup: HFSetup, device: str) -> Row:
    def check():
        from algos.attnrl.fci import fci_scores
        from algos.attnrl.lm import generate
        policy = load_policy(setup, device)
        gen = torch.Generator(device=device).manual_seed(0)
        rollouts = generate(policy, _requests(policy), 24, 1.0, gen,
                            step_score_fn=functools.partial(fci_scores, delta=1, zero_first_step=True))
        scores = [s for r in rollouts for s in (r.step_scores or [])]
        ok = all(r.step_scores is not None and len(r.step_scores) == len(r.step_starts) + 1 for r in rollouts) \
            and scores and all(math.isfinite(s) for s in scores)
        return ok, (f"{len(rollouts)} rollouts, {sum(r.num_generated for r in rollouts)} tokens sampled on {device} "
                    f"(vocab {setup.embedding}), {len(scores)} FCI step scores, max {max(scores, default=0):.3f}")
    return run_row("attnrl FCI generation", check)


def _sequences(policy, device: str):
    from algos.attnrl.lm import generate
    from algos.attnrl.ppo import TrainSequence
    # fresh responses only: their sampled log-probs are the old log-probs of every response token
    rollouts = generate(policy, _requests(policy, continuations=False), 16, 1.0,
                        torch.Generator(device=device).manual_seed(1))
    return [TrainSequence(list(r.prompt_ids), r.response_ids, list(r.logprobs),
                          [1.0 if i % 2 == 0 else -1.0] * len(r.response_ids), float(i % 2 == 0))
            for i, r in enumerate(rollouts) if r.response_ids]


def _update(policy, sequences, lr: float, optimizer_state: dict | None = None) -> tuple[object, dict]:
    """One PPO update as the learner makes it (``ppo_update``, Adam at ``lr``); the context holding its optimizer."""
    from algos.attnrl.config import RLConfig
    from algos.attnrl.ppo import UpdateContext, ppo_update
    cfg = RLConfig(lr=lr, ppo_minibatch=len(sequences), ppo_epochs=1)
    ref = copy.deepcopy(policy)
    context = policy.update_context = UpdateContext(optimizer_state=optimizer_state)  # as ranks.update_context
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=cfg.lr)  # as algos.attnrl.training_run
    metrics = ppo_update(policy, ref, optimizer, sequences, cfg, random.Random(0))
    return context, metrics


def _moved(model, before: dict) -> tuple[int, int]:
    after = model.state_dict()
    return (sum(int((after[k].detach().cpu() != v).sum()) for k, v in before.items()),
            sum(v.numel() for v in before.values()))


def _adam_step(state_dict: dict) -> int:
    steps = {int(s["step"]) for s in state_dict["state"].values()}
    return steps.pop() if len(steps) == 1 else -1


def _off_cpu(state) -> list[str]:
    """Where tensors of a loaded checkpoint are not on the CPU (a load without ``map_location`` leaves them on the
    saving device)."""
    found: list[str] = []

    def walk(x, where: str) -> None:
        if isinstance(x, torch.Tensor):
            if x.device.type != "cpu":
                found.append(f"{where} on {x.device}")
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{where}.{k}")
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{where}[{i}]")
    walk(state, "state")
    return found


def attnrl_update(setup: HFSetup, device: str, workdir: Path) -> list[Row]:
    """One update at lr 1e-6 on the device, the learner's state saved from there; then that checkpoint loaded the
    learner's way (onto the CPU) and trained on there (two rows)."""
    from experiments.attnrl.learner_state import learner_state, load_learner_state
    from experiments.attnrl.weights import hf_weights
    saved: dict = {}

    def update():
        policy = load_policy(setup, device)
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in policy.model.parameters()})
        before = {k: v.detach().cpu().clone() for k, v in policy.model.state_dict().items()}
        sequences = _sequences(policy, device)
        context, metrics = _update(policy, sequences, lr=1e-6)
        moved, total = _moved(policy.model, before)
        path = workdir / "learner.pt"
        torch.save(learner_state(hf_weights(policy, str(setup.path)), context.optimizer, 1, 1, 16, 0.0, {},
                                 workdir), path)
        saved.update(path=path, sequences=sequences, step=_adam_step(context.optimizer.state_dict()))
        ok = dtypes == ["float32"] and moved / total > 0.9 and metrics.get("optimizer_steps") == 1
        return ok, (f"weights {'/'.join(dtypes)}, autocast bf16 {policy.autocast_bf16}: {moved}/{total} "
                    f"({moved / total:.1%}) moved in one update at lr 1e-6 on {device} (want fp32, > 90 %)")

    def resume():
        if "path" not in saved:
            return False, "no checkpoint (the update row failed)"
        state = load_learner_state(saved["path"])  # as ranks.saved_state
        off_cpu = _off_cpu(state)
        if off_cpu:  # a CUDA machine would resume from these anyway: a CPU-only one could not even read them
            return False, f"Learner state saved on {device}, loaded NOT on cpu: {', '.join(off_cpu[:3])}"
        policy = load_policy(setup, "cpu")
        policy.model.load_state_dict(state["weights"]["state_dict"])  # as Learner.go_live
        weights = {k: v.clone() for k, v in policy.model.state_dict().items()}
        same = all(torch.equal(weights[k], v) for k, v in state["weights"]["state_dict"].items())
        context, _ = _update(policy, saved["sequences"], lr=1e-6, optimizer_state=state["optimizer"])
        moments = [t for s in context.optimizer.state.values() for t in s.values()
                   if isinstance(t, torch.Tensor) and t.dim() > 0]
        on_cpu = all(p.device.type == "cpu" for p in policy.model.parameters()) and \
            all(t.device.type == "cpu" for t in moments)
        step = _adam_step(context.optimizer.state_dict())
        moved, total = _moved(policy.model, weights)
        ok = same and on_cpu and step == saved["step"] + 1 and moved / total > 0.9
        return ok, (f"Learner state saved on {device}, loaded with map_location: all on cpu; weights equal "
                    f"{same}, Adam step {saved['step']} -> {step} (want {saved['step'] + 1}), model and moments on "
                    f"cpu {on_cpu}, next update moved {moved / total:.1%}")
    return [run_row("attnrl update lr 1e-6", update), run_row(f"attnrl learner state {device} -> cpu, resumed", resume)]


@contextlib.contextmanager
def _chunk_rows(rows: int | None):
    from algos.attnrl import scoring
    before = scoring.LOGPROB_CHUNK_ROWS
    scoring.LOGPROB_CHUNK_ROWS = rows or before
    try:
        yield scoring.LOGPROB_CHUNK_ROWS
    finally:
        scoring.LOGPROB_CHUNK_ROWS = before


def logprob_call(setup: HFSetup, device: str, sequences: int = 8, response: int = 512, prompt: int = 16,
                 chunk_rows: int | None = None) -> Row:
    """The learner's log-prob call (``forward_scores``, no gradients: old and reference log-probs) on ``sequences``
    responses of ``response`` tokens: its peak memory beyond the weights must stay within ``PEAK_BOUND`` x what it
    must hold, the model's logits plus one chunk's three (rows, vocab) fp32 working arrays. Taking the log-softmax of
    all gathered positions at once (issue 39 #6) holds ~4 fp32 copies of (sequences, response, vocab) besides."""
    def check():
        from algos.attnrl.scoring import forward_scores
        policy = load_policy(setup, device)
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, setup.vocab, (sequences, prompt), generator=g).tolist()
        responses = torch.randint(0, setup.vocab, (sequences, response), generator=g).tolist()
        with torch.no_grad(), policy.autocast():
            logits_dtype = policy.model(input_ids=torch.tensor([prompts[0][:2]], device=device)).logits.dtype
        with _chunk_rows(chunk_rows) as chunk, torch.no_grad():
            call = functools.partial(forward_scores, policy, prompts, responses)
            with PeakMemory() as probe:
                scores = call() if not device.startswith("cuda") else None
            if device.startswith("cuda"):
                scores, allocator_peak = cuda_peak_of(call, device)
        rows = sequences * response
        logits = sequences * (prompt + response) * setup.embedding * logits_dtype.itemsize
        must_hold = logits + 3 * min(chunk, rows) * setup.embedding * 4
        peak = allocator_peak if device.startswith("cuda") else probe.peak
        ok = peak <= PEAK_BOUND * must_hold and bool(torch.isfinite(scores.logprobs).all())
        return ok, (f"{sequences}x{response} tokens, vocab {setup.embedding}, chunk {chunk}: peak {size(peak)} "
                    f"({'CUDA allocator' if device.startswith('cuda') else 'allocations counted by dispatch'}) vs "
                    f"must hold {size(must_hold)} (logits {logits_dtype} {size(logits)} + 3 chunk rows fp32): "
                    f"{peak / must_hold:.2f}x (bound {PEAK_BOUND}x; one full fp32 copy "
                    f"{size(rows * setup.embedding * 4)})")
    return run_row("attnrl learner log-prob call: peak memory", check)
