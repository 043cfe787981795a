"""Budgets are caps: a unit of work that would cross its budget does not start, so a run ends at or below it."""
from __future__ import annotations

from typing import Any

from cluster.metrics import read_metrics
from tests.helpers import one_rank_pendulum


class CountingPool:
    """The in-process pool ``run_one_rank`` makes, counting the env steps it is asked for (rounds in flight included)."""

    def __init__(self) -> None:
        from cluster.local_pool import LocalPool
        from experiments.registry import sampler_factories
        self.pool = LocalPool(sampler_factories())
        self.env_steps = 0

    def map(self, sampler: str, requests: list[dict], **kwargs: Any) -> list:
        if sampler == "env":
            # training rounds ask for "steps"; evaluation requests ask for episodes
            self.env_steps += sum(r.get("steps", 0) for r in requests) * kwargs["config"]["num_envs"]
        return self.pool.map(sampler, requests, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)


def test_lift_pretraining_never_steps_past_its_env_step_budget(tmp_path):
    """Rounds of 32 env steps under a budget of 100: three rounds (96), not a fourth that would end at 128, and no
    round sent to the pool beyond them (the overlapped round in flight included)."""
    from experiments.lift.pretrain_learner import run_one_rank
    run = tmp_path / "run"
    config = one_rank_pendulum(run, "budget", total_env_steps=100, eval_every_steps=64)
    pool = CountingPool()
    try:
        assert run_one_rank(config, pool=pool) is True
    finally:
        pool.close()
    df = read_metrics(run)
    assert int(df["env_steps"].max()) == 96 and pool.env_steps == 96
    assert "eval_return" in df and df["eval_return"].notna().iloc[-1]  # the last round still evaluates
