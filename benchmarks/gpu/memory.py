"""Peak memory of a piece of code, on any device: CUDA's allocator where there is one, else a dispatch-level count.

:class:`PeakMemory` counts every storage an op allocates while it is active and subtracts it when the storage is
freed, so its ``peak`` is the most bytes those allocations held at once (weights and inputs made before it started
are not counted). Kernels' internal scratch space is invisible to it; on CUDA the allocator's own peak sees that too.
"""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakMemory(TorchDispatchMode):
    """Bytes held at once by the storages allocated inside (views and in-place results allocate nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def _held(self) -> int:
        self.live = {k: v for k, v in self.live.items() if not v[0].expired()}
        return sum(n for _, n in self.live.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr not in inputs and ptr not in self.live and storage.nbytes():
                    self.live[ptr] = (StorageWeakRef(storage), storage.nbytes())
        self.peak = max(self.peak, self._held())
        return out


def cuda_peak_of(fn, device: str) -> tuple[object, int]:
    """``fn()`` and the most bytes CUDA's allocator held beyond what was allocated before it."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    return out, torch.cuda.max_memory_allocated(device) - base


def size(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
