"""Part 2: time to the return threshold on Pendulum-v1: orrery's lift_pretrain experiment, SB3 and RLlib."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks.sac.common import CHILD_ENV, ROOT, fmt, load_average, log, markdown_table, ratio


@dataclass
class Budget:
    threshold: float
    max_env_steps: int
    time_cap_s: float
    eval_every: int
    eval_episodes: int
    seed: int


@dataclass
class Curve:
    """Evaluations of one learner: ``(env_steps, wall_s, eval_return)``; the first one at/above the threshold."""

    learner: str
    settings: str
    evals: list[tuple[int, float, float]] = field(default_factory=list)
    learner_s: list[float] = field(default_factory=list)  # cumulative update time at each evaluation
    eval_s: float | None = 0.0  # None: evaluation ran inside the loop and was not timed apart (orrery)
    setup_s: float | None = None  # before learning starts (model build; for orrery: Ray and Ray Train start)
    total_env_steps: int = 0
    total_wall_s: float = 0.0
    note: str = ""

    def reached(self, threshold: float, time_cap_s: float = math.inf) -> int | None:
        """Index of the first evaluation at or above ``threshold`` within the time cap, else None."""
        return next((i for i, (_, wall, ret) in enumerate(self.evals) if ret >= threshold and wall <= time_cap_s),
                    None)


def eval_policy(policy: Callable[[np.ndarray], np.ndarray], budget: Budget) -> float:
    """Mean deterministic return on Pendulum-v1; ``policy`` maps observations to actions in [-1, 1]."""
    from envs.control.rollout import evaluate
    stats = evaluate("pendulum", policy, budget.eval_episodes, seed=10_000 + budget.seed)
    return float(np.mean(stats.returns))


def run_experiment(overrides: list[str], out: Path, name: str, timeout_s: float) -> tuple[Path, float, int, str]:
    """``python -m experiments.run <overrides>`` in its own session; returns (run dir, wall s, return code, command).

    On timeout the run gets SIGINT (Ray shuts its cluster down), then SIGKILL after 60 s.
    """
    runs = out / "runs"
    args = [*overrides, f"output_dir={runs}", f"run_name={name}", "cluster.include_dashboard=false"]
    cmd = [sys.executable, "-m", "experiments.run", *args]
    log_path = out / f"{name}.log"
    log.info("running %s (log %s)", " ".join(args), log_path)
    start = time.perf_counter()
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **CHILD_ENV})
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s: time cap %.0f s reached, interrupting", name, timeout_s)
            os.killpg(proc.pid, signal.SIGINT)
            try:
                rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
    wall = time.perf_counter() - start
    if rc != 0:
        log.warning("%s exited with %d; tail of %s:\n%s", name, rc, log_path,
                    "".join(log_path.read_text().splitlines(keepends=True)[-15:]))
    return runs / "lift_pretrain" / name, wall, rc, "python -m experiments.run " + " ".join(overrides)


def learner_seconds(df) -> np.ndarray:
    """Cumulative update time per metrics row: each round's new updates divided by its ``updates_per_s``."""
    new = df["updates"].diff().fillna(df["updates"]).to_numpy()
    rate = df["updates_per_s"].to_numpy()
    return np.cumsum(np.where(new > 0, new / np.where(rate > 0, rate, np.inf), 0.0))


def orrery_pendulum(budget: Budget, out: Path, stamp: str) -> Curve:
    from cluster.metrics import read_metrics
    overrides = ["experiment=lift_pretrain", "env=pendulum", f"seed={budget.seed}",
                 f"experiment.stop_return={budget.threshold}", f"experiment.total_env_steps={budget.max_env_steps}",
                 f"experiment.eval_every_steps={budget.eval_every}", f"experiment.eval_episodes={budget.eval_episodes}"]
    # The cap applies to the learner loop (like the peers' learn()); Ray and Ray Train start get 5 more minutes.
    run_path, wall, rc, cmd = run_experiment(overrides, out, f"pendulum-{stamp}", budget.time_cap_s + 300)
    curve = Curve("orrery (lift_pretrain experiment)",
                  "preset `pendulum`: 8 envs on the pool, batch 1024, G=4, 64-64 swish, fp32; " + f"`{cmd}`")
    try:
        df = read_metrics(run_path)
    except Exception as err:  # noqa: BLE001 - a failed run is reported, not fatal
        curve.note = f"no metrics ({err}); exit code {rc}"
        return curve
    learner = learner_seconds(df)
    ev = df["eval_return"].notna() if "eval_return" in df else df["env_steps"] < 0
    curve.evals = [(int(s), float(w), float(r)) for s, w, r in
                   zip(df.loc[ev, "env_steps"], df.loc[ev, "wall_s"], df.loc[ev, "eval_return"])]
    curve.learner_s = [float(x) for x in learner[ev.to_numpy()]]
    curve.eval_s = None  # the pool evaluates inside the learner loop; its time is in wall_s
    curve.total_env_steps, curve.total_wall_s = int(df["env_steps"].iloc[-1]), float(df["wall_s"].iloc[-1])
    curve.setup_s = wall - curve.total_wall_s  # interpreter, Ray, pool, Ray Train start, plots, shutdown
    curve.note = f"subprocess {wall:.0f} s in all (exit {rc})"
    if curve.total_wall_s > budget.time_cap_s:
        curve.note += f"; ran past the {budget.time_cap_s:.0f} s cap"
    return curve


def sb3_pendulum(budget: Budget) -> Curve:
    import gymnasium as gym
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    curve = Curve("SB3 SAC", "rl-baselines3-zoo `Pendulum-v1` (n_timesteps 20000, learning_rate 1e-3; SB3 defaults: "
                  "256-256 ReLU, batch 256, buffer 1e6, learning_starts 100, 1 update per env step, no gSDE)")
    built = time.perf_counter()
    env = gym.make("Pendulum-v1")
    model = SAC("MlpPolicy", env, learning_rate=1e-3, seed=budget.seed, device="cpu", verbose=0)
    high = env.action_space.high
    learner = [0.0]
    train = model.train

    def timed_train(*args: Any, **kwargs: Any) -> None:
        t = time.perf_counter()
        train(*args, **kwargs)
        learner[0] += time.perf_counter() - t

    model.train = timed_train  # learn() calls self.train: accumulate the pure learner time
    curve.setup_s = time.perf_counter() - built

    class Evaluate(BaseCallback):
        def _on_training_start(self) -> None:
            self.start, self.last = time.perf_counter(), 0

        def _on_step(self) -> bool:
            steps = self.num_timesteps
            elapsed = time.perf_counter() - self.start
            if steps - self.last >= budget.eval_every:
                self.last = steps
                t = time.perf_counter()
                ret = eval_policy(lambda obs: model.predict(obs, deterministic=True)[0] / high, budget)
                curve.eval_s += time.perf_counter() - t
                curve.evals.append((steps, time.perf_counter() - self.start, ret))
                curve.learner_s.append(learner[0])
                log.info("SB3 %d env steps, %.0f s: eval return %.1f (load %s)", steps, elapsed, ret, load_average())
                if ret >= budget.threshold:
                    return False
            if elapsed > budget.time_cap_s:
                curve.note = f"stopped at the {budget.time_cap_s:.0f} s cap"
                return False
            return True

    callback = Evaluate()
    model.learn(total_timesteps=budget.max_env_steps, callback=callback)
    curve.total_env_steps, curve.total_wall_s = model.num_timesteps, time.perf_counter() - callback.start
    env.close()
    return curve


def rllib_config(seed: int):
    """RLlib's tuned Pendulum-v1 SAC example (``rllib/tuned_examples/sac/pendulum_sac.py``, 1 learner)."""
    from torch import nn

    from ray.rllib.algorithms.sac import SACConfig as RLlibSACConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    return (
        RLlibSACConfig()
        .environment("Pendulum-v1")
        .training(initial_alpha=1.001, actor_lr=2e-4, critic_lr=8e-4, alpha_lr=9e-4, lr=None, target_entropy="auto",
                  n_step=(2, 5), tau=0.005, train_batch_size_per_learner=256, target_network_update_freq=1,
                  replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 100000, "alpha": 1.0,
                                        "beta": 0.0},
                  num_steps_sampled_before_learning_starts=256)
        .rl_module(model_config=DefaultModelConfig(
            fcnet_hiddens=[256, 256], fcnet_activation="relu", fcnet_kernel_initializer=nn.init.xavier_uniform_,
            head_fcnet_hiddens=[], head_fcnet_activation=None, head_fcnet_kernel_initializer="orthogonal_",
            head_fcnet_kernel_initializer_kwargs={"gain": 0.01}))
        .reporting(metrics_num_episodes_for_smoothing=5)
        .env_runners(num_env_runners=0)  # sampling in the driver (ray.md section 4: the measured setting)
        .learners(num_learners=0)
        .debugging(seed=seed)
    )


def rllib_child(budget: Budget, result_path: Path) -> None:
    """Runs inside a fresh interpreter: own Ray cluster, Algorithm logdir in a temp dir, shut down at the end."""
    import ray
    import torch
    import ray.tune.trainable.trainable as trainable

    torch.set_num_threads(1)
    storage = tempfile.mkdtemp(prefix="orrery-rllib-")
    trainable.DEFAULT_STORAGE_PATH = storage  # the Algorithm's logdir would otherwise be ~/ray_results (ray.md P6)
    curve = Curve("RLlib SAC (new API stack)",
                  "tuned example `pendulum_sac.py`: 256-256 ReLU, batch 256, n_step (2, 5), prioritized episode "
                  "replay, actor/critic/alpha lr 2e-4/8e-4/9e-4; num_env_runners=0, num_learners=0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20,
             log_to_driver=False)
    try:
        built = time.perf_counter()
        algo = rllib_config(budget.seed).build_algo()
        curve.setup_s = time.perf_counter() - built
        learner = [0.0]
        update = algo.learner_group.update

        def timed_update(*args: Any, **kwargs: Any):
            t = time.perf_counter()
            try:
                return update(*args, **kwargs)
            finally:
                learner[0] += time.perf_counter() - t

        algo.learner_group.update = timed_update
        module = algo.get_module()

        def policy(obs: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                out = module.forward_inference({"obs": torch.as_tensor(obs, dtype=torch.float32)})
            mean = out["action_dist_inputs"].chunk(2, dim=-1)[0]
            return torch.tanh(mean).numpy()  # the deterministic action of RLlib's squashed Gaussian, in [-1, 1]

        start, last, steps = time.perf_counter(), 0, 0
        while steps < budget.max_env_steps:
            result = algo.train()
            steps = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
            elapsed = time.perf_counter() - start
            if steps - last >= budget.eval_every:
                last = steps
                t = time.perf_counter()
                module = algo.get_module()
                ret = eval_policy(policy, budget)
                curve.eval_s += time.perf_counter() - t
                curve.evals.append((steps, time.perf_counter() - start, ret))
                curve.learner_s.append(learner[0])
                log.info("RLlib %d env steps, %.0f s: eval return %.1f (load %s)", steps, elapsed, ret, load_average())
                if ret >= budget.threshold:
                    break
            if elapsed > budget.time_cap_s:
                curve.note = f"stopped at the {budget.time_cap_s:.0f} s cap"
                break
        curve.total_env_steps, curve.total_wall_s = steps, time.perf_counter() - start
        algo.stop()
    finally:
        ray.shutdown()
        import shutil
        shutil.rmtree(storage, ignore_errors=True)
    result_path.write_text(json.dumps(asdict(curve)))


def rllib_pendulum(budget: Budget, out: Path, stamp: str) -> Curve:
    result_path = out / f"rllib-pendulum-{stamp}.json"
    log_path = out / f"rllib-pendulum-{stamp}.log"
    cmd = [sys.executable, "-m", "benchmarks.sac", "--child-rllib", str(result_path), "--seed", str(budget.seed),
           "--threshold", str(budget.threshold), "--max-env-steps", str(budget.max_env_steps),
           "--time-cap", str(budget.time_cap_s), "--eval-every", str(budget.eval_every),
           "--eval-episodes", str(budget.eval_episodes)]
    log.info("running RLlib in a subprocess (log %s)", log_path)
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **CHILD_ENV})
        try:
            rc = proc.wait(timeout=budget.time_cap_s + 300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            rc = proc.wait(timeout=60)
    if rc != 0 or not result_path.exists():
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
        log.warning("RLlib run failed (exit %s):\n%s", rc, tail)
        return Curve("RLlib SAC (new API stack)", "tuned example `pendulum_sac.py`", note=f"failed (exit {rc})")
    data = json.loads(result_path.read_text())
    data["evals"] = [tuple(e) for e in data["evals"]]
    return Curve(**data)


def report_pendulum(curves: list[Curve], budget: Budget) -> str:
    ours = curves[0]
    i_ours = ours.reached(budget.threshold, budget.time_cap_s)
    rows, notes = [], []
    for c in curves:
        i = c.reached(budget.threshold, budget.time_cap_s)
        if i is None:
            steps = wall = learner = None
            reached = f"not reached ({c.total_env_steps:,} env steps, {c.total_wall_s:.0f} s)"
        else:
            steps, wall, _ = c.evals[i]
            learner = c.learner_s[i] if i < len(c.learner_s) else None
            reached = f"{c.evals[i][2]:.0f}"
        best = max((e[2] for e in c.evals), default=float("nan"))
        if c is ours or i_ours is None:
            vs = "-"
        elif i is None:
            vs = f"> {c.total_wall_s / ours.evals[i_ours][1]:.1f}x time"
        else:
            vs = (f"{wall / ours.evals[i_ours][1]:.1f}x time, "
                  f"{steps / ours.evals[i_ours][0]:.2f}x env steps")
        rows.append([c.learner, reached, fmt(steps, 0) if steps is not None else "-", fmt(wall),
                     fmt(learner), fmt(best), fmt(ratio(c.total_env_steps, c.total_wall_s)), fmt(c.setup_s), vs])
        curve_text = ", ".join(f"{s}: {r:.0f}" for s, _, r in c.evals)
        notes.append(f"- {c.learner}: {c.settings}. Evaluations (env steps: return): {curve_text or '-'}. "
                     + ("Evaluation inside the learner loop (pool), not timed apart. " if c.eval_s is None else
                        f"Evaluation time {c.eval_s:.1f} s. ") + c.note)
    header = ["learner", f"return at threshold ({budget.threshold:g})", "env steps", "wall s", "learner s",
              "best eval", "env steps/s (whole run)", "setup s", "peer / orrery"]
    return markdown_table(header, rows) + "\n\n" + "\n".join(notes)
