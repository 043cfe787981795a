"""A row of the device tier: its outcome ("ok", "FAIL" or "not run"), its one-line figure, and the table of rows."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

OK, FAIL, NOT_RUN = "ok", "FAIL", "not run"


class NotRun(Exception):
    """Raised inside a row's check when the row cannot run here; the message says why (never an "ok")."""


@dataclass
class Row:
    name: str
    status: str  # OK, FAIL or NOT_RUN
    line: str  # what was checked and the figure (or why it did not run), one line
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == OK

    def __str__(self) -> str:
        return f"[gpu] {self.status:7s} {self.name}: {self.line} ({self.wall_s:.1f} s)"


def run_row(name: str, check: Callable[[], tuple[bool, str]]) -> Row:
    """Run one check: (passed, figure) is its outcome; ``NotRun`` says it could not run; any other exception is the
    row's failure, its type and message the figure (so one broken row never hides the others)."""
    start = time.perf_counter()
    try:
        passed, line = check()
        status = OK if passed else FAIL
    except NotRun as why:
        status, line = NOT_RUN, str(why)
    except Exception as err:  # noqa: BLE001 - every failure is reported as this row's
        status, line = FAIL, f"raised {type(err).__name__}: {err}"[:400]
    return Row(name, status, line.replace("|", "/").replace("\n", " "), round(time.perf_counter() - start, 1))


def table(rows: list[Row]) -> str:
    lines = ["| row | status | what it checked, the figure | s |", "|---|---|---|---|"]
    return "\n".join(lines + [f"| {r.name} | {r.status} | {r.line} | {r.wall_s} |" for r in rows]) + "\n"
