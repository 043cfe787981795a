"""orrery's LIFT SAC against Stable-Baselines3 and RLlib: update speed, Pendulum wall time, Humanoid throughput.

Three parts, all run in one invocation on the same machine (``--only`` picks one):

    updates   gradient updates/s at batch 1024 with 256-256 MLPs, Pendulum-sized (obs 3, act 1) and
              HalfCheetah-sized (obs 17, act 6): ``algos.lift.sac.update`` (fp32 and bf16 autocast) against SB3's
              ``SAC.train`` on the same sizes, in this process, 1 torch thread, repeats interleaved so background
              load hits every row alike. Both sample their own replay buffer (50k random transitions) inside the
              timed call. Besides wall-clock rates, updates per CPU-second of this process: on a shared machine
              the wall clock mostly measures how much of a core the scheduler gave us.
    pendulum  wall time and env steps until the deterministic evaluation return (``--eval-episodes`` episodes
              every ``--eval-every`` env steps, ``envs.control.rollout.evaluate`` with seed 10000 + seed for everyone)
              reaches ``--threshold`` on Pendulum-v1, capped at ``--max-env-steps`` and ``--time-cap`` each:
              * orrery: the real cluster experiment (``python -m experiments.run experiment=lift_pretrain
                env=pendulum experiment.stop_return=...``) in a subprocess, read back from its metrics Parquet;
                its wall time is the learner loop's ``wall_s`` (from the start of ``train_fn``: pool acting,
                normalizer, replay, updates, evaluation), and the subprocess total (Ray start, Ray Train start)
                is given too; "learner" sums the update time (updates / ``updates_per_s`` per round);
              * SB3 SAC with rl-baselines3-zoo's Pendulum-v1 entry (``hyperparams/sac.yml``: n_timesteps 20000,
                learning_rate 1e-3, every other setting SB3's default: net_arch 256-256, batch 256, buffer 1e6,
                learning_starts 100, train_freq 1, gradient_steps 1, no gSDE), in this process;
              * RLlib SAC (new API stack) with ``rllib/tuned_examples/sac/pendulum_sac.py``'s settings (that file
                is not in the installed wheel; settings copied below from ray-project/ray master), with
                ``num_env_runners=0``, ``num_learners=0``, ``OMP_NUM_THREADS=1`` (ray.md P4), in a subprocess
                with its own embedded Ray cluster, shut down at the end, and its Algorithm logdir in a temp dir.
              For SB3 and RLlib the wall time runs from the start of learning (model/Algorithm built) and
              includes their evaluations, as the experiment's does.
    humanoid  env steps/s and updates/s of the lift_pretrain experiment on Humanoid-v5 with its 2 pool workers
              busy (``experiment.num_shards=2``), a short fixed budget, from its metrics Parquet; beside it the
              same collection without a learner or Ray (``VectorRollout.collect``, random policy, one process).

Usage (repo root):

    OMP_NUM_THREADS=1 python -m benchmarks.sac [--quick] [--only updates|pendulum|humanoid] [--out benchmarks/out]
        [--record benchmarks/RESULTS.md]"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.sac.common import BATCH, FILL, ROOT, load_average, machine_note
from benchmarks.sac.humanoid import auto_precision, humanoid
from benchmarks.sac.pendulum import Budget, orrery_pendulum, report_pendulum, rllib_child, rllib_pendulum, sb3_pendulum
from benchmarks.sac.updates import bench_updates, report_updates


SECTION = "## SAC learner vs Stable-Baselines3 and RLlib (`python -m benchmarks.sac`)"
RESULTS_HEADER = "# Benchmarks\n\nBenchmarks — each section gives the command, the machine, the table.\n"
PARTS = ("updates", "pendulum", "humanoid")
SUBSECTIONS = {"updates": "### Gradient updates/s", "pendulum": "### Pendulum-v1: time to the return threshold",
               "humanoid": "### Humanoid-v5: env steps/s while training"}


def record(path: Path, parts: dict[str, str], preamble: str) -> None:
    """Write this benchmark's section into RESULTS.md: replace the subsections measured now, keep the others and
    every other section (re-reads the file just before writing; other benchmarks write their own sections)."""
    text = path.read_text() if path.exists() else RESULTS_HEADER
    start = text.find(SECTION)
    old: dict[str, str] = {}
    if start >= 0:
        end = text.find("\n## ", start + len(SECTION))
        body = text[start:end + 1 if end >= 0 else len(text)]
        for part, title in SUBSECTIONS.items():
            i = body.find(title)
            if i >= 0:
                j = body.find("\n### ", i + len(title))
                old[part] = body[i:j + 1 if j >= 0 else len(body)].rstrip("\n")
    merged = {**old, **{p: f"{SUBSECTIONS[p]}\n\n{md}" for p, md in parts.items()}}
    section = SECTION + "\n\n" + preamble + "\n\n" + "\n\n".join(merged[p] for p in PARTS if p in merged) + "\n"
    text = path.read_text() if path.exists() else RESULTS_HEADER  # re-read right before the write
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[end:] if end >= 0 else "")
    path.write_text(text.rstrip("\n") + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small budgets: a smoke check of every part")
    p.add_argument("--only", choices=PARTS, action="append", help="run only this part (repeatable)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out", help="run dirs, logs, JSON results")
    p.add_argument("--record", type=Path, default=None, help="write the section into this markdown file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--utd", type=int, default=None, help="updates per timed call (default 16, quick 4)")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per learner (default 5, quick 2)")
    p.add_argument("--threshold", type=float, default=-200.0, help="Pendulum eval return to reach")
    p.add_argument("--max-env-steps", type=int, default=None, help="Pendulum cap per learner (default 20000)")
    p.add_argument("--time-cap", type=float, default=None, help="Pendulum wall cap per learner, s (default 360)")
    p.add_argument("--eval-every", type=int, default=1000)
    p.add_argument("--eval-episodes", type=int, default=8)
    p.add_argument("--humanoid-steps", type=int, default=None, help="Humanoid env steps (default 6400, quick 2560)")
    p.add_argument("--child-rllib", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    import torch
    torch.set_num_threads(1)
    quick = args.quick
    budget = Budget(args.threshold, args.max_env_steps or (6000 if quick else 20_000),
                    args.time_cap or (120.0 if quick else 360.0), args.eval_every, args.eval_episodes, args.seed)
    if args.child_rllib is not None:
        rllib_child(budget, args.child_rllib)
        return
    parts = args.only or list(PARTS)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    command = "OMP_NUM_THREADS=1 python -m benchmarks.sac " + shlex.join(sys.argv[1:] if argv is None else argv)
    load_before = load_average()
    print(f"load average before: {load_before} (1/5/15 min); os.getloadavg() = {os.getloadavg()}", flush=True)
    print(f"machine: {machine_note()}", flush=True)
    started = time.perf_counter()
    results: dict[str, str] = {}

    def header(part_started: str) -> str:
        return (f"Run {time.strftime('%Y-%m-%d %H:%M')}: `{command}`; load average (1/5/15 min) before, after: "
                f"{part_started}, {load_average()}; `bf16: auto` chose {auto_precision()}.")

    if "updates" in parts:
        load = load_average()
        rows = bench_updates(args.utd or (4 if quick else 16), args.repeats or (2 if quick else 5), args.seed)
        md = report_updates(rows)
        results["updates"] = (header(load) + f" Batch {BATCH}, actor and twin critic 256-256 ReLU, replay of "
                              f"{FILL:,} random transitions sampled inside the timed call, {rows[0].utd} updates per "
                              f"call, median of {len(rows[0].wall_s)} interleaved calls, 1 torch thread, one "
                              "process. orrery: `algos.lift.sac.update` (fused AdamW, twin critic as two plain "
                              "MLPs, observation normalizer); SB3: `SAC.train` (Adam).\n\n" + md)
        print("\n" + md + "\n", flush=True)
    if "pendulum" in parts:
        load = load_average()
        curves = [orrery_pendulum(budget, out, stamp), sb3_pendulum(budget), rllib_pendulum(budget, out, stamp)]
        (out / f"pendulum-{stamp}.json").write_text(json.dumps([asdict(c) for c in curves], indent=1))
        md = report_pendulum(curves, budget)
        results["pendulum"] = (header(load) + f" Deterministic evaluation, {budget.eval_episodes} episodes every "
                               f"{budget.eval_every} env steps (`envs.control.rollout.evaluate`, seed {10_000 + budget.seed}) "
                               f"for all three; caps {budget.max_env_steps:,} env steps and {budget.time_cap_s:.0f} s "
                               f"each; seed {budget.seed}, one run each (one seed: a noisy figure). 'wall s' runs "
                               "from the start of learning to the evaluation that reached the threshold and "
                               "includes evaluation; 'learner s' is update time only; 'setup s' is what came before "
                               "learning (orrery: interpreter, Ray, pool and Ray Train start, plus plots and "
                               "shutdown after).\n\n" + md)
        print("\n" + md + "\n", flush=True)
    if "humanoid" in parts:
        load = load_average()
        steps = args.humanoid_steps or (2560 if quick else 6400)
        md = humanoid(steps, out, stamp, args.seed, 300.0 if quick else 600.0)
        results["humanoid"] = header(load) + "\n\n" + md
        print("\n" + md + "\n", flush=True)
    elapsed = time.perf_counter() - started
    load_after = load_average()
    print(f"load average after: {load_after}; os.getloadavg() = {os.getloadavg()}; benchmark took {elapsed:.0f} s",
          flush=True)
    if args.record:
        # the 1-minute averages: the 5- and 15-minute ones still carry whatever ran before the benchmark started
        busy = max(float(load.split("/")[0]) for load in (load_before, load_after)) > 2
        preamble = (f"Machine: {machine_note()}." +
                    (" A shared, loaded machine (load average above 2 on these cores: other jobs ran alongside): "
                     "wall-clock figures are noisy; ratios measured in the same run, and per-CPU-second rates, are "
                     "what compare." if busy else "") +
                    f" Last run: {elapsed / 60:.1f} min for {', '.join(parts)}.")
        record(args.record, results, preamble)
        print(f"recorded in {args.record}", flush=True)


if __name__ == "__main__":
    main()
