"""The whole suite on both cores: ``.venv/bin/python -m tests`` (what CI runs, through ``.ci/run``).

Most tests keep one core busy, so the suite runs as two pytest processes side by side (markers from conftest.py):
the tests on the embedded session Ray cluster (``-m "cluster and not nodes"``) with a few CPU-bound modules that
balance the two (``first_lane``, tests/conftest.py), and all the others, unit and learning tests and those that start
their own ``ray start`` nodes. The two selections are complements, so together they are exactly ``pytest tests``; both must pass. With arguments, ``python -m tests ARGS``
is one plain ``pytest ARGS`` (e.g. ``-m "not slow"``, the fast tier). Keep ``.cache/`` between runs to skip training
the tiny AttnRL SFT model.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST = "(cluster and not nodes) or first_lane"
LANES = (("the tests on the session cluster (and first_lane)", FIRST),
         ("all other tests", f"not ({FIRST})"))


def main(argv: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    if argv:
        return subprocess.call([*pytest, *argv], cwd=ROOT)
    with tempfile.TemporaryFile("w+") as other_log:
        other = subprocess.Popen([*pytest, "-q", "--durations=10", "-m", LANES[1][1], "tests"], cwd=ROOT,
                                 stdout=other_log, stderr=subprocess.STDOUT)
        print(f"=== {LANES[0][0]} (-m '{LANES[0][1]}'); {LANES[1][0]} run beside them ===", flush=True)
        first = subprocess.call([*pytest, "-q", "--durations=10", "-m", LANES[0][1], "tests"], cwd=ROOT)
        second = other.wait()
        other_log.seek(0)
        print(f"\n=== {LANES[1][0]} (-m '{LANES[1][1]}') ===", flush=True)
        sys.stdout.write(other_log.read())
    print(f"{LANES[0][0]}: exit {first}; {LANES[1][0]}: exit {second}", flush=True)
    return first or second


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main(sys.argv[1:]))
