"""LIFT finetuning benchmark: real env steps to recover 80 % of the pre-change return, LIFT vs the baselines.

    python -m benchmarks.lift_finetune                      # 3 seeds, InvertedPendulum-v5, gravity x9 (default)
    python -m benchmarks.lift_finetune --change gravity:7   # another change
    python -m benchmarks.lift_finetune --quick              # 1 seed, 3 short epochs (laptop check, minutes)
    python -m benchmarks.lift_finetune --task walker2d --pretrain-run runs/lift_pretrain/<run>

One pretrained policy shared by all seeds (``--pretrain-run``, or one in-process SAC pretraining of 16000 env steps,
pretraining seed 1, written in lift_pretrain's format by ``pretrain_in_process``; it scores 1000 and keeps 1000
zero-shot up to gravity x8, drops to ~43 at x9 and ~4 at x10: the default change is the mildest one that hurts), then
per seed one ``lift_finetune`` run in compare mode (lift, sac_finetune, mbpo_wm) on
the embedded cluster. Reports, per method, the real steps to recover (see experiments/lift/finetune.py for the
definition), final/best return and real-env falls; writes a JSON, a table and a plot (return vs real steps, mean
over seeds; falls).

Schedule (``FINE_SCHEDULE``): every method evaluates after each epoch of ``real_steps_per_epoch`` = 200 real steps,
so "steps to 80 %" has a 200-step resolution for all of them. LIFT and mbpo_wm: no prefill (the world model starts
from its stage-2 fit on the pretraining replay), collect 200 deterministic steps, retrain the model on all real data,
then branch model rollouts and do many SAC steps (HUPT x 20 per 200 real steps, see below). sac_finetune: stochastic
actions in the real env, 1 SAC step per real transition in bursts every 100 real steps (no prefill either). All
methods share the SAC coefficients: LIFT's finetune values except that the pretrained temperature is kept and tau is
the pretraining 0.005 (LIFT's alpha reset + tau 0.001 give the documented early dip on this small pretraining).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time
import uuid
from pathlib import Path

import numpy as np

from experiments.lift.finetune import method_rows
from experiments.lift.finetune_config import METHODS

os.environ.setdefault("OMP_NUM_THREADS", "1")
log = logging.getLogger(__name__)
# Overrides of the full run (see the module docstring). 10 epochs x 200 = 2000 real steps per method; HUPT ramps
# 20 -> 100 branches of 400 start states over epochs 0-2, each followed by 20 SAC steps: 400 -> 2000 model-based SAC
# steps per 200 real steps (UTD 2 -> 10; LIFT's full schedule is 20), horizon 1 -> 5.
FINE_SCHEDULE = ["experiment.epochs=10", "experiment.real_steps_per_epoch=200", "experiment.prefill_steps=0",
                 "experiment.wm_retrain_first=false", "experiment.hupt_schedule=[0,2,20,100]",
                 "experiment.horizon_schedule=[0,4,1,5]", "experiment.wm_retrain_steps=300",
                 "experiment.load_alpha=true", "experiment.sac.tau=0.005", "experiment.baseline_chunk_steps=100",
                 "experiment.baseline_updates_per_step=1.0"]
QUICK_SCHEDULE = ["experiment.epochs=3", "experiment.real_steps_per_epoch=500", "experiment.prefill_steps=500",
                  "experiment.wm_pretrain_steps=500", "experiment.wm_retrain_steps=200"]


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


def curves(results: list[dict]) -> dict[str, dict[str, np.ndarray]]:
    """Per method: real steps (the shared evaluation schedule) and the eval returns (seeds, steps) read from each
    seed's metrics; seeds are cut to the shortest curve."""
    from cluster.metrics import read_metrics
    out: dict[str, dict[str, np.ndarray]] = {}
    for m in METHODS:
        per_seed = []
        for r in results:
            rows = method_rows(read_metrics(r["run_dir"]), m).dropna(subset=["eval_return"])
            if len(rows):
                per_seed.append((rows["real_env_steps"].to_numpy(), rows["eval_return"].to_numpy()))
        if per_seed:
            n = min(len(steps) for steps, _ in per_seed)
            out[m] = {"steps": per_seed[0][0][:n], "returns": np.stack([ret[:n] for _, ret in per_seed])}
    return out


def plot(results: list[dict], out: Path) -> None:
    """Return vs real env steps (mean over seeds, shaded min-max) with the 80 % line; falls per method."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax_falls) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [2, 1]})
    pre = float(np.mean([r["pre_change_return"] for r in results]))
    zero = float(np.mean([r["zero_shot_return"] for r in results]))
    for i, (m, c) in enumerate(curves(results).items()):
        mean = c["returns"].mean(0)
        ax.plot(c["steps"], mean, marker="o", ms=3, color=f"C{i}", label=m)
        ax.fill_between(c["steps"], c["returns"].min(0), c["returns"].max(0), color=f"C{i}", alpha=0.15)
    ax.axhline(pre, color="k", ls="--", lw=1, label="pre-change")
    ax.axhline(zero + 0.8 * (pre - zero), color="k", ls="-.", lw=0.7, alpha=0.6, label="80 % recovery")
    ax.set_xlabel("real env steps")
    ax.set_ylabel("deterministic eval return")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    for i, m in enumerate(METHODS):
        falls = [r["methods"][m]["falls"] for r in results if m in r["methods"]]
        ax_falls.bar(i, np.mean(falls) if falls else 0, color=f"C{i}", alpha=0.8)
        ax_falls.scatter([i] * len(falls), falls, color="k", s=10, zorder=3)
    ax_falls.set_xticks(range(len(METHODS)), METHODS, fontsize=8)
    ax_falls.set_ylabel("real-env falls (per seed)")
    ax_falls.grid(alpha=0.3, axis="y")
    change = results[0]["change"]
    fig.suptitle(f"LIFT finetuning, {results[0]['task']}, {change['name']} x{change.get('scale')}, "
                 f"{len(results)} seed(s) (shaded: min-max)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def mean_std(values: list[float]) -> str:
    return f"{np.mean(values):.0f} ± {np.std(values):.0f}" if values else "-"


def table(results: list[dict]) -> str:
    """Markdown rows per method: steps to 80 % (mean ± std over the seeds that recovered), ratio to sac_finetune
    per seed, falls, final and best return, wall time."""
    lines = ["| method | real steps to 80 % | recovered | ratio to sac_finetune (per seed) | real falls | final return "
             "| best return | wall s |", "|---|---|---|---|---|---|---|---|"]
    for m in METHODS:
        rows = [r["methods"][m] for r in results if m in r["methods"]]
        if not rows:
            continue
        steps = [s["real_steps_to_recover"] for s in rows]
        ok = [s for s in steps if s is not None]
        ratios = []
        for r in results:
            mine, base = r["methods"][m]["real_steps_to_recover"], r["methods"]["sac_finetune"]["real_steps_to_recover"]
            ratios.append("never" if mine is None else ("-" if base is None else f"{mine / base:.2f}"))
        lines.append(f"| {m} | {mean_std(ok)} | {len(ok)}/{len(steps)} | {', '.join(ratios)} | "
                     f"{mean_std([s['falls'] for s in rows])} | {mean_std([s['final_return'] for s in rows])} | "
                     f"{mean_std([s['best_return'] for s in rows])} | {mean_std([s['wall_s'] for s in rows])} |")
    return "\n".join(lines)


def parse_change(text: str | None) -> list[str]:
    """``gear:0.4`` -> the hydra override of experiment.change; None -> the task's default change."""
    if not text or text == "default":
        return []
    name, scale = text.split(":")
    return [f"experiment.change={{name:{name},scale:{float(scale)}}}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="inverted_pendulum")
    parser.add_argument("--change", default="gravity:9.0",
                        help="NAME:SCALE, e.g. gear:0.4; 'default' = the task's DEFAULT_CHANGES entry")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 seed, 3 short epochs")
    parser.add_argument("--pretrain-run", default=None, help="a lift_pretrain run dir (default: pretrain in-process)")
    parser.add_argument("--pretrain-steps", type=int, default=16000)
    parser.add_argument("--pretrain-seed", type=int, default=1)
    parser.add_argument("--out", default="runs/bench_lift_finetune")
    parser.add_argument("--plot", default=None, help="also write the plot here (e.g. benchmarks/lift_finetune.png)")
    parser.add_argument("overrides", nargs="*", help="extra hydra overrides for the lift_finetune runs (win last)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch
    torch.set_num_threads(1)
    from experiments.run import main as run_main

    out = Path(args.out).resolve()  # the Ray workers do not share the driver's working directory
    out.mkdir(parents=True, exist_ok=True)
    seeds = [0] if args.quick else list(range(args.seeds))
    sizes = QUICK_SCHEDULE if args.quick else FINE_SCHEDULE
    tag = (args.change or "default").replace(":", "x")
    results = []
    started = time.perf_counter()
    pretrain = (Path(args.pretrain_run).resolve() if args.pretrain_run
                else out / f"pretrain{args.pretrain_steps}-seed{args.pretrain_seed}")
    if not args.pretrain_run and not (pretrain / "agent.pt").exists():
        t0 = time.perf_counter()
        pretrain_in_process(pretrain, args.task, args.pretrain_steps, args.pretrain_seed, batch_size=1024)
        log.info("pretrained in %.0f s", time.perf_counter() - t0)
    for seed in seeds:
        pool = f"bench-lf-{uuid.uuid4().hex[:6]}"
        summary = run_main(["experiment=lift_finetune", f"env={args.task}", f"experiment.pretrain_run={pretrain}",
                            "experiment.methods=[lift,sac_finetune,mbpo_wm]", f"seed={seed}", f"output_dir={out}",
                            f"run_name={tag}-seed{seed}-{uuid.uuid4().hex[:4]}", f"pool.name={pool}",
                            "cluster.include_dashboard=false", *sizes, *parse_change(args.change), *args.overrides])
        from cluster.pool import SharedPool
        SharedPool.attach({"name": pool}, create=False).shutdown()
        if summary["zero_shot_return"] >= 0.9 * summary["pre_change_return"]:
            log.warning("seed %d: the change leaves this policy at %.0f of %.0f: nothing to recover, pick a stronger "
                        "--change", seed, summary["zero_shot_return"], summary["pre_change_return"])
        results.append({"seed": seed, "run_dir": str(Path(summary["plot"]).parent.parent), **summary})
        (out / f"results-{tag}.json").write_text(json.dumps(results, indent=2))
    plot_path = out / f"lift_finetune-{tag}.png"
    plot(results, plot_path)
    if args.plot:
        plot(results, Path(args.plot))
    print(f"\nLIFT finetuning benchmark ({results[0]['task']}, change {results[0]['change']}, {len(seeds)} seed(s), "
          f"{time.perf_counter() - started:.0f} s)")
    print("seed  pre-change  zero-shot  method        steps-to-80%  final   best    falls  real-steps  wall-s")
    for r in results:
        for m, s in r["methods"].items():
            print(f"{r['seed']:>4}  {r['pre_change_return']:>10.1f}  {r['zero_shot_return']:>9.1f}  {m:<12}  "
                  f"{str(s['real_steps_to_recover']):>12}  {s['final_return']:>6.1f}  {s['best_return']:>6.1f}  "
                  f"{s['falls']:>5}  {s['real_steps']:>10}  {s['wall_s']:>6.0f}")
    print("\n" + table(results))
    print(f"results: {out / f'results-{tag}.json'}, plot: {plot_path}")


if __name__ == "__main__":
    main()
