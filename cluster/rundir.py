"""Run directory layout: ``<output_dir>/<experiment>/<run_name>/``.

    config.yaml        the fully resolved config the run used (resumes check they match)
    run_id             the run's unique id (kept across resumes): the prefix of its pool weight keys and scope,
                       its metrics' run tag; creating this file (create-or-fail) is what claims the directory
    metrics/           Parquet store of per-iteration metrics (see cluster.metrics)
    tb/                TensorBoard event files
    data/<name>/       Parquet stores of run data (transitions, samples)
    checkpoints/       learner checkpoints (Ray Train storage lives here too)
    plots/             PNG figures
    summary.json       the run's result, written when it ends

Two drivers never share a directory: a default name is a timestamp plus a random suffix, made with a create-or-fail
``mkdir`` (retried under a new name), and a named run is refused when its directory is already claimed, unless
``resume=true``. Everything a run keys on the cluster derives from its ``run_id``.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.store import ParquetStore

RUN_ID_FILE = "run_id"
SUMMARY_FILE = "summary.json"  # written when a run ends (experiments.run)


class RunNameTaken(FileExistsError):
    """A run directory that another run claimed, asked for without ``resume=true``."""


def _claim(path: Path) -> bool:
    """Create ``path/run_id`` (create-or-fail: of two drivers asking at once, exactly one gets True) with the run's
    unique id, ``<experiment>/<run name>/<uid>``: unique on a cluster even when two runs share a name (two tours, two
    output dirs)."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path / RUN_ID_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{path.parent.name}/{path.name}/{uuid.uuid4().hex[:8]}\n")
    return True


def default_run_name() -> str:
    """A timestamp to the second and a short random suffix: two drivers started in the same second differ."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def claim_new_dir(base: Path, name=default_run_name, tries: int = 20) -> Path:
    """A new directory ``base/<name()>``, made with a create-or-fail mkdir: retried under a new name on a collision."""
    base.mkdir(parents=True, exist_ok=True)
    for _ in range(tries):
        path = base / name()
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"could not claim a new directory under {base} in {tries} tries")


def unfinished_runs(base: Path) -> list[Path]:
    """The runs under ``base`` that a bare ``resume=true`` could mean: claimed ones without a ``summary.json``."""
    return sorted(p for p in base.glob("*") if (p / RUN_ID_FILE).is_file() and not (p / SUMMARY_FILE).exists())


@dataclass
class RunDir:
    path: Path

    @classmethod
    def create(cls, output_dir: str | Path, experiment: str, run_name: str | None = None,
               resume: bool = False) -> "RunDir":
        """Claim the run's directory. A new run gets a fresh default name (or ``run_name``, refused when another run
        holds it); ``resume=true`` continues ``run_name``, or without a name the one unfinished run there is."""
        base = Path(output_dir).resolve() / experiment
        if resume:
            path = base / run_name if run_name is not None else cls._the_run_to_resume(base)
            if not path.is_dir():
                raise FileNotFoundError(f"resume=true but run directory {path} does not exist")
            _claim(path)  # a run from before run ids (or one killed before its claim) gets its id now
        elif run_name is None:
            path = claim_new_dir(base)
            _claim(path)
        else:
            path = base / run_name
            # a config.yaml without a run id: a run of the code before run ids were claims
            if (path / "config.yaml").exists() or not _claim(path):
                raise RunNameTaken(f"run directory {path} is already used by another run: give another run_name, "
                                   f"or add resume=true to continue that run")
        for sub in ("checkpoints", "plots", "data", "tb"):
            (path / sub).mkdir(parents=True, exist_ok=True)
        return cls(path)

    @staticmethod
    def _the_run_to_resume(base: Path) -> Path:
        runs = unfinished_runs(base)
        if len(runs) == 1:
            return runs[0]
        if not runs:
            raise FileNotFoundError(f"resume=true but there is no unfinished run under {base}: name the run to "
                                    f"continue with run_name=")
        shown = ", ".join(p.name for p in runs[:8]) + (f" and {len(runs) - 8} more" if len(runs) > 8 else "")
        raise FileNotFoundError(f"resume=true without run_name, but {len(runs)} unfinished runs under {base} could "
                                f"be meant ({shown}): add run_name=<one of them>")

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def run_id(self) -> str:
        """``<experiment>/<run name>/<uid>``, written when the directory was claimed and kept across resumes: the
        prefix of the run's pool weight keys, its pool scope and its metrics' ``run`` tag."""
        return (self.path / RUN_ID_FILE).read_text().strip()

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def learner_checkpoints(self, learner: str = "learner") -> list[Path]:
        """The checkpoint directories Ray Train kept for ``learner`` (``checkpoints/<learner>/checkpoint_*``),
        oldest first; Ray's own bookkeeping files beside them are not checkpoints."""
        root = self.checkpoints / learner
        dirs = [p for p in root.glob("checkpoint_*") if p.is_dir()] if root.is_dir() else []
        return sorted(dirs, key=lambda p: p.stat().st_mtime)

    @property
    def plots(self) -> Path:
        return self.path / "plots"

    def store(self, name: str) -> ParquetStore:
        return ParquetStore(self.path / "data" / name)

    def metrics_store(self) -> ParquetStore:
        return ParquetStore(self.path / "metrics")

    def save_config(self, config: dict[str, Any]) -> None:
        import yaml
        (self.path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def write_json(self, name: str, data: Any) -> Path:
        target = self.path / name
        target.write_text(json.dumps(data, indent=2, default=str))
        return target
