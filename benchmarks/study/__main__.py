"""``python -m benchmarks.study <study>|all {run,status,report}`` (see ``benchmarks/study/__init__.py``)."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from benchmarks.study import STUDIES
from benchmarks.study.core import StudyError
from benchmarks.study.records import RESULTS
from benchmarks.study.runner import Paths, print_exc_line, run_lane, unit_main
from benchmarks.study.status import format_status, report, status_rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if argv[:1] == ["_unit"]:  # the lane's child process: one unit
        p = argparse.ArgumentParser(prog="benchmarks.study _unit")
        p.add_argument("study")
        p.add_argument("unit")
        p.add_argument("--results", type=Path, default=RESULTS)
        a = p.parse_args(argv[1:])
        return unit_main(a.study, a.unit, a.results)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.study", description=__doc__)
    parser.add_argument("study", help=f"{' | '.join(STUDIES)} | all (or module:ATTR)")
    parser.add_argument("action", choices=["run", "status", "report"])
    parser.add_argument("--results", type=Path, default=RESULTS, help="root of the records (default %(default)s)")
    parser.add_argument("--max-units", type=int, default=None, help="run: stop after this many finished units")
    parser.add_argument("--no-commit", action="store_true", help="run: do not git-commit finished units")
    args = parser.parse_args(argv)
    paths = Paths(args.results)
    try:
        if args.action == "run":
            return run_lane(args.study, paths, args.max_units, commit=not args.no_commit)
        if args.action == "status":
            print(format_status(status_rows(args.study, paths)))
            return 0
        for path in report(args.study, paths):
            print(f"wrote {path}")
        return 0
    except StudyError as e:
        print(f"study error: {print_exc_line(e).removeprefix('benchmarks.study.core.StudyError: ')}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
