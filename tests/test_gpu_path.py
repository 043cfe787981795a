"""The GPU path checked on a CPU-only machine: device consistency under fake CUDA tensors (``tests/fake_cuda.py``),
checkpoint loading that does not depend on the saving process's devices, and precision chosen by the hardware."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_fake_cuda_check(name: str) -> None:
    """One check of ``tests.fake_cuda_checks`` in its own process (fake tensors can crash an interpreter's teardown)."""
    proc = subprocess.run([sys.executable, "-m", "tests.fake_cuda_checks", name], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and f"ok {name}" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.mark.parametrize("name", ["world_model_training", "mixing_is_a_runtime_error"])
def test_world_model_path_on_fake_cuda(name):
    run_fake_cuda_check(name)
