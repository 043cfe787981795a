"""What this study reuses from ecit_beyond (issue 42): its null rows (kci and kci_lp subset p-values of the E-CIT
study's null datasets at n = 4000, 16000, 64000) and its Sachs PC graphs. Read from its records, never rerun; reused
only where its settings are this study's (checked by :func:`reuse_settings`).

Only ecit_beyond's records are read here, not its code (which moved from ``benchmarks/study/ecit_beyond.py`` into
``benchmarks/studies/ecit_beyond/`` during this session); the data helpers both use are ``benchmarks.study.ecit_data``.
"""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.study.core import StudyError
from benchmarks.study.records import RESULTS, load_records

BEYOND = "ecit_beyond"


def beyond_dir(study_root: Path | None = None) -> Path:
    """ecit_beyond's records beside this study's (``<root>/ecit_beyond/records``), else the repository's."""
    if study_root is not None:
        local = Path(study_root) / BEYOND / "records"
        if local.exists():
            return local
    return RESULTS / BEYOND / "records"


def beyond_design(study_root: Path | None = None) -> dict:
    path = beyond_dir(study_root) / "artifacts" / "design.json"
    if not path.exists():
        raise StudyError(f"ecit_power: ecit_beyond's design is not at {path}; its null rows cannot be reused")
    return json.loads(path.read_text())


def beyond_records(study_root: Path | None = None) -> list[dict]:
    return load_records(beyond_dir(study_root))


def reuse_settings(study_root: Path | None, data: dict, m: int, combiner: tuple, tuned: str,
                   nulls: dict[int, int]) -> dict:
    """ecit_beyond's null-row settings, checked against this study's: the same triplet design, subset size and tuned
    combiner, and ``nulls[n]`` null datasets per seed in every ``typei-n<n>`` record (one-line error otherwise)."""
    d = beyond_design(study_root)
    want = {"data": data, "m": m, "tuned": tuned}
    for key, value in want.items():
        if d.get(key) != value:
            raise StudyError(f"ecit_power: ecit_beyond's {key} is {d.get(key)!r}, this study's {value!r}; its null "
                             "rows are another design's")
    if tuple(d["combiners"][tuned]) != tuple(combiner):
        raise StudyError(f"ecit_power: ecit_beyond's {tuned} is {d['combiners'][tuned]}, not {list(combiner)}")
    seeds: dict[str, list[int]] = {}
    for r in beyond_records(study_root):
        if not r["unit"].startswith("typei-"):
            continue
        n = int(r["n"])
        if n in nulls and len(r["tests"]["kci"]["null"]) != nulls[n]:
            raise StudyError(f"ecit_power: {r['unit']} has {len(r['tests']['kci']['null'])} null datasets, "
                             f"the design expects {nulls[n]}")
        seeds.setdefault(str(n), []).append(int(r["seed"]))
    return {"design_sha_of_beyond_records": sorted({r.get("start_sha") or "" for r in beyond_records(study_root)
                                                    if r["role"] != "stage"}),
            "null_seeds": {n: sorted(s) for n, s in seeds.items()}, "nulls_per_seed": {str(n): c for n, c in
                                                                                      nulls.items()}}


def beyond_nulls(study_root: Path | None = None) -> dict[int, list[dict]]:
    """n -> ecit_beyond's typei records at n (their ``tests[sub]['null']`` hold the subset p-values)."""
    out: dict[int, list[dict]] = {}
    for r in beyond_records(study_root):
        if r["unit"].startswith("typei-"):
            out.setdefault(int(r["n"]), []).append(r)
    return out


def beyond_sachs(study_root: Path | None = None) -> list[dict]:
    """ecit_beyond's Sachs records that hold a PC graph (those that fit in their budget)."""
    return [r for r in beyond_records(study_root) if r["unit"].startswith("sachs-") and r.get("graph") is not None]
