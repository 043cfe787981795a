"""A CPU-only stand-in for a CUDA device, to catch device mixing without a GPU.

Under ``torch._subclasses.fake_tensor.FakeTensorMode`` a CPU build of torch can hold tensors on ``cuda:0`` (shapes,
dtypes and devices, no values) and raises ``FakeTensorDeviceMismatchError`` when one op mixes cuda and cpu tensors.
``fake_cuda()`` adds what a whole training function needs to run through it on a CPU build:
- a read of a value (``.item()``, ``float(t)``) returns a placeholder, so control flow goes on with made-up numbers;
- indexing, index assignment and ``copy_`` of a cuda tensor (which a CPU build refuses before any dispatch) run on
  a cpu twin; a cuda index into a cpu tensor raises, as on a GPU;
- no autograd graph (recording one on a cuda tensor aborts a CPU build): ``backward`` is a no-op, so an optimiser step
  changes nothing. The forward's devices are what is checked; the backward follows them.
Not caught: ``.numpy()`` of a cuda tensor (a fake tensor has no data either way), device choices made by C++ code
paths that never reach dispatch. Modules go to the fake device with ``to_fake_cuda`` (``.to("cuda")`` is refused).
Freeing some fake tensors can crash the interpreter at exit: run checks in their own process
(``tests/fake_cuda_checks.py``).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten


def _placeholder(dtype: torch.dtype):
    return 0.5 if dtype.is_floating_point else (True if dtype == torch.bool else 1)


_SCALAR_READS = (torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__bool__,
                 torch.Tensor.__index__)


class _ValuelessFakeMode(FakeTensorMode):
    """FakeTensorMode whose scalar reads return 0.5 (floats) or 1 (ints, bools) instead of raising."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is aten._local_scalar_dense.default:
            return _placeholder(args[0].dtype)
        return super().__torch_dispatch__(func, types, args, kwargs)


def _is_cuda(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cuda"


def _index_tensors(index) -> list[torch.Tensor]:
    items = index if isinstance(index, tuple) else (index,)
    return [i for i in items if isinstance(i, torch.Tensor)]


def _on_cpu(index):
    """The index with its tensors moved to (fake) cpu, for the cpu twin of a fake cuda tensor."""
    if isinstance(index, tuple):
        return tuple(_on_cpu(i) for i in index)
    return torch.empty_like(index, device="cpu") if _is_cuda(index) else index


class _FakeCudaGuards(TorchFunctionMode):
    """What a CPU build refuses before any dispatch on a cuda tensor (it looks for a CUDA device guard): indexing,
    index assignment, ``copy_`` and ``backward``. Indexing runs on a cpu twin of the same shape and dtype (no values
    exist anyway) and keeps the device rule (a cuda index into a cpu tensor raises); a view made by indexing is a
    copy here, which a device check does not notice."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
            self_, index = args[0], args[1]
            if not _is_cuda(self_) and any(_is_cuda(i) for i in _index_tensors(index)):
                raise RuntimeError("indices should be either on cpu or on the same device as the indexed tensor (cpu)")
            if _is_cuda(self_):
                twin = torch.empty_like(self_, device="cpu")
                if func is torch.Tensor.__setitem__:
                    value = args[2]
                    if isinstance(value, torch.Tensor):
                        torch.broadcast_shapes(value.shape, twin[_on_cpu(index)].shape)
                    return None
                return twin[_on_cpu(index)].to(self_.device)
        if func in _SCALAR_READS and _is_cuda(args[0]):
            return _placeholder(args[0].dtype)
        if func is torch.Tensor.backward and _is_cuda(args[0]):
            return None  # the autograd engine needs a real CUDA device; the backward follows the forward's devices
        if func is torch.Tensor.copy_ and _is_cuda(args[0]):
            torch.broadcast_shapes(args[1].shape, args[0].shape)  # copies across devices are legal in torch
            return args[0]
        return func(*args, **kwargs)


@contextmanager
def fake_cuda() -> Iterator[FakeTensorMode]:
    """Inside: ``torch.zeros(..., device="cuda")`` works on a CPU-only machine; mixing devices in one op raises."""
    # no autograd graph: recording one on a cuda tensor needs a real CUDA device (the process aborts without it)
    with torch.no_grad(), _ValuelessFakeMode(allow_non_fake_inputs=True) as mode, _FakeCudaGuards():
        yield mode


def to_fake_cuda(module: torch.nn.Module) -> torch.nn.Module:
    """Move ``module``'s parameters and buffers to the fake cuda device (inside ``fake_cuda()``)."""
    for sub in module.modules():
        for name, param in list(sub.named_parameters(recurse=False)):
            setattr(sub, name, torch.nn.Parameter(torch.empty_like(param, device="cuda:0"),
                                                  requires_grad=param.requires_grad))
        for name, buf in list(sub.named_buffers(recurse=False)):
            sub._buffers[name] = torch.empty_like(buf, device="cuda:0")
    return module


def on_fake_cuda(t: torch.Tensor) -> bool:
    return isinstance(t, FakeTensor) and t.device.type == "cuda"
