"""LIFT's batched rigid-body prior on the device against MuJoCo's own terms, with no MuJoCo on the device.

The lent image has no MuJoCo, so what the row needs from it travels in the working tree: ``TABLES`` holds, for a
model with every joint kind (``envs/control/joint_kinds.py``) and for Humanoid-v5, the model's tables
(``envs.control.rigid_body_tables.ModelTables``), random states, and MuJoCo's M, qfrc_bias, qfrc_passive and
qfrc_actuator at each state (its per-state loop, ``MujocoPrior.numpy_terms``). The row builds
``RigidBodyDynamics`` from the tables, computes the terms on the device, and compares them with MuJoCo's: 1e-6
relative in float64, 1e-3 in float32. Written here, where MuJoCo is installed:

    python -m benchmarks.gpu.physics --export          # rewrites benchmarks/first_gpu_run_tables.npz (~1 MB)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks.gpu.rows import NotRun, Row, run_row

TABLES = Path(__file__).resolve().parents[1] / "first_gpu_run_tables.npz"
MODELS = {"hand": 256, "humanoid": 64}  # model -> states stored
TERMS = ("M", "qfrc_bias", "qfrc_passive", "qfrc_actuator")  # RigidBodyDynamics.terms' order
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3}


def load_cases(path: Path = TABLES) -> dict[str, dict]:
    """Per model: its ``ModelTables``, the states (qpos, qvel, ctrl) and MuJoCo's terms, as stored."""
    from envs.control.rigid_body_tables import ModelTables
    if not path.exists():
        raise NotRun(f"no {path.name} beside the script (python -m benchmarks.gpu.physics --export writes it where "
                     f"MuJoCo is installed)")
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    return {name: {"tables": ModelTables.from_arrays(arrays, f"{name}.tables."),
                   "states": [arrays[f"{name}.{k}"] for k in ("qpos", "qvel", "ctrl")],
                   "terms": [arrays[f"{name}.{k}"] for k in TERMS]}
            for name in sorted(str(n) for n in arrays["models"])}


def physics_prior(device: str, path: Path = TABLES) -> Row:
    def check():
        from envs.control.rigid_body import RigidBodyDynamics
        cases = load_cases(path)
        figures, ok = [], True
        for name, case in cases.items():
            dynamics = RigidBodyDynamics(case["tables"])
            for dtype, tol in TOLERANCE.items():
                got = dynamics.terms(*(torch.from_numpy(x).to(device, dtype) for x in case["states"]))
                on_device = all(g.device.type == torch.device(device).type and g.dtype == dtype for g in got)
                errors = [float(np.abs(g.double().cpu().numpy() - want).max() / np.abs(want).max())
                          for g, want in zip(got, case["terms"])]
                vacuous = [t for t, want in zip(TERMS, case["terms"]) if np.abs(want).max() < 1e-3]
                ok &= on_device and max(errors) < tol and not vacuous
                figures.append(f"{name} {str(dtype).removeprefix('torch.')} on {device} {on_device}: max rel. error "
                               f"{max(errors):.1e} (< {tol:g}, {TERMS[int(np.argmax(errors))]})"
                               + (f", ~0 reference: {vacuous}" if vacuous else ""))
        states = ", ".join(f"{n} {len(c['states'][0])}" for n, c in cases.items())
        return ok, f"vs MuJoCo's stored terms ({states} states): " + "; ".join(figures)
    return run_row("lift physics prior vs MuJoCo", check)


def export(path: Path = TABLES) -> None:
    """Write the tables, states and MuJoCo's terms (needs MuJoCo and gymnasium: run it here, not on the device)."""
    import gymnasium as gym
    import mujoco

    from envs.control.mujoco_prior import MujocoPrior
    from envs.control.rigid_body_tables import ModelTables
    from envs.control.joint_kinds import HAND_XML, random_states
    models = {"hand": mujoco.MjModel.from_xml_string(HAND_XML), "humanoid": gym.make("Humanoid-v5").unwrapped.model}
    arrays: dict[str, np.ndarray] = {"models": np.array(sorted(models)), "mujoco_version": np.array(mujoco.__version__)}
    for name, model in models.items():
        qpos, qvel, ctrl = random_states(model, MODELS[name], seed=0)
        mass, bias, actuator, passive = MujocoPrior(model, frame_skip=1).numpy_terms(qpos, qvel, ctrl)
        arrays.update(ModelTables.from_mujoco(model).arrays(f"{name}.tables."))
        arrays.update({f"{name}.qpos": qpos, f"{name}.qvel": qvel, f"{name}.ctrl": ctrl, f"{name}.M": mass,
                       f"{name}.qfrc_bias": bias, f"{name}.qfrc_passive": passive, f"{name}.qfrc_actuator": actuator})
    np.savez_compressed(path, **arrays)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.2f} MiB, MuJoCo {mujoco.__version__})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", action="store_true", help="write the tables file (needs MuJoCo)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.export:
        export()
    else:
        print(physics_prior(args.device))
    sys.exit(0)
