"""Every generation call's rollouts, as sampled: what a resumed AttnRL learner replays to rebuild its state.

The training loop (``algos.attnrl.train.train``) keeps its state in the loop itself: the off-policy pipeline's
pending batch, the attention filter's running mean, the adaptive batch size, the RNGs, token counters. A resumed
learner therefore runs the loop again from the start, answering its first generation calls from this log instead of
the pool (and skipping the updates those calls led to, see ``algos.attnrl.ppo.UpdateContext``): the loop takes the
same decisions on the same data and arrives at the checkpoint with exactly the state it had.

One Parquet part per call (part i = call i, an empty part for a call without requests), one row per rollout, in
request order. Everything is stored exactly as sampled (``algos.attnrl.lm.generate`` returns float32 log-probs and
entropies), so the replayed rollouts are identical to the live ones. Prompt and prefix are not stored:
the replayed loop issues the same requests, and each row keeps its context length to check that it does.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from algos.attnrl.lm import GenerationRequest, Rollout
from cluster.store import ParquetStore

SCHEMA = pa.schema([
    ("context_tokens", pa.int32()),  # prompt + prefix length of the request: a replay consistency check
    ("generated_ids", pa.list_(pa.int32())),
    ("logprobs", pa.list_(pa.float32())),
    ("entropies", pa.list_(pa.float32())),
    ("step_starts", pa.list_(pa.int32())),
    ("step_scores", pa.list_(pa.float64())),  # null without FCI; few per rollout, kept as the scorer returned them
    ("finished", pa.bool_()),
    ("reward", pa.float64()),  # null for requests without a problem
    ("weights_version", pa.int64()),
    ("published_version", pa.int64()),  # the version the learner had published when it issued the call
])


@dataclass
class LoggedCall:
    rows: list[dict]

    @property
    def published_version(self) -> int | None:
        return int(self.rows[0]["published_version"]) if self.rows else None


class RolloutLog:
    def __init__(self, path: str | Path) -> None:
        self.store = ParquetStore(path)

    def write(self, rollouts: list[Rollout], published_version: int) -> None:
        columns = {
            "context_tokens": [len(r.prompt_ids) + len(r.prefix_ids) for r in rollouts],
            "generated_ids": [r.generated_ids for r in rollouts],
            "logprobs": [r.logprobs for r in rollouts],
            "entropies": [r.entropies for r in rollouts],
            "step_starts": [r.step_starts for r in rollouts],
            "step_scores": [r.step_scores for r in rollouts],
            "finished": [r.finished for r in rollouts],
            "reward": [r.meta.get("reward") for r in rollouts],
            "weights_version": [int(r.meta.get("weights_version", -1)) for r in rollouts],
            "published_version": [int(published_version)] * len(rollouts),
        }
        self.store.append(pa.table(columns, schema=SCHEMA))

    def read(self) -> list[LoggedCall]:
        return [LoggedCall(pq.read_table(part, schema=SCHEMA).to_pylist()) for part in self.store.parts()]


def replayed_rollouts(call: LoggedCall, requests: list[GenerationRequest], index: int) -> list[Rollout]:
    """The logged rollouts of call ``index`` for ``requests`` (which must be the ones the call was made with)."""
    rows = call.rows
    if len(rows) != len(requests) or any(row["context_tokens"] != len(q.prompt_ids) + len(q.prefix_ids)
                                         for row, q in zip(rows, requests)):
        raise RuntimeError(f"resume: generation call {index} now asks for {len(requests)} rollouts that differ from "
                           f"the {len(rows)} it logged: the run no longer replays as it ran (changed code or config?)")
    return [Rollout(prompt_ids=tuple(q.prompt_ids), prefix_ids=tuple(q.prefix_ids),
                    generated_ids=row["generated_ids"], logprobs=row["logprobs"], entropies=row["entropies"],
                    finished=row["finished"], step_starts=row["step_starts"], step_scores=row["step_scores"],
                    tag=q.tag, meta={"reward": row["reward"], "weights_version": row["weights_version"]})
            for q, row in zip(requests, rows)]
