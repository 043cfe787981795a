"""VIDD on the cluster: reward-guided fine-tuning of a small masked-diffusion model for molecules, DNA or proteins.

    python -m experiments.run experiment=vidd_molecule                                   # VIDD alone
    python -m experiments.run experiment=vidd_molecule experiment.method=ddpo            # one baseline
    (ddpp, rw_mle likewise; VIDD's released-code variant: experiment.distill_target=final_sample)
    python -m experiments.run experiment=vidd_molecule \
        experiment.methods=[vidd,best_of_n,standard_ft,ddpo]                             # compare mode (the tour)
    python -m experiments.run experiment=vidd_protein experiment.fasta=/path/seqs.fasta  # or experiment.fasta=demo

Stages (Algorithm 1 of Su, Li, Uehara et al., ICLR 2026: algos/vidd/vidd.py):
  0. pretraining (data.py): the MDLM denoiser is fitted to the task corpus by maximum likelihood and cached as
     run_dir/pretrained.pt (``experiment.pretrained`` reuses a saved one). Its samples give the "pretrained" row.
  1. per method, under one oracle-query budget (``query_budget``, distinct sequences sent to the oracle, counted
     exactly in the pool workers):
       vidd         roll-in from the teacher p_out with probability beta (else p_pre), roll-out x̄ ~ p_out, soft
                    values v = r(x̂0) and value-weighted NLL on the learner; p_out <- theta every K iterations
       standard_ft  the same with beta = 0 and p_out = p_pre forever (one-shot distillation of p_pre's target)
       ddpo         PPO-clip over the denoising chain with normalized terminal rewards (algos/vidd/ddpo.py)
       ddpp         DDPP posterior matching of p_pre tilted by exp(r / alpha) (algos/vidd/x0_losses.py)
       rw_mle       reward-weighted MLE of the roll-ins' final samples (the released protein scripts' loss)
       best_of_n    test-time selection from p_pre: best of N = budget // best_of_n_outputs samples per output
                    (no learner: it runs from this driver through the pool)
     Sampling (roll-ins, roll-outs + values, DDPO trajectories, evaluation samples) runs on the shared pool's
     "diffusion" sampler (sampler.py) with weights published by version; learners (learner.py) run under Ray Train.
  2. evaluation every ``eval_every`` iterations and at the end: ``eval_samples`` fresh samples of the student (their
     oracle calls are evaluation, not training, and are reported apart as ``eval_queries``): reward mean / median /
     top-10 %, the KL to the pretrained model along the student's own denoising trajectories (``kl``, nats; the
     closeness measure: algos/vidd/closeness.py; best-of-N: its bound log N - (N - 1)/N), NELBO under the pretrained
     model (nats per sequence: how typical, which a sharpened model raises without moving far), diversity, validity,
     uniqueness. Metrics go to run_dir/metrics (column ``method_id`` = index in algos.vidd.config.METHODS, -1 =
     pretrained) and the samples to run_dir/data/samples (Parquet, with the method name as a string column).
Plots (plots.py): plots/vidd_reward_vs_queries.png (median reward vs oracle queries), plots/vidd_reward_vs_kl.png
(the reward-closeness frontier), plots/vidd_quality.png.
``Config`` and ``check`` (config.py) are what experiments/registry.py expects of an experiment's module, with ``run``.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from algos.vidd.config import METHODS
from experiments.vidd.config import Config, check  # noqa: F401 - check: the registry's hook
from experiments.vidd.data import build_model, load_bundle, pretrain_stage, sampler_config
from experiments.vidd.metrics import reward_stats, set_metrics, task_metrics, write_samples
from experiments.vidd.plots import plot_results
from experiments.vidd.sampler_requests import best_of_n_candidates, evaluate_through_pool, queries_of, sum_info

log = logging.getLogger(__name__)

PRETRAINED_ID = -1.0
PROTOCOL_KEYS = ("heldout_reward_median", "kmer3_corr")  # DNA: the held-out oracle, naturalness


def run(cfg: dict, ctx) -> dict[str, Any]:
    from cluster.metrics import MetricsLogger, read_metrics
    from cluster.train import fit, stage0
    from experiments.vidd.learner import train_fn

    exp: Config = ctx.typed["experiment"]
    seed = cfg["seed"]
    run_path = ctx.run_dir.path
    pool = ctx.pool
    n_requests = ctx.typed["pool"].num_workers
    run_id = ctx.run_id  # unique on the cluster: the prefix of this run's pool weight keys
    pretrained_path = Path(exp.pretrained) if exp.pretrained else run_path / "pretrained.pt"
    if pretrained_path.is_file():
        bundle = load_bundle(pretrained_path)
        if bundle.get("task") != exp.task or bundle["denoiser"]["seq_len"] != exp.seq_len:
            from experiments.config import ConfigError
            raise ConfigError(f"experiment.pretrained: {pretrained_path} is a {bundle.get('task')} model of length "
                              f"{bundle['denoiser']['seq_len']}, not {exp.task} of length {exp.seq_len}")
        log.info("using the pretrained model %s", pretrained_path)
    else:
        bundle = stage0(pretrain_stage, exp, seed, run_path, pretrained_path, train=ctx.typed["train"])
    pre_model = build_model(bundle)
    scfg = sampler_config(exp, bundle)
    methods = exp.method_list()
    samples = ctx.run_dir.store("samples")

    # pretrained reference and best-of-N run from the driver, before any learner writes metrics or samples
    pre_key = f"{run_id}/pretrained"
    pool.publish(pre_key, {"pretrained": bundle["state_dict"]})
    pre_metrics, columns = evaluate_through_pool(pool, scfg, pre_key, "pretrained", exp.eval_samples, seed + 17,
                                                 n_requests, exp.task, pre_model, exp.nll_time_samples,
                                                 task_metrics(exp, seed))
    write_samples(samples, columns, "pretrained", 0, 0, seed)
    driver_rows = [{"method_id": PRETRAINED_ID, "iteration": 0, "queries": 0, "wall_s": 0.0, **pre_metrics}]
    if "best_of_n" in methods:
        driver_rows += run_best_of_n(pool, exp, scfg, pre_key, pre_model, seed, n_requests, samples)
    # written now, while no learner runs: one writer per store at a time
    driver_log = MetricsLogger(run_path, tensorboard=False)
    for row in driver_rows:
        driver_log.log(int(row["iteration"]), row)
    driver_log.close()

    for m in methods:
        if m == "best_of_n":
            continue
        loop = {"experiment": dataclasses.asdict(exp), "pool": dataclasses.asdict(ctx.typed["pool"]),
                "run_path": str(run_path), "run_id": run_id, "method": m, "seed": seed,
                "torch_threads": cfg["torch_threads"], "pretrained_path": str(pretrained_path),
                "sampler_config": scfg}
        fit(train_fn, loop, name=f"learner-{m}", storage_path=ctx.run_dir.checkpoints, train=ctx.typed["train"])

    df = read_metrics(run_path)
    pretrained = {"median_reward": pre_metrics["reward_median"], "top10_reward": pre_metrics["reward_top10"],
                  "nll": pre_metrics["nll"], "kl": 0.0, "diversity": _num(pre_metrics["diversity"]),
                  "validity": pre_metrics["validity"],
                  **{k: _num(pre_metrics[k]) for k in PROTOCOL_KEYS if k in pre_metrics}}
    title = {"molecule": f"molecules ({exp.reward})", "dna": "DNA (liver-TF motif proxy)",
             "protein": "protein (beta-sheet propensity proxy)"}[exp.task]
    per_method = summarise(df, methods)
    plots = plot_results(df, methods, pretrained, per_method, ctx.run_dir.plots, f"VIDD on {title}")
    summary = {"task": exp.task, "query_budget": exp.query_budget, "pretrained": pretrained, "methods": per_method,
               "plots": plots}
    ctx.run_dir.write_json("pretrain_metrics.json", bundle.get("metrics", {}))
    print(f"VIDD {exp.task} ({exp.reward}), budget {exp.query_budget} oracle queries per method; pretrained median "
          f"{pretrained['median_reward']:.3f}, NLL {pretrained['nll']:.1f}", flush=True)
    for m, s in summary["methods"].items():
        if s:
            kl = "-" if s["kl"] is None else f"{s['kl']:.1f}"
            print(f"  {m:12s} median {s['median_reward']:.3f} top10 {s['top10_reward']:.3f} KL {kl} "
                  f"NLL {s['nll']:.1f} "
                  f"diversity {s['diversity']} validity {s['validity']:.2f} queries {s['queries']} "
                  f"wall {s['wall_s']:.0f} s", flush=True)
    return summary


def run_best_of_n(pool, exp: Config, scfg: dict, key: str, pre_model, seed: int, n_requests: int,
                  samples) -> list[dict]:
    """Best-of-N from p_pre through the pool: M = best_of_n_outputs outputs, N = budget // M candidates each.

    One draw of M * N scored candidates; the reward-vs-queries curve takes the first n candidates of every output
    for n = 1, 2, 4, ..., N (nested subsets of the same draw), each point costing M * n oracle queries.
    """
    import torch

    from algos.vidd.closeness import best_of_n_kl_bound
    from algos.vidd.mdlm import nelbo
    M = exp.best_of_n_outputs
    N = exp.query_budget // M
    start = time.perf_counter()
    results = best_of_n_candidates(pool, scfg, key, M * N, seed * 31 + 5, n_requests)
    tokens = np.concatenate([r["tokens"] for r in results]).astype(np.int64).reshape(M, N, -1)
    rewards = np.concatenate([r["rewards"] for r in results]).reshape(M, N)
    sequences = np.array([s for r in results for s in r["sequences"]], dtype=object).reshape(M, N)
    queries = queries_of(results)  # distinct sequences within each request: <= M * N
    sample_s = time.perf_counter() - start
    rows = []
    sizes = sorted({*(2 ** i for i in range(int(math.log2(N)) + 1)), N})
    for i, n in enumerate(sizes):
        best = rewards[:, :n].argmax(axis=1)
        chosen = tokens[np.arange(M), best]
        chosen_seq = list(sequences[np.arange(M), best])
        nll = nelbo(pre_model, torch.as_tensor(chosen), n_time_samples=exp.nll_time_samples,
                    generator=torch.Generator().manual_seed(seed))
        row = {"method_id": float(METHODS.index("best_of_n")), "iteration": i + 1, "best_of": n,
               # the full draw's distinct-query count, pro rata for the nested subsets
               "queries": int(round(queries * n / N)), **reward_stats(rewards[np.arange(M), best]),
               "nll": float(nll.mean()), "kl": best_of_n_kl_bound(n), "kl_se": 0.0,  # no trajectory: the bound
               **set_metrics(exp.task, chosen_seq), "eval_queries": 0.0,
               "wall_s": sample_s * n / N + (time.perf_counter() - start - sample_s)}
        rows.append(row)
        if n == N:
            write_samples(samples, {"sequence": chosen_seq, "reward": rewards[np.arange(M), best],
                                    "nll": nll.numpy(), "tokens": chosen}, "best_of_n", i + 1, queries, seed)
    rows[-1].update({f"train_{k}": v for k, v in sum_info(results).items()})
    return rows


def summarise(df, methods: list[str]) -> dict[str, dict | None]:
    """Per method, the last evaluation's figures (None if it never evaluated) with its queries and wall time."""
    out = {}
    for m in methods:
        rows = df[df["method_id"] == METHODS.index(m)].sort_values(["queries", "iteration"])
        ev = rows.dropna(subset=["reward_median"])
        if not len(ev):
            out[m] = None
            continue
        last = ev.iloc[-1]
        out[m] = {"median_reward": float(last["reward_median"]), "top10_reward": float(last["reward_top10"]),
                  "mean_reward": float(last["reward_mean"]), "nll": float(last["nll"]),
                  "kl": _num(last["kl"]) if "kl" in last.index else None,
                  "diversity": _num(last["diversity"]), "validity": float(last["validity"]),
                  "uniqueness": float(last["uniqueness"]), "queries": int(rows["queries"].max()),
                  "wall_s": float(rows["wall_s"].max()),
                  **{k: _num(last[k]) for k in PROTOCOL_KEYS if k in last.index}}
    return out


def _num(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None
