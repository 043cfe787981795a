"""Run directory layout: ``<output_dir>/<experiment>/<run_name>/``.

    config.yaml        the fully resolved config the run used (resumes check they match)
    run_id             the run's unique id (kept across resumes): the prefix of its pool weight keys and scope
    metrics/           Parquet store of per-iteration metrics (see cluster.metrics)
    tb/                TensorBoard event files
    data/<name>/       Parquet stores of run data (transitions, samples)
    checkpoints/       learner checkpoints (Ray Train storage lives here too)
    plots/             PNG figures
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.store import ParquetStore


@dataclass
class RunDir:
    path: Path

    @classmethod
    def create(cls, output_dir: str | Path, experiment: str, run_name: str | None = None,
               resume: bool = False) -> "RunDir":
        base = Path(output_dir).resolve() / experiment
        if run_name is None and resume:
            runs = sorted((p for p in base.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
            if not runs:
                raise FileNotFoundError(f"resume=true but there is no earlier run under {base}")
            run_name = runs[-1].name
        if run_name is None:
            run_name = time.strftime("%Y%m%d-%H%M%S")
        path = base / run_name
        if resume and not path.exists():
            raise FileNotFoundError(f"resume=true but run directory {path} does not exist")
        for sub in ("checkpoints", "plots", "data", "tb"):
            (path / sub).mkdir(parents=True, exist_ok=True)
        return cls(path)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def run_id(self) -> str:
        """``<experiment>/<run name>/<uid>``: unique on a cluster even when two runs share a name (two tours, two
        output dirs), and the same when the run is resumed."""
        path = self.path / "run_id"
        if not path.exists():
            path.write_text(f"{self.path.parent.name}/{self.name}/{uuid.uuid4().hex[:8]}\n")
        return path.read_text().strip()

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
