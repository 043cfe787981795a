"""Part 1: gradient updates/s of orrery's SAC update against Stable-Baselines3's ``SAC.train`` at the same sizes."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from benchmarks.sac.common import BATCH, FILL, HIDDEN, fmt, load_average, log, markdown_table, ratio, timed


SIZES = {"Pendulum (obs 3, act 1)": ("Pendulum-v1", 3, 1), "HalfCheetah (obs 17, act 6)": ("HalfCheetah-v5", 17, 6)}


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
