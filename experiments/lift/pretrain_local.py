"""LIFT stage 1 in one process (no Ray), in resumable chunks: the pretraining a study runs as ``stage`` units.

The same loop as ``pretrain_learner`` on one rank without overlap: ``steps_per_round`` vectorised steps of the
stochastic policy -> normalizer, replay -> ``steps_per_round * utd`` SAC updates, evaluation on schedule. A chunk runs
until its deadline and leaves a ``checkpoint`` dict (agent with optimisers and normalizer, counters, RNG states,
evaluation curve): what resuming needs, without the replay. The replay goes to a scratch file that survives on the same
machine; a chunk resumed without it (a new machine) refills ``min_replay_size`` transitions with the current policy
before updating again, and says so in the checkpoint (``refills``).

The world-model columns (qpos, qvel, ctrl, next state) of the newest ``wm_rows`` transitions are kept beside the
replay: stage 2 (``fit_stage2``) fits the world models on them, as LIFT fits its model on the pretraining replay.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from algos.lift.agent import SACAgent
from algos.lift.replay import ReplayBuffer, transition_fields
from algos.lift.sac import SACConfig, update
from envs.control.rollout import VectorRollout, evaluate

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
WM_COLUMNS = ("qpos", "qvel", "ctrl", "next_qpos", "next_qvel", "terminated", "truncated")


@dataclass
class PretrainSpec:
    """What to pretrain: the env preset's SAC and task (``configs/env_preset/lift_pretrain_<task>.yaml``), the step
    budget and the evaluation schedule."""

    task: str = "walker2d"
    total_env_steps: int = 100_000
    eval_every_steps: int = 10_000
    eval_episodes: int = 4
    wm_rows: int = 20_000  # newest transitions kept for stage 2
    preset_overrides: dict = field(default_factory=dict)  # e.g. {"sac": {"min_replay_size": 500}} (tests)

    def preset(self) -> dict:
        path = ROOT / "configs" / "env_preset" / f"lift_pretrain_{self.task}.yaml"
        if not path.exists():
            raise FileNotFoundError(f"no pretraining preset for {self.task}: {path}")
        raw = yaml.safe_load(path.read_text())
        for key, value in self.preset_overrides.items():
            raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
        return raw

    def sac_config(self) -> SACConfig:
        from experiments.lift.pretrain_config import Config
        raw = self.preset()
        cfg = Config(sac_preset=raw.get("sac_preset", "humanoid"), sac=raw.get("sac", {}))
        sac = cfg.sac_config()
        sac.bf16 = False  # fp32 on every CPU: the start model must not depend on the machine's float path
        return sac

    def change(self) -> dict | None:
        return self.preset().get("change")

    def steps_per_round(self) -> int:
        return int(self.preset().get("steps_per_round", 4))


class LocalPretrain:
    """The agent, replay and envs of a chunked in-process pretraining."""

    def __init__(self, spec: PretrainSpec, seed: int, checkpoint: dict | None, replay_file: Path) -> None:
        self.spec, self.seed, self.replay_file = spec, seed, replay_file
        self.sac = sac = spec.sac_config()
        self.change = spec.change()
        probe = VectorRollout(spec.task, 1, seed, self.change)
        obs_dim, act_dim = probe.single_observation_space.shape[0], probe.single_action_space.shape[0]
        probe.close()
        torch.manual_seed(seed)
        self.agent = SACAgent(obs_dim, act_dim, sac)
        self.buffer = ReplayBuffer(sac.replay_capacity, transition_fields(obs_dim, act_dim))
        self.wm_data: dict[str, np.ndarray] = {}
        self.gen = torch.Generator().manual_seed(seed * 7)
        self.state: dict[str, Any] = {"env_steps": 0, "rounds": 0, "chunks": 0, "refills": 0, "refill_until": 0,
                                      "eval_steps": [], "eval_returns": [], "train_returns": [], "falls": 0}
        if checkpoint is not None:
            self.agent.load_state_dict(checkpoint["agent"])
            self.gen.set_state(checkpoint["gen"])
            torch.set_rng_state(checkpoint["torch_rng"])
            self.state = checkpoint["state"]
            self._load_replay()
        self.state["chunks"] += 1
        # a fresh env batch per chunk (env states are not checkpointed), seeded by the chunk
        self.rollout = VectorRollout(spec.task, sac.num_envs, seed * 1000 + self.state["chunks"], self.change,
                                     physics_state=True)

    @property
    def done(self) -> bool:
        return self.state["env_steps"] >= self.spec.total_env_steps

    def _load_replay(self) -> None:
        saved = (torch.load(self.replay_file, weights_only=False, map_location="cpu") if self.replay_file.exists()
                 else None)
        if saved is not None and saved.get("env_steps") == self.state["env_steps"]:
            self.buffer.load_state_dict(saved["buffer"])
            self.wm_data = saved["wm_data"]
            return
        # a new machine (or a replay from another step): refill before updating again
        self.state["refills"] += 1
        self.state["refill_until"] = self.state["env_steps"] + self.sac.min_replay_size
        log.warning("pretraining resumed at %d env steps without its replay: refilling %d transitions",
                    self.state["env_steps"], self.sac.min_replay_size)

    def checkpoint(self) -> dict:
        """What resuming needs (not the replay, which goes to ``replay_file``)."""
        self.replay_file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.replay_file.with_suffix(".tmp")
        torch.save({"env_steps": self.state["env_steps"], "buffer": self.buffer.state_dict(),
                    "wm_data": self.wm_data}, partial)
        partial.replace(self.replay_file)
        return {"agent": self.agent.state_dict(), "gen": self.gen.get_state(), "torch_rng": torch.get_rng_state(),
                "state": self.state}

    def _remember(self, batch: dict[str, np.ndarray]) -> None:
        self.agent.update_normalizers(batch["obs"])
        self.buffer.add({k: batch[k] for k in self.buffer.specs})
        new = {k: np.asarray(batch[k], dtype=np.float32 if k in ("ctrl", "terminated", "truncated") else np.float64)
               for k in WM_COLUMNS}
        keep = self.spec.wm_rows
        self.wm_data = {k: np.concatenate([self.wm_data[k], v])[-keep:] if self.wm_data else v[-keep:]
                        for k, v in new.items()}

    def evaluate(self) -> float:
        stats = evaluate(self.spec.task, lambda obs: self.agent.act(obs, True).numpy(), self.spec.eval_episodes,
                         self.seed + 12345, self.change)
        value = float(np.mean(stats.returns))
        self.state["eval_steps"].append(self.state["env_steps"])
        self.state["eval_returns"].append(value)
        return value

    def run(self, seconds_left: Callable[[], float], progress: Callable[..., None] | None = None,
            max_steps: int | None = None) -> bool:
        """Rounds until the step budget, until ``seconds_left()`` drops under a margin or (tests) after ``max_steps``
        env steps of this chunk; True when the budget is done."""
        sac, st = self.sac, self.state
        steps_per_round = self.spec.steps_per_round()
        last_eval = st["eval_steps"][-1] if st["eval_steps"] else -self.spec.eval_every_steps
        round_s, chunk_end = 0.0, st["env_steps"] + (max_steps or self.spec.total_env_steps)
        while not self.done and st["env_steps"] < chunk_end and seconds_left() > max(30.0, 5 * round_s):
            t0 = time.perf_counter()
            batch, stats = self.rollout.collect(lambda obs: self.agent.act(obs, False, self.gen).numpy(),
                                                steps_per_round)
            self._remember(batch)
            st["env_steps"] += len(batch["reward"])
            st["rounds"] += 1
            st["falls"] += stats.terminations
            if stats.returns:
                st["train_returns"].append([st["env_steps"], float(np.mean(stats.returns))])
            ready = len(self.buffer) >= sac.min_replay_size and st["env_steps"] >= st["refill_until"]
            if ready:
                for _ in range(steps_per_round):
                    update(self.agent, lambda n: self.buffer.sample(n, self.gen), sac)
            if st["env_steps"] - last_eval >= self.spec.eval_every_steps or self.done:
                last_eval = st["env_steps"]
                value = self.evaluate()
                if progress is not None:
                    progress(st["env_steps"], self.spec.total_env_steps, eval_return=value,
                             updates=self.agent.num_updates)
            round_s = 0.9 * round_s + 0.1 * (time.perf_counter() - t0) if round_s else time.perf_counter() - t0
        self.rollout.close()
        return self.done


def fit_stage2(kind: str, task: str, exp: Any, data: dict[str, np.ndarray]) -> tuple[Any, dict[str, Any]]:
    """Stage 2: the world model of ``kind`` fitted on pretraining transitions (world-model columns, ctrl as action)
    with early stopping and ``exp.wm_pretrain_seed``; returns (model, metrics without lists)."""
    from algos.lift.world_model_training import train_world_model
    from experiments.lift.world_models import early_stopping, make_world_model
    model = make_world_model(kind, task, exp, exp.wm_pretrain_seed)
    columns = {"qpos": data["qpos"], "qvel": data["qvel"], "action": data["ctrl"].astype(np.float64),
               "next_qpos": data["next_qpos"], "next_qvel": data["next_qvel"], "terminated": data["terminated"],
               "truncated": data["truncated"]}
    metrics = train_world_model(model, columns, early_stopping=early_stopping(exp))
    return model, {k: v for k, v in metrics.items() if not isinstance(v, list)}
