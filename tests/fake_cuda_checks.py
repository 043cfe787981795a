"""Device checks of the GPU path on a CPU-only machine, one per process (``tests/test_gpu_path.py`` runs them).

    python -m tests.fake_cuda_checks world_model_training

Each check builds what a learner puts on its GPU on the fake cuda device of ``tests.fake_cuda`` and runs the code
that feeds it host data; a tensor left on the CPU in one op with a cuda one raises. A check prints ``ok <name>`` and
the process exits with ``os._exit`` (fake tensors can crash the interpreter's teardown).
"""
from __future__ import annotations

import os
import sys
import traceback

import numpy as np
import torch

from tests.fake_cuda import fake_cuda, on_fake_cuda, to_fake_cuda


class RodPrior:
    """A one-joint ``RigidBodyPrior`` in torch only (a pendulum), so the physics model runs under fake tensors."""

    nq = nv = 1
    n_substeps = 1
    timestep = 0.05
    linear_qpos = linear_qvel = (0,)
    quaternion_qpos = quaternion_qvel = translation_qpos = ()

    def terms(self, qpos, qvel, action):
        minv_h = torch.ones(*qpos.shape[:-1], 1, 1, dtype=qpos.dtype, device=qpos.device)
        return minv_h, action[..., :1].to(qpos.dtype) + 3.0 * torch.sin(qpos[..., :1])


def pendulum_transitions(episodes: int = 12, steps: int = 20, seed: int = 0) -> dict[str, np.ndarray]:
    """Flat transitions (``TRANSITION_COLUMNS``) of a damped pendulum under random torques, whole episodes."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {k: [] for k in ("qpos", "qvel", "action", "next_qpos", "next_qvel", "terminated",
                                             "truncated")}
    for _ in range(episodes):
        q, v = rng.uniform(-1, 1, 1), rng.uniform(-1, 1, 1)
        for t in range(steps):
            a = rng.uniform(-2, 2, 1)
            v2 = v + 0.05 * (a + 3.0 * np.sin(q))
            q2 = q + 0.05 * v2
            for key, value in zip(rows, (q, v, a, q2, v2, 0.0, float(t == steps - 1))):
                rows[key].append(value)
            q, v = q2, v2
    return {k: np.array(v) for k, v in rows.items()}


def models():
    from algos.lift.world_model import BlackBoxEnsemble, PhysicsWorldModel, WorldModelConfig
    cfg = WorldModelConfig(hidden_sizes=(16, 16), train_steps=4, eval_every=2, batch_size=32, eval_horizon=5)
    return {"physics": PhysicsWorldModel(RodPrior(), 1, cfg),
            "blackbox": BlackBoxEnsemble(1, 1, 1, WorldModelConfig(**{**cfg.__dict__, "ensemble_size": 3}))}


def check_world_model_training() -> None:
    """Stage 2 (fresh scalers) and a stage-3 retraining (refit, early stopping, fixed units) of both model kinds on
    the (fake) GPU, then the held-out error on fresh host data: what finetune_learner does on its first GPU epoch."""
    from algos.lift.world_model_training import EarlyStopping, heldout_errors, train_world_model
    data = pendulum_transitions()
    with fake_cuda():
        for name, model in models().items():
            model = to_fake_cuda(model)
            train_world_model(model, data)
            units = model.state_std.clone()
            out = train_world_model(model, data, early_stopping=EarlyStopping(1), scalers="refit", state_std=units)
            errors = heldout_errors(model, pendulum_transitions(seed=1), 5, state_std=units)
            assert len(errors) == 5 and out["steps"] >= 1, (name, out)
            assert all(on_fake_cuda(t) for t in model.state_dict().values()), name


def check_mixing_is_a_runtime_error() -> None:
    """A CPU batch into a cuda model fails with a device error (a RuntimeError), which the finetune learner's
    ``except ValueError`` (the "no hold-out data" case) does not swallow."""
    from algos.lift.world_model_training import as_tensors, gather_windows, successor_index, windows
    data = pendulum_transitions()
    successor = successor_index(data)
    index, valid = windows(successor, np.arange(40), 1)
    with fake_cuda():
        model = to_fake_cuda(models()["physics"])
        batch = gather_windows(as_tensors(data), index, valid)  # host tensors: the bug this guards against
        try:
            model.loss(batch)
        except ValueError as err:
            raise AssertionError(f"a device mix surfaced as a ValueError: {err}") from err
        except RuntimeError:
            return
    raise AssertionError("a CPU batch into a cuda model went through")


CHECKS = {"world_model_training": check_world_model_training, "mixing_is_a_runtime_error": check_mixing_is_a_runtime_error}


if __name__ == "__main__":
    torch.set_num_threads(1)
    name = sys.argv[1]
    try:
        CHECKS[name]()
    except BaseException:  # noqa: BLE001 - reported, then the process ends with a failing status
        traceback.print_exc()
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(1)
    print(f"ok {name}", flush=True)
    os._exit(0)
