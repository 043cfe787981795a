"""What a study is made of: units (one method x seed x setting, or one chunk of a long stage), the study that lists
them, and the context a unit runs in. The runner (``runner.py``) decides what runs next; this module only describes.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

# "posthoc": a reported-seed unit of an analysis added after a declared rule gave its result (labelled so in the
# report); it runs after the declared units and the study's table is whole without it
ROLES = ("stage", "gate", "tune", "report", "posthoc")
REPORTED_SEEDS = tuple(range(10, 15))
MIN_TUNING_SEED = 100
STAGE_CALL_S = 15 * 60  # a long stage checkpoints at least this often, so a killed lane loses at most this much
_NAME = re.compile(r"^[A-Za-z0-9_.=-]+$")


class StudyError(RuntimeError):
    """A study's plan or records are inconsistent; the message is one line naming what and where."""


@dataclass(frozen=True)
class Unit:
    """One piece of a study that runs on one core in <= ~20 min and leaves one JSON record.

    ``fn`` is ``"module:function"``, called as ``function(ctx)`` in a fresh process. It returns the record's body
    (``{"metrics": ..., "curves": ...}``) or, for a ``stage`` unit only, ``None``: checkpointed, call again.
    """

    name: str
    role: str
    method: str
    seed: int | None
    fn: str
    setting: dict = field(default_factory=dict)
    after: tuple[str, ...] = ()
    est_core_s: float = 900.0

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise StudyError(f"unit name {self.name!r}: use only letters, digits and _.=-")
        if self.role not in ROLES:
            raise StudyError(f"unit {self.name}: role must be one of {ROLES}, got {self.role!r}")
        if self.role in ("report", "posthoc") and self.seed not in REPORTED_SEEDS:
            raise StudyError(f"unit {self.name}: reported seeds are {REPORTED_SEEDS[0]}-{REPORTED_SEEDS[-1]}, "
                             f"got {self.seed}")
        if self.role == "tune" and (self.seed is None or self.seed < MIN_TUNING_SEED):
            raise StudyError(f"unit {self.name}: tuning seeds are >= {MIN_TUNING_SEED}, got {self.seed}")
        if ":" not in self.fn:
            raise StudyError(f"unit {self.name}: fn must be 'module:function', got {self.fn!r}")
        json.dumps(self.setting)  # a setting goes into the record as it is

    @property
    def uses_start_model(self) -> bool:
        """Stages make the start model; every other unit starts from it and records its sha."""
        return self.role != "stage"


@dataclass(frozen=True)
class Study:
    """A named list of units, the files that make its start model, and the function that reports its records."""

    name: str
    title: str
    units: Callable[[], list[Unit]]
    start_files: Callable[[Path], list[Path]]
    report: str  # "module:function": fn(records, out_dir) -> a RESULTS.md section starting with "## "
    # records by unit -> why the study ends here (a declared rule that failed: no unit after it runs), else None
    stopped: Callable[[dict[str, dict]], str | None] | None = None
    # studies whose RESULTS.md section this one's whole table replaces (their folders and records stay)
    supersedes: tuple[str, ...] = ()

    def why_stopped(self, records: list[dict]) -> str | None:
        return self.stopped({r["unit"]: r for r in records}) if self.stopped else None

    def plan(self) -> list[Unit]:
        """The units, checked: unique names, dependencies that exist and come earlier."""
        units = self.units()
        seen: set[str] = set()
        for unit in units:
            if unit.name in seen:
                raise StudyError(f"study {self.name}: unit {unit.name} is listed twice")
            missing = [a for a in unit.after if a not in seen]
            if missing:
                raise StudyError(f"study {self.name}: unit {unit.name} runs after {missing[0]}, which is not listed "
                                 f"before it")
            seen.add(unit.name)
        return units


def measured_costs(records: list[dict]) -> dict[tuple[str, str], float]:
    """Mean CPU-s of the finished units of each (role, method): what a pending unit of that kind will cost."""
    seen: dict[tuple[str, str], list[float]] = {}
    for r in records:
        seen.setdefault((r["role"], r["method"]), []).append(r.get("cpu_s", 0.0))
    return {k: sum(v) / len(v) for k, v in seen.items()}


def expected_core_s(unit: Unit, measured: dict[tuple[str, str], float]) -> float:
    """A pending unit's CPU-s: its kind's measured mean, else its declared estimate. A method not measured yet keeps
    its estimate (another method's cost says nothing of it: lift_official's cheap SAC units had priced its LIFT units
    at a fifth), and so does a stage (one of a kind: its record's cost is not the next one's)."""
    cost = measured.get((unit.role, unit.method))
    return cost if cost is not None and unit.role != "stage" else unit.est_core_s


@dataclass
class UnitContext:
    """What a running unit sees: where its records and artifacts live, the records already made, its deadline."""

    study: str
    unit: Unit
    results_dir: Path
    work_dir: Path
    start_sha: str | None
    deadline: float
    overrides: dict = field(default_factory=dict)  # tests shrink a unit through this (fn reads ctx.size(...))

    @property
    def seed(self) -> int | None:
        return self.unit.seed

    @property
    def setting(self) -> dict:
        return self.unit.setting

    @property
    def artifacts(self) -> Path:
        return self.results_dir / "artifacts"

    def size(self, key: str, default: Any) -> Any:
        """A size knob of the unit (steps, queries, tokens), shrunk by tests through ``overrides``."""
        return self.overrides.get(key, default)

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def records(self) -> dict[str, dict]:
        from benchmarks.study.records import load_records
        return {r["unit"]: r for r in load_records(self.results_dir)}

    def save_artifact(self, relpath: str, obj: Any) -> Path:
        import torch

        from benchmarks.study.records import atomic_write_bytes
        import io
        buf = io.BytesIO()
        torch.save(obj, buf)
        return atomic_write_bytes(self.artifacts / relpath, buf.getvalue())

    def load_artifact(self, relpath: str) -> Any:
        import torch
        path = self.artifacts / relpath
        if not path.exists():
            return None
        return torch.load(path, weights_only=False, map_location="cpu")

    def write_json_artifact(self, relpath: str, obj: Any) -> Path:
        from benchmarks.study.records import atomic_write_bytes
        return atomic_write_bytes(self.artifacts / relpath, (json.dumps(obj, indent=1) + "\n").encode())

    def read_json_artifact(self, relpath: str) -> Any:
        path = self.artifacts / relpath
        return json.loads(path.read_text()) if path.exists() else None

    def progress(self, done: float, total: float, unit: str = "steps", **metrics: float) -> None:
        """One progress line on stderr: ``[study/unit] done/total unit (pct) | metrics``."""
        pct = 100.0 * done / total if total else 0.0
        tail = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
        print(f"[{self.study}/{self.unit.name}] {done:.0f}/{total:.0f} {unit} ({pct:.0f}%)"
              + (f" | {tail}" if tail else ""), file=sys.stderr, flush=True)


def threads_one() -> None:
    """One thread per unit: two lanes on two cores, and torch's default would oversubscribe them."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover
        pass
