"""envs/control/rigid_body.py equals MuJoCo's M, qfrc_bias, qfrc_passive and qfrc_actuator (float64, 1e-6 relative).

The reference is MuJoCo itself, one state at a time (``MujocoPrior.numpy_terms``, the loop the batched code replaces).
"""
from __future__ import annotations

import gymnasium as gym
import mujoco
import numpy as np
import pytest
import torch

from envs.control.mujoco_prior import MujocoPrior
from envs.control.joint_kinds import HAND_XML, random_states
from envs.control.rigid_body import RigidBodyDynamics

TASKS = ["Walker2d-v5", "Humanoid-v5", "Hopper-v5", "HalfCheetah-v5", "InvertedPendulum-v5"]

def _model(name: str) -> mujoco.MjModel:
    if name == "hand":
        return mujoco.MjModel.from_xml_string(HAND_XML)
    return gym.make(name).unwrapped.model


def _assert_close(got: torch.Tensor, want: np.ndarray, what: str) -> None:
    scale = max(float(np.abs(want).max()), 1e-9)
    error = float(np.abs(got.detach().numpy() - want).max()) / scale
    assert error < 1e-6, f"{what}: max error {error:.2e} of max |value| {scale:.3g}"


@pytest.mark.parametrize("name", TASKS + ["hand"])
def test_terms_equal_mujoco_on_random_states(name):
    model = _model(name)
    qpos, qvel, ctrl = random_states(model, 1000, seed=0)
    mass, bias, actuator, passive = MujocoPrior(model, frame_skip=1).numpy_terms(qpos, qvel, ctrl)
    got = RigidBodyDynamics(model).terms(*(torch.from_numpy(x) for x in (qpos, qvel, ctrl)))
    for value, want, what in zip(got, (mass, bias, passive, actuator), ("M", "qfrc_bias", "qfrc_passive",
                                                                         "qfrc_actuator")):
        assert np.abs(want).max() > 1e-3, f"{what} is ~0 on {name}: the comparison would be vacuous"
        _assert_close(value, want, f"{name} {what}")


def test_wrong_conventions_would_fail():
    """The comparison can fail: a free joint's angular velocity taken in the world frame changes M and the bias."""
    model = _model("hand")
    qpos, qvel, ctrl = random_states(model, 20, seed=1)
    mass, bias, _, _ = MujocoPrior(model, frame_skip=1).numpy_terms(qpos, qvel, ctrl)
    dynamics = RigidBodyDynamics(model)
    got_mass, got_bias, _, _ = dynamics.terms(*(torch.from_numpy(x) for x in (qpos, qvel, ctrl)))
    _assert_close(got_mass, mass, "M")
    perturbed = qvel.copy()
    perturbed[:, 3:6] += 0.5  # a different angular velocity must give a different bias
    _, other_bias, _, _ = dynamics.terms(*(torch.from_numpy(x) for x in (qpos, perturbed, ctrl)))
    with pytest.raises(AssertionError):
        _assert_close(other_bias, bias, "bias")


def test_float32_and_gradients():
    model = _model("Humanoid-v5")
    qpos, qvel, ctrl = random_states(model, 64, seed=2)
    mass, bias, _, _ = MujocoPrior(model, frame_skip=1).numpy_terms(qpos, qvel, ctrl)
    dynamics = RigidBodyDynamics(model)
    tensors = [torch.tensor(x, dtype=torch.float32, requires_grad=True) for x in (qpos, qvel, ctrl)]
    got = dynamics.terms(*tensors)
    assert all(t.dtype == torch.float32 for t in got)
    assert np.abs(got[0].detach().double().numpy() - mass).max() / np.abs(mass).max() < 1e-4
    assert np.abs(got[1].detach().double().numpy() - bias).max() / np.abs(bias).max() < 1e-4
    sum(t.sum() for t in got).backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0 for t in tensors)


def test_unsupported_features_raise():
    xml = HAND_XML.replace('<option gravity="0.3 -0.2 -9.81"/>', '<option density="1.2"/>')
    with pytest.raises(NotImplementedError, match="fluid"):
        RigidBodyDynamics(mujoco.MjModel.from_xml_string(xml))


@pytest.mark.parametrize("name", ["Humanoid-v5", "HalfCheetah-v5"])
def test_prior_backends_agree(name):
    """MujocoPrior's default (batched torch, Cholesky) gives the MuJoCo loop's (M + hD)^-1 and force."""
    model = _model(name)
    qpos, qvel, ctrl = (torch.from_numpy(x) for x in random_states(model, 200, seed=3))
    batched, loop = MujocoPrior(model, frame_skip=5), MujocoPrior(model, frame_skip=5, backend="mujoco")
    assert batched.backend == "torch"
    for got, want, what in zip(batched.terms(qpos, qvel, ctrl), loop.terms(qpos, qvel, ctrl), ("minv_h", "force")):
        _assert_close(got, want.numpy(), what)
    with pytest.raises(ValueError, match="backend"):
        MujocoPrior(model, frame_skip=1, backend="warp")


def test_prior_computes_in_float64_for_float32_states_unless_asked():
    """fp32 states get the fp64 terms rounded to fp32 by default (as the MuJoCo loop gives them), and the fp32
    computation only when ``compute_dtype=None`` asks for it."""
    model = _model("Humanoid-v5")
    qpos, qvel, ctrl = (torch.from_numpy(x).float().double() for x in random_states(model, 64, seed=4))
    exact = MujocoPrior(model, frame_skip=5).terms(qpos, qvel, ctrl)
    default = MujocoPrior(model, frame_skip=5).terms(qpos.float(), qvel.float(), ctrl.float())
    fast = MujocoPrior(model, frame_skip=5, compute_dtype=None).terms(qpos.float(), qvel.float(), ctrl.float())
    for d, f, e in zip(default, fast, exact):
        assert d.dtype == f.dtype == torch.float32
        assert torch.equal(d, e.float())
        assert not torch.equal(f, e.float())


def test_the_prior_from_saved_tables_equals_the_prior_from_the_model(tmp_path):
    """``ModelTables`` saved to ``.npz`` and loaded again give the very terms of the model (a machine without MuJoCo
    runs the prior this way: tests/test_gpu_check.py imports and runs it with MuJoCo unimportable)."""
    from envs.control.rigid_body_tables import ModelTables
    model = _model("hand")
    ModelTables.from_mujoco(model).save(tmp_path / "hand.npz")
    states = [torch.from_numpy(x) for x in random_states(model, 16, seed=6)]
    got = RigidBodyDynamics(ModelTables.load(tmp_path / "hand.npz")).terms(*states)
    assert all(torch.equal(g, w) for g, w in zip(got, RigidBodyDynamics(model).terms(*states)))
    with pytest.raises(ValueError, match="lack"):
        ModelTables({"nq": np.array(1)})


def test_the_first_gpu_runs_tables_are_mujocos_own():
    """benchmarks/first_gpu_run_tables.npz (what the GPU row compares with) holds this MuJoCo's tables of the models
    and its terms at the stored states: a stale or hand-edited file fails here (rewrite it with
    ``python -m benchmarks.gpu.physics --export``)."""
    from benchmarks.gpu import physics
    from envs.control.mujoco_prior import MujocoPrior
    from envs.control.rigid_body_tables import ModelTables
    cases = physics.load_cases()
    models = {"hand": _model("hand"), "humanoid": _model("Humanoid-v5")}
    assert sorted(cases) == sorted(models)
    for name, case in cases.items():
        fresh = ModelTables.from_mujoco(models[name]).arrays()
        stored = case["tables"].arrays()
        assert all(np.array_equal(fresh[k], stored[k]) for k in fresh), name
        mass, bias, actuator, passive = MujocoPrior(models[name], frame_skip=1).numpy_terms(*case["states"])
        for want, got in zip((mass, bias, passive, actuator), case["terms"]):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * max(1.0, float(np.abs(want).max())))
