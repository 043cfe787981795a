"""Create (or refresh) the project's virtual environment at ``.venv`` using only the standard library.

    python3 -m experiments.venv            # then .venv/bin/python -m experiments.run / -m pytest

CPU machines get ``torch==2.13.0`` installed first (a local CPU build; a bare ``torch`` requirement would pull a
multi-GB CUDA build), and every package at the exact version of ``constraints-cpu.txt``, so two fresh machines get the
same environment. GPU nodes set ``ORRERY_TORCH`` to the torch requirement they want, e.g.
``ORRERY_TORCH="torch==2.13.0" ORRERY_TORCH_INDEX=https://download.pytorch.org/whl/cu126``; they keep every other pin
of the constraints (only torch's own line, made for the CPU build, gives way), so GPU and CPU nodes run the same Ray,
numpy and transformers (torch's index installs torch and what it needs; the package step then applies the pins).
The environment is rebuilt only when ``pyproject.toml``, the constraints or the torch choice change (a stamp file
records them). Packages go in with uv when uv can be installed (the same pinned
versions from the same sources pip is configured with, ~30 s instead of ~90 s on a 2-core machine), else with pip.

Another Python: the interpreter that runs this module is the venv's, and ``ORRERY_VENV`` names the folder (relative to
the repo root, default ``.venv``), so other versions get their own environment beside CI's, e.g.

    ORRERY_VENV=.venv312 python3.12 -m experiments.venv    # what .ci/run-py312 does, then the fast tier

A venv made by another Python version is refused, not rebuilt over. The CPU pin ``torch==2.13.0`` is the local
``+cpu`` build only for CPython 3.11 (``/opt/wheels``); for 3.12 and 3.13 it resolves to PyPI's ``torch==2.13.0``, the
CUDA 13 build with its ~3 GB of CUDA libraries, which runs on a CPU like the CPU build (where the PyTorch index is
reachable, ``ORRERY_TORCH_INDEX=https://download.pytorch.org/whl/cpu`` gets the small CPU build instead).
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import venv
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
# The folder of the environment; CI's is .venv, another Python's goes beside it (ORRERY_VENV=.venv312)
VENV = ROOT / os.environ.get("ORRERY_VENV", ".venv")
STAMP = VENV / ".orrery-stamp"
CONSTRAINTS = ROOT / "constraints-cpu.txt"
CPU_TORCH = "torch==2.13.0"


def _python() -> Path:
    return VENV / "bin" / "python"


def _pip(*args: str) -> None:
    cmd = [str(_python()), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def _pip_config() -> list[str]:
    """pip's configured package sources and constraints (pip.conf, PIP_* variables) as uv options, so uv installs
    from where pip would (a machine's local wheel folders and mirrors) under the same caps."""
    out = subprocess.run([str(_python()), "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    options = []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name, value = key.rsplit(".", 1)[-1], value.strip().strip("'\"")
        flag = {"find-links": "--find-links", "extra-index-url": "--extra-index-url", "index-url": "--index-url",
                "constraint": "-c"}.get(name)
        for item in value.split() if flag else ():
            local = item.removeprefix("file://")
            if item.startswith(("http://", "https://")) or Path(local).exists():
                options += [flag, item]
    return options


def _installer() -> Callable[..., None]:
    """uv when it can be had (installs in seconds what pip takes a minute and a half for), else pip."""
    uv = VENV / "bin" / "uv"
    if not uv.exists():
        try:
            _pip("uv")
        except subprocess.CalledProcessError:
            print("uv is not installable here: installing with pip", flush=True)
            return _pip
    sources = _pip_config()

    def install(*args: str) -> None:
        # pip takes the best version over all its indexes; uv's default takes the first index that has the package
        # and pip compiles bytecode at install; uv does not, and where PYTHONDONTWRITEBYTECODE is set every process
        # would then compile its imports from source (a test suite twice as slow)
        cmd = [str(uv), "pip", "install", "-q", "--python", str(_python()), "--index-strategy", "unsafe-best-match",
               "--compile-bytecode", *sources, *args]
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            print("uv failed: installing with pip", flush=True)
            _pip(*args)
    return install


def _wanted_stamp(torch_req: str, index: str) -> str:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + CONSTRAINTS.read_bytes()).hexdigest()
    return f"{digest} {torch_req} {index}".strip()  # stored stripped: an empty index must not leave a space


def _requirement_name(line: str) -> str:
    return re.split(r"[\s=<>!~;\[]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")


def constraint_lines(torch_req: str, index: str) -> list[str]:
    """The pins to install under: all of ``constraints-cpu.txt`` for the CPU build; for a GPU node's own torch
    (``ORRERY_TORCH``/``ORRERY_TORCH_INDEX``) all of them but torch's, which that choice replaces."""
    lines = [ln for ln in CONSTRAINTS.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if torch_req == CPU_TORCH and not index:
        return lines
    return [ln for ln in lines if _requirement_name(ln) != "torch"]


def _constraints_file(torch_req: str, index: str, venv_dir: Path | None = None) -> Path:
    if torch_req == CPU_TORCH and not index:
        return CONSTRAINTS
    path = (venv_dir or VENV) / "constraints-gpu.txt"
    path.write_text("\n".join(constraint_lines(torch_req, index)) + "\n")
    return path


def install_steps(torch_req: str, index: str, venv_dir: Path | None = None) -> list[list[str]]:
    """The installer's arguments, step by step: torch, then orrery with its extras, then molsets. Every step is
    pinned by the constraints in use (for a GPU node's own torch, all of them but torch's: ``constraint_lines``),
    except the torch step from a torch index, which hosts torch's dependencies at its own versions only (the next
    step moves them to the pins from PyPI)."""
    pinned = ["-c", str(_constraints_file(torch_req, index, venv_dir))]
    return [[*(pinned if not index else []), torch_req, *(["--index-url", index] if index else [])],
            [*pinned, "-e", ".[test,bench]"],
            # molsets pins ancient dependencies; it only ships the MOSES SMILES we read: install it without them
            [*pinned, "--no-deps", "molsets==0.3.1"]]


def venv_python_version(venv_dir: Path) -> str | None:
    """The ``major.minor`` of the Python a venv was made with (its ``pyvenv.cfg``), None where there is none."""
    cfg = venv_dir / "pyvenv.cfg"
    if not cfg.exists():
        return None
    for line in cfg.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version", "version_info"):
            return ".".join(value.strip().split(".")[:2])
    return None


def ensure_venv() -> Path:
    torch_req = os.environ.get("ORRERY_TORCH", CPU_TORCH)
    index = os.environ.get("ORRERY_TORCH_INDEX", "")
    made_with, running = venv_python_version(VENV), f"{sys.version_info.major}.{sys.version_info.minor}"
    if made_with is not None and made_with != running:
        # installing 3.12 packages into a 3.11 venv would break it; the other version gets its own folder
        raise SystemExit(f"{VENV} was made with Python {made_with}, this is {running}: set ORRERY_VENV to another "
                         f"folder (e.g. ORRERY_VENV=.venv{running.replace('.', '')}) or remove {VENV}")
    wanted = _wanted_stamp(torch_req, index)
    if _python().exists() and STAMP.exists() and STAMP.read_text().strip() == wanted:
        return _python()
    if not _python().exists():
        print(f"creating virtual environment {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    install = _installer()
    for args in install_steps(torch_req, index):
        install(*args)
    STAMP.write_text(wanted + "\n")
    return _python()


if __name__ == "__main__":
    try:
        print(f"virtual environment ready: {ensure_venv()}", flush=True)
    except subprocess.CalledProcessError as err:
        sys.exit(f"setup failed: {' '.join(map(str, err.cmd))} exited with {err.returncode}")
