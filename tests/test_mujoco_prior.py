"""The exact rigid-body prior (envs/control/mujoco_prior.py): MuJoCo's equation of motion and its Euler step."""
from __future__ import annotations

import types

import gymnasium as gym
import mujoco
import numpy as np
import pytest
import torch

from envs.control import mujoco_prior
from envs.control.mujoco_prior import (MujocoPrior, euler_velocity_update, full_mass_matrix, identity_residual, prior_terms,
                               set_euler)

torch.set_num_threads(1)
TASKS = ["Humanoid-v5", "Walker2d-v5", "HalfCheetah-v5", "InvertedPendulum-v5"]


def _visit(env: gym.Env, steps: int, seed: int):
    """Yield the env after each of ``steps`` random actions (resetting after falls)."""
    env.reset(seed=seed)
    env.action_space.seed(seed)
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        yield env
        if terminated or truncated:
            env.reset()


@pytest.mark.parametrize("task", TASKS)
def test_equation_of_motion_identity_holds_on_visited_states(task):
    env = gym.make(task)
    model, data = env.unwrapped.model, env.unwrapped.data
    residuals, constraint_norms, inertial_norms = [], [], []
    for _ in _visit(env, 40, seed=0):
        residuals.append(identity_residual(model, data))
        terms = prior_terms(model, data)
        constraint_norms.append(np.abs(terms.constraint).max())
        inertial_norms.append(np.abs(terms.mass_matrix @ data.qacc).max())
    assert max(residuals) < 1e-8
    assert max(inertial_norms) > 1e-2  # the identity is not trivially 0 = 0
    if task != "InvertedPendulum-v5":  # the locomotion tasks touch the floor: leaving out contacts breaks (1)
        assert max(constraint_norms) > 1e-3


def test_mass_matrix_matches_mujoco_product():
    env = gym.make("Humanoid-v5")
    model, data = env.unwrapped.model, env.unwrapped.data
    for _ in _visit(env, 5, seed=1):
        mujoco.mj_forward(model, data)
        vector = np.random.default_rng(0).normal(size=model.nv)
        product = np.zeros(model.nv)
        mujoco.mj_mulM(model, data, product, vector)
        dense = full_mass_matrix(model, data)
        np.testing.assert_allclose(dense @ vector, product, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(dense, dense.T, atol=1e-12)


def test_mass_matrix_probe_falls_back_to_mujoco3_signature(monkeypatch):
    calls = []

    def mujoco3_full_m(model, dst, sparse):  # mujoco 3.x: mj_fullM(m, dst, d.qM)
        if not isinstance(dst, np.ndarray):
            raise TypeError("incompatible function arguments")
        calls.append(sparse)
        dst[:] = 7.0

    monkeypatch.setattr(mujoco, "mj_fullM", mujoco3_full_m)
    filler = mujoco_prior._pick_mass_matrix_filler()
    out = np.zeros((1, 1))
    filler(None, types.SimpleNamespace(qM=np.ones(1)), out)
    assert filler is mujoco_prior._fill_mass_matrix_v3 and out[0, 0] == 7.0 and len(calls) == 1


@pytest.mark.parametrize("task", ["Walker2d-v5", "HalfCheetah-v5", "Humanoid-v5"])
def test_euler_prior_reproduces_next_velocity(task):
    """Equation (2) with MuJoCo's own constraint force is exactly MuJoCo's Euler step."""
    env = gym.make(task)
    model, data = env.unwrapped.model, env.unwrapped.data
    set_euler(model)
    assert model.opt.integrator == mujoco.mjtIntegrator.mjINT_EULER
    errors, changes = [], []
    for _ in _visit(env, 10, seed=2):
        for _ in range(3):  # a few single substeps from the visited state
            terms = prior_terms(model, data)
            predicted = euler_velocity_update(model, terms, data.qvel.copy(), residual=terms.constraint)
            before = data.qvel.copy()
            mujoco.mj_step(model, data)
            errors.append(np.abs(predicted - data.qvel).max())
            changes.append(np.abs(data.qvel - before).max())
    assert max(errors) < 1e-9
    assert max(changes) > 1e-3  # velocities really changed, so the match is informative


def test_rk4_step_differs_from_euler_prior():
    """Walker2d-v5 is RK4 in gymnasium: equation (2) is not exact there (the residual has to absorb it)."""
    env = gym.make("Walker2d-v5")
    model, data = env.unwrapped.model, env.unwrapped.data
    assert model.opt.integrator == mujoco.mjtIntegrator.mjINT_RK4
    errors = []
    for _ in _visit(env, 10, seed=3):
        terms = prior_terms(model, data)
        predicted = euler_velocity_update(model, terms, data.qvel.copy(), residual=terms.constraint)
        mujoco.mj_step(model, data)
        errors.append(np.abs(predicted - data.qvel).max())
    assert max(errors) > 1e-6


@pytest.mark.parametrize("task", ["Humanoid-v5", "Walker2d-v5"])
def test_batched_prior_matches_single_state_terms(task):
    env = gym.make(task)
    prior = MujocoPrior.from_env(env)
    model, data = env.unwrapped.model, env.unwrapped.data
    states = [(data.qpos.copy(), data.qvel.copy(), env.action_space.sample().astype(np.float64))
              for _ in _visit(env, 6, seed=4)]
    qpos, qvel, action = (torch.tensor(np.array(x)) for x in zip(*states))
    minv_h, force = prior.terms(qpos, qvel, action)
    damping = np.diag(mujoco_prior.implicit_damping(model))
    for i, (q, v, a) in enumerate(states):
        data.qpos[:], data.qvel[:] = q, v
        terms = prior_terms(model, data, a)
        np.testing.assert_allclose(minv_h[i].numpy() @ (terms.mass_matrix + damping), np.eye(model.nv), atol=1e-8)
        np.testing.assert_allclose(force[i].numpy(), terms.actuator + terms.passive - terms.bias, atol=1e-9)
    assert prior.translation_qpos == ((0, 1) if task == "Humanoid-v5" else (0,))
    assert minv_h.dtype == torch.float64


def test_batched_prior_in_several_chunks_equals_the_loop():
    """A batch larger than one chunk (Humanoid fp64: 1024 states) gives the MuJoCo loop's terms in every row."""
    env = gym.make("Humanoid-v5")
    batched, loop = MujocoPrior.from_env(env), MujocoPrior.from_env(env, backend="mujoco")
    assert mujoco_prior._chunk_rows(batched.nv, 8) < 1100
    rng = np.random.default_rng(5)
    model = env.unwrapped.model
    qpos = model.qpos0 + rng.normal(scale=0.3, size=(1100, model.nq))
    quat = rng.normal(size=(1100, 4))
    qpos[:, 3:7] = quat / np.linalg.norm(quat, axis=1, keepdims=True)
    states = [torch.from_numpy(x) for x in (qpos, rng.normal(size=(1100, model.nv)),
                                            rng.uniform(-1, 1, size=(1100, model.nu)))]
    for got, want in zip(batched.terms(*states), loop.terms(*states)):
        assert float((got - want).abs().max() / want.abs().max()) < 1e-9


def test_prior_keeps_the_nominal_model_when_the_env_is_changed():
    env = gym.make("Walker2d-v5")
    prior = MujocoPrior.from_env(env)
    qpos, qvel = torch.tensor(env.unwrapped.init_qpos)[None], torch.zeros(1, 9, dtype=torch.float64)
    action = torch.ones(1, 6, dtype=torch.float64)
    before = prior.terms(qpos, qvel, action)
    env.unwrapped.model.body_mass[:] *= 2.0
    env.unwrapped.model.actuator_gear[:] *= 0.5
    after = prior.terms(qpos, qvel, action)
    for x, y in zip(before, after):
        torch.testing.assert_close(x, y)


def test_pendulum_prior_reproduces_pendulum_v1_below_the_speed_limit():
    from envs.control.mujoco_prior import PendulumPrior

    env = gym.make("Pendulum-v1")
    env.reset(seed=0)
    prior = PendulumPrior(env)
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(30):
        theta, speed = env.unwrapped.state.copy()
        action = rng.uniform(-2.0, 2.0, size=(1, 1))
        env.step(action[0].astype(np.float32))
        minv_h, force = prior.terms(torch.tensor([[theta]]), torch.tensor([[speed]]), torch.tensor(action))
        next_speed = speed + prior.timestep * (minv_h @ force.unsqueeze(-1)).item()
        if abs(next_speed) < 8.0:
            assert env.unwrapped.state[1] == pytest.approx(next_speed, abs=1e-5)
            assert env.unwrapped.state[0] == pytest.approx(theta + prior.timestep * next_speed, abs=1e-5)
            checked += 1
    assert checked >= 20
