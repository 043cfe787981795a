"""VIDD vs best-of-N, standard fine-tuning and DDPO-style fine-tuning on molecules (QED), at one oracle-query budget.

    python -m benchmarks.vidd_molecule            # 3 seeds, the smoke experiment's sizes (tens of minutes on 2 cores)
    python -m benchmarks.vidd_molecule --quick    # 3 seeds, smaller model / budget (a few minutes)

One denoiser is pretrained on MOSES (SELFIES) and shared by every method and seed. Each method then runs the
single-process reference driver algos.vidd.finetune.finetune (the same algorithm the cluster experiment distributes)
with the same oracle-query budget, counted exactly by algos.vidd.oracle.RewardCounter. Reported per method (mean ± std
over seeds, on ``eval_samples`` fresh samples of the final model; best-of-N: its selected outputs): median and top-10 % QED, mean
QED, NELBO under the pretrained model (nats per molecule), diversity, validity, wall time; plus a plot of median
reward against oracle queries (evaluations during training) in <out>/vidd_reward_vs_queries.png.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from algos.vidd.config import METHODS
from algos.vidd.finetune import finetune
from algos.vidd.mdlm import nelbo
from algos.vidd.sampling import sample
from envs.bio.molecules import MoleculeReward, tokens_to_smiles
from experiments.vidd.config import Config
from experiments.vidd.data import build_model, load_bundle, load_task_data, pretrain_model
from experiments.vidd.metrics import reward_stats, set_metrics

log = logging.getLogger("benchmarks.vidd_molecule")


def sizes(quick: bool) -> Config:
    if quick:
        return Config(n_train=2000, n_heldout=100, seq_len=32, d_model=48, n_layers=2, n_heads=4, pretrain_steps=250,
                      query_budget=2048, batch_size=16, eval_every=4, eval_samples=64, best_of_n_outputs=32)
    return Config()  # configs/experiment/vidd_molecule.yaml smoke defaults


def evaluate(model, pre, reward: MoleculeReward, exp: Config, seed: int) -> dict:
    gen = torch.Generator().manual_seed(10_000 + seed)
    tokens = sample(model, exp.eval_samples, exp.seq_len, exp.num_sampling_steps, gen).tokens
    return score(tokens, pre, reward, exp, seed)


def score(tokens, pre, reward: MoleculeReward, exp: Config, seed: int) -> dict:
    rewards, _ = reward(tokens)  # evaluation queries: outside the training budget
    nll = nelbo(pre, tokens, n_time_samples=exp.nll_time_samples, generator=torch.Generator().manual_seed(seed))
    return {**reward_stats(rewards), "nll": float(nll.mean()),
            **set_metrics("molecule", [s or "" for s in tokens_to_smiles(tokens, reward.vocab)])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default="runs/bench_vidd_molecule")
    parser.add_argument("--methods", default=",".join(["vidd", "best_of_n", "standard_ft", "ddpo"]))
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    out = Path(args.out) / ("quick" if args.quick else "full")
    out.mkdir(parents=True, exist_ok=True)
    exp = sizes(args.quick)
    methods = [m for m in args.methods.split(",") if m]
    assert set(methods) <= set(METHODS), methods

    path = out / "pretrained.pt"
    bundle = load_bundle(path) if path.is_file() else pretrain_model(
        exp, load_task_data(exp, 0, out), 0, path)
    pre = build_model(bundle)
    from envs.bio.sequences import Vocab
    vocab = Vocab(tuple(bundle["vocab"]["symbols"]), pad=bundle["vocab"]["pad"])
    reward = MoleculeReward(vocab=vocab, kind="qed")
    results: dict[str, list[dict]] = {"pretrained": [evaluate(pre, pre, reward, exp, s) for s in range(args.seeds)]}
    curves: dict[str, list] = {}
    for method in methods:
        results[method] = []
        for seed in range(args.seeds):
            start = time.perf_counter()
            res = finetune(method, pre, reward, exp, seed=seed,  # exp is the experiment's VIDDConfig
                           eval_fn=lambda m: {k: v for k, v in evaluate(m, pre, reward, exp, seed).items()
                                              if k in ("reward_median",)})
            wall = time.perf_counter() - start
            final = (score(res.samples, pre, reward, exp, seed) if method == "best_of_n"
                     else evaluate(res.model, pre, reward, exp, seed))
            final.update(queries=res.reward_queries, wall_s=wall, iterations=res.iterations)
            results[method].append(final)
            curve = [(h["reward_queries"] if "reward_queries" in h else res.reward_queries, h["eval/reward_median"])
                     for h in res.history if "eval/reward_median" in h]
            curves.setdefault(method, []).append(curve or [(res.reward_queries, final["reward_median"])])
            log.info("%s seed %d: median %.3f top10 %.3f NLL %.1f div %.3f queries %d wall %.0f s", method, seed,
                     final["reward_median"], final["reward_top10"], final["nll"], final["diversity"],
                     res.reward_queries, wall)
    table = summarise(results)
    (out / "results.json").write_text(json.dumps({"config": dataclasses.asdict(exp), "seeds": args.seeds,
                                                  "per_seed": results, "summary": table, "curves": curves},
                                                 indent=2, default=float))
    plot(curves, table, out / "vidd_reward_vs_queries.png", exp)
    print(markdown(table, exp, args))


def summarise(results: dict[str, list[dict]]) -> dict[str, dict]:
    keys = ("reward_median", "reward_top10", "reward_mean", "nll", "diversity", "validity", "queries", "wall_s")
    return {m: {k: (float(np.mean([r[k] for r in rows])), float(np.std([r[k] for r in rows])))
                for k in keys if k in rows[0]} for m, rows in results.items()}


def markdown(table: dict, exp: Config, args) -> str:
    lines = [f"| method | median QED | top-10% QED | NLL (nats) | diversity | validity | queries | wall (s) |",
             "|---|---|---|---|---|---|---|---|"]
    fmt = lambda s, k, p=3: f"{s[k][0]:.{p}f} ± {s[k][1]:.{p}f}" if k in s else "-"  # noqa: E731
    for m, s in table.items():
        lines.append(f"| {m} | {fmt(s, 'reward_median')} | {fmt(s, 'reward_top10')} | {fmt(s, 'nll', 1)} | "
                     f"{fmt(s, 'diversity')} | {fmt(s, 'validity', 2)} | {fmt(s, 'queries', 0)} | {fmt(s, 'wall_s', 0)} |")
    return "\n".join(lines)


def plot(curves: dict, table: dict, path: Path, exp: Config) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, (m, runs) in enumerate(curves.items()):
        for j, curve in enumerate(runs):
            q, r = zip(*curve)
            ax.plot(q, r, marker="o", ms=3, color=f"C{i}", alpha=0.8, label=m if j == 0 else None)
    ax.axhline(table["pretrained"]["reward_median"][0], color="gray", ls="--", label="pretrained")
    ax.set_xlabel("oracle queries")
    ax.set_ylabel("median QED of samples")
    ax.set_title(f"VIDD vs baselines on MOSES (budget {exp.query_budget}, one line per seed)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
