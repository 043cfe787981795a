"""LIFT finetuning benchmark (issue 15): real env steps to recover 80 % of the pre-change return, falls and joint
excursions in the real env, final return and the world model's held-out error, LIFT against its controls.

Superseded for the Walker2d study by ``benchmarks/study/lift.py`` (issue 23: resumable units on the study runner,
records in benchmarks/studies/lift/records/, change gates, tuned coefficients, an evaluation every 250 real steps); this
script remains for the Ray path (compare mode on the embedded cluster) and the InvertedPendulum task.

    python -m benchmarks.lift_finetune --change ood_velocity --seeds 10-14     # Walker2d, LIFT's own change
    python -m benchmarks.lift_finetune --change friction --seeds 0-1 --methods lift,sac_finetune   # tuning seeds
    python -m benchmarks.lift_finetune --task inverted_pendulum --change gravity:9 --seeds 0-2   # the old task
    python -m benchmarks.lift_finetune --quick                                   # 1 seed, short epochs (minutes)

Task (default ``walker2d``): Walker2d-v5 pretrained by ``lift_pretrain`` with a forward-velocity command
v* ~ U(0, 1.5) m/s (configs/env_preset/lift_pretrain_walker2d.yaml, ~45 min on 2 cores), kept in
``<out>/pretrain-walker2d-<hash of its config>`` and reused by every later call (``--pretrain-run`` names another).
Changes (``CHANGES``): ``ood_velocity`` (LIFT's own: command 2.25 = 1.5 v_max, reference = the pretrained policy at
v_max), ``friction`` and ``mass`` (at command 1.0, reference = the same command in the nominal env); or NAME:SCALE.
Stage 2 (the world models fitted on the pretraining replay) is cached in the pretraining run too.

Per seed one ``lift_finetune`` run in compare mode with the methods (default: all seven of
``experiments.lift.finetune_config.METHOD_SPECS``), each from the same pretrained policy and world model, evaluated
after each epoch the same way. Results are saved per seed as they finish (``results-<change>.json``; a rerun skips
the seeds already there). The report: per method the mean and 95 % t-interval over seeds of each metric, and the
seed-paired difference to ``sac_finetune`` with its interval (a claim holds only when that excludes zero). Runs
that never recover count as the real-step budget (a lower bound).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import time
import uuid
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]
V_MAX = 1.5  # top of the pretraining command range (configs/env_preset/lift_pretrain_walker2d.yaml)


def command(v: float) -> dict:
    return {"command_range": [v, v], "sigma": 0.5}


# name -> (finetuning env, reference env of the pre-change return), for the command-conditioned Walker2d pretraining
CHANGES: dict[str, tuple[dict, dict]] = {
    "ood_velocity": ({"target_velocity": command(1.5 * V_MAX)}, {"target_velocity": command(V_MAX)}),
    "friction": ({"target_velocity": command(1.0), "friction": {"scale": 0.3}}, {"target_velocity": command(1.0)}),
    "mass": ({"target_velocity": command(1.0), "mass": {"scale": 2.0}}, {"target_velocity": command(1.0)}),
}
ALL_METHODS = ["lift", "sac_finetune", "sac_finetune_matched", "mbpo_wm", "lift_stochastic", "lift_prior_only",
               "lift_residual_only"]
# The study's schedule (overrides of lift_finetune; the tuning behind it is in benchmarks/RESULTS.md).
SCHEDULE = ["experiment.epochs=12", "experiment.real_steps_per_epoch=500", "experiment.prefill_steps=500",
            "experiment.num_real_envs=4", "experiment.horizon_schedule=[0,8,1,5]", "experiment.hupt_schedule=[0,4,5,50]",
            "experiment.wm_pretrain_steps=3000", "experiment.wm_retrain_steps=400", "experiment.eval_episodes=5",
            "experiment.baseline_chunk_steps=100"]
QUICK = ["experiment.epochs=2", "experiment.real_steps_per_epoch=400", "experiment.prefill_steps=200",
         "experiment.wm_pretrain_steps=300", "experiment.wm_retrain_steps=100", "experiment.hupt_schedule=[0,1,2,4]",
         "experiment.eval_episodes=2"]
# The InvertedPendulum task of the first benchmark (in-process pretraining, gravity change).
PENDULUM_SCHEDULE = ["experiment.epochs=10", "experiment.real_steps_per_epoch=200", "experiment.prefill_steps=0",
                     "experiment.wm_retrain_first=false", "experiment.hupt_schedule=[0,2,20,100]",
                     "experiment.horizon_schedule=[0,4,1,5]", "experiment.wm_retrain_steps=300",
                     "experiment.load_alpha=true", "experiment.sac.tau=0.005", "experiment.update_normalizer=false"]


def pretrain_in_process(run: Path, task: str = "inverted_pendulum", env_steps: int = 5000, seed: int = 0,
                        batch_size: int = 256, updates_per_round: int = 8, num_envs: int = 8) -> Path:
    """A small SAC pretraining without the cluster, written like a lift_pretrain run: policy.pt, agent.pt (full
    SACAgent state) and data/replay-rank0 Parquet with the physics columns. For tests and quick benchmarks."""
    import torch

    from algos.lift.agent import SACAgent
    from algos.lift.replay import ReplayBuffer, transition_fields
    from algos.lift.sac import SACConfig, update
    from cluster.store import ParquetStore
    from envs.control.rollout import VectorRollout

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    cfg = SACConfig.preset("pendulum", batch_size=batch_size, min_replay_size=512, num_envs=num_envs)
    rollout = VectorRollout(task, num_envs, seed, physics_state=True)
    obs_dim, act_dim = rollout.single_observation_space.shape[0], rollout.single_action_space.shape[0]
    agent = SACAgent(obs_dim, act_dim, cfg)
    buffer = ReplayBuffer(cfg.replay_capacity, transition_fields(obs_dim, act_dim))
    gen = torch.Generator().manual_seed(seed)
    chunks, steps = [], 0

    def policy(obs: np.ndarray) -> np.ndarray:
        if len(buffer) < cfg.min_replay_size:  # uniform prefill, as a fresh SAC run would
            return rng.uniform(-1, 1, (len(obs), act_dim)).astype(np.float32)
        return agent.act(obs).numpy()

    while steps < env_steps:
        batch, _ = rollout.collect(policy, 8)
        agent.update_normalizers(batch["obs"])
        buffer.add({k: batch[k] for k in buffer.specs})
        chunks.append(batch)
        steps += len(batch["reward"])
        if len(buffer) >= cfg.min_replay_size:
            for _ in range(updates_per_round):
                update(agent, lambda n: buffer.sample(n, gen), cfg)
    rollout.close()
    run.mkdir(parents=True, exist_ok=True)
    ParquetStore(run / "data" / "replay-rank0").append({k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]})
    torch.save(agent.policy_state(), run / "policy.pt")
    torch.save(agent.state_dict(), run / "agent.pt")
    return run


def cached_pretraining(task: str, out: Path, overrides: list[str], seed: int = 0) -> Path:
    """The lift_pretrain run of ``task`` with its env preset (+ ``overrides``), made once and kept under a name that
    hashes its configuration: a changed preset pretrains anew, an unchanged one is reused."""
    from cluster.pool import shutdown_pool
    from experiments.run import main as run_main
    preset = ROOT / "configs" / "env_preset" / f"lift_pretrain_{task}.yaml"
    key = json.dumps({"preset": preset.read_text() if preset.exists() else "", "overrides": overrides, "seed": seed})
    name = f"pretrain-{task}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"
    run = out / "lift_pretrain" / name
    if (run / "agent.pt").exists():
        return run
    log.info("pretraining %s into %s (cached for later calls)", task, run)
    pool = f"bench-lp-{uuid.uuid4().hex[:6]}"
    run_main(["experiment=lift_pretrain", f"env={task}", f"output_dir={out}", f"run_name={name}", f"seed={seed}",
              f"pool.name={pool}", "cluster.include_dashboard=false", *overrides,
              *(["resume=true"] if run.exists() else [])])
    shutdown_pool(pool)
    return run


def change_overrides(task: str, change: str) -> tuple[list[str], str]:
    """Hydra overrides of the finetuning (and reference) env for a named change or NAME:SCALE, and a file tag."""
    def spec(d: dict) -> str:
        return json.dumps(d).replace('"', "").replace(" ", "")
    if task == "walker2d" and change in CHANGES:
        env, reference = CHANGES[change]
        return [f"experiment.change={spec(env)}", f"experiment.reference_change={spec(reference)}"], change
    if change in ("", "default"):
        return [], "default"
    name, scale = change.split(":")
    return [f"experiment.change={{name:{name},scale:{float(scale)}}}"], change.replace(":", "x")


def parse_seeds(text: str) -> list[int]:
    """``0-4`` or ``10,11,12``."""
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",") if s]


def real_step_budget(overrides: list[str]) -> float:
    """Prefill + epochs x real steps per epoch of the schedule (what a never-recovered run is censored at)."""
    values = {o.split("=")[0].split(".")[-1]: o.split("=")[1] for o in overrides if o.startswith("experiment.")}
    return float(values.get("prefill_steps", 1000)) + float(values.get("epochs", 6)) * float(
        values.get("real_steps_per_epoch", 1000))


def main() -> None:
    from benchmarks.lift_finetune_stats import plot, table, wm_table
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="walker2d")
    parser.add_argument("--change", default="ood_velocity", help=f"{', '.join(CHANGES)}, NAME:SCALE or default")
    parser.add_argument("--seeds", default="10-14", help="e.g. 10-14 (reported) or 0-1 (tuning)")
    parser.add_argument("--methods", default=",".join(ALL_METHODS))
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 short epochs")
    parser.add_argument("--pretrain-run", default=None, help="a lift_pretrain run dir (default: cached pretraining)")
    parser.add_argument("--pretrain-steps", type=int, default=16000, help="inverted_pendulum in-process pretraining")
    parser.add_argument("--out", default="runs/bench_lift_finetune")
    parser.add_argument("--tag", default=None, help="results file tag (default: the change)")
    parser.add_argument("--plot", default=None, help="also write the plot here (e.g. benchmarks/lift_finetune.png)")
    parser.add_argument("overrides", nargs="*", help="extra hydra overrides for the lift_finetune runs (win last)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch
    torch.set_num_threads(1)
    from cluster.pool import shutdown_pool
    from experiments.run import main as run_main

    out = Path(args.out).resolve()  # the Ray workers do not share the driver's working directory
    out.mkdir(parents=True, exist_ok=True)
    methods = [m for m in args.methods.split(",") if m]
    seeds = [0] if args.quick else parse_seeds(args.seeds)
    if args.pretrain_run:
        pretrain = Path(args.pretrain_run).resolve()
    elif args.task == "walker2d":
        pretrain = cached_pretraining("walker2d", out, [])
    else:
        pretrain = out / f"pretrain-{args.task}-{args.pretrain_steps}"
        if not (pretrain / "agent.pt").exists():
            pretrain_in_process(pretrain, args.task, args.pretrain_steps, seed=1, batch_size=1024)
    change, tag = change_overrides(args.task, args.change)
    tag = args.tag or tag
    schedule = QUICK if args.quick else (SCHEDULE if args.task == "walker2d" else PENDULUM_SCHEDULE)
    sizes = [*schedule, *args.overrides]
    results_path = out / f"results-{tag}.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else []
    done = {r["seed"] for r in results}
    started = time.perf_counter()
    for seed in seeds:
        if seed in done:
            log.info("seed %d: already in %s", seed, results_path)
            continue
        pool = f"bench-lf-{uuid.uuid4().hex[:6]}"
        t0 = time.perf_counter()
        summary = run_main(["experiment=lift_finetune", f"env={args.task}", f"experiment.pretrain_run={pretrain}",
                            f"experiment.methods=[{','.join(methods)}]", f"seed={seed}", f"output_dir={out}",
                            f"run_name={tag}-seed{seed}-{uuid.uuid4().hex[:4]}", f"pool.name={pool}",
                            "cluster.include_dashboard=false", *change, *sizes])
        shutdown_pool(pool)
        results.append({"seed": seed, "run_dir": str(Path(summary["plot"]).parent.parent), "overrides": sizes,
                        "wall_s": time.perf_counter() - t0, **summary})
        results_path.write_text(json.dumps(results, indent=2))  # one seed at a time: a crash loses one run
    results = [r for r in results if r["seed"] in seeds]
    budget = real_step_budget(sizes)
    title = f"LIFT finetuning, {results[0]['task']}, {tag}"
    plot(results, out / f"lift_finetune-{tag}.png", title)
    if args.plot:
        plot(results, Path(args.plot), title)
    md = table(results, methods, "sac_finetune", budget) + "\n\n" + wm_table(results)
    (out / f"table-{tag}.md").write_text(md + "\n")
    print(f"\n{title}: seeds {[r['seed'] for r in results]}, pre-change {np.mean([r['pre_change_return'] for r in results]):.0f}, "
          f"zero-shot {np.mean([r['zero_shot_return'] for r in results]):.0f}, budget {budget:.0f} real steps, "
          f"{time.perf_counter() - started:.0f} s\n\n{md}\n\nresults: {results_path}")


if __name__ == "__main__":
    main()
