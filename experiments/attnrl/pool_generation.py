"""Generation for the AttnRL learner on the shared pool: ``algos.attnrl.train.train``'s ``generate_fn`` sends each
generation call to the pool's "lm" samplers (split over the workers) with the weights published by version, records
which batch every call carried and logs its rollouts (which a resumed learner replays)."""
from __future__ import annotations

import functools
import math
from collections import deque
from typing import Any, Sequence

import torch

from algos.attnrl.sft import accuracy_by_difficulty
from experiments.attnrl.rollout_log import LoggedCall, RolloutLog, replayed_rollouts


class RecordingTask:
    """The task as ``algos.attnrl.train.train`` sees it, remembering every sampled problem by its encoded prompt, so a
    generation request (token ids only) can carry its problem to the worker that scores it."""

    def __init__(self, task, encode) -> None:
        self.task, self.encode = task, encode
        self.cfg = task.cfg
        self.by_prompt: dict[tuple[int, ...], Any] = {}

    def sample(self, rng, n, difficulty=None):
        problems = self.task.sample(rng, n, difficulty)
        for p in problems:
            self.by_prompt[tuple(self.encode(p.prompt))] = p
        return problems

    def __getattr__(self, name):  # reward, max_response_chars, influence, tokenizer
        return getattr(self.task, name)


class PoolGenerator:
    """``generate_fn`` for :func:`algos.attnrl.train.train` that samples on the shared pool.

    Before a call, the learner's current weights are published if an update happened since the last publication
    (one pool version per policy update); the call's requests are split into ``num_chunks`` pool requests. Every
    call is recorded (``calls``) with the number of updates before it, the weights version the workers used and
    which batch's initial samples it carried; :meth:`on_update` adds which batch's continuations it carried.

    With a ``log`` every call's rollouts are written to it; calls in ``replay`` (a resumed learner's log) are
    answered from there, in order, before any call goes to the pool.
    """

    def __init__(self, pool, key: str, policy, weights_fn, task: RecordingTask, num_chunks: int,
                 sampler_config: dict | None = None, log: RolloutLog | None = None,
                 replay: Sequence[LoggedCall] = ()) -> None:
        self.pool, self.key, self.policy, self.weights_fn = pool, key, policy, weights_fn
        self.task, self.num_chunks = task, num_chunks
        self.sampler_config = sampler_config or {}
        self.log = log
        self.replay: deque[LoggedCall] = deque(replay)
        self.updates = 0  # policy updates applied so far (advanced by the learner's log_fn, see on_update)
        self.published_updates = -1
        self.version = 0  # pool version holding the weights after ``published_updates`` updates
        self.version_of_updates: dict[int, int] = {}
        self.calls: list[dict] = []
        self.pending_batches: deque[int] = deque()  # tree batches whose continuations are still to be trained
        self.next_batch = 0
        self.batch_stats: dict[int, dict] = {}
        self.generated_tokens = 0

    def publish(self) -> int:
        if self.published_updates != self.updates:
            self.version = self.pool.publish(self.key, self.weights_fn(self.policy))
            self.published_updates = self.updates
            self.version_of_updates[self.updates] = self.version
        return self.version

    def run(self, items: list[dict], max_new_tokens: int, temperature: float, fci: dict | None,
            generator=None) -> list:
        if not items:  # e.g. every prompt of a batch filtered out by adaptive sampling: nothing to sample
            return []
        version = self.publish()
        chunks = _split(items, self.num_chunks)
        seeds = _chunk_seeds(len(chunks), generator)
        results = self.pool.map("lm", [{"items": c, "max_new_tokens": max_new_tokens, "temperature": temperature,
                                        "fci": fci, "seed": s} for c, s in zip(chunks, seeds)],
                                config=self.sampler_config, weights=self.key)
        used = {r["weights_version"] for r in results}
        if used != {version}:
            raise RuntimeError(f"pool sampled with weights versions {used}, expected {version}")
        return [r for res in results for r in res["rollouts"]]

    def __call__(self, policy, requests, max_new_tokens, temperature=1.0, generator=None, step_score_fn=None):
        if self.replay:
            _chunk_seeds(len(_split(list(requests), self.num_chunks)), generator)  # as the live call drew them
            call = self.replay.popleft()
            rollouts = replayed_rollouts(call, list(requests), len(self.calls))
            if call.published_version is not None:
                self.version = call.published_version
            self._record_call(rollouts)
            return rollouts
        fci = None
        if step_score_fn is not None:
            if not isinstance(step_score_fn, functools.partial):
                raise TypeError("pool generation needs step_score_fn = functools.partial(fci_scores, ...)")
            fci = {k: step_score_fn.keywords[k] for k in ("delta", "zero_first_step") if k in step_score_fn.keywords}
        items = [{"prompt_ids": list(r.prompt_ids), "prefix_ids": list(r.prefix_ids),
                  "max_new_tokens": r.max_new_tokens, "tag": r.tag,
                  "problem": self.task.by_prompt.get(tuple(r.prompt_ids))} for r in requests]
        rollouts = self.run(items, max_new_tokens, temperature, fci, generator)
        if self.log is not None:
            self.log.write(rollouts, self.version)
        self._record_call(rollouts)
        return rollouts

    @property
    def replaying(self) -> bool:
        return bool(self.replay)

    def _record_call(self, rollouts: list) -> None:
        kinds = [r.tag[0] if isinstance(r.tag, tuple) and r.tag and isinstance(r.tag[0], str) else None
                 for r in rollouts]
        init = [r for r, k in zip(rollouts, kinds) if k != "cont"]  # GRPO's samples count as initial samples
        tokens = sum(r.num_generated for r in rollouts)
        self.generated_tokens += tokens
        init_batch = -1
        if init:
            init_batch = self.next_batch
            self.next_batch += 1
            if "init" in kinds:  # a tree batch: its continuations come in a later call
                self.pending_batches.append(init_batch)
            self.batch_stats[init_batch] = _initial_sample_stats(init, self.task)
        self.calls.append({"call": len(self.calls), "updates_before": self.updates,
                           "weights_version": int(rollouts[0].meta["weights_version"]) if rollouts else -1,
                           "published_version": self.version, "init_batch": init_batch, "cont_batch": -1,
                           "init_requests": len(init), "cont_requests": kinds.count("cont"),
                           "generated_tokens": tokens})

    def on_update(self) -> None:
        """An update was made. For a tree method it trained the oldest batch still waiting for its continuations,
        which the last call carried (that call may have had none to sample: every response filtered)."""
        self.updates += 1
        if self.pending_batches and self.calls:
            self.calls[-1]["cont_batch"] = self.pending_batches.popleft()

    def evaluate(self, problems: Sequence, max_new_tokens: int) -> tuple[float, dict[int, float]]:
        """Greedy accuracy of the current weights on ``problems``, generated and scored on the pool."""
        items = [{"prompt_ids": self.policy.codec.encode(p.prompt), "prefix_ids": [], "max_new_tokens": None,
                  "tag": i, "problem": p} for i, p in enumerate(problems)]
        rollouts = self.run(items, max_new_tokens, 0.0, None)
        return accuracy_by_difficulty(problems, [r.meta["reward"] for r in rollouts])


def _split(items: list, n: int) -> list[list]:
    if not items:
        return []
    n = max(1, min(n, len(items)))
    size = math.ceil(len(items) / n)
    return [items[i:i + size] for i in range(0, len(items), size)]


def _chunk_seeds(num_chunks: int, generator) -> list[int]:
    """One sampling seed per pool request, drawn from the training run's generator (so a run is reproducible
    whichever worker takes which request); without a generator (evaluation) the chunk index."""
    return [int(torch.randint(0, 2**31 - 1, (1,), generator=generator)) if generator is not None else i
            for i in range(num_chunks)]


def _initial_sample_stats(init: list, task: RecordingTask) -> dict[str, float]:
    """All-correct / all-wrong prompt ratios and accuracy by difficulty of one batch's initial samples."""
    groups: dict[Any, list[float]] = {}
    for r in init:
        prompt = tuple(r.prompt_ids)
        groups.setdefault(prompt, []).append(float(r.meta["reward"] or 0.0))
    out = {"init_all_correct_ratio": sum(all(v > 0 for v in g) for g in groups.values()) / len(groups),
           "init_all_wrong_ratio": sum(not any(v > 0 for v in g) for g in groups.values()) / len(groups)}
    problems = [task.by_prompt[tuple(r.prompt_ids)] for r in init]
    _, by_d = accuracy_by_difficulty(problems, [r.meta["reward"] or 0.0 for r in init])
    out |= {f"train_acc_d{d}": a for d, a in by_d.items()}
    return out
