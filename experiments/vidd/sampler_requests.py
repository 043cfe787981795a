"""What the driver and the learners ask of the pool's "diffusion" sampler (experiments/vidd/sampler.py), and how the
answers come back together: evaluation samples, VIDD roll-out batches, final-sample batches (DDPP, RW_MLE, the
released VIDD variant), DDPO trajectories, best-of-N candidates.

A request of ``n`` samples is split into at most one request per pool worker; every answer counts its oracle queries
(``queries``, distinct sequences) and the oracle's own counts (``reward_info``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from experiments.vidd.metrics import reward_stats, set_metrics

SAMPLER = "diffusion"


def split_requests(n: int, parts: int) -> list[int]:
    """``n`` split into at most ``parts`` near-equal positive chunks (one pool request each)."""
    parts = max(1, min(parts, n))
    return [n // parts + (i < n % parts) for i in range(parts)]


def queries_of(results: list[dict]) -> int:
    return sum(r["queries"] for r in results)


def sum_info(results: list[dict]) -> dict[str, float]:
    """The oracle's counts (invalid, empty, errors, ...) summed over answers."""
    total: dict[str, float] = {}
    for r in results:
        for k, v in r.get("reward_info", {}).items():
            if k != "n_queries":
                total[k] = total.get(k, 0) + v
    return total


def evaluate_through_pool(pool, scfg: dict, weights_key: str, role: str, n: int, seed: int, n_requests: int,
                          task: str, pretrained_model, nll_time_samples: int, extra=None,
                          model=None) -> tuple[dict, dict]:
    """``n`` fresh samples of ``role`` scored in the pool; returns (metrics, sample columns). ``extra(sequences)``
    adds task metrics (DNA: the held-out oracle and the 3-mer correlation). ``model``: the local copy of ``role``'s
    weights; given, the samples' denoising trajectories come back and ``kl`` is KL(model || pretrained) along them
    (``algos/vidd/closeness.py``); without it ``role`` is the pretrained model itself, at KL 0."""
    import torch

    from algos.vidd.mdlm import nelbo
    reqs = [{"kind": "sample", "n": k, "seed": seed * 7919 + i, "model": role, "score": True,
             "record_trajectory": model is not None} for i, k in enumerate(split_requests(n, n_requests))]
    results = pool.map(SAMPLER, reqs, config=scfg, weights=weights_key)
    tokens = np.concatenate([r["tokens"] for r in results]).astype(np.int64)
    rewards = np.concatenate([r["rewards"] for r in results])
    sequences = [s for r in results for s in r["sequences"]]
    nll = nelbo(pretrained_model, torch.as_tensor(tokens), n_time_samples=nll_time_samples,
                generator=torch.Generator().manual_seed(seed))
    kl = {"kl": 0.0, "kl_se": 0.0, "kl_rb": 0.0}
    if model is not None:
        kl = closeness(model, pretrained_model, np.concatenate([r["states"] for r in results], axis=1))
    metrics = {**reward_stats(rewards), "nll": float(nll.mean()), **kl, **set_metrics(task, sequences),
               "eval_queries": float(queries_of(results)),
               **{f"eval_{k}": float(v) for k, v in sum_info(results).items()},
               **(extra(sequences) if extra is not None else {})}
    columns = {"sequence": sequences, "reward": rewards, "nll": nll.numpy(), "tokens": tokens}
    return metrics, columns


def closeness(model, pretrained_model, states: np.ndarray) -> dict[str, float]:
    """``algos.vidd.closeness.trajectory_kl_summary`` of ``states`` ``[T + 1, n, L]``, drawn from ``model`` by a pool
    worker, which samples in eval mode: so is the local copy here, then put back as it was. The sampler's log-linear
    schedule is the estimator's default."""
    import torch

    from algos.vidd.closeness import trajectory_kl_summary
    was_training = model.training
    model.eval()
    try:
        return trajectory_kl_summary(model, pretrained_model, torch.as_tensor(states.astype(np.int64)))
    finally:
        model.train(was_training)


def vidd_transitions(pool, scfg: dict, weights_key: str, cfg, n: int, budget: int, seed: int, n_requests: int,
                     with_teacher: bool) -> tuple[Any, list[dict]]:
    """Roll-in of ``n`` trajectories (teacher or p_pre), roll-out and values within ``budget`` queries, in the pool;
    returns the :class:`algos.vidd.vidd.VIDDBatch` and the answers. ``cfg``: the method's VIDDConfig."""
    from algos.vidd.vidd import rollin_is_teacher_sample
    # each request needs >= 2 queries (one value pair): near the end of the budget use fewer requests
    chunks = split_requests(n, min(n_requests, max(1, budget // 2)))
    allowances = split_requests(budget, len(chunks))
    reqs = [{"kind": "vidd", "n": k, "seed": seed + i, "model": "teacher" if with_teacher else "pretrained",
             "steps_per_trajectory": cfg.timesteps_per_trajectory, "max_queries": int(allowances[i]),
             "value_model": cfg.value_model, "value_estimator": cfg.value_estimator,
             "greedy_tokens_per_step": cfg.greedy_tokens_per_step, "next_value": cfg.next_value,
             "keep_teacher_log_probs": cfg.exact_teacher_term, "value_denominator": cfg.value_denominator,
             "states_from_teacher": rollin_is_teacher_sample(with_teacher, cfg)}
            for i, k in enumerate(chunks)]
    results = pool.map(SAMPLER, reqs, config=scfg, weights=weights_key)
    return vidd_batch(results), results


def x0_transitions(pool, scfg: dict, weights_key: str, cfg, method: str, n: int, budget: int, seed: int,
                   n_requests: int, with_teacher: bool) -> tuple[Any, list[dict]]:
    """Roll-in of ``n`` trajectories, their final samples and (DDPP, the released VIDD variant) the values of the
    selected states, within ``budget`` queries, in the pool: an :class:`algos.vidd.x0_losses.X0Batch` and the
    answers. ``cfg``: the method's VIDDConfig."""
    import torch

    from algos.vidd.x0_losses import X0Batch, value_model_role
    chunks = split_requests(n, min(n_requests, max(1, budget)))
    allowances = split_requests(budget, len(chunks))
    role = value_model_role(method, cfg)
    reqs = [{"kind": "x0", "n": k, "seed": seed + i, "model": "teacher" if with_teacher else "pretrained",
             "steps_per_trajectory": cfg.timesteps_per_trajectory, "max_queries": int(allowances[i]),
             "value_model": role, "value_estimator": "one_step" if method == "ddpp" else cfg.value_estimator,
             "greedy_tokens_per_step": cfg.greedy_tokens_per_step} for i, k in enumerate(chunks)]
    results = pool.map(SAMPLER, reqs, config=scfg, weights=weights_key)
    offsets = np.cumsum([0] + [r["num_samples"] for r in results[:-1]])  # trajectory ids unique across answers
    cat = lambda k, dtype: torch.as_tensor(np.concatenate([r[k] for r in results])).to(dtype)  # noqa: E731
    trajectory = torch.as_tensor(np.concatenate([r["trajectory"] + o for r, o in zip(results, offsets)])).long()
    batch = X0Batch(x_t=cat("x_t", torch.long), x0=cat("x0", torch.long), t=cat("t", torch.float32),
                    trajectory=trajectory, r_final=cat("r_final", torch.float32),
                    v_current=cat("v_current", torch.float32), valid=cat("valid", torch.bool))
    return batch, results


def vidd_batch(results: list[dict]):
    """The answers' transitions as one :class:`algos.vidd.vidd.VIDDBatch`."""
    import torch

    from algos.vidd.vidd import VIDDBatch
    cat = lambda k, dtype: torch.as_tensor(np.concatenate([r[k] for r in results])).to(dtype)  # noqa: E731
    return VIDDBatch(x_t=cat("x_t", torch.long), x_next=cat("x_next", torch.long), t=cat("t", torch.float32),
                     s=cat("s", torch.float32), v_current=cat("v_current", torch.float32),
                     v_next=cat("v_next", torch.float32), changed=cat("changed", torch.bool),
                     teacher_log_probs=cat("teacher_log_probs", torch.float32) if "teacher_log_probs" in results[0]
                     else None)


def ddpo_trajectories(pool, scfg: dict, weights_key: str, n: int, seed: int, n_requests: int):
    """``n`` trajectories of the current student, their final samples scored (one query per distinct sample):
    ``(states [T+1, n, L], rewards [n], answers)``."""
    import torch
    reqs = [{"kind": "sample", "n": k, "seed": seed + i, "model": "student", "record_trajectory": True,
             "score": True, "max_queries": k} for i, k in enumerate(split_requests(n, n_requests))]
    results = pool.map(SAMPLER, reqs, config=scfg, weights=weights_key)
    states = torch.as_tensor(np.concatenate([r["states"] for r in results], axis=1)).long()
    rewards = torch.as_tensor(np.concatenate([r["rewards"] for r in results]), dtype=torch.float32)
    return states, rewards, results


def best_of_n_candidates(pool, scfg: dict, weights_key: str, n: int, seed: int, n_requests: int) -> list[dict]:
    """``n`` scored samples of p_pre (best-of-N's candidates), each request within its own share of the budget."""
    reqs = [{"kind": "sample", "n": k, "seed": seed + i, "model": "pretrained", "score": True, "max_queries": k}
            for i, k in enumerate(split_requests(n, n_requests))]
    return pool.map(SAMPLER, reqs, config=scfg, weights=weights_key)
