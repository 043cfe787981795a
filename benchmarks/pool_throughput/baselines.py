"""The rows without the pool: bare ``mj_step`` (c), gymnasium's loop (a) and the lean env loop (e), AsyncVectorEnv (b) and
``VectorRollout.collect`` without Ray (d), each in a fresh process."""
from __future__ import annotations

import math
import multiprocessing as mp
import statistics
import time
from functools import partial
from typing import Any, Callable

import numpy as np

from benchmarks.pool_throughput.common import CpuClock, Measurement, TASK, TASK_ID


# -- (c) the physical limit ----------------------------------------------------------------------------------------
class BarePhysics:
    """Humanoid-v5's model stepped by ``mj_step`` alone, with the env's reset rule and nothing else."""

    def __init__(self, seed: int) -> None:
        import gymnasium as gym
        import mujoco
        self.mujoco = mujoco
        env = gym.make(TASK_ID)
        base = env.unwrapped
        self.model, self.frame_skip = base.model, base.frame_skip
        self.data = mujoco.MjData(self.model)
        self.z_range, self.noise = base._healthy_z_range, base._reset_noise_scale
        self.max_steps = env.spec.max_episode_steps
        self.rng = np.random.default_rng(seed)
        self.ctrl_low, self.ctrl_high = self.model.actuator_ctrlrange.T
        self.t = 0
        self.reset()

    def reset(self) -> None:
        m, d, c = self.model, self.data, self.noise
        self.mujoco.mj_resetData(m, d)
        d.qpos[:] = m.qpos0 + self.rng.uniform(-c, c, m.nq)
        d.qvel[:] = self.rng.uniform(-c, c, m.nv)
        self.mujoco.mj_forward(m, d)
        self.t = 0

    def run(self, env_steps: int) -> int:
        """Step ``env_steps`` env steps (``frame_skip`` mj_steps each); returns the number of episodes ended."""
        m, d, mj_step, nstep = self.model, self.data, self.mujoco.mj_step, self.frame_skip
        zmin, zmax = self.z_range
        ctrl = self.rng.uniform(self.ctrl_low, self.ctrl_high, size=(env_steps, m.nu))
        episodes = 0
        for k in range(env_steps):
            d.ctrl[:] = ctrl[k]
            mj_step(m, d, nstep=nstep)
            self.t += 1
            if not zmin < d.qpos[2] < zmax or self.t >= self.max_steps:
                self.reset()
                episodes += 1
        return episodes


def _physics_process(env_steps: int, seed: int, barrier: Any, queue: Any) -> None:
    sim = BarePhysics(seed)
    sim.run(200)  # warm-up
    barrier.wait()  # all cores start timing together
    start, cpu = time.perf_counter(), time.process_time()
    episodes = sim.run(env_steps)
    queue.put(Measurement(env_steps / (time.perf_counter() - start), env_steps / (time.process_time() - cpu),
                          env_steps / max(episodes, 1)))


def measure_physics(cores: int, env_steps: int, seed: int) -> Measurement:
    """(c): ``cores`` processes, ``env_steps`` in all; throughput = sum of the per-process rates (they run
    concurrently from a common start), steps per CPU-second = total steps / total CPU seconds."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(cores), ctx.Queue()
    procs = [ctx.Process(target=_physics_process, args=(env_steps // cores, seed + i, barrier, queue))
             for i in range(cores)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join()
    per_process = env_steps // cores
    return Measurement(sum(r.steps_per_s for r in results),
                       len(results) * per_process / sum(per_process / r.steps_per_cpu_s for r in results),
                       statistics.mean(r.episode_length for r in results))


# -- (a), (b), (d): the env without Ray ----------------------------------------------------------------------------
def measure_gym_loop(env_steps: int, seed: int, warmup: int = 200, lean: bool = False) -> Measurement:
    """(a): one env, one process, ``env.step`` / ``env.reset`` and nothing else; (e) with ``lean``: the env
    ``envs.control.tasks.make_env`` builds (``envs.control.fast_mujoco.FastHumanoid`` in ``RescaleAction``)."""
    import gymnasium as gym
    if lean:
        from envs.control.tasks import make_env
        env = make_env(TASK)
    else:
        env = gym.make(TASK_ID)
    env.reset(seed=seed)
    space = env.action_space
    actions = np.random.default_rng(seed).uniform(space.low, space.high,
                                                  size=(warmup + env_steps,) + space.shape).astype(np.float32)

    def run(batch: np.ndarray) -> int:
        episodes = 0
        for a in batch:
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()
                episodes += 1
        return episodes

    run(actions[:warmup])
    start, cpu = time.perf_counter(), CpuClock()
    episodes = run(actions[warmup:])
    wall, cpu_s = time.perf_counter() - start, cpu.seconds()
    env.close()
    return Measurement(env_steps / wall, env_steps / cpu_s, env_steps / max(episodes, 1))


def measure_async_vector(num_envs: int, env_steps: int, seed: int, warmup: int = 50) -> Measurement:
    """(b): gymnasium's AsyncVectorEnv, one subprocess per env."""
    import gymnasium as gym
    envs = gym.vector.AsyncVectorEnv([partial(gym.make, TASK_ID)] * num_envs, context="spawn",
                                     autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        envs.reset(seed=seed)
        space = envs.action_space  # batched: (num_envs, act_dim)
        vsteps = math.ceil(env_steps / num_envs)
        actions = np.random.default_rng(seed).uniform(space.low, space.high,
                                                      size=(warmup + vsteps,) + space.shape).astype(np.float32)
        for a in actions[:warmup]:
            envs.step(a)
        episodes = 0
        start, cpu = time.perf_counter(), CpuClock()  # this process and the env processes
        for a in actions[warmup:]:
            _, _, terminated, truncated, _ = envs.step(a)
            episodes += int(np.sum(terminated | truncated))
        wall, cpu_s = time.perf_counter() - start, cpu.seconds()
    finally:
        envs.close()
    steps = vsteps * num_envs
    return Measurement(steps / wall, steps / cpu_s, steps / max(episodes, 1))


def measure_rollout(num_envs: int, steps_per_call: int, env_steps: int, seed: int,
                    physics_state: bool) -> Measurement:
    """(d): the pool sampler's stepping path, ``VectorRollout.collect``, called as a sampler calls it."""
    from envs.control.rollout import VectorRollout, random_policy
    rollout = VectorRollout(TASK, num_envs, seed, physics_state=physics_state)
    policy = random_policy(rollout.single_action_space, seed)
    rollout.collect(policy, 5)  # warm-up
    calls = max(1, math.ceil(env_steps / (num_envs * steps_per_call)))
    lengths: list[int] = []
    start, cpu = time.perf_counter(), CpuClock()
    for _ in range(calls):
        _, stats = rollout.collect(policy, steps_per_call)
        lengths.extend(stats.lengths)
    wall, cpu_s = time.perf_counter() - start, cpu.seconds()
    rollout.close()
    steps = calls * num_envs * steps_per_call
    return Measurement(steps / wall, steps / cpu_s, float(np.mean(lengths)) if lengths else float("nan"))


def _measure_and_send(job: Callable[..., Measurement], args: tuple, queue: Any) -> None:
    queue.put(job(*args))


def in_fresh_process(job: Callable[..., Measurement], *args: Any) -> Measurement:
    """Run a Ray-free measurement in a new process, so its CPU seconds are its own (plus its env processes'),
    not this driver's Ray threads and Ray's background processes."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure_and_send, args=(job, args, queue))
    proc.start()
    result = queue.get(timeout=3600)
    proc.join()
    return result
