"""Verifiable multi-step reasoning task for AttnRL: step-delimited DAG arithmetic.

A problem is a short program over single-letter variables, e.g. (modulus 10, wrap-around)::

    prompt   a=7;b=5;c=a+b;d=c*b;?d\n
    response c=a+b:a7+b5;c=2\n
             d=c*b:c2*b5;d=0\n
             ans=0<eos>

Each response line is one reasoning step (steps end at the newline delimiter; the prompt is step 0). A line copies
its definition from the prompt, then each operand name followed by its value, copied from where that value was
defined, and ends with its own result written ``name=value`` exactly like an input of the prompt. A value is
defined in one place only (the prompt for inputs, the step's own line otherwise), so a later step that consumes
``c`` has to look back at the line that computed ``c``: the true influence of every step is known
(:func:`step_influence`), which is what AttnRL's FCI scores are checked against. Difficulty is the number of
computation steps. Reward is exact match of the final ``ans=`` line.

The layout is chosen so that a two-layer transformer learns the look-ups within a few hundred steps: a value is
always emitted right after its variable's name, and every definition site reads ``name=value``, so one look-up is
"find ``<name>=`` and copy the next token" (an induction-head pattern).

Two program layouts (``ReasoningTaskConfig.layout``):

* ``chain`` (the default): the query is the last step and nearly every step feeds it; short programs.
* ``cone`` and ``hub`` (:func:`sample_cone_problem`, below): only part of the steps feed the queried variable (its
  dependency cone); distractor steps, early ones included, are computed too but never reach the answer. In ``hub``
  one mid-trace cone step feeds every later cone step. The answer line names the queried variable
  (``ans=q7``), so reading off its value is the same look-up as copying an operand.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Iterator, Sequence

OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}
ANSWER_PREFIX = "ans="
DELIMITER = "\n"
VALUES_MARK = ":"  # separates a step's definition from its operands (name + value)
ASSIGN_MARK = ";"  # precedes the step's result, written ``name=value`` like the prompt's inputs
VARIABLE_NAMES = "abcdefghijklmnopqrstuvwxyz"
LAYOUTS = ("chain", "cone", "hub")


@dataclass(frozen=True)
class ReasoningTaskConfig:
    """Distribution of programs.

    Each step combines two distinct earlier variables. ``recency_bias`` is the probability that one of them is the
    most recently defined variable (long dependency chains); otherwise both are drawn uniformly from all earlier
    variables (fan-out, unused distractor steps).
    Values are written zero-padded to a fixed width so every step line has the same length. With ``bounded``,
    each step's operator (and, for non-commutative ones, operand order) is drawn among those whose exact result
    lies in [0, modulus - 1], so no wrap-around ever happens: plain small-number arithmetic is monotone in each
    operand and a two-layer transformer picks it up within a few hundred updates, whereas modular addition (no
    first-order signal) sits at chance for thousands. ``bounded=False`` reduces modulo ``modulus`` (real LMs).
    """

    min_steps: int = 1
    max_steps: int = 4
    num_inputs: int = 2
    modulus: int = 10
    ops: str = "+-"
    bounded: bool = True
    recency_bias: float = 0.5  # chain layout only
    layout: str = "chain"  # "chain", "cone" or "hub" (module docstring)
    cone_fraction: float = 0.5  # cone/hub: share of the computation steps in the answer's dependency cone
    distractor_reuse: float = 0.3  # cone/hub: probability that a distractor's operand is an earlier distractor

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if not 0.0 < self.cone_fraction <= 1.0:
            raise ValueError(f"cone_fraction must be in (0, 1], got {self.cone_fraction}")
        if not 0.0 <= self.distractor_reuse <= 1.0:
            raise ValueError(f"distractor_reuse must be in [0, 1], got {self.distractor_reuse}")
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"min_steps/max_steps must satisfy 1 <= min_steps <= max_steps, got {self.min_steps}, "
                             f"{self.max_steps}")
        if self.num_inputs < 2:
            raise ValueError(f"num_inputs must be >= 2 (steps combine two distinct variables), got {self.num_inputs}")
        if self.num_inputs + self.max_steps > len(VARIABLE_NAMES):
            raise ValueError(f"num_inputs + max_steps must be <= {len(VARIABLE_NAMES)} (one letter per variable)")
        if self.modulus < 2:
            raise ValueError(f"modulus must be >= 2, got {self.modulus}")
        if not self.ops or any(op not in OPS for op in self.ops):
            raise ValueError(f"ops must be a non-empty subset of {''.join(OPS)}, got {self.ops!r}")
        if not 0.0 <= self.recency_bias <= 1.0:
            raise ValueError(f"recency_bias must be in [0, 1], got {self.recency_bias}")

    @property
    def value_width(self) -> int:
        return len(str(self.modulus - 1))


@dataclass(frozen=True)
class Step:
    """One assignment ``target = left op right``."""

    target: str
    left: str
    op: str
    right: str


@dataclass(frozen=True)
class Problem:
    inputs: tuple[tuple[str, int], ...]
    steps: tuple[Step, ...]
    query: str
    modulus: int
    value_width: int
    values: dict[str, int] = field(compare=False, hash=False, repr=False)
    name_in_answer: bool = False  # the answer line reads ``ans=<query><value>`` (cone/hub layouts)

    @property
    def difficulty(self) -> int:
        return len(self.steps)

    @property
    def answer_line(self) -> str:
        return ANSWER_PREFIX + (self.query if self.name_in_answer else "") + self.fmt(self.answer)

    def dependency_cone(self) -> list[bool]:
        """One entry per response step of the solution: True for the computation steps whose value the answer
        depends on (the query's step and, transitively, the steps it reads), False for the others and for the
        answer line itself."""
        needed = {self.query}
        cone = [False] * len(self.steps)
        for i in reversed(range(len(self.steps))):
            s = self.steps[i]
            if s.target in needed:
                cone[i] = True
                needed |= {s.left, s.right}
        return cone + [False]

    @property
    def answer(self) -> int:
        return self.values[self.query]

    def fmt(self, value: int) -> str:
        return str(value).zfill(self.value_width)

    @property
    def prompt(self) -> str:
        parts = [f"{name}={self.fmt(v)}" for name, v in self.inputs]
        parts += [f"{s.target}={s.left}{s.op}{s.right}" for s in self.steps]
        return ";".join(parts) + f";?{self.query}" + DELIMITER

    def solution_lines(self) -> list[str]:
        """Reference response, one line per step; the last line is the answer step."""
        lines = []
        for s in self.steps:
            lhs, rhs = self.fmt(self.values[s.left]), self.fmt(self.values[s.right])
            lines.append(f"{s.target}={s.left}{s.op}{s.right}{VALUES_MARK}{s.left}{lhs}{s.op}{s.right}{rhs}"
                         f"{ASSIGN_MARK}{s.target}={self.fmt(self.values[s.target])}")
        lines.append(self.answer_line)
        return lines

    @property
    def solution(self) -> str:
        return DELIMITER.join(self.solution_lines())


def draw_inputs(cfg: "ReasoningTaskConfig",
                rng: random.Random) -> tuple[Iterator[str], dict[str, int], list[tuple[str, int]]]:
    """The program's input variables: (the iterator of names still free, values by name, [(name, value)])."""
    names = iter(VARIABLE_NAMES)
    values: dict[str, int] = {}
    inputs = []
    for _ in range(cfg.num_inputs):
        name = next(names)
        values[name] = rng.randrange(cfg.modulus)
        inputs.append((name, values[name]))
    return names, values, inputs


def sample_problem(cfg: ReasoningTaskConfig, rng: random.Random, difficulty: int | None = None) -> Problem:
    """Draw one program. Chain layout: the query is the last computed variable, so the answer depends on the final
    step; cone and hub layouts: :func:`sample_cone_problem`."""
    num_steps = rng.randint(cfg.min_steps, cfg.max_steps) if difficulty is None else difficulty
    if num_steps < 1 or cfg.num_inputs + num_steps > len(VARIABLE_NAMES):
        raise ValueError(f"difficulty must be in [1, {len(VARIABLE_NAMES) - cfg.num_inputs}], got {num_steps}")
    if cfg.layout != "chain":
        return sample_cone_problem(cfg, rng, num_steps)
    names, values, inputs = draw_inputs(cfg, rng)
    defined = [name for name, _ in inputs]
    steps = []
    for _ in range(num_steps):
        # Distinct operands: "x-x" would make a step's value independent of its inputs.
        first = defined[-1] if rng.random() < cfg.recency_bias else rng.choice(defined)
        second = rng.choice([v for v in defined if v != first])
        target = next(names)
        steps.append(combine(cfg, rng, values, target, first, second))
        defined.append(target)
    return Problem(tuple(inputs), tuple(steps), steps[-1].target, cfg.modulus, cfg.value_width, values)


def combine(cfg: ReasoningTaskConfig, rng: random.Random, values: dict[str, int], target: str, first: str,
            second: str) -> Step:
    """The step ``target = first op second`` (or with the operands swapped): operator and order drawn as
    ``cfg.bounded`` allows; ``values[target]`` is set."""
    choices = [(op, x, y) for op in cfg.ops for x, y in ((first, second), (second, first))]
    if cfg.bounded:
        choices = [c for c in choices if 0 <= OPS[c[0]](values[c[1]], values[c[2]]) < cfg.modulus] or [
            (op, x, y) for op in "+-" for x, y in ((first, second), (second, first))
            if 0 <= OPS[op](values[x], values[y]) < cfg.modulus]  # + or - always has an in-range order
    op, left, right = rng.choice(choices)
    values[target] = OPS[op](values[left], values[right]) % cfg.modulus
    return Step(target, left, op, right)


def reward(problem: Problem, response: str, finished: bool = True) -> float:
    """Exact match of the final line with the answer line (``ans=<answer>``, or ``ans=<query><answer>`` in the
    cone/hub layouts); unfinished (truncated) responses get 0."""
    if not finished:
        return 0.0
    lines = response.rstrip(DELIMITER).split(DELIMITER)
    return float(lines[-1] == problem.answer_line)


def step_influence(problem: Problem, transitive: bool = True) -> list[int]:
    """Ground-truth influence of each response step: how many later response steps consume its result.

    Index ``i`` is response step ``i + 1`` (index 0 of the FCI vector is the prompt). The answer line consumes the
    query variable and has influence 0. ``transitive=True`` counts every later step that depends on it through
    any chain; ``False`` counts direct consumers only (the steps that copy its value, i.e. attend to it).
    """
    targets = [s.target for s in problem.steps]
    consumers: list[set[int]] = []  # consumers[i] = indices of later response steps that read step i's variable
    for i, t in enumerate(targets):
        direct = {j for j in range(i + 1, len(targets)) if t in (problem.steps[j].left, problem.steps[j].right)}
        if t == problem.query:
            direct.add(len(targets))  # the answer line
        consumers.append(direct)
    if transitive:
        for i in reversed(range(len(targets))):
            closure = set(consumers[i])
            for j in consumers[i]:
                if j < len(targets):
                    closure |= consumers[j]
            consumers[i] = closure
    return [len(c) for c in consumers] + [0]


# ------------------------------------------------------------------------------------ cone and hub layouts
# Programs whose answer depends on only part of their steps: the ``cone`` and ``hub`` layouts of the reasoning task.
#
# A program of K computation steps (difficulty K) puts about ``cone_fraction * K`` of them in the queried variable's
# dependency cone, at random positions (so distractors are spread over the trace, early ones included, and "earliest"
# is not "influential"); the query is the last cone step, so distractors may also follow it. Every step is written
# out in the response, but only the cone steps can change the answer.
#
# * Cone steps form a chain with skip connections: the first reads two inputs, every later one reads the previous
#   cone step and one input or earlier cone step. Every cone step therefore feeds the answer.
# * ``hub``: the middle cone step (index ``(c - 1) // 2`` of ``c``) feeds every later cone step directly; the steps after it
#   read the hub and the previous cone step, so one mid-trace step is pivotal and attended to by all that follow.
# * Distractor steps read any two earlier variables; with probability ``distractor_reuse`` (per operand) an earlier
#   distractor, else an input or cone variable. They are never read by a cone step, so they are attended to (by
#   later distractors) without mattering: the case where attention and influence part ways.


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


class CharTokenizer:
    """Character vocabulary for the task; ids 0 and 1 are padding and end-of-sequence."""

    PAD, EOS = "<pad>", "<eos>"

    def __init__(self, alphabet: str | None = None) -> None:
        alphabet = alphabet or VARIABLE_NAMES + "0123456789" + "=;:?" + "".join(OPS) + DELIMITER
        self.itos = [self.PAD, self.EOS] + sorted(set(alphabet))
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self.pad_id, self.eos_id = 0, 1
        self.delimiter_ids = frozenset({self.stoi[DELIMITER]})

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        return [self.stoi[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.itos[i] for i in ids if i > self.eos_id)


class ReasoningTask:
    """The task as the RL driver sees it: sample problems, encode prompts and references, score responses."""

    def __init__(self, cfg: ReasoningTaskConfig | None = None) -> None:
        self.cfg = cfg or ReasoningTaskConfig()
        self.tokenizer = CharTokenizer()

    def sample(self, rng: random.Random, n: int, difficulty: int | None = None) -> list[Problem]:
        return [sample_problem(self.cfg, rng, difficulty) for _ in range(n)]

    def evaluation_problems(self, per_difficulty: int, seed: int,
                            difficulties: Sequence[int] | None = None) -> list[Problem]:
        """A fixed evaluation set: ``per_difficulty`` problems of each difficulty (default: all the task's), drawn
        difficulty after difficulty from one ``random.Random(seed)``."""
        rng = random.Random(seed)
        if difficulties is None:
            difficulties = range(self.cfg.min_steps, self.cfg.max_steps + 1)
        return [p for d in difficulties for p in self.sample(rng, per_difficulty, d)]

    def reward(self, problem: Problem, response: str, finished: bool = True) -> float:
        return reward(problem, response, finished)

    def influence(self, problem: Problem, transitive: bool = True) -> list[int]:
        return step_influence(problem, transitive)

    def dependency_cone(self, problem: Problem) -> list[bool]:
        return problem.dependency_cone()

    def max_response_chars(self, difficulty: int | None = None) -> int:
        """Length of the longest reference response (+1 for the end token), a safe generation cap."""
        steps = self.cfg.max_steps if difficulty is None else difficulty
        w = self.cfg.value_width
        line = 5 + 1 + 2 * (1 + w) + 1 + 1 + 2 + w + 1  # c=a+b : axx+byy ; c= zz \n
        return steps * line + len(ANSWER_PREFIX) + (self.cfg.layout != "chain") + w + 1
