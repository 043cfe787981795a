"""Device and precision choices: the logic that puts learners and samplers on the GPU Ray gave them and turns bf16 on
only where the hardware runs it natively, checked without CUDA and on any CPU."""
from __future__ import annotations

import pytest
import torch

from algos.precision import cpu_bf16_native, cpu_flags, use_bf16
from cluster import ddp
from cluster.devices import pick_device


@pytest.mark.parametrize("gpu_ids, cuda, requested, expected", [
    ([], False, "auto", "cpu"),
    ([], True, "auto", "cpu"),            # CUDA present but no GPU assigned to this worker: stay off it
    ([0], True, "auto", "cuda:0"),        # the assigned GPU (CUDA_VISIBLE_DEVICES makes it index 0)
    (["0"], False, "auto", "cpu"),        # a logical GPU of a rehearsal cluster: no CUDA, run on the CPU
    ([], False, "cuda:1", "cuda:1"),      # an explicit choice wins
])
def test_a_worker_uses_the_gpu_ray_assigned_when_cuda_can(gpu_ids, cuda, requested, expected):
    assert pick_device(gpu_ids, cuda_available=cuda, requested=requested) == torch.device(expected)


def test_collectives_run_on_the_process_group_device_and_write_back(monkeypatch):
    seen = []

    def op(t):
        seen.append(t)
        t.add_(1.0)
    x = torch.zeros(3)
    ddp._on_collective_device([x], op, target=torch.device("cpu"))  # already there: reduced in place, no copy
    assert seen[0] is x and torch.equal(x, torch.ones(3))
    import torch.distributed as dist
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert ddp.collective_device() == torch.device("cuda", 0), "NCCL refuses CPU tensors"
    monkeypatch.setattr(dist, "get_backend", lambda *a: "gloo")
    assert ddp.collective_device() == torch.device("cpu")


@pytest.mark.parametrize("flags, native", [({"avx2", "fma"}, False), ({"avx512f", "avx512_bf16"}, True),
                                           ({"amx_bf16", "amx_tile"}, True), ({"avx512f"}, False)])
def test_bf16_is_native_only_with_amx_or_avx512_bf16(flags, native):
    assert cpu_bf16_native(flags) is native


def test_bf16_auto_follows_the_hardware_and_explicit_settings_win():
    assert use_bf16(True) is True and use_bf16(False) is False
    flags = cpu_flags()
    expected = cpu_bf16_native(flags) if flags is not None else use_bf16("auto")
    assert use_bf16("auto", "cpu") is expected is use_bf16(None, "cpu")
    with pytest.raises(ValueError, match="true, false or auto"):
        use_bf16("sometimes")


def test_given_cpu_flags_stand_in_for_the_cpus(monkeypatch):
    monkeypatch.setenv("ORRERY_CPU_FLAGS", "avx2 fma")
    assert cpu_flags() == {"avx2", "fma"} and cpu_bf16_native() is False
    monkeypatch.setenv("ORRERY_CPU_FLAGS", "avx512f avx512_bf16")
    assert cpu_bf16_native() is True
