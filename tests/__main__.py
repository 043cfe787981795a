"""The whole suite on both cores: ``.venv/bin/python -m tests`` (what CI runs, through ``.ci/run``).

Most tests keep one core busy, so the suite runs as two pytest processes side by side (markers from conftest.py):
the tests on the embedded session Ray cluster (``-m "cluster and not nodes"``), and all the others, unit and learning
tests and those that start their own ``ray start`` nodes (``-m "not cluster or nodes"``). The two selections are
complements, so together they are exactly ``pytest tests``; both must pass. With arguments, ``python -m tests ARGS``
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
# Each test belongs to exactly one lane (the three expressions partition every marker combination).
LANES = (("the tests on the session cluster", "cluster and not nodes and not second_session"),
         ("the tests that start their own ray nodes", "nodes"),
         ("unit and learning tests, and LIFT's cluster tests on a second session cluster",
          "not nodes and (not cluster or second_session)"))


def main(argv: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    if argv:
        return subprocess.call([*pytest, *argv], cwd=ROOT)
    logs = [tempfile.TemporaryFile("w+") for _ in LANES[1:]]
    others = [subprocess.Popen([*pytest, "-q", "--durations=10", "-m", expr, "tests"], cwd=ROOT, stdout=log,
                               stderr=subprocess.STDOUT) for (_, expr), log in zip(LANES[1:], logs)]
    print(f"=== {LANES[0][0]} (-m '{LANES[0][1]}'); the other lanes run beside them ===", flush=True)
    codes = [subprocess.call([*pytest, "-q", "--durations=10", "-m", LANES[0][1], "tests"], cwd=ROOT)]
    for (name, expr), proc, log in zip(LANES[1:], others, logs):
        codes.append(proc.wait())
        log.seek(0)
        print(f"\n=== {name} (-m '{expr}') ===", flush=True)
        sys.stdout.write(log.read())
        log.close()
    print("; ".join(f"{name}: exit {code}" for (name, _), code in zip(LANES, codes)), flush=True)
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main(sys.argv[1:]))
