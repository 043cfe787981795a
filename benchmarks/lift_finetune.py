"""LIFT finetuning benchmark: real env steps to recover 80 % of the pre-change return, LIFT vs the baselines.

    python -m benchmarks.lift_finetune                      # 3 seeds, InvertedPendulum-v5, gravity x4 (default)
    python -m benchmarks.lift_finetune --quick              # 1 seed, short epochs (laptop check, minutes)
    python -m benchmarks.lift_finetune --task walker2d --pretrain-run runs/lift_pretrain/<run>

Per seed: a pretrained policy (``--pretrain-run``, or a quick in-process SAC pretraining written in lift_pretrain's
format by ``pretrain_in_process``), then one ``lift_finetune`` run in compare mode (lift, sac_finetune, mbpo_wm) on
the embedded cluster. Reports, per method, the real steps to recover (see experiments/lift_finetune.py for the
definition), final/best return and real-env falls; writes a JSON and a plot.
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

os.environ.setdefault("OMP_NUM_THREADS", "1")
log = logging.getLogger(__name__)
METHODS = ("lift", "sac_finetune", "mbpo_wm")


def pretrain_in_process(run: Path, task: str = "inverted_pendulum", env_steps: int = 5000, seed: int = 0,
                        batch_size: int = 256, updates_per_round: int = 8, num_envs: int = 8) -> Path:
    """A small SAC pretraining without the cluster, written like a lift_pretrain run: policy.pt, agent.pt (full
    SACAgent state) and data/replay-rank0 Parquet with the physics columns. For tests and quick benchmarks."""
    import torch

    from algos.replay import ReplayBuffer
    from algos.sac import SACAgent, SACConfig, update
    from cluster.store import ParquetStore
    from envs.control import VectorRollout

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    cfg = SACConfig.preset("pendulum", batch_size=batch_size, min_replay_size=512, num_envs=num_envs)
    rollout = VectorRollout(task, num_envs, seed, physics_state=True)
    obs_dim, act_dim = rollout.single_observation_space.shape[0], rollout.single_action_space.shape[0]
    agent = SACAgent(obs_dim, act_dim, cfg)
    fields = {"obs": ((obs_dim,), torch.float32), "action": ((act_dim,), torch.float32), "reward": ((), torch.float32),
              "next_obs": ((obs_dim,), torch.float32), "terminated": ((), torch.float32),
              "truncated": ((), torch.float32)}
    buffer = ReplayBuffer(cfg.replay_capacity, fields)
    gen = torch.Generator().manual_seed(seed)
    chunks, steps = [], 0

    def policy(obs: np.ndarray) -> np.ndarray:
        if len(buffer) < cfg.min_replay_size:  # uniform prefill, as a fresh SAC run would
            return rng.uniform(-1, 1, (len(obs), act_dim)).astype(np.float32)
        return agent.act(obs).numpy()

    while steps < env_steps:
        batch, _ = rollout.collect(policy, 8)
        agent.update_normalizers(batch["obs"])
        buffer.add({k: batch[k] for k in fields})
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


def plot(results: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, m in enumerate(METHODS):
        steps = [r["methods"][m]["real_steps_to_recover"] for r in results if m in r["methods"]]
        falls = [r["methods"][m]["falls"] for r in results if m in r["methods"]]
        ok = [s for s in steps if s is not None]
        axes[0].bar(i, np.mean(ok) if ok else 0, color=f"C{i}", alpha=0.8)
        axes[0].scatter([i] * len(ok), ok, color="k", s=10, zorder=3)
        axes[0].text(i, 0, f"{len(ok)}/{len(steps)} recovered", ha="center", va="bottom", fontsize=8)
        axes[1].bar(i, np.mean(falls) if falls else 0, color=f"C{i}", alpha=0.8)
        axes[1].scatter([i] * len(falls), falls, color="k", s=10, zorder=3)
    for ax, label in zip(axes, ("real steps to recover 80% (recovered seeds)", "real-env falls during finetuning")):
        ax.set_xticks(range(len(METHODS)), METHODS)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"LIFT finetuning, {results[0]['task']}, {results[0]['change']}, {len(results)} seed(s)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="inverted_pendulum")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 seed, 3 short epochs")
    parser.add_argument("--pretrain-run", default=None, help="a lift_pretrain run dir (default: pretrain in-process)")
    parser.add_argument("--pretrain-steps", type=int, default=8000)
    parser.add_argument("--out", default="runs/bench_lift_finetune")
    parser.add_argument("overrides", nargs="*", help="extra hydra overrides for the lift_finetune runs")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch
    torch.set_num_threads(1)
    from experiments.run import main as run_main

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [0] if args.quick else list(range(args.seeds))
    sizes = (["experiment.epochs=3", "experiment.real_steps_per_epoch=500", "experiment.prefill_steps=500",
              "experiment.wm_pretrain_steps=500", "experiment.wm_retrain_steps=200"]
             if args.quick else ["experiment.epochs=6"])
    results = []
    started = time.perf_counter()
    for seed in seeds:
        pretrain = Path(args.pretrain_run) if args.pretrain_run else out / f"pretrain-seed{seed}"
        if not args.pretrain_run and not (pretrain / "agent.pt").exists():
            t0 = time.perf_counter()
            pretrain_in_process(pretrain, args.task, args.pretrain_steps, seed, batch_size=1024)  # ~1000 at 8k steps
            log.info("seed %d: pretrained in %.0f s", seed, time.perf_counter() - t0)
        pool = f"bench-lf-{uuid.uuid4().hex[:6]}"
        summary = run_main(["experiment=lift_finetune", f"env={args.task}", f"experiment.pretrain_run={pretrain}",
                            "experiment.methods=[lift,sac_finetune,mbpo_wm]", f"seed={seed}", f"output_dir={out}",
                            f"run_name=seed{seed}", f"pool.name={pool}", "cluster.include_dashboard=false",
                            *sizes, *args.overrides])
        from cluster.pool import SharedPool
        SharedPool.attach({"name": pool}, create=False).shutdown()
        results.append({"seed": seed, **summary})
        (out / "results.json").write_text(json.dumps(results, indent=2))
    plot(results, out / "lift_finetune.png")
    print(f"\nLIFT finetuning benchmark ({results[0]['task']}, change {results[0]['change']}, {len(seeds)} seed(s), "
          f"{time.perf_counter() - started:.0f} s)")
    print("seed  pre-change  zero-shot  method        steps-to-80%  final   best    falls  real-steps  wall-s")
    for r in results:
        for m, s in r["methods"].items():
            print(f"{r['seed']:>4}  {r['pre_change_return']:>10.1f}  {r['zero_shot_return']:>9.1f}  {m:<12}  "
                  f"{str(s['real_steps_to_recover']):>12}  {s['final_return']:>6.1f}  {s['best_return']:>6.1f}  "
                  f"{s['falls']:>5}  {s['real_steps']:>10}  {s['wall_s']:>6.0f}")
    print(f"results: {out / 'results.json'}, plot: {out / 'lift_finetune.png'}")


if __name__ == "__main__":
    main()
