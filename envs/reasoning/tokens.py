"""The reasoning task in the task's own units: every variable name, operator, value and mark is one token.

With the character tokenizer (:class:`envs.reasoning.task.CharTokenizer`) a name or a value of several characters is
several tokens. :class:`UnitTokenizer` makes each one token, so a look-up ("find ``<name>=`` and copy the value") is
one key and one copied token, whatever the spelling. On the default task (one-letter names, one-digit values) the two
tokenizers coincide token for token, and a model trained with either is the same model. :class:`UnitReasoningTask`
therefore writes the task with two-letter names (:data:`UNIT_NAMES`) and, with a modulus above 10, two-digit values,
where a unit is two characters:

    prompt   ba=07;ce=15;di=ba+ce;?di\\n          (tokens: ba = 07 ; ce = 15 ; di = ba + ce ; ? di \\n)
    response di=ba+ce:ba07+ce15;di=22...

The programs are those of the underlying :class:`ReasoningTask` (same generator, same seeds), with each one-letter
name renamed; rewards, dependency cones and influences are unchanged by the renaming.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Sequence

from envs.reasoning.task import (ANSWER_PREFIX, ASSIGN_MARK, DELIMITER, OPS, VALUES_MARK, VARIABLE_NAMES, Problem,
                                 ReasoningTask, ReasoningTaskConfig, Step)

# consonant + vowel: two letters each, none a prefix of another or of "ans", pronounceable in a printed trace
UNIT_NAMES = tuple(c + "aeiou"[i % 5] for i, c in enumerate("bcdfghjklmnpqrstvwxz"))


class UnitTokenizer:
    """One token per name, value, operator and mark; ids 0 and 1 are padding and end-of-sequence.

    ``names``: the variable names; values are ``0 .. modulus - 1`` written zero-padded to ``width`` digits (as the
    task writes them). Encoding is a longest match over the vocabulary and raises on text it cannot cover."""

    PAD, EOS = "<pad>", "<eos>"

    def __init__(self, names: Sequence[str], modulus: int, width: int) -> None:
        marks = ["=", ASSIGN_MARK, VALUES_MARK, "?", *OPS, DELIMITER, ANSWER_PREFIX.rstrip("=")]
        values = [str(v).zfill(width) for v in range(modulus)]
        self.itos = [self.PAD, self.EOS, *dict.fromkeys([*names, *values, *marks])]
        if len(self.itos) != 2 + len(set(names)) + modulus + len(marks):
            raise ValueError("names, values and marks of the unit vocabulary must be distinct")
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self.pad_id, self.eos_id = 0, 1
        self.delimiter_ids = frozenset({self.stoi[DELIMITER]})
        self._lengths = sorted({len(s) for s in self.itos[2:]}, reverse=True)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            for n in self._lengths:
                tok = self.stoi.get(text[i:i + n])
                if tok is not None and tok > self.eos_id:
                    ids.append(tok)
                    i += n
                    break
            else:
                raise ValueError(f"unit tokenizer: no token for {text[i:i + 8]!r} at offset {i}")
        return ids

    def decode(self, ids) -> str:
        return "".join(self.itos[i] for i in ids if i > self.eos_id)


def rename(problem: Problem, names: dict[str, str]) -> Problem:
    """The same program with every variable renamed by ``names`` (one-letter name -> unit name)."""
    return dataclasses.replace(
        problem, inputs=tuple((names[n], v) for n, v in problem.inputs),
        steps=tuple(Step(names[s.target], names[s.left], s.op, names[s.right]) for s in problem.steps),
        query=names[problem.query], values={names[n]: v for n, v in problem.values.items()})


class UnitReasoningTask(ReasoningTask):
    """:class:`ReasoningTask` with two-letter names and the :class:`UnitTokenizer` (module docstring)."""

    def __init__(self, cfg: ReasoningTaskConfig | None = None, names: Sequence[str] = UNIT_NAMES) -> None:
        super().__init__(cfg)
        if self.cfg.num_inputs + self.cfg.max_steps > len(names):
            raise ValueError(f"num_inputs + max_steps must be <= {len(names)} (one unit name per variable)")
        self.names = dict(zip(VARIABLE_NAMES, names))
        self.tokenizer = UnitTokenizer(names, self.cfg.modulus, self.cfg.value_width)

    def sample(self, rng: random.Random, n: int, difficulty: int | None = None) -> list[Problem]:
        return [rename(p, self.names) for p in super().sample(rng, n, difficulty)]

    def max_response_chars(self, difficulty: int | None = None) -> int:
        """The generation cap in *tokens* (the name is the task interface's): the longest reference response + 1."""
        steps = self.cfg.max_steps if difficulty is None else difficulty
        line = 16  # c = a + b : a v + b v ; c = v \n
        return steps * line + 2 + (self.cfg.layout != "chain") + 1 + 1  # ans = [q] v <eos>

    def unit_share(self, problems: Sequence[Problem]) -> float:
        """Share of the tokens of the problems' prompts and solutions that are longer than one character (how far
        this tokenization is from the character one)."""
        tokens = [t for p in problems for t in self.tokenizer.encode(p.prompt + p.solution)]
        return sum(len(self.tokenizer.itos[t]) > 1 for t in tokens) / max(len(tokens), 1)
