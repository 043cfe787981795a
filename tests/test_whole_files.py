"""The storage filesystem of sweeps: a writer killed mid-file leaves the previous whole file (pyarrow's local
filesystem, the control, leaves a truncated one), a finished copy is byte for byte, and the filesystem survives the
pickling that ships it to Tune's trial actors."""
from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs

from cluster.whole_files import whole_files_filesystem

ROOT = Path(__file__).resolve().parents[1]

KILLED_WRITER = """
import os, signal, sys
import pyarrow.fs as pafs
from cluster.whole_files import whole_files_filesystem
fs = whole_files_filesystem() if sys.argv[2] == "whole" else pafs.LocalFileSystem()
stream = fs.open_output_stream(sys.argv[1])
stream.write(b'{"trial_data": [' + b"1, " * 100_000)
stream.flush()
os.kill(os.getpid(), signal.SIGKILL)  # as a preempted driver: no close, no cleanup
"""


def _killed_while_writing(target: Path, filesystem: str) -> bytes:
    target.write_bytes(b'{"trial_data": []}')
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(target), filesystem], cwd=ROOT,
                          capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    return target.read_bytes()


def test_a_writer_killed_mid_file_leaves_the_previous_whole_file(tmp_path):
    assert _killed_while_writing(tmp_path / "experiment_state.json", "whole") == b'{"trial_data": []}'
    control = _killed_while_writing(tmp_path / "control.json", "local")
    assert control.startswith(b'{"trial_data": [1, ') and not control.endswith(b"]}"), "the hazard it guards against"


def test_a_copied_tree_arrives_byte_for_byte_and_nothing_else(tmp_path):
    source, target = tmp_path / "staging", tmp_path / "storage"
    (source / "trial_0" / "checkpoint_000001").mkdir(parents=True)
    files = {"experiment_state-1.json": b"{}" * 3000, "tuner.pkl": bytes(range(256)) * 40,
             "trial_0/checkpoint_000001/state.json": b'{"step": 4}', "trial_0/result.json": b""}
    for name, data in files.items():
        (source / name).write_bytes(data)
    target.mkdir()
    (target / "tuner.pkl").write_bytes(b"an older version")
    pafs.copy_files(str(source), str(target), destination_filesystem=whole_files_filesystem(), chunk_size=1000)
    copied = {str(p.relative_to(target)): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    assert copied == files  # no partial files left beside them


def test_the_filesystem_survives_pickling_and_copies_single_files(tmp_path):
    fs = pickle.loads(pickle.dumps(whole_files_filesystem()))
    assert fs.equals(whole_files_filesystem())
    (tmp_path / "a").write_bytes(b"x" * 5_000_000)
    fs.copy_file(str(tmp_path / "a"), str(tmp_path / "b"))
    assert (tmp_path / "b").read_bytes() == b"x" * 5_000_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_a_stream_dropped_without_close_publishes_nothing(tmp_path):
    """pyarrow returns early from a failed copy without closing its output stream: that is not a finished file."""
    import gc
    target = tmp_path / "tuner.pkl"
    target.write_bytes(b"whole")
    stream = whole_files_filesystem().open_output_stream(str(target))
    stream.write(b"half of a new vers")
    del stream
    gc.collect()
    assert target.read_bytes() == b"whole" and [p.name for p in tmp_path.iterdir()] == ["tuner.pkl"]
