"""Which device a learner or sampler uses: the GPU Ray assigned to it, if CUDA can use it, else the CPU.

Pure selection logic (testable without CUDA) plus the one call that reads Ray's assignment. A logical GPU without CUDA
(a rehearsal cluster started with ``ray start --num-gpus``) runs on the CPU, with a warning, so the paper's
structure can be rehearsed on a CPU machine.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)


def pick_device(gpu_ids: Sequence[Any], *, cuda_available: bool | None = None, requested: str = "auto",
                ray_device: Callable[[], Any] | None = None):
    """``requested`` ("auto", "cpu", "cuda", "cuda:1") wins unless "auto"; "auto" is the assigned GPU when Ray gave
    this process one (``gpu_ids``) and CUDA works, else the CPU. ``ray_device`` maps the assignment to a torch device
    (Ray Train's ``get_device``); by default Ray's ``CUDA_VISIBLE_DEVICES`` makes the first visible device the
    assigned one."""
    import torch
    if requested != "auto":
        return torch.device(requested)
    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    if gpu_ids and cuda:
        return ray_device() if ray_device is not None else torch.device("cuda", 0)
    if gpu_ids:
        log.warning("Ray assigned GPU(s) %s but CUDA is not available: running on the CPU", list(gpu_ids))
    return torch.device("cpu")


def assigned_device(requested: str = "auto"):
    """The device of this Ray worker process (a pool sampler's, a Train worker's)."""
    import ray
    return pick_device(ray.get_gpu_ids() if ray.is_initialized() else [], requested=requested)
