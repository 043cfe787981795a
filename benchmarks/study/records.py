"""A study's records on disk: one JSON file per finished unit in ``benchmarks/studies/<study>/records/``, written atomically
(a killed unit leaves nothing half-written), with what makes a figure traceable: the start model's sha, the code's
commit, the CPU it ran on and what it cost."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "studies"  # one folder per study: its code, REPORT.md, figures, records/
REQUIRED = ("study", "unit", "role", "method", "seed", "start_sha", "metrics", "commit", "cpu", "wall_s", "cpu_s")
_CPU_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename: readers see the old file
    or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; records are read by whoever checks the study out
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_record(results_dir: Path, record: dict) -> Path:
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise ValueError(f"record of {record.get('unit')}: missing {missing}")
    text = json.dumps(record, indent=1, allow_nan=True, sort_keys=False) + "\n"
    return atomic_write_bytes(results_dir / f"{record['unit']}.json", text.encode())


def load_records(results_dir: Path) -> list[dict]:
    """Every finished unit's record (``<unit>.json``; temporary files of killed writes are skipped)."""
    if not results_dir.exists():
        return []
    out = []
    for path in sorted(results_dir.glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("unit") != path.stem:
            raise ValueError(f"{path}: names unit {record.get('unit')!r}, not {path.stem!r}")
        out.append(record)
    return out


def sha256_files(paths: list[Path]) -> str | None:
    """One sha256 over the files' names and bytes (in the given order); None while any is missing."""
    if not paths or not all(p.exists() for p in paths):
        return None
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def cpu_info() -> dict:
    """The CPU's model name and the flags that change a run's floating-point path or speed."""
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("unknown", "", platform.machine()):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags |= set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {"model": model, "flags": [f for f in _CPU_FLAGS if f in flags], "cores": os.cpu_count()}


def git_commit() -> str:
    """HEAD's sha, with ``+dirty`` when the code under the record differs from it (results files excluded)."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                ":(exclude,glob)benchmarks/studies/**/records/**", ":(exclude,glob)benchmarks/studies/**/REPORT.md",
                ":(exclude,glob)benchmarks/studies/**/*.png")
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
