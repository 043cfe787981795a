"""Where the test suite's CPU goes: ``.venv/bin/python -m benchmarks.suite_cpu [--top 30] [test paths]``.

The suite is bound by CPU on two cores (94 % busy with three lanes), so its wall time falls only with the work its
tests do. Wall time per test says little there (every test is slowed by the other lanes), and a test's own process is
a small part of its CPU: Ray's workers, raylets and the drivers it starts are not its children. So this runs the
three lanes of ``python -m tests`` (tests/__main__.py) side by side as usual, each inside a cpuacct cgroup of its own
that every process the lane starts inherits, and records each test's CPU from its cgroup's counter (module-scoped
fixtures count toward the module's first test). Needs a writable cgroup v1 ``cpuacct`` hierarchy (root on Linux);
it refuses in one line otherwise. Writes ``benchmarks/out/suite_cpu.jsonl`` and prints the tests and modules that
cost the most, and each lane's CPU and wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
OUT_ENV = "ORRERY_SUITE_CPU_OUT"
NO_TESTS = 5  # pytest's exit status when a lane selects none of the given paths' tests


def _own_cgroup_usage_ns() -> int:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            return int((CPUACCT / path.lstrip("/") / "cpuacct.usage").read_text())
    raise RuntimeError("this process is in no cpuacct cgroup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Loaded into each lane's pytest with ``-p benchmarks.suite_cpu``: one JSON line per test."""
    if OUT_ENV not in os.environ:
        yield
        return
    cpu0, wall0 = _own_cgroup_usage_ns(), time.monotonic()
    yield
    row = {"test": item.nodeid, "cpu_s": (_own_cgroup_usage_ns() - cpu0) / 1e9, "wall_s": time.monotonic() - wall0}
    with open(os.environ[OUT_ENV], "a") as fh:
        fh.write(json.dumps(row) + "\n")


def _run_lanes(out: Path, paths: list[str]) -> list[dict]:
    from tests.__main__ import LANES
    if not os.access(CPUACCT, os.W_OK):
        raise SystemExit(f"suite_cpu: {CPUACCT} is not a writable cgroup v1 cpuacct hierarchy (needs root on Linux)")
    lanes = []
    for i, (name, marks) in enumerate(LANES):
        group = CPUACCT / f"orrery-suite-lane{i}"
        group.mkdir(exist_ok=True)
        log = out.with_name(f"suite_cpu-lane{i}.log")
        env = {**os.environ, OUT_ENV: str(out)}
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "benchmarks.suite_cpu", "-q", "-m",
               marks, *paths]
        # the lane joins its cgroup before pytest starts, so every process it starts is counted there
        join = lambda g=group: (g / "cgroup.procs").write_text(str(os.getpid()))  # noqa: E731
        usage0 = int((group / "cpuacct.usage").read_text())
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                preexec_fn=join)
        lanes.append({"name": name, "group": group, "usage0": usage0, "proc": proc, "t0": time.monotonic(),
                      "log": log})
    for lane in lanes:
        lane["code"] = lane["proc"].wait()
        lane["wall_s"] = time.monotonic() - lane["t0"]
        lane["cpu_s"] = (int((lane["group"] / "cpuacct.usage").read_text()) - lane["usage0"]) / 1e9
    return lanes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=30, help="how many tests and modules to print")
    parser.add_argument("paths", nargs="*", default=["tests"], help="test paths (default: the whole suite)")
    args = parser.parse_args(argv)
    out = ROOT / "benchmarks" / "out" / "suite_cpu.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    lanes = _run_lanes(out, args.paths)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    by_module: dict[str, float] = defaultdict(float)
    for r in rows:
        by_module[r["test"].split("::")[0]] += r["cpu_s"]
    print(f"{'lane':60s} {'CPU s':>8s} {'wall s':>8s} exit")
    for lane in lanes:
        print(f"{lane['name'][:60]:60s} {lane['cpu_s']:8.0f} {lane['wall_s']:8.0f} {lane['code']} ({lane['log']})")
    print(f"\nall lanes: {sum(la['cpu_s'] for la in lanes):.0f} CPU s over {len(rows)} tests\n")
    print(f"{'CPU s':>8s} {'wall s':>8s}  test (the {args.top} costliest)")
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[:args.top]:
        print(f"{r['cpu_s']:8.1f} {r['wall_s']:8.1f}  {r['test']}")
    print(f"\n{'CPU s':>8s}  module")
    for module, cpu in sorted(by_module.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{cpu:8.1f}  {module}")
    return next((lane["code"] for lane in lanes if lane["code"] not in (0, NO_TESTS)), 0)


if __name__ == "__main__":
    sys.exit(main())
