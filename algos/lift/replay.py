"""FIFO replay buffer: a preallocated ring of torch tensors with uniform sampling (with replacement).

This is LIFT's ``UniformSamplingQueue``: inserts overwrite the oldest transitions once full, and a high-UTD
update draws all ``G * B`` indices in one call. ``transition_fields`` is the layout of a SAC transition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

Spec = tuple[Sequence[int], torch.dtype | str]


def transition_fields(obs_dim: int, act_dim: int, critic_view: bool = False) -> dict[str, Spec]:
    """The fields of a SAC transition (what ``algos.lift.sac.update`` reads and env rollouts return), float32;
    ``critic_view``: also the critic's own obs/next_obs (LIFT's model buffer: the actor's view there is noisy)."""
    fields = {"obs": ((obs_dim,), torch.float32), "action": ((act_dim,), torch.float32),
              "reward": ((), torch.float32), "next_obs": ((obs_dim,), torch.float32),
              "terminated": ((), torch.float32), "truncated": ((), torch.float32)}
    if critic_view:
        fields |= {"critic_obs": ((obs_dim,), torch.float32), "next_critic_obs": ((obs_dim,), torch.float32)}
    return fields


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return resolved


class ReplayBuffer:
    """Ring buffer of named fields, each stored as one ``(capacity, *shape)`` tensor.

    Args:
        capacity: maximum number of transitions kept.
        specs: ``{name: (shape, dtype)}``, e.g. ``{"obs": ((17,), torch.float32), "terminated": ((), "float32")}``.
        device: where the storage lives (the learner's device, so sampling needs no copy).
    """

    def __init__(self, capacity: int, specs: Mapping[str, Spec], device: torch.device | str = "cpu"):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        if not specs:
            raise ValueError("specs must name at least one field")
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self.specs = {name: (tuple(shape), _as_dtype(dtype)) for name, (shape, dtype) in specs.items()}
        self.storage = {
            name: torch.zeros((self.capacity, *shape), dtype=dtype, device=self.device)
            for name, (shape, dtype) in self.specs.items()
        }
        self.ptr = 0  # next slot to write
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, batch: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """Append ``n`` transitions (every field has leading dim ``n``), overwriting the oldest when full."""
        if set(batch) != set(self.specs):
            raise ValueError(f"batch keys {sorted(batch)} != buffer fields {sorted(self.specs)}")
        tensors = {}
        n = None
        for name, value in batch.items():
            shape, dtype = self.specs[name]
            t = torch.as_tensor(value).to(device=self.device, dtype=dtype)
            if t.shape[1:] != shape:
                raise ValueError(f"field {name!r}: expected (n, *{shape}), got {tuple(t.shape)}")
            if n is None:
                n = t.shape[0]
            elif t.shape[0] != n:
                raise ValueError(f"field {name!r} has {t.shape[0]} rows, others have {n}")
            tensors[name] = t
        if not n:
            return
        if n > self.capacity:  # only the newest `capacity` rows would survive anyway
            tensors = {k: v[-self.capacity:] for k, v in tensors.items()}
            self.ptr = (self.ptr + n - self.capacity) % self.capacity
            n = self.capacity
        idx = (self.ptr + torch.arange(n, device=self.device)) % self.capacity
        for name, t in tensors.items():
            self.storage[name].index_copy_(0, idx, t)
        self.ptr = (self.ptr + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, n: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """``n`` transitions drawn uniformly with replacement (the generator must live on ``self.device``)."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty buffer")
        idx = torch.randint(self.size, (n,), generator=generator, device=self.device)
        return {name: t[idx] for name, t in self.storage.items()}

    def resized(self, capacity: int) -> "ReplayBuffer":
        """A buffer of ``capacity`` rows holding this one's newest min(size, capacity) rows, oldest first (LIFT
        rebuilds its SAC buffer this way when the model horizon changes)."""
        out = ReplayBuffer(capacity, self.specs, device=self.device)
        if self.size:
            order = (self.ptr - self.size + torch.arange(self.size, device=self.device)) % self.capacity
            order = order[-out.capacity:]
            out.add({name: t[order] for name, t in self.storage.items()})
        return out

    def state_dict(self) -> dict[str, Any]:
        """Filled rows (CPU tensors), ring pointer and layout; ``load_state_dict`` restores them bit-exactly.
        Exact resume needs the rows, so each checkpoint copies the filled ring to host memory once (a 1M-row humanoid
        replay: 0.5-3 GB per rank, by observation size); at paper sizes checkpoints are 50k updates apart."""
        return {
            "capacity": self.capacity,
            "specs": {name: (shape, str(dtype).removeprefix("torch.")) for name, (shape, dtype) in self.specs.items()},
            "ptr": self.ptr,
            "size": self.size,
            "storage": {name: t[: self.size].to("cpu", copy=True) for name, t in self.storage.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        specs = {name: (tuple(shape), _as_dtype(dtype)) for name, (shape, dtype) in state["specs"].items()}
        if state["capacity"] != self.capacity or specs != self.specs:
            raise ValueError(f"the saved buffer's layout differs from this one: capacity {state['capacity']} vs "
                             f"{self.capacity}, fields {sorted(specs)} vs {sorted(self.specs)} (a checkpoint of "
                             f"another version or setting: start the run afresh)")
        for name, saved in state["storage"].items():
            self.storage[name].zero_()
            self.storage[name][: state["size"]].copy_(saved)
        self.ptr = int(state["ptr"])
        self.size = int(state["size"])
