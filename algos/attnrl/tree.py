"""All responses to one prompt as a tree, and TreeRL's process advantages on it (AttnRL Eq. 2-3).

An initial response is cut at its branch offsets into segments (nodes); the continuations sampled from offset o
become siblings of the segment that starts at o. Every root-to-leaf path is one training sequence whose tokens
carry the advantage of the node they belong to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from algos.attnrl.ppo import TrainSequence


@dataclass
class TreeNode:
    tokens: list[int]
    old_logprobs: list[float]  # behaviour log-probs of ``tokens`` (from the call that sampled them)
    parent: int | None
    children: list[int] = field(default_factory=list)
    reward: float | None = None  # leaves only


@dataclass
class Continuation:
    """One continuation sampled from a branch point: its generated tokens, their log-probs and its reward."""

    tokens: list[int]
    logprobs: list[float]
    reward: float


class PromptTree:
    """All responses to one prompt as a tree of token segments; node 0 is the prompt (root)."""

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self.prompt_ids = list(prompt_ids)
        self.nodes: list[TreeNode] = [TreeNode(list(prompt_ids), [], None)]

    def add_node(self, parent: int, tokens: Sequence[int], old_logprobs: Sequence[float],
                 reward: float | None = None) -> int:
        if len(tokens) != len(old_logprobs):
            raise ValueError("tokens and old_logprobs must have equal length")
        self.nodes.append(TreeNode(list(tokens), list(old_logprobs), parent, reward=reward))
        self.nodes[parent].children.append(len(self.nodes) - 1)
        return len(self.nodes) - 1

    def add_response(self, tokens: Sequence[int], logprobs: Sequence[float], reward: float,
                     continuations: Mapping[int, Sequence[Continuation]] | None = None) -> None:
        """Add one initial response, cut at its branch offsets; continuations from offset o become siblings of
        the original segment that starts at o. Without continuations the response is a single leaf."""
        continuations = continuations or {}
        cuts = sorted(continuations)
        if cuts and not 0 < cuts[0] <= cuts[-1] < len(tokens):
            raise ValueError(f"branch offsets {cuts} must lie inside the response (1..{len(tokens) - 1})")
        bounds = [0] + cuts + [len(tokens)]
        parent = 0
        for i in range(len(bounds) - 1):
            a, b = bounds[i], bounds[i + 1]
            last = i == len(bounds) - 2
            node = self.add_node(parent, tokens[a:b], logprobs[a:b], reward if last else None)
            for continuation in continuations.get(a, ()) if i > 0 else ():
                self.add_node(parent, continuation.tokens, continuation.logprobs, continuation.reward)
            parent = node

    def leaves(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if i > 0 and not n.children]

    def leaf_rewards(self) -> list[float]:
        return [self.nodes[i].reward for i in self.leaves()]

    def has_signal(self) -> bool:
        """False when all leaves are equally rewarded (all advantages are 0): the zero-advantage filter."""
        rewards = self.leaf_rewards()
        return len(set(rewards)) > 1

    def leaf_counts_and_values(self) -> tuple[list[int], list[float]]:
        """|L(s)| and V(s) = mean reward of the leaves under s, for every node (parents precede children)."""
        count = [0] * len(self.nodes)
        total = [0.0] * len(self.nodes)
        for i in reversed(range(1, len(self.nodes))):
            node = self.nodes[i]
            if not node.children:
                count[i], total[i] = 1, float(node.reward)
            count[node.parent] += count[i]
            total[node.parent] += total[i]
        return count, [t / c if c else 0.0 for t, c in zip(total, count)]


def tree_advantages(tree: PromptTree) -> list[float]:
    """TreeRL Eq. 3: A(s) = [(V(s) - V(root)) + (V(s) - V(parent(s)))] / sqrt(|L(s)|); 0 for the root."""
    count, value = tree.leaf_counts_and_values()
    adv = [0.0] * len(tree.nodes)
    for i in range(1, len(tree.nodes)):
        parent = tree.nodes[i].parent
        adv[i] = ((value[i] - value[0]) + (value[i] - value[parent])) / math.sqrt(count[i])
    return adv


def training_paths(tree: PromptTree, advantages: Sequence[float] | None = None,
                   drop_unexpanded: bool = True) -> list[TrainSequence]:
    """One training sequence per root-to-leaf path; each token carries its node's advantage. Paths of a single
    segment (responses that were never branched) are dropped but still counted in V(root)."""
    advantages = tree_advantages(tree) if advantages is None else advantages
    paths = []
    for leaf in tree.leaves():
        chain, i = [], leaf
        while i != 0:
            chain.append(i)
            i = tree.nodes[i].parent
        if drop_unexpanded and len(chain) == 1:
            continue
        chain.reverse()
        tokens, old_lp, adv = [], [], []
        for i in chain:
            node = tree.nodes[i]
            tokens += node.tokens
            old_lp += node.old_logprobs
            adv += [advantages[i]] * len(node.tokens)
        paths.append(TrainSequence(tree.prompt_ids, tokens, old_lp, adv, float(tree.nodes[leaf].reward)))
    return paths
