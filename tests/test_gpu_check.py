"""gpu_check's rows can fail: each known bug put back (planted) on the CPU makes its row fail, and the rows pass
without it. The FCI-mask bug (a cpu mask times cuda sums) shows on a GPU only; tests/test_gpu_fixes.py covers it on
meta tensors. The Ray rows' assertions are checked on logs written the way the learners and stage 0 write them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_rows

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return gpu_rows.hf_setup(tmp_path_factory.mktemp("hf"), "cpu")


def _by_name(rows):
    return {r.name: r for r in rows}


# ------------------------------------------------------------------------------------------------ device rows

def test_the_attnrl_rows_pass_on_cpu(setup, tmp_path):
    rows = [gpu_rows.attnrl_generate(setup, "cpu"), *gpu_rows.attnrl_update(setup, "cpu", tmp_path),
            gpu_rows.logprob_memory(setup, "cpu", sequences=4, length=24, chunk_rows=16)]
    assert all(r.ok for r in rows), "\n".join(map(str, rows))
    assert "FCI step scores" in rows[0].line and "moved" in rows[1].line


def test_a_bf16_master_copy_fails_the_update_row(setup, tmp_path, monkeypatch):
    """The bug of issue 39 #4: the model loaded in the checkpoint's bf16; lr 1e-6 moves almost nothing."""
    from algos.attnrl import lm
    real = lm.load_hf_policy
    monkeypatch.setattr(lm, "load_hf_policy", lambda path, *a, **k: real(path, *a, **{**k, "dtype": torch.bfloat16}))
    update, _ = gpu_rows.attnrl_update(setup, "cpu", tmp_path)
    assert not update.ok and "bfloat16" in update.line, update


def test_a_resume_without_the_optimizer_moments_fails_the_resume_row(setup, tmp_path, monkeypatch):
    """A resumed learner that starts Adam afresh (the checkpoint's moments never adopted) takes a different step."""
    from algos.attnrl import ppo
    monkeypatch.setattr(ppo, "_adopt", lambda optimizer, ctx: setattr(ctx, "optimizer", optimizer))
    update, resume = gpu_rows.attnrl_update(setup, "cpu", tmp_path)
    assert update.ok and not resume.ok and "Adam step 1 -> 1" in resume.line, resume


def test_full_logprob_copies_fail_the_memory_row(setup, monkeypatch):
    """The bug of issue 39 #6: gather every position's logits and take a full log-softmax."""
    from algos.attnrl import lm

    def direct(logits, gather_pos, targets, mask, temperature, chunk_rows=0):
        x = logits.float().gather(1, gather_pos[..., None].expand(-1, -1, logits.shape[-1]))
        logp = (x / temperature if temperature > 0 else x).log_softmax(-1)
        return logp.gather(-1, targets[..., None]).squeeze(-1) * mask, -(logp.exp() * logp).sum(-1) * mask
    monkeypatch.setattr(lm, "token_logprobs", direct)
    row = gpu_rows.logprob_memory(setup, "cpu", sequences=4, length=24, chunk_rows=16)
    assert not row.ok and "largest temporary" in row.line, row


def test_a_row_that_raises_fails_with_the_error(setup, monkeypatch):
    from algos.attnrl import lm

    def broken(*a, **k):
        raise RuntimeError("Expected all tensors to be on the same device, but found cuda:0 and cpu")
    monkeypatch.setattr(lm, "generate", broken)
    row = gpu_rows.attnrl_generate(setup, "cpu")
    assert not row.ok and "same device" in row.line


# ------------------------------------------------------------------------------------------------ collectives

def one_rank_groups(rank, world, backend, device, port, queue):
    """The old check's bug: every process its own one-rank group (a collective that checks nothing). Each takes a
    free port of its own (``port + rank`` may be taken by another process, and that rank then reports an error)."""
    gpu_rows._collective_worker(0, 1, backend, device, gpu_rows._free_port(), queue)


def test_group_problem_names_what_is_wrong():
    good = [(0, 3.0, None, [10, 11], None), (1, 3.0, None, [10, 11], None)]
    assert gpu_rows.group_problem(good, 2, mixed=False) is None
    assert "want 3" in gpu_rows.group_problem([(0, 1.0, None, [10], None), (1, 2.0, None, [11], None)], 2, False)
    assert "distinct processes" in gpu_rows.group_problem([(0, 3.0, None, [10, 10], None)] * 2, 2, False)
    assert "1 of 2" in gpu_rows.group_problem(good[:1], 2, False)
    assert "cpu all_reduce" in gpu_rows.group_problem([(0, 3.0, 1.0, [10, 11], None), (1, 3.0, 3.0, [10, 11], None)],
                                                      2, mixed=True)
    assert gpu_rows.group_problem([(0, None, None, [], "RuntimeError: NCCL error")], 1, False) == \
        "RuntimeError: NCCL error"


def rank_one_dies(rank, world, backend, device, port, queue):
    """A rank killed before it reports (an out-of-memory kill, a failed import)."""
    if rank == 1:
        os._exit(3)
    gpu_rows._collective_worker(rank, world, backend, device, port, queue)


@pytest.mark.slow
def test_the_collectives_row_fails_on_one_rank_groups_and_on_a_dead_rank(monkeypatch):
    """(It passes with the real worker: test_the_device_tier_rehearses_on_cpu_end_to_end.)"""
    monkeypatch.setattr(gpu_rows, "_collective_worker", one_rank_groups)  # spawn pickles it by name: this module's
    (row,) = gpu_rows.collectives("cpu", world=2)
    assert not row.ok and "want 3" in row.line, row
    monkeypatch.setattr(gpu_rows, "_collective_worker", rank_one_dies)
    reports = gpu_rows.run_group("gloo", "cpu", 2, timeout_s=60)  # rank 0 waits for its peer: not 60 s here
    assert "rank 1 exited with 3" in gpu_rows.group_problem(reports, 2, mixed=False)


@pytest.mark.slow
def test_the_device_tier_rehearses_on_cpu_end_to_end():
    """``python -m benchmarks.gpu_check --tier device --device cpu``: what a lent GPU machine runs, minus CUDA."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--tier", "device", "--device", "cpu"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[gpu_check] ok ")]
    assert len(lines) == 7 and "all 7 rows ok" in proc.stdout  # the 7th: the LIFT physics prior (issue 41)
    assert any("lift physics prior" in ln for ln in lines), lines
    assert "2 distinct pids" in next(ln for ln in lines if "collectives gloo x2" in ln)


# --------------------------------------------------------------------------------------- the Ray rows' checks

def test_stage0_must_report_the_gpu_from_inside_its_task():
    from benchmarks.gpu_check import stage0_on_gpu
    asked = "INFO cluster.train: stage 0 (pretrain_stage) as a Ray task with {'num_gpus': 0.4}"
    assert stage0_on_gpu(Path("."), asked + "\nINFO cluster.train: stage 0 (pretrain_stage) ran on cuda:0 "
                                            "(reported by the task)") is None
    assert "off the GPU" in stage0_on_gpu(Path("."), asked + "\nstage 0 (pretrain_stage) ran on cpu (reported ...)")
    assert "did not run as a Ray task" in stage0_on_gpu(Path("."), asked)  # asking for a GPU is not computing on it


def test_the_learners_must_say_where_they_compute():
    from benchmarks.gpu_check import learner_on_cpu, learner_on_gpu, nccl_backend
    on_gpu = "learner rank 0 computes on cuda:0\nlearner rank 1 computes on cuda:0"
    assert learner_on_gpu(Path("."), on_gpu) is None and "off cpu" in learner_on_cpu(Path("."), on_gpu)
    assert "off cuda" in learner_on_gpu(Path("."), "learner rank 0 computes on cuda:0\nlearner rank 1 computes on cpu")
    assert "did not say" in learner_on_gpu(Path("."), "precision on cuda: bf16")
    assert nccl_backend(Path("."), "learner rank 0 of 1: process group backend cpu:gloo,cuda:nccl") is None
    assert "not NCCL" in nccl_backend(Path("."), "learner rank 0 of 2: process group backend gloo")


def test_the_ray_rows_cover_nccl_and_a_resume_onto_the_cpu():
    from benchmarks.gpu_check import steps
    rows = {s.name: s for s in steps(Path("/runs"), Path("/hf"))}
    nccl = next(s for s in rows.values() if "nccl" in s.name)
    assert not any(o.startswith("train.backend=") for o in nccl.placement) and "nccl_backend" in nccl.checks
    to_cpu = next(s for s in rows.values() if "CPU" in s.name)
    assert "train.use_gpu=false" in to_cpu.placement and {"resumed", "learner_on_cpu"} <= set(to_cpu.checks)
    assert "learner_on_gpu" in rows["lift_finetune"].checks
    assert all("stage0_on_gpu" in s.checks for s in rows.values() if s.experiment in ("vidd_molecule", "attnrl"))
