"""A small study for the runner's tests: a resumable stage that makes a start model, a tuning unit and five reported
units that read it. Each unit sleeps a little so a test can kill a lane in the middle of one."""
from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.study.core import Study, Unit, UnitContext

STEP_S = float(os.environ.get("TOY_STEP_S", "0.05"))
STAGE_STEPS = 40


def stage(ctx: UnitContext) -> dict | None:
    """Counts to STAGE_STEPS, checkpointing after every step; returns None when its call's time is up."""
    state = ctx.load_artifact("stage/checkpoint.pt") or {"step": 0, "starts": []}
    state["starts"].append(state["step"])
    while state["step"] < STAGE_STEPS:
        time.sleep(STEP_S)
        state["step"] += 1
        ctx.save_artifact("stage/checkpoint.pt", state)
        if ctx.time_left() <= 0:
            return None
    ctx.write_json_artifact("stage/model.json", {"weight": 2.0})
    return {"metrics": {"steps": state["step"]}, "starts": state["starts"]}


def method(ctx: UnitContext) -> dict:
    (ctx.work_dir / "started").write_text(str(os.getpid()))
    time.sleep(ctx.size("sleep_s", float(os.environ.get("TOY_UNIT_S", "0.2"))))
    weight = ctx.read_json_artifact("stage/model.json")["weight"]
    score = weight * (ctx.seed or 0) + ctx.setting.get("lr", 1.0)
    return {"metrics": {"score": score}, "curves": {"x": [0, 1, 2], "y": [0.0, score / 2, score]}}


def units() -> list[Unit]:
    fn = "tests.study_toy:method"
    plan = [Unit("stage", "stage", "stage", None, "tests.study_toy:stage", est_core_s=5),
            Unit("tune-s100", "tune", "toy", 100, fn, {"lr": 0.5}, after=("stage",), est_core_s=1)]
    plan += [Unit(f"toy-s{s}", "report", "toy", s, fn, {"lr": 0.5}, after=("tune-s100",), est_core_s=1)
             for s in range(10, 15)]
    return plan


def report(records: list[dict], out_dir: Path) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = sorted((r for r in records if r["role"] == "report"), key=lambda r: r["seed"])
    fig, ax = plt.subplots()
    for r in rows:
        ax.plot(r["curves"]["x"], r["curves"]["y"])
    fig.savefig(out_dir / "toy.png")
    plt.close(fig)
    table = "\n".join(f"| {r['seed']} | {r['metrics']['score']:.1f} |" for r in rows)
    return f"## Toy study (`python -m benchmarks.study toy report`)\n\n| seed | score |\n|---|---|\n{table}\n\n{json.dumps(len(rows))} seeds\n\n![the curves](toy.png)\n"


STUDY = Study(name="toy", title="a toy study", units=units,
              start_files=lambda artifacts: [artifacts / "stage" / "model.json"], report="tests.study_toy:report")


def report_next(records: list[dict], out_dir: Path) -> str:
    return report(records, out_dir).replace("## Toy study (`python -m benchmarks.study toy report`)",
                                            "## Toy successor (`python -m benchmarks.study toy_next report`)")


# a later study of the same question: its whole table replaces toy's RESULTS.md section
STUDY_NEXT = replace(STUDY, name="toy_next", report="tests.study_toy:report_next", supersedes=("toy",))
