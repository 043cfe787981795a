"""A local filesystem for Tune's storage on which every file is written whole or not at all.

Tune writes its sweep state (experiment state, search-algorithm state, trial checkpoints) in the driver's staging
folder and then copies it into the sweep's storage file by file, overwriting the previous copy in place. A driver
killed during that copy (a preempted machine, a Ctrl-C at the wrong moment) leaves a truncated state file, from which
Tune cannot restore. Given this filesystem as ``storage_filesystem``, each copied file goes to a hidden partial file
beside its target and is renamed over the target only when complete, so a kill leaves the previous whole version.
Renames within one directory are atomic on local disks and on NFS, which a multi-node cluster shares.
"""
from __future__ import annotations

import io
import os
import tempfile
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

PARTIAL_SUFFIX = ".partial"


class _WholeFileWriter(io.RawIOBase):
    """Writes to a hidden partial file; ``close`` makes it the target. A writer that never closes (its process was
    killed) leaves the target as it was."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        directory, name = os.path.split(path)
        fd, self.partial = tempfile.mkstemp(prefix=f".{name}.", suffix=PARTIAL_SUFFIX, dir=directory or ".")
        self._file = os.fdopen(fd, "wb")

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return self._file.write(data)

    def tell(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()

    def close(self) -> None:
        if not self.closed:
            try:
                self._file.flush()
                os.fsync(self._file.fileno())  # the data is on disk before the name points at it
                self._file.close()
                os.replace(self.partial, self.path)
            finally:
                if os.path.exists(self.partial):
                    os.unlink(self.partial)
        super().close()

    def __del__(self) -> None:
        # Dropped without close: the copy failed part-way (pyarrow returns early without closing). Not the target.
        if not self.closed:
            self._file.close()
            if os.path.exists(self.partial):
                os.unlink(self.partial)
            io.RawIOBase.close(self)


class WholeFilesHandler(pafs.FileSystemHandler):
    """pyarrow's local filesystem, except that files opened for writing (and copies) appear only when complete."""

    def __init__(self) -> None:
        self._local = pafs.LocalFileSystem()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WholeFilesHandler)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __reduce__(self):  # Tune ships the storage filesystem to every trial actor
        return WholeFilesHandler, ()

    def get_type_name(self) -> str:
        return "orrery-whole-files"

    def normalize_path(self, path: str) -> str:
        return self._local.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self._local.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self._local.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self._local.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self._local.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("refusing to delete the contents of / (orrery whole-files storage)")

    def delete_file(self, path: str) -> None:
        self._local.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self._local.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        with self._local.open_input_stream(src) as source, self.open_output_stream(dest, None) as target:
            while chunk := source.read(1 << 20):
                target.write(chunk)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self._local.open_input_stream(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self._local.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return pa.PythonFile(_WholeFileWriter(path), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return self._local.open_append_stream(path)


def whole_files_filesystem() -> pafs.FileSystem:
    """The filesystem to give Tune as ``storage_filesystem`` (paths given with it must be absolute)."""
    return pafs.PyFileSystem(WholeFilesHandler())
