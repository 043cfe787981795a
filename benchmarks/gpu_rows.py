"""gpu_check's rows that need no Ray: what one GPU shows about orrery's device code, with the machine's own torch.

Each row is a function of the device ("cuda" on a GPU; "cpu" to rehearse them, and in ``tests/test_gpu_check.py``,
which puts known bugs back and sees the rows fail) returning a :class:`Row`: what it checked, the figure, ok or not.
Only torch, transformers and tokenizers are imported (a lent GPU machine has them, and no Ray, hydra or MuJoCo).

- ``collectives``: real process groups of separate processes: gloo over tensors on the device with 2 ranks (what
  two learners sharing one GPU use), and on CUDA ``cpu:gloo,cuda:nccl`` (scale=paper's backend) with world size 1,
  all one GPU allows (NCCL refuses two ranks on one GPU).
- ``attnrl_generate``: AttnRL's sampling with FCI step scores on the device, from a Qwen2-shaped model saved in bf16.
- ``attnrl_update``: one PPO update at the paper's lr 1e-6 in the precision ``bf16: auto`` picks there; the weights
  must be fp32 masters and (nearly) all must move.
- ``logprob_memory``: the largest temporary allocated while scoring sequences at the real vocabulary is bounded by
  ``LOGPROB_CHUNK_ROWS x vocab`` fp32 (on CUDA, also the peak allocation beyond the logits).
- ``vidd_stage0_and_sampler``: VIDD's stage 0 (MDLM pretraining) and its ancestral sampler on the device, the
  generator on the CPU as VIDD keeps it.
- ``physics_prior``: LIFT's batched rigid-body prior on the device equals its CPU float64 result (needs MuJoCo).
- ``resume_to_cpu``: the AttnRL learner's checkpoint (weights and Adam moments, as ``Learner.state`` writes it) saved
  from the device, read on the CPU the way ``experiments.attnrl.ranks.saved_state`` reads it, and trained on there.
"""
from __future__ import annotations

import functools
import math
import multiprocessing as mp
import os
import queue as queue_module
import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass
class Row:
    name: str
    ok: bool
    line: str  # what was checked and the figure, one line

    def __str__(self) -> str:
        return f"[gpu_check] {'ok  ' if self.ok else 'FAIL'} {self.name}: {self.line}"


def _row(name: str, fn) -> Row:
    """Run a row; an exception is the row's failure (its type and message are the figure)."""
    start = time.perf_counter()
    try:
        ok, line = fn()
    except Exception as err:  # noqa: BLE001 - every failure is reported as this row's
        ok, line = False, f"raised {type(err).__name__}: {err}"[:400]
    return Row(name, ok, f"{line} ({time.perf_counter() - start:.1f} s)")


# ------------------------------------------------------------------------------------------------- collectives

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collective_worker(rank: int, world: int, backend: str, device: str, port: int, queue) -> None:
    """One rank: join the group, all-reduce ``rank + 1`` on the device (and on the CPU where the backend is mixed),
    gather every rank's process id; put (rank, device sum, cpu sum, pids, error) on ``queue``."""
    import torch.distributed as dist
    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        on_device = torch.full((4,), float(rank + 1), device=device)
        dist.all_reduce(on_device)
        cpu_sum = None
        if "cpu:" in backend:
            on_cpu = torch.full((4,), float(rank + 1))
            dist.all_reduce(on_cpu)
            cpu_sum = float(on_cpu[0])
        pids: list = [None] * dist.get_world_size()
        dist.all_gather_object(pids, os.getpid())
        queue.put((rank, float(on_device[0]), cpu_sum, pids, None))
        dist.destroy_process_group()
    except Exception as err:  # noqa: BLE001 - reported by the parent
        queue.put((rank, None, None, [], f"{type(err).__name__}: {err}"[:300]))


def run_group(backend: str, device: str, world: int, start_method: str = "spawn",
              timeout_s: float = 120.0) -> list[tuple]:
    """``world`` processes in one process group; each rank's report, by rank."""
    ctx = mp.get_context(start_method)  # spawn: a parent that already used CUDA cannot fork CUDA children
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_collective_worker, args=(r, world, backend, device, port, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    reports: list[tuple] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(reports) < world and time.monotonic() < deadline:
            try:
                reports.append(queue.get(timeout=1.0))
            except queue_module.Empty:
                # a rank that died before reporting (killed, failed import) leaves the others waiting: stop here
                dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    reports.append((dead[0][0], None, None, [], f"rank {dead[0][0]} exited with {dead[0][1]}"))
                    break
    finally:
        complete = len(reports) == world and not any(r[4] for r in reports)
        for p in procs:
            p.join(timeout=30 if complete else 1)  # a rank whose peer failed waits in a collective forever
            if p.is_alive():
                p.kill()
                p.join()
    return sorted(reports, key=lambda r: r[0])  # by rank alone: a failed rank's Nones do not order against floats


def group_problem(reports: list[tuple], world: int, mixed: bool) -> str | None:
    """None if every rank of ``world`` separate processes saw the sum over all ranks, else what is wrong."""
    want = world * (world + 1) / 2
    errors = [r[4] for r in reports if r[4]]
    if errors:
        return errors[0]
    if len(reports) != world:
        return f"{len(reports)} of {world} ranks reported"
    wrong = [(r[0], r[1]) for r in reports if r[1] != want]
    if wrong:
        return f"device all_reduce gave {wrong} (rank, sum), want {want:g} on every rank"
    if mixed and any(r[2] != want for r in reports):
        return f"cpu all_reduce gave {[r[2] for r in reports]}, want {want:g}"
    pids = {p for r in reports for p in r[3]}
    if len(pids) != world or any(len(r[3]) != world for r in reports):
        return f"the group held {len(pids)} distinct processes, want {world}"
    return None


def collectives(device: str, world: int = 2, start_method: str = "spawn") -> list[Row]:
    groups = [("gloo", world)]
    if device.startswith("cuda"):
        groups.append(("cpu:gloo,cuda:nccl", 1))  # NCCL refuses two ranks on one GPU: world size 1 is all it allows

    def check(backend: str, n: int):
        reports = run_group(backend, device, n, start_method)
        problem = group_problem(reports, n, mixed="cpu:" in backend)
        sums = sorted({r[1] for r in reports if r[1] is not None})
        return problem is None, problem or (f"{n} processes, all_reduce on {device}: sum {sums} on every rank "
                                            f"(want {n * (n + 1) / 2:g}), {n} distinct pids")
    return [_row(f"collectives {backend} x{n}", functools.partial(check, backend, n)) for backend, n in groups]


# --------------------------------------------------------------------------------------------------- AttnRL

@dataclass
class HFSetup:
    path: Path
    vocab: int
    embedding: int
    hidden: int


def hf_setup(workdir: Path, device: str) -> HFSetup:
    """A Qwen2-shaped model saved in bf16: the real vocabulary on a GPU, a small one to rehearse on the CPU."""
    from transformers.utils import logging as hf_logging

    from benchmarks.gpu_check import HF_VOCAB, build_hf_model
    hf_logging.disable_progress_bar()  # one line per row
    big = device.startswith("cuda")
    setup = HFSetup(workdir / "qwen2-bf16", HF_VOCAB if big else 300, 151_936 if big else 300, 64 if big else 32)
    if not (setup.path / "config.json").exists():
        build_hf_model(setup.path, setup.vocab, setup.embedding, setup.hidden, save_dtype="bfloat16")
    return setup


def _policy(setup: HFSetup, device: str):
    from algos.attnrl.lm import load_hf_policy
    from algos.precision import use_bf16
    policy = load_hf_policy(str(setup.path), autocast_bf16=use_bf16("auto", device))
    policy.model.to(device)
    return policy


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
        policy = _policy(setup, device)
        gen = torch.Generator(device=device).manual_seed(0)
        rollouts = generate(policy, _requests(policy), 24, 1.0, gen,
                            step_score_fn=functools.partial(fci_scores, delta=1, zero_first_step=True))
        scores = [s for r in rollouts for s in (r.step_scores or [])]
        ok = all(r.step_scores is not None and len(r.step_scores) == len(r.step_starts) + 1 for r in rollouts) \
            and scores and all(math.isfinite(s) for s in scores)
        return ok, (f"{len(rollouts)} rollouts, {sum(r.num_generated for r in rollouts)} tokens sampled on {device} "
                    f"(vocab {setup.embedding}), {len(scores)} FCI step scores, max {max(scores, default=0):.3f}")
    return _row("attnrl FCI generation", check)


def _sequences(policy, device: str):
    from algos.attnrl.lm import generate
    from algos.attnrl.ppo import TrainSequence
    # fresh responses only: their sampled log-probs are the old log-probs of every response token
    rollouts = generate(policy, _requests(policy, continuations=False), 16, 1.0,
                        torch.Generator(device=device).manual_seed(1))
    return [TrainSequence(list(r.prompt_ids), r.response_ids, list(r.logprobs),
                          [1.0 if i % 2 == 0 else -1.0] * len(r.response_ids), float(i % 2 == 0))
            for i, r in enumerate(rollouts) if r.response_ids]


def _update(policy, sequences, lr: float, optimizer_state: dict | None = None):
    """One PPO update through ``algos.attnrl.ppo.ppo_update`` (the learner's), Adam at ``lr``; the optimizer."""
    import copy

    from algos.attnrl.config import RLConfig
    from algos.attnrl.ppo import UpdateContext, ppo_update
    cfg = RLConfig(lr=lr, ppo_minibatch=len(sequences), ppo_epochs=1)
    ref = copy.deepcopy(policy)
    policy.update_context = UpdateContext(optimizer_state=optimizer_state)
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=cfg.lr)  # as algos.attnrl.training_run
    metrics = ppo_update(policy, ref, optimizer, sequences, cfg, random.Random(0))
    return optimizer, metrics


def _moved(model, before: dict) -> tuple[int, int]:
    after = model.state_dict()
    return (sum(int((after[k].detach().cpu() != v).sum()) for k, v in before.items()),
            sum(v.numel() for v in before.values()))


def attnrl_update(setup: HFSetup, device: str, workdir: Path) -> list[Row]:
    """One update at lr 1e-6 on the device, then the checkpoint resumed on the CPU (two rows)."""
    saved: dict = {}

    def update():
        policy = _policy(setup, device)
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in policy.model.parameters()})
        before = {k: v.detach().cpu().clone() for k, v in policy.model.state_dict().items()}
        sequences = _sequences(policy, device)
        optimizer, metrics = _update(policy, sequences, lr=1e-6)
        moved, total = _moved(policy.model, before)
        # what Learner.state writes (experiments/attnrl/learner.py): cpu weights and the optimizer's state dict
        path = workdir / "learner.pt"
        torch.save({"weights": {"state_dict": {k: v.detach().to("cpu").clone()
                                               for k, v in policy.model.state_dict().items()}},
                    "optimizer": optimizer.state_dict(), "updates": 1}, path)
        saved.update(path=path, sequences=sequences, step=_adam_step(optimizer.state_dict()))
        ok = dtypes == ["float32"] and moved / total > 0.9 and metrics.get("optimizer_steps") == 1
        return ok, (f"weights {'/'.join(dtypes)}, autocast bf16 {policy.autocast_bf16}: {moved}/{total} "
                    f"({moved / total:.1%}) moved in one update at lr 1e-6 on {device} (want fp32, > 90 %)")

    def resume():
        if "path" not in saved:
            return False, "no checkpoint (the update row failed)"
        state = torch.load(saved["path"], map_location="cpu", weights_only=True)  # as ranks.saved_state
        policy = _policy(setup, "cpu")
        policy.model.load_state_dict(state["weights"]["state_dict"])
        weights = {k: v.clone() for k, v in policy.model.state_dict().items()}
        same = all(torch.equal(weights[k], v) for k, v in state["weights"]["state_dict"].items())
        optimizer, _ = _update(policy, saved["sequences"], lr=1e-6, optimizer_state=state.get("optimizer"))
        moments = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)
                   and t.dim() > 0]
        on_cpu = all(p.device.type == "cpu" for p in policy.model.parameters()) and \
            all(t.device.type == "cpu" for t in moments)
        step = _adam_step(optimizer.state_dict())
        moved, total = _moved(policy.model, weights)
        ok = same and on_cpu and step == saved["step"] + 1 and moved / total > 0.9
        return ok, (f"checkpoint from {device} read on cpu: weights equal {same}, Adam step {saved['step']} -> "
                    f"{step} (want {saved['step'] + 1}), model and moments on cpu {on_cpu}, next update moved "
                    f"{moved / total:.1%}")
    return [_row("attnrl update lr 1e-6", update), _row(f"attnrl resume {device} -> cpu", resume)]


def _adam_step(state_dict: dict) -> int:
    steps = {int(s["step"]) for s in state_dict["state"].values()}
    return steps.pop() if len(steps) == 1 else -1


def _size(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


class LargestAllocation(TorchDispatchMode):
    """The largest tensor (bytes) an op allocates inside: views of an op's inputs allocate nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def logprob_memory(setup: HFSetup, device: str, sequences: int = 8, length: int = 512,
                   chunk_rows: int | None = None) -> Row:
    """Score ``sequences`` x ``length`` response tokens at the model's vocabulary the way the learner does
    (``algos.attnrl.lm.token_logprobs`` on the model's logits)."""
    def check():
        from algos.attnrl import lm
        policy = _policy(setup, device)
        chunk = chunk_rows or lm.LOGPROB_CHUNK_ROWS
        V = setup.embedding
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, setup.vocab, (sequences, length + 1), generator=g).to(device)
        with torch.no_grad(), policy.autocast():
            logits = policy.model(input_ids=ids).logits
        gather_pos = torch.arange(length, device=device).expand(sequences, -1)
        targets = ids[:, 1:]
        mask = torch.ones(sequences, length, device=device)
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        with torch.no_grad(), LargestAllocation() as probe:
            lp, _ = lm.token_logprobs(logits, gather_pos, targets, mask, 1.0, chunk_rows=chunk)
        peak = torch.cuda.max_memory_allocated() - base if cuda else None
        bound = chunk * V * 4
        full = sequences * length * V * 4
        ok = probe.largest <= bound and bool(torch.isfinite(lp).all())
        return ok, (f"{sequences}x{length} tokens, vocab {V}: largest temporary {_size(probe.largest)} (bound "
                    f"{chunk} x vocab fp32 = {_size(bound)}; one full fp32 copy {_size(full)})"
                    + (f", peak beyond the logits {_size(peak)}" if cuda else ""))
    return _row("attnrl log-prob temporaries", check)


# ----------------------------------------------------------------------------------------------------- VIDD

def _chain_data(n: int, length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Token sequences that mostly count up by one (mod ``vocab``): a law a denoiser learns in a few steps."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    steps = 1 + (torch.rand(n, length, generator=g) < 0.1).long()
    return (start + steps.cumsum(1) - steps[:, :1]) % vocab


def vidd_stage0_and_sampler(device: str, steps: int = 200, vocab: int = 32, length: int = 32, samples: int = 256,
                            d_model: int = 64, bf16: bool | str = "auto") -> Row:
    """VIDD's stage 0 (MDLM pretraining, ``algos.vidd.mdlm.pretrain``) with the model on the device and the
    generator on the CPU, as ``experiments/vidd/data.py`` runs it, then the ancestral sampler there."""
    def check():
        from algos.vidd.mdlm import DenoiserConfig, MaskedDenoiser, PretrainConfig, pretrain
        from algos.vidd.sampling import sample
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = MaskedDenoiser(DenoiserConfig(vocab_size=vocab, seq_len=length, d_model=d_model, n_layers=2,
                                                  n_heads=4, bf16=bf16)).to(device)
        losses: list[float] = []
        pretrain(model, _chain_data(2048, length, vocab), PretrainConfig(steps=steps, batch_size=64, lr=3e-3,
                                                                         log_every=max(1, steps // 4)),
                 torch.Generator().manual_seed(0), log_fn=lambda step, m: losses.append(m["pretrain/nelbo_per_token"]))
        start = time.perf_counter()
        out = sample(model, samples, length, 32, torch.Generator().manual_seed(1)).tokens
        rate = out.shape[0] / (time.perf_counter() - start)
        on_device = all(p.device.type == torch.device(device).type for p in model.parameters())
        counting = float(((out[:, 1:] - out[:, :-1]) % vocab == 1).float().mean())
        ok = on_device and losses[-1] < losses[0] and bool((out < vocab).all())
        return ok, (f"model on {device} {on_device}; NELBO/token {losses[0]:.2f} -> {losses[-1]:.2f} in {steps} "
                    f"steps; {samples} samples ({rate:.0f}/s), {counting:.0%} of steps count up (chance "
                    f"{1 / vocab:.0%}), no mask left {bool((out < vocab).all())}")
    return _row("vidd stage 0 + sampler", check)


# ----------------------------------------------------------------------------------------------------- LIFT

def physics_prior(device: str, batch: int = 512) -> Row:
    """LIFT's batched rigid-body prior (``envs.control.rigid_body``, issue 41) on the device equals its CPU float64
    result on random states of a model with free, ball, slide and hinge joints (tests/test_rigid_body.py's), in
    float64 (1e-9 relative) and float32 (1e-3). Needs MuJoCo to build the model: without it the row says it skipped
    and passes (it has nothing to check)."""
    def check():
        try:  # MuJoCo (and the test module's gymnasium, pytest) build the model and the states
            import mujoco

            from envs.control.rigid_body import RigidBodyDynamics
            from tests.test_rigid_body import HAND_XML, random_states
        except ImportError as err:
            return True, f"skipped: {err} (MuJoCo builds the model)"
        model = mujoco.MjModel.from_xml_string(HAND_XML)
        dynamics = RigidBodyDynamics(model)
        states = [torch.from_numpy(x) for x in random_states(model, batch, seed=0)]
        reference = dynamics.terms(*states)
        errors = {}
        for dtype, tol in ((torch.float64, 1e-9), (torch.float32, 1e-3)):
            got = dynamics.terms(*(x.to(device, dtype) for x in states))
            on_device = all(g.device.type == torch.device(device).type and g.dtype == dtype for g in got)
            errors[dtype] = (on_device, max(float((g.double().cpu() - r).abs().max() / r.abs().max().clamp_min(1e-9))
                                            for g, r in zip(got, reference)), tol)
        ok = all(on and err < tol for on, err, tol in errors.values())
        return ok, "; ".join(f"{str(d).split('.')[-1]} on {device} {on}, max rel. error vs cpu fp64 {err:.1e} "
                             f"(< {tol:g})" for d, (on, err, tol) in errors.items())
    return _row("lift physics prior", check)


def run(device: str, workdir: Path, world: int = 2) -> list[Row]:
    """Every row, in order, each printed as it ends."""
    rows: list[Row] = []

    def emit(new: list[Row]) -> None:
        for r in new:
            print(r, flush=True)
        rows.extend(new)
    emit(collectives(device, world))
    setup = hf_setup(workdir, device)
    emit([attnrl_generate(setup, device)])
    emit(attnrl_update(setup, device, workdir))
    emit([logprob_memory(setup, device, **({} if device.startswith("cuda") else
                                           {"sequences": 4, "length": 24, "chunk_rows": 16}))])
    emit([vidd_stage0_and_sampler(device, **({"steps": 300} if device.startswith("cuda") else
                                             {"steps": 30, "vocab": 16, "length": 16, "samples": 32, "d_model": 32,
                                              "bf16": False}))])  # a rehearsal: the same numbers on every CPU
    emit([physics_prior(device)])
    return rows
