"""A small SAC pretraining without the cluster, in lift_pretrain's file format, for the tests that need a pretrained
policy to finetune (tests/test_lift_finetune.py): seconds, where a lift_pretrain job takes a minute."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def pretrain_in_process(run: Path, task: str = "inverted_pendulum", env_steps: int = 5000, seed: int = 0,
                        batch_size: int = 256, updates_per_round: int = 8, num_envs: int = 8) -> Path:
    """A small SAC pretraining without the cluster, written like a lift_pretrain run: policy.pt, agent.pt (full
    SACAgent state) and data/replay-rank0 Parquet with the physics columns. For tests and quick benchmarks."""
    import torch

    from algos.lift.agent import SACAgent
    from algos.lift.replay import ReplayBuffer, transition_fields
    from algos.lift.sac import SACConfig, update
    from cluster.store import ParquetStore
    from envs.control.rollout import VectorRollout

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    cfg = SACConfig.preset("pendulum", batch_size=batch_size, min_replay_size=512, num_envs=num_envs)
    rollout = VectorRollout(task, num_envs, seed, physics_state=True)
    obs_dim, act_dim = rollout.single_observation_space.shape[0], rollout.single_action_space.shape[0]
    agent = SACAgent(obs_dim, act_dim, cfg)
    buffer = ReplayBuffer(cfg.replay_capacity, transition_fields(obs_dim, act_dim))
    gen = torch.Generator().manual_seed(seed)
    chunks, steps = [], 0

    def policy(obs: np.ndarray) -> np.ndarray:
        if len(buffer) < cfg.min_replay_size:  # uniform prefill, as a fresh SAC run would
            return rng.uniform(-1, 1, (len(obs), act_dim)).astype(np.float32)
        return agent.act(obs).numpy()

    while steps < env_steps:
        batch, _ = rollout.collect(policy, 8)
        agent.update_normalizers(batch["obs"])
        buffer.add({k: batch[k] for k in buffer.specs})
        chunks.append(batch)
        steps += len(batch["reward"])
        if len(buffer) >= cfg.min_replay_size:
            for _ in range(updates_per_round):
                update(agent, lambda n: buffer.sample(n, gen), cfg)
    rollout.close()
    run.mkdir(parents=True, exist_ok=True)
    ParquetStore(run / "data" / "replay-rank0").append({k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]})
    torch.save(agent.policy_state(), run / "policy.pt")
    torch.save(agent.state_dict(), run / "agent.pt")
    return run
