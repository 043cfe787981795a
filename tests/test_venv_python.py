"""experiments/venv.py under another Python: ORRERY_VENV names its folder, and a venv made by another Python version
is refused before anything is installed into it (3.12 packages in CI's 3.11 .venv would break it)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from experiments.venv import venv_python_version

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_a_venv_was_made_with_is_read_from_its_cfg(tmp_path):
    assert venv_python_version(tmp_path) is None
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.12.1\n")
    assert venv_python_version(tmp_path) == "3.12"
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\nversion_info = 3.13.0.final.0\n")
    assert venv_python_version(tmp_path) == "3.13"


def test_a_venv_of_another_python_is_refused_untouched(tmp_path):
    other = "3.9" if sys.version_info[:2] != (3, 9) else "3.8"
    venv_dir = tmp_path / "venv-other"
    venv_dir.mkdir()
    (venv_dir / "pyvenv.cfg").write_text(f"home = /usr/bin\nversion = {other}.1\n")
    env = {**os.environ, "ORRERY_VENV": str(venv_dir)}
    done = subprocess.run([sys.executable, "-m", "experiments.venv"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert f"made with Python {other}" in done.stderr and "ORRERY_VENV" in done.stderr, done.stderr
    assert sorted(p.name for p in venv_dir.iterdir()) == ["pyvenv.cfg"]  # nothing created or installed


def _pins() -> list[str]:
    from experiments.venv import CONSTRAINTS
    return [ln for ln in CONSTRAINTS.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _constraints_of(step: list[str]) -> list[str] | None:
    if "-c" not in step:
        return None
    path = Path(step[step.index("-c") + 1])
    return [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_a_gpu_node_installs_everything_but_its_torch_under_the_pins(tmp_path):
    """GPU nodes (ORRERY_TORCH/ORRERY_TORCH_INDEX) keep every pin of the constraints but torch's: reverting the
    pins in use to the CPU build's only (the bug of issue 39 #5) leaves their packages unpinned and this fails."""
    from experiments.venv import install_steps
    without_torch = [ln for ln in _pins() if not ln.startswith("torch==")]
    assert len(without_torch) == len(_pins()) - 1
    for torch_req, index in (("torch==2.13.0", "https://download.pytorch.org/whl/cu126"), ("torch>=2.11", "")):
        steps = install_steps(torch_req, index, tmp_path)
        assert [s for s in steps if torch_req in s] == [steps[0]]
        for step in steps[1:] + ([steps[0]] if not index else []):
            assert _constraints_of(step) == without_torch, (torch_req, index, step)
        if index:  # the torch index hosts torch's dependencies at its own versions: that one step is unpinned
            assert "-c" not in steps[0] and steps[0][-2:] == ["--index-url", index]
    for step in install_steps("torch==2.13.0", "", tmp_path):  # the CPU build: every pin, torch's too
        assert _constraints_of(step) == _pins()


def test_ensure_venv_installs_exactly_those_steps(tmp_path, monkeypatch):
    """What ``python3 -m experiments.venv`` runs on a GPU node is ``install_steps``' list, step by step."""
    from experiments import venv as venv_module
    venv_dir = tmp_path / "venv"
    (venv_dir / "bin").mkdir(parents=True)
    (venv_dir / "bin" / "python").write_text("")  # an existing venv: nothing is created
    monkeypatch.setattr(venv_module, "VENV", venv_dir)
    monkeypatch.setattr(venv_module, "STAMP", venv_dir / ".orrery-stamp")
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(venv_module, "_installer", lambda: lambda *args: calls.append(args))
    monkeypatch.setenv("ORRERY_TORCH", "torch==2.13.0")
    monkeypatch.setenv("ORRERY_TORCH_INDEX", "https://download.pytorch.org/whl/cu126")
    venv_module.ensure_venv()
    want = venv_module.install_steps("torch==2.13.0", "https://download.pytorch.org/whl/cu126", venv_dir)
    assert [list(c) for c in calls] == want and all(_constraints_of(list(c)) for c in calls[1:])
