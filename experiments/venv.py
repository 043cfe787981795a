"""Create (or refresh) the project's virtual environment at ``.venv`` using only the standard library.

    python3 -m experiments.venv            # then .venv/bin/python -m experiments.run / -m pytest

CPU machines get ``torch==2.13.0`` installed first (a local CPU build; a bare ``torch`` requirement would pull a
multi-GB CUDA build), and every package at the exact version of ``constraints-cpu.txt``, so two fresh machines get the
same environment. GPU nodes set ``ORRERY_TORCH`` to the torch requirement they want, e.g.
``ORRERY_TORCH="torch==2.13.0" ORRERY_TORCH_INDEX=https://download.pytorch.org/whl/cu126`` (then the constraints, made
for the CPU build, are not applied). The environment is rebuilt only when ``pyproject.toml``, the constraints or the
torch choice change (a stamp file records them).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
STAMP = VENV / ".orrery-stamp"
CONSTRAINTS = ROOT / "constraints-cpu.txt"
CPU_TORCH = "torch==2.13.0"


def _python() -> Path:
    return VENV / "bin" / "python"


def _pip(*args: str) -> None:
    cmd = [str(_python()), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def _wanted_stamp(torch_req: str, index: str) -> str:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + CONSTRAINTS.read_bytes()).hexdigest()
    return f"{digest} {torch_req} {index}"


def ensure_venv() -> Path:
    torch_req = os.environ.get("ORRERY_TORCH", CPU_TORCH)
    index = os.environ.get("ORRERY_TORCH_INDEX", "")
    wanted = _wanted_stamp(torch_req, index)
    if _python().exists() and STAMP.exists() and STAMP.read_text().strip() == wanted:
        return _python()
    if not _python().exists():
        print(f"creating virtual environment {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    pinned = ["-c", str(CONSTRAINTS)] if torch_req == CPU_TORCH and not index else []
    _pip(*pinned, torch_req, *(["--index-url", index] if index else []))
    _pip(*pinned, "-e", ".[test,bench]")
    # molsets pins ancient dependencies; it only ships the MOSES SMILES we read, so install it without them.
    _pip(*pinned, "--no-deps", "molsets==0.3.1")
    STAMP.write_text(wanted + "\n")
    return _python()


if __name__ == "__main__":
    try:
        print(f"virtual environment ready: {ensure_venv()}", flush=True)
    except subprocess.CalledProcessError as err:
        sys.exit(f"setup failed: {' '.join(map(str, err.cmd))} exited with {err.returncode}")
