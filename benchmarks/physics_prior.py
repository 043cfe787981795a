"""LIFT's physics prior (issue 41): MuJoCo's per-state loop against the batched torch prior, and one model step.

Two parts, measured in one run on the same machine, 1 torch thread (``--threads``), repeats interleaved so that
background load hits every row alike, best of ``--repeats`` reported, timed by this thread's CPU time (``--wall``:
the wall clock):

    prior   states/s of ``MujocoPrior.terms`` ((M + hD)^-1 and τ_act + τ_passive − c) at each batch size: the
            ``backend="mujoco"`` loop (float64, CPU, the reference) against the default ``backend="torch"``
            (``envs.control.rigid_body``, batched Cholesky) in float64 and float32; ratio = batched / loop.
    step    one model-rollout step (``WorldModel.predict``, no gradient, float32, member "random") of the physics
            world model (torch prior) against the black-box model (``BlackBoxEnsemble.like``), same
            ``WorldModelConfig`` (LIFT's lift_finetune wm_hidden 200-200-200, ensemble 1), equal batch; ratio =
            black-box time / physics time (>= 1: the physics step is as fast). The physics model on the MuJoCo loop
            is timed beside them.

Usage (repo root):

    OMP_NUM_THREADS=1 python -m benchmarks.physics_prior [--task Humanoid-v5] [--batches 256 4096 65536]
        [--step-batch 4096] [--repeats 3]
"""
from __future__ import annotations

import argparse
import logging
import time
from typing import Callable

import gymnasium as gym
import numpy as np
import torch

from algos.lift.world_model import BlackBoxEnsemble, PhysicsWorldModel, WorldModelConfig
from envs.control.mujoco_prior import MujocoPrior

log = logging.getLogger(__name__)


def _states(prior: MujocoPrior, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random states near qpos0 (unit quaternions) and controls, float64."""
    rng = np.random.default_rng(seed)
    qpos = prior.model.qpos0 + rng.normal(scale=0.3, size=(batch, prior.nq))
    for start in prior.quaternion_qpos:
        quat = rng.normal(size=(batch, 4))
        qpos[:, start:start + 4] = quat / np.linalg.norm(quat, axis=1, keepdims=True)
    qvel = rng.normal(size=(batch, prior.nv))
    ctrl = rng.uniform(-1, 1, size=(batch, prior.nu))
    return torch.from_numpy(qpos), torch.from_numpy(qvel), torch.from_numpy(ctrl)


def _best(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best time (s) of each function, the functions interleaved within each repeat (first call: warm-up).

    CPU time of this thread (everything here runs on one thread): on the shared machine the wall clock mostly
    measures what the scheduler gave us. ``CLOCK`` switches to the wall clock.
    """
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = CLOCK()
            fn()
            best[name] = min(best[name], CLOCK() - start)
    return best


CLOCK = time.thread_time


def prior_rows(prior: MujocoPrior, loop: MujocoPrior, batches: list[int], repeats: int) -> list[tuple]:
    rows = []
    for batch in batches:
        qpos, qvel, ctrl = _states(prior, batch, seed=batch)
        q32, v32, c32 = qpos.float(), qvel.float(), ctrl.float()
        times = _best({
            "loop": lambda: loop.terms(qpos, qvel, ctrl),
            "fp64": lambda: prior.terms(qpos, qvel, ctrl),
            "fp32": lambda: prior.terms(q32, v32, c32),
        }, repeats if batch < 65536 else 1)
        rate = {name: batch / t for name, t in times.items()}
        rows.append((batch, rate["loop"], rate["fp64"], rate["fp32"], rate["fp64"] / rate["loop"],
                     rate["fp32"] / rate["loop"]))
        log.info("prior batch %d: %s", batch, rate)
    return rows


def step_row(env: gym.Env, prior: MujocoPrior, loop: MujocoPrior, batch: int, repeats: int) -> tuple:
    cfg = WorldModelConfig(hidden_sizes=(200, 200, 200), ensemble_size=1)
    act_dim = env.action_space.shape[0]
    physics = PhysicsWorldModel(prior, act_dim, cfg).eval()
    physics_loop = PhysicsWorldModel(loop, act_dim, cfg).eval()
    physics_loop.load_state_dict(physics.state_dict())
    blackbox = BlackBoxEnsemble.like(prior, act_dim, cfg).eval()
    qpos, qvel, ctrl = _states(prior, batch, seed=1)
    state, action = torch.cat((qpos, qvel), -1).float(), ctrl.float()

    def step(model):
        def run():
            with torch.no_grad():
                return model.predict(state, action, member="random")
        return run

    times = _best({"physics": step(physics), "blackbox": step(blackbox), "physics_loop": step(physics_loop)}, repeats)
    return batch, times["physics"], times["blackbox"], times["physics_loop"]


def table(task: str, rows: list[tuple], step: tuple, threads: int) -> str:
    clock = "wall clock" if CLOCK is time.perf_counter else "thread CPU time"
    lines = [f"Task {task}, {threads} torch thread(s), states/s by {clock} (best of repeats):", "",
             "| batch | MuJoCo loop (fp64) | batched torch fp64 | batched torch fp32 | fp64 / loop | fp32 / loop |",
             "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {b} | {lp:,.0f} | {f64:,.0f} | {f32:,.0f} | {r64:.1f}x | {r32:.1f}x |"
              for b, lp, f64, f32, r64, r32 in rows]
    batch, phys, black, phys_loop = step
    lines += ["", f"One model-rollout step (predict, fp32, no grad) at batch {batch}, {clock}:", "",
              "| model | ms / step | black-box time / this |", "|---|---:|---:|",
              f"| physics (batched torch prior) | {1e3 * phys:.1f} | {black / phys:.2f}x |",
              f"| physics (MuJoCo loop prior) | {1e3 * phys_loop:.1f} | {black / phys_loop:.2f}x |",
              f"| black box | {1e3 * black:.1f} | 1.00x |"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="Humanoid-v5")
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 4096, 65536])
    parser.add_argument("--step-batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--wall", action="store_true", help="time by the wall clock instead of thread CPU time")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    global CLOCK
    if args.wall:
        CLOCK = time.perf_counter
    elif args.threads != 1:
        raise SystemExit("thread CPU time needs --threads 1; use --wall with more threads")
    torch.manual_seed(0)
    env = gym.make(args.task)
    # the prior rows compute in the states' dtype (fp64 and fp32 rows); the model step uses the default (fp64 inside)
    loop = MujocoPrior.from_env(env, backend="mujoco")
    rows = prior_rows(MujocoPrior.from_env(env, compute_dtype=None), loop, args.batches, args.repeats)
    step = step_row(env, MujocoPrior.from_env(env), loop, args.step_batch, args.repeats)
    print(table(args.task, rows, step, args.threads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
