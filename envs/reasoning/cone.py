"""Programs whose answer depends on only part of their steps: the ``cone`` and ``hub`` layouts of the reasoning task.

A program of K computation steps (difficulty K) puts about ``cone_fraction * K`` of them in the queried variable's
dependency cone, at random positions (so distractors are spread over the trace, early ones included, and "earliest"
is not "influential"); the query is the last cone step, so distractors may also follow it. Every step is written
out in the response, but only the cone steps can change the answer.

* Cone steps form a chain with skip connections: the first reads two inputs, every later one reads the previous
  cone step and one input or earlier cone step. Every cone step therefore feeds the answer.
* ``hub``: the middle cone step (index ``(c - 1) // 2`` of ``c``) feeds every later cone step directly; the steps after it
  read the hub and the previous cone step, so one mid-trace step is pivotal and attended to by all that follow.
* Distractor steps read any two earlier variables; with probability ``distractor_reuse`` (per operand) an earlier
  distractor, else an input or cone variable. They are never read by a cone step, so they are attended to (by
  later distractors) without mattering: the case where attention and influence part ways.
"""
from __future__ import annotations

import random

from envs.reasoning.task import Problem, ReasoningTaskConfig, combine, draw_inputs


def cone_positions(num_steps: int, cone_fraction: float, rng: random.Random) -> list[int]:
    """Sorted positions of the cone steps among ``num_steps`` (at least two, at most all)."""
    size = min(num_steps, max(2, round(cone_fraction * num_steps)))
    return sorted(rng.sample(range(num_steps), size))


def sample_cone_problem(cfg: ReasoningTaskConfig, rng: random.Random, num_steps: int) -> Problem:
    """One program of the ``cone`` or ``hub`` layout (module docstring) with ``num_steps`` computation steps."""
    if num_steps < 2:
        raise ValueError(f"cone and hub programs need at least 2 steps, got {num_steps}")
    names, values, inputs = draw_inputs(cfg, rng)
    input_names = [name for name, _ in inputs]
    in_cone = set(cone_positions(num_steps, cfg.cone_fraction, rng))
    hub_index = (len(in_cone) - 1) // 2 if cfg.layout == "hub" else None
    cone: list[str] = []  # cone variables defined so far, in order
    distractors: list[str] = []
    steps = []
    for position in range(num_steps):
        target = next(names)
        if position in in_cone:
            first, second = _cone_operands(rng, input_names, cone, hub_index)
            cone.append(target)
        else:
            first, second = _distractor_operands(rng, input_names + cone, distractors, cfg.distractor_reuse)
            distractors.append(target)
        steps.append(combine(cfg, rng, values, target, first, second))
    return Problem(tuple(inputs), tuple(steps), cone[-1], cfg.modulus, cfg.value_width, values, name_in_answer=True)


def _cone_operands(rng: random.Random, inputs: list[str], cone: list[str], hub_index: int | None) -> tuple[str, str]:
    """Operands of the next cone step: two inputs for the first; then the previous cone step plus an input or an
    earlier cone step; after the hub, the hub plus the previous cone step (or, right after it, an earlier one)."""
    if not cone:
        first, second = rng.sample(inputs, 2)
        return first, second
    if hub_index is not None and len(cone) > hub_index:
        hub, previous = cone[hub_index], cone[-1]
        if previous != hub:
            return hub, previous
        return hub, rng.choice(inputs + cone[:hub_index])
    previous = cone[-1]
    return previous, rng.choice(inputs + cone[:-1])


def _distractor_operands(rng: random.Random, useful: list[str], distractors: list[str], reuse: float
                         ) -> tuple[str, str]:
    """Two distinct earlier variables; each is an earlier distractor with probability ``reuse`` (when one exists)."""
    chosen: list[str] = []
    while len(chosen) < 2:
        pool = distractors if distractors and rng.random() < reuse else useful
        pool = [v for v in pool if v not in chosen] or [v for v in useful + distractors if v not in chosen]
        chosen.append(rng.choice(pool))
    return chosen[0], chosen[1]
