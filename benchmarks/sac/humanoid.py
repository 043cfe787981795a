"""Part 3: Humanoid-v5 env steps/s while training, against collection alone."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.sac.common import fmt, markdown_table, ratio, timed
from benchmarks.sac.pendulum import learner_seconds, run_experiment


def collection_only(steps: int, num_envs: int, seed: int) -> tuple[float, float]:
    """Env steps/s and per CPU-second of ``VectorRollout.collect`` on Humanoid-v5 (random policy, physics state)."""
    from envs.control.rollout import VectorRollout, random_policy
    rollout = VectorRollout("humanoid", num_envs, seed, physics_state=True)
    policy = random_policy(rollout.single_action_space, seed)
    rollout.collect(policy, 10)  # warm-up
    per_call = 100
    calls = max(1, steps // (per_call * num_envs))
    wall, cpu = timed(lambda: [rollout.collect(policy, per_call) for _ in range(calls)])
    rollout.close()
    n = calls * per_call * num_envs
    return n / wall, n / cpu


def humanoid(total_env_steps: int, out: Path, stamp: str, seed: int, time_cap_s: float) -> str:
    from cluster.metrics import read_metrics
    overrides = ["experiment=lift_pretrain", "env=humanoid", f"seed={seed}",
                 f"experiment.total_env_steps={total_env_steps}", "experiment.num_shards=2"]
    run_path, wall, rc, cmd = run_experiment(overrides, out, f"humanoid-{stamp}", time_cap_s)
    collect_rate, collect_cpu_rate = collection_only(min(total_env_steps, 8000), 16, seed)
    try:
        df = read_metrics(run_path)
    except Exception as err:  # noqa: BLE001
        return f"Humanoid run failed: no metrics ({err}), exit {rc}; command `{cmd}`"
    env_steps, wall_s = df["env_steps"].to_numpy(), df["wall_s"].to_numpy()
    train = np.flatnonzero(df["updates"].to_numpy() > 0)
    overall = env_steps[-1] / wall_s[-1]
    if len(train):
        first = train[0]
        t0, s0 = (wall_s[first - 1], env_steps[first - 1]) if first > 0 else (0.0, 0)
        training = (env_steps[-1] - s0) / (wall_s[-1] - t0)
        prefill = s0 / t0 if t0 > 0 else float("nan")
        learner = learner_seconds(df)[-1]
        updates = int(df["updates"].iloc[-1])
        updates_learner, updates_wall = updates / learner, updates / (wall_s[-1] - t0)
    else:
        training = prefill = updates_learner = updates_wall = float("nan")
        updates = 0
    rows = [
        ["orrery lift_pretrain, 2 pool workers, training", fmt(training, 0), fmt(updates_wall), fmt(updates_learner)],
        ["orrery lift_pretrain, 2 pool workers, prefill (no updates)", fmt(prefill, 0), "-", "-"],
        ["orrery lift_pretrain, 2 pool workers, whole run", fmt(overall, 0), "-", "-"],
        ["collection only: VectorRollout.collect, 16 envs, random policy, 1 process, no Ray", fmt(collect_rate, 0),
         "-", "-"],
    ]
    header = ["configuration", "env steps/s", "updates/s (wall, training phase)", "updates/s (learner time only)"]
    return (markdown_table(header, rows) +
          f"\n\n- command: `{cmd}` (preset `humanoid` at laptop size: 16 envs split over 2 pool workers, batch 512, "
          f"G=9, actor 128-64-32, critic 256-128-64, bf16 auto = {auto_precision()}; 4 steps per round = 36 updates per 64 env steps; "
          f"physics state and Parquet replay on); {int(env_steps[-1]):,} env steps, {updates:,} updates, learner "
          f"loop {wall_s[-1]:.0f} s, subprocess {wall:.0f} s in all (exit {rc}); updates took "
          f"{fmt(100 * ratio(learner, wall_s[-1] - t0) if len(train) else None, 0)}% of the training phase's wall "
          "time (the rest: waiting for the pool's round, normalizer, replay, Parquet, publishing, evaluation)\n"
          f"- training phase / collection only: **{fmt(ratio(training, collect_rate), 2)}x** (collection only: "
          f"{collect_cpu_rate:,.0f} env steps per CPU-s)")


def auto_precision() -> str:
    """What ``bf16: auto`` (the presets' setting) resolves to on this machine's CPU, and why."""
    from algos.precision import NATIVE_CPU_FLAGS, cpu_flags, use_bf16
    flags = cpu_flags()
    why = ("flags " + ", ".join(f for f in NATIVE_CPU_FLAGS if f in flags) if flags and use_bf16("auto", "cpu")
           else "no AMX/AVX512-BF16" if flags is not None else "timed probe")
    return f"{'bf16' if use_bf16('auto', 'cpu') else 'fp32'} ({why})"
