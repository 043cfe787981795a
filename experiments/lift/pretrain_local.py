"""LIFT stage 1 for a study's ``stage`` unit, in resumable chunks, by the one pretraining loop: the learner a cluster
job runs (``pretrain_learner.run_rounds`` on one rank, its env samplers in this process).

``LocalPretrain`` is the chunked interface the Walker2d studies' stages call (``benchmarks/study/lift_stages.py``):
``run`` drives the learner until its budget, a deadline or (tests) a step count, and pauses it with a checkpoint in
the learner's run directory beside ``replay_file`` (with the replay ring: a later chunk on this machine resumes
exactly). ``checkpoint`` is the small part a study commits (agent with optimisers and normaliser, counters and
evaluation curve): a chunk resumed from it on another machine starts the learner from that agent with an empty
replay, which the learner refills with the current policy before updating again (``refills`` counts them).
When the budget is done, ``replay_file`` gets the world-model columns of the newest ``wm_rows`` transitions of the
learner's Parquet replay, which stage 2 (``fit_stage2``) fits on, as LIFT fits its model on the pretraining replay.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from algos.lift.agent import SACAgent
from algos.lift.replay import ReplayBuffer, transition_fields
from algos.lift.sac_config import SACConfig

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
WM_COLUMNS = ("qpos", "qvel", "ctrl", "next_qpos", "next_qvel", "terminated", "truncated")
STOP_MARGIN_S = 30.0  # a pause (the checkpoint with its replay ring) must fit in what is left


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
        sac = Config(**self.experiment(1)).sac_config()
        return sac

    def change(self) -> dict | None:
        return self.preset().get("change")

    def steps_per_round(self) -> int:
        return int(self.preset().get("steps_per_round", 4))

    def experiment(self, total_env_steps: int | None = None) -> dict[str, Any]:
        """The learner's ``experiment.*`` (``pretrain_config.Config``): the preset's SAC in fp32 (the start model must
        not depend on the machine's float path) and this spec's budget and evaluation schedule."""
        raw = self.preset()
        return {"sac_preset": raw.get("sac_preset", "humanoid"), "sac": {**raw.get("sac", {}), "bf16": False},
                "total_env_steps": total_env_steps or self.total_env_steps, "steps_per_round": self.steps_per_round(),
                "eval_every_steps": self.eval_every_steps, "eval_episodes": self.eval_episodes,
                "checkpoint_every_updates": int(raw.get("checkpoint_every_updates", 20_000)),
                "physics_state": True, "change": self.change()}


def _fresh_state() -> dict[str, Any]:
    return {"env_steps": 0, "chunks": 0, "refills": 0, "eval_steps": [], "eval_returns": [], "train_returns": [],
            "falls": 0}


class LocalPretrain:
    """One chunk of the learner's pretraining in this process (see the module docstring)."""

    def __init__(self, spec: PretrainSpec, seed: int, checkpoint: dict | None, replay_file: Path) -> None:
        self.spec, self.seed, self.replay_file = spec, seed, replay_file
        self.sac = spec.sac_config()
        self.run_path = replay_file.parent / "learner"
        self.state = {**_fresh_state(), **(checkpoint or {}).get("state", {})}
        self.state["chunks"] += 1
        self.agent: SACAgent | None = None
        local = self._local_steps()
        if checkpoint is not None and (local is None or local < self.state["env_steps"]):
            self._seed_learner(checkpoint["agent"])  # another machine: the agent alone, the replay refilled

    def _latest(self) -> Path:
        return self.run_path / "checkpoints" / "latest" / "rank0.pt"

    def _local_steps(self) -> int | None:
        latest = self._latest()
        if not latest.exists():
            return None
        return int(torch.load(latest, weights_only=True, map_location="cpu")["counters"]["env_steps"])

    def _seed_learner(self, agent_state: dict) -> None:
        """A learner checkpoint of ``agent_state`` and this run's counters with an empty replay ring."""
        arch = agent_state["arch"]
        ring = ReplayBuffer(self.sac.replay_capacity, transition_fields(arch["obs_dim"], arch["act_dim"]))
        gen = torch.Generator().manual_seed(self.seed * 7 + self.state["chunks"])
        counters = {"env_steps": self.state["env_steps"], "rounds": 0, "wall_s": 0.0, "resumed_from": -1}
        import shutil
        shutil.rmtree(self.run_path, ignore_errors=True)  # its replay and metrics belong to another history
        self._latest().parent.mkdir(parents=True, exist_ok=True)
        torch.save({"agent": agent_state, "buffer": ring.state_dict(), "counters": counters,
                    "sample_gen": gen.get_state(), "journal": {}}, self._latest())
        self.state["refills"] += 1
        log.warning("pretraining resumed at %d env steps without its replay: the learner refills %d transitions",
                    self.state["env_steps"], self.sac.min_replay_size)

    def config(self) -> dict[str, Any]:
        return {"experiment": self.spec.experiment(), "pool": {}, "run_path": str(self.run_path),
                "run_id": f"pretrain-{self.spec.task}-s{self.seed}", "task": self.spec.task, "seed": self.seed,
                "torch_threads": 1, "change": self.spec.change()}

    def run(self, seconds_left: Callable[[], float], progress: Callable[..., None] | None = None,
            max_steps: int | None = None) -> bool:
        """The learner's rounds until the step budget, until ``seconds_left()`` drops under a margin or (tests) after
        ``max_steps`` env steps of this chunk; True when the budget is done."""
        from cluster import ddp
        from cluster.local_pool import LocalPool
        from experiments.lift.pretrain_learner import PretrainLearner, SubmittingPool, run_rounds
        from experiments.registry import sampler_factories
        pool = LocalPool(sampler_factories())
        try:
            with ddp.local_session(self.run_path / "checkpoints"):
                learner = PretrainLearner(self.config(), pool=SubmittingPool(pool))
                chunk_end = learner.counters["env_steps"] + (max_steps or self.spec.total_env_steps)

                def should_stop() -> bool:
                    return seconds_left() < STOP_MARGIN_S or learner.counters["env_steps"] >= chunk_end
                done = run_rounds(learner, should_stop)
        finally:
            pool.close()
        self.agent = learner.agent
        self._follow_metrics(learner.counters["env_steps"])
        if progress is not None:
            last = self.state["eval_returns"][-1] if self.state["eval_returns"] else float("nan")
            progress(self.state["env_steps"], self.spec.total_env_steps, eval_return=last,
                     updates=self.agent.num_updates)
        if done:
            self._save_wm_rows()
        return done

    def _follow_metrics(self, env_steps: int) -> None:
        """Counters and curves from the learner's metric rows (a history from another machine is kept before them)."""
        from cluster.metrics import read_metrics
        df = read_metrics(self.run_path)
        first = int(df["env_steps"].min()) if len(df) else env_steps
        st = self.state
        keep = [i for i, s in enumerate(st["eval_steps"]) if s < first]
        st["eval_steps"] = [st["eval_steps"][i] for i in keep]
        st["eval_returns"] = [st["eval_returns"][i] for i in keep]
        st["train_returns"] = [r for r in st["train_returns"] if r[0] < first]
        if "eval_return" in df:
            ev = df.dropna(subset=["eval_return"])
            st["eval_steps"] += [int(v) for v in ev["env_steps"]]
            st["eval_returns"] += [float(v) for v in ev["eval_return"]]
        if "train_return" in df:
            tr = df.dropna(subset=["train_return"])
            st["train_returns"] += [[int(s), float(v)] for s, v in zip(tr["env_steps"], tr["train_return"])]
        st["falls"] = int(df["falls"].fillna(0).sum()) if "falls" in df else st["falls"]
        st["env_steps"] = env_steps

    def _save_wm_rows(self) -> None:
        from cluster.store import ParquetStore
        data = ParquetStore(self.run_path / "data" / "replay-rank0").to_numpy(list(WM_COLUMNS))
        keep = self.spec.wm_rows
        wm = {k: np.asarray(data[k][-keep:], dtype=np.float32 if k in ("ctrl", "terminated", "truncated")
                            else np.float64) for k in WM_COLUMNS}
        self.replay_file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.replay_file.with_suffix(".tmp")
        torch.save({"env_steps": self.state["env_steps"], "wm_data": wm}, partial)
        partial.replace(self.replay_file)

    def checkpoint(self) -> dict:
        """What resuming on another machine needs: the agent (weights, optimisers, normaliser) and the counters."""
        if self.agent is None:
            raise RuntimeError("checkpoint() before run(): nothing has been pretrained in this chunk")
        return {"agent": self.agent.state_dict(), "state": self.state}


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
