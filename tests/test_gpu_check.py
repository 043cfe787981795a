"""The device tier's rows (``benchmarks/gpu``) can fail: each known bug put back (planted) on the CPU makes its row
fail, a row that cannot run says "not run" (never "ok"), and the rows pass without the bugs. The FCI-mask bug (a cpu
mask times cuda sums) shows on a GPU only; tests/test_gpu_fixes.py covers it on meta tensors. The Ray rows'
assertions are checked on logs written the way the learners and stage 0 write them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu import attnrl, collectives, device, hf_model, physics, tier
from benchmarks.gpu.rows import FAIL, NOT_RUN, OK

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("transformers")
# what the lent GPU image lacks (KINDS.md): the device tier must import none of it
NOT_ON_THE_IMAGE = ("ray", "gymnasium", "mujoco", "hydra", "omegaconf", "rdkit", "selfies", "tensorboardX", "Bio",
                    "pyjaspar", "causallearn", "cdt", "jsonschema", "stable_baselines3", "glfw", "OpenGL")
LOGPROB_CPU = {"sequences": 4, "response": 128, "prompt": 12, "chunk_rows": 64}  # tier._sizes("cpu")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return hf_model.hf_setup(tmp_path_factory.mktemp("hf"), "cpu")


# ------------------------------------------------------------------------------------------------ device rows

def test_the_attnrl_rows_pass_on_cpu(setup, tmp_path):
    rows = [attnrl.attnrl_generate(setup, "cpu"), *attnrl.attnrl_update(setup, "cpu", tmp_path),
            attnrl.logprob_call(setup, "cpu", **LOGPROB_CPU)]
    assert all(r.ok for r in rows), "\n".join(map(str, rows))
    assert "FCI step scores" in rows[0].line and "moved" in rows[1].line and "all on cpu" in rows[2].line


def test_a_bf16_master_copy_fails_the_update_row(setup, tmp_path, monkeypatch):
    """The bug of issue 39 #4: the model loaded in the checkpoint's bf16; lr 1e-6 moves almost nothing."""
    from algos.attnrl import lm
    real = lm.load_hf_policy
    monkeypatch.setattr(lm, "load_hf_policy", lambda path, *a, **k: real(path, *a, **{**k, "dtype": torch.bfloat16}))
    update, _ = attnrl.attnrl_update(setup, "cpu", tmp_path)
    assert update.status == FAIL and "bfloat16" in update.line, update


def test_a_resume_without_the_optimizer_moments_fails_the_resume_row(setup, tmp_path, monkeypatch):
    """A resumed learner that starts Adam afresh (the checkpoint's moments never adopted) takes a different step."""
    from algos.attnrl import ppo
    monkeypatch.setattr(ppo, "_adopt", lambda optimizer, ctx: setattr(ctx, "optimizer", optimizer))
    update, resume = attnrl.attnrl_update(setup, "cpu", tmp_path)
    assert update.ok and resume.status == FAIL and "Adam step 1 -> 1" in resume.line, resume


def test_a_learner_state_loaded_without_map_location_fails_the_resume_row(setup, tmp_path, monkeypatch):
    """The row reads the checkpoint with the learner's own loader; a loader that leaves tensors on the device that
    saved them (no ``map_location``; meta stands in for cuda) fails it."""
    from experiments.attnrl import learner_state

    def stays_on_the_device(path):
        state = torch.load(path, weights_only=True)
        state["optimizer"]["state"] = {k: {n: t.to("meta") if t.dim() else t for n, t in v.items()}
                                       for k, v in state["optimizer"]["state"].items()}
        return state
    monkeypatch.setattr(learner_state, "load_learner_state", stays_on_the_device)
    _, resume = attnrl.attnrl_update(setup, "cpu", tmp_path)
    assert resume.status == FAIL and "NOT on cpu" in resume.line, resume


def test_the_old_full_softmax_fails_the_learners_logprob_row(setup, monkeypatch):
    """The bug of issue 39 #6 at the learner's call site: gather every position's logits, full log-softmax."""
    from algos.attnrl import scoring

    def full_softmax(logits, gather_pos, targets, resp_mask, temperature):
        x = logits.float().gather(1, gather_pos[..., None].expand(-1, -1, logits.shape[-1]))
        logp = (x / temperature if temperature > 0 else x).log_softmax(-1)
        return logp.gather(-1, targets[..., None]).squeeze(-1) * resp_mask, -(logp.exp() * logp).sum(-1) * resp_mask
    monkeypatch.setattr(scoring, "score_logits", full_softmax)
    row = attnrl.logprob_call(setup, "cpu", **LOGPROB_CPU)
    assert row.status == FAIL and "bound 1.5x" in row.line, row


def test_a_row_that_raises_fails_with_the_error(setup, monkeypatch):
    from algos.attnrl import lm

    def broken(*a, **k):
        raise RuntimeError("Expected all tensors to be on the same device, but found cuda:0 and cpu")
    monkeypatch.setattr(lm, "generate", broken)
    row = attnrl.attnrl_generate(setup, "cpu")
    assert row.status == FAIL and "same device" in row.line


def test_device_info_and_matmul_are_rows_that_can_fail(monkeypatch):
    info: dict = {}
    assert device.device_info("cpu", info).ok and info["torch"] == torch.__version__
    if not torch.cuda.is_available():
        no_gpu = device.device_info("cuda", {})
        assert no_gpu.status == FAIL and "no CUDA device" in no_gpu.line
    assert device.matmul("cpu", n=64, repeats=1).ok
    monkeypatch.setattr(device, "_product", lambda a, b: a @ b.t())  # a wrong product, as a broken kernel gives
    wrong = device.matmul("cpu", n=64, repeats=1)
    assert wrong.status == FAIL and "rel. error" in wrong.line, wrong
    monkeypatch.setattr(device, "versions", lambda: 1 / 0)
    assert device.device_info("cpu", {}).status == FAIL


def test_a_row_that_cannot_run_says_so_and_fails_a_gpu_run():
    from benchmarks.gpu.rows import Row
    row = collectives.nccl("cpu")
    assert row.status == NOT_RUN and not row.ok and "needs a CUDA device" in row.line
    rows = [Row("a", OK, ""), row]
    assert tier.passed(rows, "cpu") and not tier.passed(rows, "cuda")
    assert not tier.passed([Row("physics", NOT_RUN, "no tables file")], "cpu")


def test_the_physics_row_is_not_run_without_its_tables_and_fails_on_a_wrong_convention(tmp_path, monkeypatch):
    assert physics.physics_prior("cpu").ok
    missing = physics.physics_prior("cpu", tmp_path / "none.npz")
    assert missing.status == NOT_RUN and "--export" in missing.line
    from envs.control import rigid_body
    transposed = rigid_body.quat_to_frame
    monkeypatch.setattr(rigid_body, "quat_to_frame", lambda q: transposed(q).transpose(0, 1))
    wrong = physics.physics_prior("cpu")
    assert wrong.status == FAIL and "max rel. error" in wrong.line, wrong


def test_a_sampler_that_leaves_masks_fails_the_vidd_row(monkeypatch):
    """VIDD's row passes with the real stage 0 and sampler, and fails when samples come back with mask tokens (a
    sampler that stops early on the device)."""
    from algos.vidd import sampling
    small = tier._sizes("cpu")["vidd"]
    from benchmarks.gpu import vidd
    assert vidd.vidd_stage0_and_sampler("cpu", **small).ok
    real = sampling.sample

    def stops_early(model, n, length, T, generator=None, **kw):
        out = real(model, n, length, T, generator, **kw)
        out.tokens[:, 0] = small["vocab"]  # the mask id
        return out
    monkeypatch.setattr(sampling, "sample", stops_early)
    row = vidd.vidd_stage0_and_sampler("cpu", **small)
    assert row.status == FAIL and "no mask left False" in row.line, row


def test_the_device_tier_imports_nothing_the_image_lacks():
    """Every module the device tier imports, with the packages the lent image lacks made unimportable; the physics
    row (the torch prior built from the stored MuJoCo tables) runs there."""
    code = (f"import sys; sys.modules.update(dict.fromkeys({NOT_ON_THE_IMAGE!r})); "
            "import benchmarks.gpu.tier, benchmarks.gpu.attnrl, benchmarks.gpu.physics, benchmarks.gpu.vidd, "
            "benchmarks.gpu.collectives, benchmarks.gpu.device, envs.control.rigid_body, algos.attnrl.scoring, "
            "algos.attnrl.ppo, experiments.attnrl.learner_state, experiments.attnrl.weights, algos.vidd.mdlm, "
            "algos.vidd.sampling; print(benchmarks.gpu.physics.physics_prior('cpu'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "[gpu] ok      lift physics prior" in proc.stdout, proc.stderr[-2000:]


# ------------------------------------------------------------------------------------------------ collectives

def one_rank_groups(rank, world, backend, device, port, queue):
    """The old check's bug: every process its own one-rank group (a collective that checks nothing). Each takes a
    free port of its own (``port + rank`` may be taken by another process, and that rank then reports an error)."""
    collectives._collective_worker(0, 1, backend, device, collectives._free_port(), queue)


def test_group_problem_names_what_is_wrong():
    good = [(0, 3.0, None, [10, 11], None), (1, 3.0, None, [10, 11], None)]
    assert collectives.group_problem(good, 2, mixed=False) is None
    assert "want 3" in collectives.group_problem([(0, 1.0, None, [10], None), (1, 2.0, None, [11], None)], 2, False)
    assert "distinct processes" in collectives.group_problem([(0, 3.0, None, [10, 10], None)] * 2, 2, False)
    assert "1 of 2" in collectives.group_problem(good[:1], 2, False)
    assert "cpu all_reduce" in collectives.group_problem(
        [(0, 3.0, 1.0, [10, 11], None), (1, 3.0, 3.0, [10, 11], None)], 2, mixed=True)
    assert collectives.group_problem([(0, None, None, [], "RuntimeError: NCCL error")], 1, False) == \
        "RuntimeError: NCCL error"


def rank_one_dies(rank, world, backend, device, port, queue):
    """A rank killed before it reports (an out-of-memory kill, a failed import)."""
    if rank == 1:
        os._exit(3)
    collectives._collective_worker(rank, world, backend, device, port, queue)


@pytest.mark.slow
def test_the_collectives_row_fails_on_one_rank_groups_and_on_a_dead_rank(monkeypatch):
    """(It passes with the real worker: test_the_device_tier_rehearses_on_cpu_end_to_end.)"""
    monkeypatch.setattr(collectives, "_collective_worker", one_rank_groups)  # spawn pickles it by name
    gloo, nccl = collectives.collectives("cpu", world=2)
    assert gloo.status == FAIL and "want 3" in gloo.line, gloo
    assert nccl.status == NOT_RUN and "needs a CUDA device" in nccl.line
    monkeypatch.setattr(collectives, "_collective_worker", rank_one_dies)
    reports = collectives.run_group("gloo", "cpu", 2, timeout_s=60)  # rank 0 waits for its peer: not 60 s here
    assert "rank 1 exited with 3" in collectives.group_problem(reports, 2, mixed=False)


@pytest.mark.slow
def test_the_device_tier_rehearses_on_cpu_end_to_end(tmp_path):
    """``python -m benchmarks.gpu --device cpu --out DIR`` (what first_gpu_run.sh runs on the GPU), with the packages
    the image lacks unimportable: 10 rows ok, NCCL not run, the table and rows.json written."""
    code = (f"import sys, runpy; sys.modules.update(dict.fromkeys({NOT_ON_THE_IMAGE!r})); "
            f"sys.argv = ['benchmarks.gpu', '--device', 'cpu', '--out', {str(tmp_path)!r}]; "
            "runpy.run_module('benchmarks.gpu', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert [r["status"] for r in rows].count(OK) == len(rows) - 1 == 10, rows
    assert next(r for r in rows if r["status"] != OK)["name"].startswith("collectives cpu:gloo,cuda:nccl")
    assert "2 distinct pids" in next(r["line"] for r in rows if r["name"] == "collectives gloo x2")
    assert "| lift physics prior vs MuJoCo | ok |" in (tmp_path / "first_gpu_run.md").read_text()


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
