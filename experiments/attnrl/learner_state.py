"""The AttnRL learner's checkpoint, written and read by plain functions that need no Ray: ``Learner.state`` builds its
dict here and ``ranks.saved_state`` reads it back here, so a machine without Ray (``benchmarks/gpu/attnrl.py`` on a
lent GPU) checks the same save and load the learner runs."""
from __future__ import annotations

from pathlib import Path

import torch


def learner_state(weights: dict | None, optimizer: torch.optim.Optimizer | None, updates: int, calls: int,
                  generated_tokens: int, wall_s: float, parts: dict, run_path: Path | str) -> dict:
    """What a checkpoint holds after ``updates`` updates: the published weights (CPU tensors, None before the first
    update), the optimizer's state dict (its moments stay on the learner's device: the reader maps them), counts,
    and the stores' parts for the journal's rollback."""
    return {"weights": weights, "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "updates": updates, "calls": calls, "generated_tokens": generated_tokens, "wall_s": wall_s,
            "parts": parts, "run_path": str(run_path)}


def load_learner_state(path: Path) -> dict:
    """A saved learner state on the CPU, whatever device wrote it (a GPU learner resumed on a CPU one, or a GPU the
    scheduler numbered differently): the resuming rank moves what it needs to its own device."""
    return torch.load(path, map_location="cpu", weights_only=True)
