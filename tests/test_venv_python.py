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
