"""The whole suite on both cores: ``.venv/bin/python -m tests`` (what CI runs, through ``.ci/run``).

The suite runs as three pytest processes side by side (markers from tests/conftest.py): the tests on the embedded
session Ray cluster, all the others (unit and learning tests, and those that start their own ``ray start`` nodes), and
the modules of ``THIRD_LANE_MODULES`` (tests/conftest.py; a session cluster of their own where a test needs one).
Cluster tests spend much of their time waiting on Ray (actors starting, checkpoints registering): with two processes
a third of both cores stayed idle. The three selections are complements, so together they are exactly
``pytest tests``; all must pass. With arguments, ``python -m tests ARGS`` is one plain ``pytest ARGS`` (e.g.
``-m "not slow"``, the fast tier). Keep ``.cache/`` between runs to skip training the tiny AttnRL SFT model.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ON_SESSION_CLUSTER = "(cluster and not nodes)"
LANES = (("the tests on the session cluster", f"{ON_SESSION_CLUSTER} and not third_lane"),
         ("all other tests", f"not {ON_SESSION_CLUSTER} and not third_lane"),
         ("the third lane (tests/conftest.py THIRD_LANE_MODULES)", "third_lane"))


def main(argv: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    if argv:
        return subprocess.call([*pytest, *argv], cwd=ROOT)
    (name, marks), others = LANES[0], LANES[1:]
    logs = [tempfile.TemporaryFile("w+") for _ in others]
    procs = [subprocess.Popen([*pytest, "-q", "--durations=10", "-m", m, "tests"], cwd=ROOT, stdout=log,
                              stderr=subprocess.STDOUT) for (_, m), log in zip(others, logs)]
    print(f"=== {name} (-m '{marks}'); the other {len(others)} lanes run beside it ===", flush=True)
    codes = [subprocess.call([*pytest, "-q", "--durations=10", "-m", marks, "tests"], cwd=ROOT)]
    for (other, m), proc, log in zip(others, procs, logs):
        codes.append(proc.wait())
        log.seek(0)
        print(f"\n=== {other} (-m '{m}') ===", flush=True)
        sys.stdout.write(log.read())
        log.close()
    print("; ".join(f"{lane}: exit {code}" for (lane, _), code in zip(LANES, codes)), flush=True)
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main(sys.argv[1:]))
