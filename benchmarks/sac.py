"""orrery's LIFT SAC against Stable-Baselines3 and RLlib: update speed, Pendulum wall time, Humanoid throughput.

Three parts, all run in one invocation on the same machine (``--only`` picks one):

    updates   gradient updates/s at batch 1024 with 256-256 MLPs, Pendulum-sized (obs 3, act 1) and
              HalfCheetah-sized (obs 17, act 6): ``algos.lift.sac.update`` (fp32 and bf16 autocast) against SB3's
              ``SAC.train`` on the same sizes, in this process, 1 torch thread, repeats interleaved so background
              load hits every row alike. Both sample their own replay buffer (50k random transitions) inside the
              timed call. Besides wall-clock rates, updates per CPU-second of this process: on a shared machine
              the wall clock mostly measures how much of a core the scheduler gave us.
    pendulum  wall time and env steps until the deterministic evaluation return (``--eval-episodes`` episodes
              every ``--eval-every`` env steps, ``envs.control.rollout.evaluate`` with seed 10000 + seed for everyone)
              reaches ``--threshold`` on Pendulum-v1, capped at ``--max-env-steps`` and ``--time-cap`` each:
              * orrery: the real cluster experiment (``python -m experiments.run experiment=lift_pretrain
                env=pendulum experiment.stop_return=...``) in a subprocess, read back from its metrics Parquet;
                its wall time is the learner loop's ``wall_s`` (from the start of ``train_fn``: pool acting,
                normalizer, replay, updates, evaluation), and the subprocess total (Ray start, Ray Train start)
                is given too; "learner" sums the update time (updates / ``updates_per_s`` per round);
              * SB3 SAC with rl-baselines3-zoo's Pendulum-v1 entry (``hyperparams/sac.yml``: n_timesteps 20000,
                learning_rate 1e-3, every other setting SB3's default: net_arch 256-256, batch 256, buffer 1e6,
                learning_starts 100, train_freq 1, gradient_steps 1, no gSDE), in this process;
              * RLlib SAC (new API stack) with ``rllib/tuned_examples/sac/pendulum_sac.py``'s settings (that file
                is not in the installed wheel; settings copied below from ray-project/ray master), with
                ``num_env_runners=0``, ``num_learners=0``, ``OMP_NUM_THREADS=1`` (ray.md P4), in a subprocess
                with its own embedded Ray cluster, shut down at the end, and its Algorithm logdir in a temp dir.
              For SB3 and RLlib the wall time runs from the start of learning (model/Algorithm built) and
              includes their evaluations, as the experiment's does.
    humanoid  env steps/s and updates/s of the lift_pretrain experiment on Humanoid-v5 with its 2 pool workers
              busy (``experiment.num_shards=2``), a short fixed budget, from its metrics Parquet; beside it the
              same collection without a learner or Ray (``VectorRollout.collect``, random policy, one process).

Usage (repo root):

    OMP_NUM_THREADS=1 python -m benchmarks.sac [--quick] [--only updates|pendulum|humanoid] [--out benchmarks/out]
        [--record benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SECTION = "## SAC learner vs Stable-Baselines3 and RLlib (`benchmarks/sac.py`)"
RESULTS_HEADER = "# Benchmarks\n\nBenchmarks — each section gives the command, the machine, the table.\n"
PARTS = ("updates", "pendulum", "humanoid")
SUBSECTIONS = {"updates": "### Gradient updates/s", "pendulum": "### Pendulum-v1: time to the return threshold",
               "humanoid": "### Humanoid-v5: env steps/s while training"}
# Child processes: no token file in ~/.ray (ray.md P1), no usage stats (P8), one thread per process (P4).
CHILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled",
             "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
log = logging.getLogger("benchmarks.sac")


# ------------------------------------------------------------------------------------------------ helpers

def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def machine_note() -> str:
    import gymnasium
    import mujoco
    import torch
    cpu = "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} cores; python {platform.python_version()}, torch {torch.__version__}, "
            f"gymnasium {gymnasium.__version__}, mujoco {mujoco.__version__}")


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) spent in ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def fmt(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:,.{digits}f}"


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or not den or not all(map(math.isfinite, (num, den))):
        return None
    return num / den


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ part 1: updates/s

SIZES = {"Pendulum (obs 3, act 1)": ("Pendulum-v1", 3, 1), "HalfCheetah (obs 17, act 6)": ("HalfCheetah-v5", 17, 6)}
BATCH, HIDDEN, FILL = 1024, (256, 256), 50_000


def orrery_updater(obs_dim: int, act_dim: int, utd: int, bf16: bool, seed: int) -> Callable[[], Any]:
    """One call = ``utd`` SAC updates of ``algos.lift.sac.update`` on a replay ring of random transitions.

    ReLU hidden layers, as SB3's default MlpPolicy (orrery's presets use swish), so both do the same arithmetic.
    """
    import torch

    from algos.lift.agent import SACAgent
    from algos.lift.replay import ReplayBuffer, transition_fields
    from algos.lift.sac import SACConfig, update
    torch.manual_seed(seed)
    cfg = SACConfig(batch_size=BATCH, utd=utd, actor_hidden=HIDDEN, critic_hidden=HIDDEN, activation="relu",
                    bf16=bf16, replay_capacity=100_000, min_replay_size=1)
    agent = SACAgent(obs_dim, act_dim, cfg)
    buffer = ReplayBuffer(cfg.replay_capacity, transition_fields(obs_dim, act_dim))
    buffer.add({"obs": torch.randn(FILL, obs_dim), "action": torch.rand(FILL, act_dim) * 2 - 1,
                "reward": torch.randn(FILL), "next_obs": torch.randn(FILL, obs_dim),
                "terminated": (torch.rand(FILL) < 0.01).float(), "truncated": torch.zeros(FILL)})
    agent.update_normalizers(buffer.storage["obs"][:FILL])
    generator = torch.Generator().manual_seed(seed)
    return lambda: update(agent, lambda n: buffer.sample(n, generator), cfg)


def sb3_updater(env_id: str, utd: int, seed: int) -> Callable[[], Any]:
    """One call = ``model.train(gradient_steps=utd, batch_size=1024)`` of SB3 SAC on a buffer of random transitions."""
    import gymnasium as gym
    from stable_baselines3 import SAC
    from stable_baselines3.common.logger import configure

    env = gym.make(env_id)
    model = SAC("MlpPolicy", env, batch_size=BATCH, policy_kwargs=dict(net_arch=list(HIDDEN)), learning_starts=0,
                buffer_size=100_000, device="cpu", seed=seed)
    model.set_logger(configure(None, []))  # train() records its losses; learn() would set this up
    rb, rng = model.replay_buffer, np.random.default_rng(seed)
    low, high = env.action_space.low, env.action_space.high
    rb.observations[:FILL] = rng.standard_normal(rb.observations[:FILL].shape)
    rb.next_observations[:FILL] = rng.standard_normal(rb.next_observations[:FILL].shape)
    rb.actions[:FILL] = rng.uniform(low, high, rb.actions[:FILL].shape)
    rb.rewards[:FILL] = rng.standard_normal(rb.rewards[:FILL].shape)
    rb.dones[:FILL] = rng.random(rb.dones[:FILL].shape) < 0.01
    rb.pos = FILL
    env.close()
    return lambda: model.train(gradient_steps=utd, batch_size=BATCH)


@dataclass
class UpdateRow:
    size: str
    impl: str
    utd: int
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)

    @property
    def per_s(self) -> float:
        return self.utd / statistics.median(self.wall_s)

    @property
    def per_cpu_s(self) -> float:
        return self.utd / statistics.median(self.cpu_s)


def bench_updates(utd: int, repeats: int, seed: int) -> list[UpdateRow]:
    import torch
    torch.set_num_threads(1)
    rows: list[UpdateRow] = []
    for size, (env_id, obs_dim, act_dim) in SIZES.items():
        runners = {
            "orrery fp32": orrery_updater(obs_dim, act_dim, utd, bf16=False, seed=seed),
            "orrery bf16": orrery_updater(obs_dim, act_dim, utd, bf16=True, seed=seed),
            "SB3": sb3_updater(env_id, utd, seed),
        }
        if torch.get_num_threads() != 1:
            raise RuntimeError(f"torch uses {torch.get_num_threads()} threads; the comparison needs 1")
        size_rows = {name: UpdateRow(size, name, utd) for name in runners}
        for fn in runners.values():  # warm-up: allocator, oneDNN kernels, optimiser state
            fn()
        for r in range(repeats):
            for name, fn in runners.items():
                wall, cpu = timed(fn)
                size_rows[name].wall_s.append(wall)
                size_rows[name].cpu_s.append(cpu)
            log.info("updates %s repeat %d/%d: %s (load %s)", size, r + 1, repeats,
                     ", ".join(f"{n} {utd / row.wall_s[-1]:.1f}/s" for n, row in size_rows.items()), load_average())
        rows += size_rows.values()
    return rows


def report_updates(rows: list[UpdateRow], target: float = 2.0) -> str:
    """Markdown table and verdicts of the updates part."""
    sb3 = {r.size: r for r in rows if r.impl == "SB3"}
    table, notes = [], []
    for r in rows:
        peer = sb3[r.size]
        table.append([r.size, r.impl, fmt(r.per_s), fmt(r.per_cpu_s),
                      fmt(ratio(r.per_s, peer.per_s), 2) + "x", fmt(ratio(r.per_cpu_s, peer.per_cpu_s), 2) + "x",
                      ", ".join(f"{r.utd / w:.1f}" for w in r.wall_s)])
    for size, peer in sb3.items():
        best = max((r for r in rows if r.size == size and r.impl != "SB3"), key=lambda r: r.per_cpu_s)
        verdict = "meets" if (ratio(best.per_cpu_s, peer.per_cpu_s) or 0) >= target else "misses"
        notes.append(f"- {size}: best orrery ({best.impl}) = **{ratio(best.per_s, peer.per_s):.2f}x SB3 wall-clock, "
                     f"{ratio(best.per_cpu_s, peer.per_cpu_s):.2f}x per CPU-second** ({verdict} the >= {target:g}x "
                     "target)")
    header = ["size", "learner", "updates/s", "updates per CPU-s", "vs SB3 (wall)", "vs SB3 (CPU-s)",
              "runs (updates/s)"]
    return markdown_table(header, table) + "\n\n" + "\n".join(notes)


# ----------------------------------------------------------------------------------- part 2: Pendulum

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


# ------------------------------------------------------------------------------------------ part 3: Humanoid

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


# ------------------------------------------------------------------------------------------------- record

def record(path: Path, parts: dict[str, str], preamble: str) -> None:
    """Write this benchmark's section into RESULTS.md: replace the subsections measured now, keep the others and
    every other section (re-reads the file just before writing; other benchmarks write their own sections)."""
    text = path.read_text() if path.exists() else RESULTS_HEADER
    start = text.find(SECTION)
    old: dict[str, str] = {}
    if start >= 0:
        end = text.find("\n## ", start + len(SECTION))
        body = text[start:end + 1 if end >= 0 else len(text)]
        for part, title in SUBSECTIONS.items():
            i = body.find(title)
            if i >= 0:
                j = body.find("\n### ", i + len(title))
                old[part] = body[i:j + 1 if j >= 0 else len(body)].rstrip("\n")
    merged = {**old, **{p: f"{SUBSECTIONS[p]}\n\n{md}" for p, md in parts.items()}}
    section = SECTION + "\n\n" + preamble + "\n\n" + "\n\n".join(merged[p] for p in PARTS if p in merged) + "\n"
    text = path.read_text() if path.exists() else RESULTS_HEADER  # re-read right before the write
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[end:] if end >= 0 else "")
    path.write_text(text.rstrip("\n") + "\n")


# --------------------------------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small budgets: a smoke check of every part")
    p.add_argument("--only", choices=PARTS, action="append", help="run only this part (repeatable)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out", help="run dirs, logs, JSON results")
    p.add_argument("--record", type=Path, default=None, help="write the section into this markdown file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--utd", type=int, default=None, help="updates per timed call (default 16, quick 4)")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per learner (default 5, quick 2)")
    p.add_argument("--threshold", type=float, default=-200.0, help="Pendulum eval return to reach")
    p.add_argument("--max-env-steps", type=int, default=None, help="Pendulum cap per learner (default 20000)")
    p.add_argument("--time-cap", type=float, default=None, help="Pendulum wall cap per learner, s (default 360)")
    p.add_argument("--eval-every", type=int, default=1000)
    p.add_argument("--eval-episodes", type=int, default=8)
    p.add_argument("--humanoid-steps", type=int, default=None, help="Humanoid env steps (default 6400, quick 2560)")
    p.add_argument("--child-rllib", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    import torch
    torch.set_num_threads(1)
    quick = args.quick
    budget = Budget(args.threshold, args.max_env_steps or (6000 if quick else 20_000),
                    args.time_cap or (120.0 if quick else 360.0), args.eval_every, args.eval_episodes, args.seed)
    if args.child_rllib is not None:
        rllib_child(budget, args.child_rllib)
        return
    parts = args.only or list(PARTS)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    command = "OMP_NUM_THREADS=1 python -m benchmarks.sac " + shlex.join(sys.argv[1:] if argv is None else argv)
    load_before = load_average()
    print(f"load average before: {load_before} (1/5/15 min); os.getloadavg() = {os.getloadavg()}", flush=True)
    print(f"machine: {machine_note()}", flush=True)
    started = time.perf_counter()
    results: dict[str, str] = {}

    def header(part_started: str) -> str:
        return (f"Run {time.strftime('%Y-%m-%d %H:%M')}: `{command}`; load average (1/5/15 min) before, after: "
                f"{part_started}, {load_average()}; `bf16: auto` chose {auto_precision()}.")

    if "updates" in parts:
        load = load_average()
        rows = bench_updates(args.utd or (4 if quick else 16), args.repeats or (2 if quick else 5), args.seed)
        md = report_updates(rows)
        results["updates"] = (header(load) + f" Batch {BATCH}, actor and twin critic 256-256 ReLU, replay of "
                              f"{FILL:,} random transitions sampled inside the timed call, {rows[0].utd} updates per "
                              f"call, median of {len(rows[0].wall_s)} interleaved calls, 1 torch thread, one "
                              "process. orrery: `algos.lift.sac.update` (fused AdamW, twin critic as two plain "
                              "MLPs, observation normalizer); SB3: `SAC.train` (Adam).\n\n" + md)
        print("\n" + md + "\n", flush=True)
    if "pendulum" in parts:
        load = load_average()
        curves = [orrery_pendulum(budget, out, stamp), sb3_pendulum(budget), rllib_pendulum(budget, out, stamp)]
        (out / f"pendulum-{stamp}.json").write_text(json.dumps([asdict(c) for c in curves], indent=1))
        md = report_pendulum(curves, budget)
        results["pendulum"] = (header(load) + f" Deterministic evaluation, {budget.eval_episodes} episodes every "
                               f"{budget.eval_every} env steps (`envs.control.rollout.evaluate`, seed {10_000 + budget.seed}) "
                               f"for all three; caps {budget.max_env_steps:,} env steps and {budget.time_cap_s:.0f} s "
                               f"each; seed {budget.seed}, one run each (one seed: a noisy figure). 'wall s' runs "
                               "from the start of learning to the evaluation that reached the threshold and "
                               "includes evaluation; 'learner s' is update time only; 'setup s' is what came before "
                               "learning (orrery: interpreter, Ray, pool and Ray Train start, plus plots and "
                               "shutdown after).\n\n" + md)
        print("\n" + md + "\n", flush=True)
    if "humanoid" in parts:
        load = load_average()
        steps = args.humanoid_steps or (2560 if quick else 6400)
        md = humanoid(steps, out, stamp, args.seed, 300.0 if quick else 600.0)
        results["humanoid"] = header(load) + "\n\n" + md
        print("\n" + md + "\n", flush=True)
    elapsed = time.perf_counter() - started
    load_after = load_average()
    print(f"load average after: {load_after}; os.getloadavg() = {os.getloadavg()}; benchmark took {elapsed:.0f} s",
          flush=True)
    if args.record:
        # the 1-minute averages: the 5- and 15-minute ones still carry whatever ran before the benchmark started
        busy = max(float(load.split("/")[0]) for load in (load_before, load_after)) > 2
        preamble = (f"Machine: {machine_note()}." +
                    (" A shared, loaded machine (load average above 2 on these cores: other jobs ran alongside): "
                     "wall-clock figures are noisy; ratios measured in the same run, and per-CPU-second rates, are "
                     "what compare." if busy else "") +
                    f" Last run: {elapsed / 60:.1f} min for {', '.join(parts)}.")
        record(args.record, results, preamble)
        print(f"recorded in {args.record}", flush=True)


if __name__ == "__main__":
    main()
