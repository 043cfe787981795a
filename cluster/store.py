"""Append-only Arrow/Parquet storage for transitions, samples and metrics.

A store is a directory of numbered Parquet files (``part-000000.parquet``, ...), one per appended chunk. Each chunk
is written to a temporary name, fsynced and then renamed, so a crash mid-write leaves at most a stray ``.tmp``
file that readers ignore: earlier chunks are never touched. Multi-dimensional columns are stored flattened as
fixed-size lists; their shapes live in the schema metadata so they read back as the arrays that went in.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

_PART = re.compile(r"^part-(\d{6})\.parquet$")
_SHAPES = b"orrery.shapes"


def _to_table(data: Mapping[str, Any] | pa.Table) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    columns, shapes, n = {}, {}, None
    for name, value in data.items():
        if hasattr(value, "detach"):  # torch tensor, without importing torch here
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray):
            rows = value.shape[0] if value.ndim else 1
            if value.ndim > 1:
                shapes[name] = list(value.shape[1:])
                flat = value.reshape(rows, -1)
                columns[name] = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])
            else:
                columns[name] = pa.array(np.atleast_1d(value))
        else:
            columns[name] = pa.array(list(value))
            rows = len(columns[name])
        if n is not None and rows != n:
            raise ValueError(f"column {name!r} has {rows} rows, expected {n} like the columns before it")
        n = rows
    table = pa.table(columns)
    if shapes:
        table = table.replace_schema_metadata({_SHAPES: json.dumps(shapes).encode()})
    return table


class ParquetStore:
    """``append`` chunks, ``read`` them back as one table, ``to_numpy``/``to_torch`` with original shapes."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def parts(self) -> list[Path]:
        return sorted(p for p in self.path.iterdir() if _PART.match(p.name))

    def __len__(self) -> int:
        return sum(pq.ParquetFile(p).metadata.num_rows for p in self.parts())

    @property
    def num_parts(self) -> int:
        return len(self.parts())

    def append(self, data: Mapping[str, Any] | pa.Table) -> Path:
        table = _to_table(data)
        parts = self.parts()
        index = int(_PART.match(parts[-1].name).group(1)) + 1 if parts else 0
        final = self.path / f"part-{index:06d}.parquet"
        tmp = self.path / f".part-{index:06d}.parquet.tmp"
        pq.write_table(table, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        return final

    def rollback(self, num_parts: int) -> int:
        """Delete chunks after the first ``num_parts`` (resume from a checkpoint without duplicating data)."""
        removed = 0
        for p in self.parts()[num_parts:]:
            p.unlink()
            removed += 1
        for tmp in self.path.glob(".part-*.tmp"):
            tmp.unlink()
        return removed

    def read(self, columns: list[str] | None = None) -> pa.Table:
        parts = self.parts()
        if not parts:
            raise FileNotFoundError(f"no data in store {self.path}")
        tables = [pq.read_table(p, columns=columns) for p in parts]
        return pa.concat_tables(tables, promote_options="default")

    def to_numpy(self, columns: list[str] | None = None) -> dict[str, np.ndarray]:
        table = self.read(columns)
        meta = table.schema.metadata or {}
        shapes = json.loads(meta.get(_SHAPES, b"{}"))
        if not shapes and self.parts():  # metadata of the first chunk survives concat only sometimes
            first = pq.read_schema(self.parts()[0]).metadata or {}
            shapes = json.loads(first.get(_SHAPES, b"{}"))
        out: dict[str, np.ndarray] = {}
        for name in table.column_names:
            col = table.column(name).combine_chunks()
            if pa.types.is_fixed_size_list(col.type):
                flat = col.flatten().to_numpy(zero_copy_only=False)
                out[name] = flat.reshape(len(col), *shapes.get(name, [col.type.list_size]))
            else:
                out[name] = col.to_numpy(zero_copy_only=False)
        return out

    def to_torch(self, columns: list[str] | None = None, device: str = "cpu") -> dict[str, Any]:
        import torch
        return {k: torch.as_tensor(np.array(v, copy=True), device=device)
                for k, v in self.to_numpy(columns).items() if v.dtype != object}
