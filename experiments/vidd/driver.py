"""VIDD on the cluster: reward-guided fine-tuning of a small masked-diffusion model for molecules, DNA or proteins.

    python -m experiments.run experiment=vidd_molecule                                   # VIDD alone
    python -m experiments.run experiment=vidd_molecule experiment.method=ddpo            # one baseline
    python -m experiments.run experiment=vidd_molecule \
        experiment.methods=[vidd,best_of_n,standard_ft,ddpo]                             # compare mode (the tour)
    python -m experiments.run experiment=vidd_protein experiment.fasta=/path/seqs.fasta  # or experiment.fasta=demo

Stages (algos/vidd/vidd.py, Algorithm 1 of Su, Li, Uehara et al., ICLR 2026):
  0. pretraining (driver): the MDLM denoiser is fitted to the task corpus by maximum likelihood and cached as
     run_dir/pretrained.pt (``experiment.pretrained`` reuses a saved one). Its samples give the "pretrained" row.
  1. per method, under one oracle-query budget (``query_budget``, distinct sequences sent to the oracle, counted
     exactly in the pool workers):
       vidd         roll-in from p_out with probability beta (else p_pre), roll-out x̄ ~ p_out, soft values
                    v = r(x̂0) and value-weighted NLL on the learner; p_out <- theta every K iterations
       standard_ft  the same with beta = 0 and p_out = p_pre forever (one-shot distillation of p_pre's target)
       ddpo         PPO-clip over the denoising chain with normalized terminal rewards (algos/vidd/ddpo.py)
       best_of_n    test-time selection from p_pre: best of N = budget // best_of_n_outputs samples per output
                    (no learner: it runs from the driver through the pool)
     Sampling (roll-ins, roll-outs + values, DDPO trajectories, evaluation samples) runs on the shared pool's
     "diffusion" sampler with weights published by version; learners run under Ray Train (DDP over gloo on CPU:
     every rank collects its share of the batch and of the remaining budget; gradients are all-reduced).
  2. evaluation every ``eval_every`` iterations and at the end: ``eval_samples`` fresh samples of the student (their
     oracle calls are evaluation, not training, and are reported apart as ``eval_queries``): reward mean / median /
     top-10 %, NELBO under the pretrained model (nats per sequence), diversity, validity, uniqueness. Metrics go to
     run_dir/metrics (column ``method_id`` = index in METHODS, -1 = pretrained) and the samples to
     run_dir/data/samples (Parquet, with the method name as a string column).
Plots: plots/vidd_reward_vs_queries.png (median reward vs oracle queries), plots/vidd_quality.png (NLL, diversity).
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

METHODS = ("vidd", "best_of_n", "standard_ft", "ddpo")
TASK_OF_EXPERIMENT = {"vidd_molecule": "molecule", "vidd_dna": "dna", "vidd_protein": "protein"}
REWARD_KINDS = {"molecule": ("qed", "sa", "composite"), "dna": ("motif",), "protein": ("beta_sheet",)}
PRETRAINED_ID = -1.0


@dataclass
class Config:
    task: str = "molecule"  # molecule | dna | protein (set by the experiment's yaml)
    method: str = "vidd"
    methods: list[str] = field(default_factory=list)  # compare mode when non-empty
    pretrained: str | None = None  # a saved pretrained.pt (from an earlier run) to skip pretraining
    fasta: str | None = None  # protein corpus; "demo" writes a small synthetic FASTA into the run dir
    # data and reward
    n_train: int = 4000
    n_heldout: int = 200
    seq_len: int = 40  # molecules: max SELFIES symbols; DNA: sequence length; proteins: max residues
    reward: str = "qed"  # molecule: qed | sa | composite; dna: motif; protein: beta_sheet
    sa_weight: float = 0.5  # composite = QED - sa_weight (SA - 1) / 9
    dna_release: str = "JASPAR2024"
    # denoiser and pretraining
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    use_bf16: bool = False
    pretrain_steps: int = 400
    pretrain_batch_size: int = 64
    pretrain_lr: float = 2e-3
    # sampling and budget
    num_sampling_steps: int = 8  # T
    query_budget: int = 8192  # oracle queries per method (training; evaluation reported apart)
    max_iterations: int = 200
    batch_size: int = 32  # roll-in trajectories (VIDD) / sampled trajectories (DDPO) per iteration
    # VIDD (algos.vidd.vidd.VIDDConfig)
    alpha: float = 0.1
    beta: float = 1.0
    refresh_interval: int | None = 5  # K; null = never
    timesteps_per_trajectory: int | None = None  # null = all T
    lr: float = 1e-3
    updates_per_batch: int = 4
    value_estimator: str = "one_step"  # one_step (Alg. 1) | greedy
    greedy_tokens_per_step: int = 4
    max_log_weight: float | None = None
    self_normalize_weights: bool = True  # weights of mean 1 within each reverse step
    next_value: str = "rollout"  # denoised (Alg. 1: v = r(x0hat(xbar))) | rollout (r of the roll-in's own x0)
    exact_teacher_term: bool = True  # control variate for the w = 1 part (needs self_normalize_weights)
    grad_clip: float = 1.0
    # DDPO baseline
    ddpo_clip: float = 0.2
    ddpo_inner_steps: int = 2
    ddpo_lr: float | None = None  # null = lr
    # best-of-N baseline
    best_of_n_outputs: int = 64
    # evaluation
    eval_every: int = 5
    eval_samples: int = 64
    nll_time_samples: int = 4

    def __post_init__(self) -> None:
        self.methods = list(self.methods)
        if self.task not in TASK_OF_EXPERIMENT.values():
            raise ValueError(f"experiment.task: must be molecule, dna or protein, got {self.task!r}")
        for m in [self.method, *self.methods]:
            if m not in METHODS:
                raise ValueError(f"experiment.method: unknown method {m!r} (choose from {', '.join(METHODS)})")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"experiment.methods: duplicates in {self.methods}")
        if self.reward not in REWARD_KINDS[self.task]:
            raise ValueError(f"experiment.reward: {self.task} rewards are {', '.join(REWARD_KINDS[self.task])}, "
                             f"got {self.reward!r}")
        for key in ("n_train", "n_heldout", "d_model", "n_layers", "n_heads", "pretrain_steps", "pretrain_batch_size",
                    "num_sampling_steps", "query_budget", "max_iterations", "batch_size", "updates_per_batch",
                    "greedy_tokens_per_step", "ddpo_inner_steps", "best_of_n_outputs", "eval_samples",
                    "nll_time_samples"):
            if getattr(self, key) < 1:
                raise ValueError(f"experiment.{key}: must be >= 1, got {getattr(self, key)}")
        if self.seq_len < 2:
            raise ValueError(f"experiment.seq_len: must be >= 2, got {self.seq_len}")
        if self.d_model % self.n_heads:
            raise ValueError(f"experiment.d_model: {self.d_model} must be divisible by n_heads={self.n_heads}")
        for key in ("alpha", "lr", "pretrain_lr", "grad_clip", "ddpo_clip"):
            if not getattr(self, key) > 0:
                raise ValueError(f"experiment.{key}: must be > 0, got {getattr(self, key)}")
        if self.ddpo_lr is not None and self.ddpo_lr <= 0:
            raise ValueError(f"experiment.ddpo_lr: must be > 0 or null, got {self.ddpo_lr}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"experiment.beta: must lie in [0, 1], got {self.beta}")
        if self.refresh_interval is not None and self.refresh_interval < 1:
            raise ValueError(f"experiment.refresh_interval: must be >= 1 or null, got {self.refresh_interval}")
        if self.timesteps_per_trajectory is not None and not 1 <= self.timesteps_per_trajectory <= self.num_sampling_steps:
            raise ValueError(f"experiment.timesteps_per_trajectory: must lie in [1, num_sampling_steps="
                             f"{self.num_sampling_steps}] or be null, got {self.timesteps_per_trajectory}")
        if self.value_estimator not in ("one_step", "greedy"):
            raise ValueError(f"experiment.value_estimator: one_step or greedy, got {self.value_estimator!r}")
        if self.next_value not in ("denoised", "rollout"):
            raise ValueError(f"experiment.next_value: denoised or rollout, got {self.next_value!r}")
        if self.exact_teacher_term and not self.self_normalize_weights:
            raise ValueError("experiment.exact_teacher_term: needs experiment.self_normalize_weights=true")
        if self.eval_every < 0:
            raise ValueError(f"experiment.eval_every: must be >= 0 (0 = only at the end), got {self.eval_every}")
        if self.query_budget < self.best_of_n_outputs and "best_of_n" in self.method_list():
            raise ValueError(f"experiment.query_budget: {self.query_budget} is below best_of_n_outputs="
                             f"{self.best_of_n_outputs} (best-of-N needs at least one candidate per output)")
        if self.task == "dna" and self.seq_len < 20:
            raise ValueError(f"experiment.seq_len: DNA sequences need >= 20 bp, got {self.seq_len}")

    def method_list(self) -> list[str]:
        return self.methods or [self.method]

    def vidd_config(self, method: str):
        """The algos.vidd.vidd.VIDDConfig of a fine-tuning method (standard_ft: beta = 0, teacher never refreshed)."""
        from algos.vidd.vidd import VIDDConfig
        cfg = VIDDConfig(
            alpha=self.alpha, beta=self.beta, refresh_interval=self.refresh_interval,
            timesteps_per_trajectory=self.timesteps_per_trajectory, batch_size=self.batch_size,
            num_iterations=self.max_iterations, max_reward_queries=self.query_budget,
            lr=self.ddpo_lr or self.lr if method == "ddpo" else self.lr, updates_per_batch=self.updates_per_batch,
            grad_clip=self.grad_clip, num_sampling_steps=self.num_sampling_steps, value_estimator=self.value_estimator,
            greedy_tokens_per_step=self.greedy_tokens_per_step, max_log_weight=self.max_log_weight,
            self_normalize_weights=self.self_normalize_weights, next_value=self.next_value,
            exact_teacher_term=self.exact_teacher_term, ddpo_clip=self.ddpo_clip,
            ddpo_inner_steps=self.ddpo_inner_steps, best_of_n_outputs=self.best_of_n_outputs)
        if method == "standard_ft":
            cfg = dataclasses.replace(cfg, beta=0.0, refresh_interval=None)
        return cfg


def check(exp: Config, raw: dict) -> None:
    from experiments.config import ConfigError
    name = raw["experiment"].get("name")
    if TASK_OF_EXPERIMENT.get(name, exp.task) != exp.task:
        raise ConfigError(f"experiment.task: {name} runs task {TASK_OF_EXPERIMENT[name]!r}, got {exp.task!r}")
    if exp.pretrained is not None and not Path(exp.pretrained).is_file():
        raise ConfigError(f"experiment.pretrained: no such file {exp.pretrained!r} (a pretrained.pt of an earlier run)")
    if exp.task == "protein":
        if exp.fasta is None:
            raise ConfigError("experiment.fasta: vidd_protein needs a FASTA path (or experiment.fasta=demo for a "
                              "small generated set)")
        if exp.fasta != "demo":
            from envs.bio.protein import read_fasta
            try:
                seqs = read_fasta(exp.fasta)
            except (FileNotFoundError, ValueError) as err:
                raise ConfigError(f"experiment.fasta: {err}") from None
            if not any(len(s) <= exp.seq_len for s in seqs):
                raise ConfigError(f"experiment.fasta: no sequence fits seq_len={exp.seq_len} "
                                  f"(shortest has {min(map(len, seqs))} residues)")


# ------------------------------------------------------------------------------------------ task, data, metrics

@dataclass
class TaskData:
    train: Any  # [N, L] tokens
    heldout: Any
    vocab: Any  # envs.bio.sequences.Vocab


def load_task_data(exp: Config, seed: int, run_path: Path) -> TaskData:
    """The pretraining corpus of the task (tokens) with a held-out split for the NLL check."""
    if exp.task == "molecule":
        from envs.bio.molecules import make_molecule_dataset
        data = make_molecule_dataset(exp.n_train, exp.n_heldout, exp.seq_len)
        return TaskData(data.train_tokens, data.heldout_tokens, data.vocab)
    if exp.task == "dna":
        from envs.bio.dna import DNA_VOCAB, dna_to_tokens, generate_dna_corpus
        seqs = generate_dna_corpus(exp.n_train + exp.n_heldout, exp.seq_len, seed=seed)
        tokens = dna_to_tokens(seqs)
        return TaskData(tokens[: exp.n_train], tokens[exp.n_train :], DNA_VOCAB)
    from envs.bio.protein import PROTEIN_VOCAB, protein_tokens, read_fasta, write_synthetic_fasta
    path = exp.fasta
    if path == "demo":
        path = write_synthetic_fasta(run_path / "demo.fasta", n=exp.n_train + exp.n_heldout,
                                     min_len=max(1, exp.seq_len // 2), max_len=exp.seq_len, seed=seed)
    seqs = [s for s in read_fasta(path) if len(s) <= exp.seq_len]
    n_heldout = min(exp.n_heldout, max(1, len(seqs) // 10))
    tokens = protein_tokens(seqs, exp.seq_len)
    return TaskData(tokens[n_heldout:], tokens[:n_heldout], PROTEIN_VOCAB)


def sampler_config(exp: Config, bundle: dict) -> dict:
    """The pool sampler's config (hashable JSON: workers cache one sampler per distinct config)."""
    reward: dict[str, Any] = {"kind": exp.reward}
    if exp.task == "molecule":
        reward["sa_weight"] = exp.sa_weight
    if exp.task == "dna":
        reward["release"] = exp.dna_release
    return {"task": exp.task, "denoiser": bundle["denoiser"], "vocab": bundle["vocab"], "reward": reward,
            "T": exp.num_sampling_steps}


def set_metrics(task: str, sequences: list[str]) -> dict[str, float]:
    """Validity, uniqueness (among valid) and diversity (molecules: mean pairwise Tanimoto distance of Morgan
    fingerprints; sequences: mean pairwise normalized Hamming distance) of a set of generated samples."""
    n = max(len(sequences), 1)
    if task == "molecule":
        from rdkit import Chem

        from envs.bio.molecules import parse_molecule, tanimoto_diversity
        mols = [parse_molecule(s) for s in sequences]
        valid = [m for m in mols if m is not None]
        unique = {Chem.MolToSmiles(m) for m in valid}
        diversity = tanimoto_diversity(valid) if len(valid) > 1 else float("nan")
    else:
        from envs.bio.protein import hamming_diversity
        valid = [s for s in sequences if s]
        unique = set(valid)
        diversity = hamming_diversity(valid) if len(valid) > 1 else float("nan")
    return {"validity": len(valid) / n, "uniqueness": len(unique) / max(len(valid), 1), "diversity": diversity}


def reward_stats(rewards: np.ndarray) -> dict[str, float]:
    r = np.sort(np.asarray(rewards, dtype=np.float64))
    top = r[-max(1, len(r) // 10):]
    return {"reward_mean": float(r.mean()), "reward_median": float(np.median(r)), "reward_top10": float(top.mean())}


def split_requests(n: int, parts: int) -> list[int]:
    """``n`` split into at most ``parts`` near-equal positive chunks (one pool request each)."""
    parts = max(1, min(parts, n))
    return [n // parts + (i < n % parts) for i in range(parts)]


def evaluate_through_pool(pool, scfg: dict, weights_key: str, role: str, n: int, seed: int, n_requests: int,
                          task: str, pretrained_model, nll_time_samples: int) -> tuple[dict, dict]:
    """``n`` fresh samples of ``role`` scored in the pool; returns (metrics, sample columns)."""
    import torch

    from algos.vidd.mdlm import nelbo
    reqs = [{"kind": "sample", "n": k, "seed": seed * 7919 + i, "model": role, "score": True}
            for i, k in enumerate(split_requests(n, n_requests))]
    results = pool.map("diffusion", reqs, config=scfg, weights=weights_key)
    tokens = np.concatenate([r["tokens"] for r in results]).astype(np.int64)
    rewards = np.concatenate([r["rewards"] for r in results])
    sequences = [s for r in results for s in r["sequences"]]
    nll = nelbo(pretrained_model, torch.as_tensor(tokens), n_time_samples=nll_time_samples,
                generator=torch.Generator().manual_seed(seed))
    metrics = {**reward_stats(rewards), "nll": float(nll.mean()), **set_metrics(task, sequences),
               "eval_queries": float(sum(r["queries"] for r in results)),
               **{f"eval_{k}": float(v) for k, v in _sum_info(results).items()}}
    columns = {"sequence": sequences, "reward": rewards, "nll": nll.numpy(), "tokens": tokens}
    return metrics, columns


def _sum_info(results: list[dict]) -> dict[str, float]:
    total: dict[str, float] = {}
    for r in results:
        for k, v in r.get("reward_info", {}).items():
            if k != "n_queries":
                total[k] = total.get(k, 0) + v
    return total


def write_samples(store, columns: dict, method: str, iteration: int, queries: int, seed: int) -> None:
    n = len(columns["sequence"])
    store.append({"method": [method] * n, "iteration": np.full(n, iteration), "queries": np.full(n, queries),
                  "seed": np.full(n, seed), **columns})


# ------------------------------------------------------------------------------------------ pretraining

def pretrain_model(exp: Config, data: TaskData, seed: int, out: Path) -> dict:
    """Fit the denoiser to the corpus (MDLM NELBO) and save the bundle {denoiser, vocab, state_dict, metrics}."""
    import torch

    from algos.vidd.mdlm import DenoiserConfig, MaskedDenoiser, PretrainConfig, nelbo, pretrain
    torch.manual_seed(seed)
    dcfg = DenoiserConfig(vocab_size=data.vocab.size, seq_len=exp.seq_len, d_model=exp.d_model,
                          n_layers=exp.n_layers, n_heads=exp.n_heads, use_bf16=exp.use_bf16)
    model = MaskedDenoiser(dcfg)
    gen = torch.Generator().manual_seed(seed)
    heldout_before = float(nelbo(model, data.heldout, n_time_samples=2, generator=gen).mean())
    start = time.perf_counter()
    metrics = pretrain(model, data.train, PretrainConfig(steps=exp.pretrain_steps, batch_size=exp.pretrain_batch_size,
                                                         lr=exp.pretrain_lr, log_every=max(1, exp.pretrain_steps // 5)),
                       gen, log_fn=lambda step, m: log.info("pretrain step %d: %s", step, m))
    heldout_after = float(nelbo(model, data.heldout, n_time_samples=2, generator=gen).mean())
    bundle = {"task": exp.task, "denoiser": dataclasses.asdict(dcfg),
              "vocab": {"symbols": list(data.vocab.symbols), "pad": data.vocab.pad},
              "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
              "metrics": {**metrics, "heldout_nll_before": heldout_before, "heldout_nll_after": heldout_after,
                          "pretrain_s": time.perf_counter() - start}}
    torch.save(bundle, out)
    log.info("pretrained %s denoiser in %.0f s: held-out NELBO %.1f -> %.1f nats", exp.task,
             bundle["metrics"]["pretrain_s"], heldout_before, heldout_after)
    return bundle


def build_model(bundle: dict):
    from algos.vidd.mdlm import DenoiserConfig, MaskedDenoiser
    model = MaskedDenoiser(DenoiserConfig(**bundle["denoiser"]))
    model.load_state_dict(bundle["state_dict"])
    return model.eval()


# ------------------------------------------------------------------------------------------ learner (Train worker)

def _vidd_batch(results: list[dict]):
    import torch

    from algos.vidd.vidd import VIDDBatch
    cat = lambda k, dtype: torch.as_tensor(np.concatenate([r[k] for r in results])).to(dtype)  # noqa: E731
    return VIDDBatch(x_t=cat("x_t", torch.long), x_next=cat("x_next", torch.long), t=cat("t", torch.float32),
                     s=cat("s", torch.float32), v_current=cat("v_current", torch.float32),
                     v_next=cat("v_next", torch.float32), changed=cat("changed", torch.bool),
                     teacher_log_probs=cat("teacher_log_probs", torch.float32) if "teacher_log_probs" in results[0]
                     else None)


def train_fn(config: dict) -> None:
    import torch
    from torch import nn

    from algos.vidd import ddpo
    from algos.vidd.vidd import refresh_teacher, vidd_loss
    from cluster import ddp
    from cluster.metrics import MetricsLogger, Progress
    from cluster.store import ParquetStore
    from experiments.registry import attach_pool

    ddp.set_threads(config["torch_threads"])
    ddp.quiet_logs()
    exp = Config(**config["experiment"])
    method, seed = config["method"], config["seed"]
    method_id = float(METHODS.index(method))
    vcfg = exp.vidd_config(method)
    rank, world = ddp.rank(), ddp.world_size()
    run_path = Path(config["run_path"])
    bundle = torch.load(config["pretrained_path"], weights_only=False)
    pre = build_model(bundle)
    for p in pre.parameters():
        p.requires_grad_(False)
    student = build_model(bundle).train()
    rollout = copy.deepcopy(pre)  # p_out (VIDD); unused by DDPO, whose sampler is the student itself
    optimizer = torch.optim.Adam(student.parameters(), lr=vcfg.lr, eps=vcfg.adam_eps)
    counters = {"iteration": 0, "queries": 0, "eval_queries": 0, "wall_s": 0.0, "sample_parts": 0}
    samples = ParquetStore(run_path / "data" / "samples")
    with ddp.latest_checkpoint() as ckpt:
        if ckpt is not None:
            state = torch.load(ckpt / "learner.pt", weights_only=False)
            student.load_state_dict(state["student"])
            rollout.load_state_dict(state["rollout"])
            optimizer.load_state_dict(state["optimizer"])
            counters = state["counters"]
            if rank == 0:
                samples.rollback(counters["sample_parts"])
            log.info("%s resumed at iteration %d, %d queries", method, counters["iteration"], counters["queries"])
    model = ddp.wrap_ddp(student)
    model.mask_id, model.seq_len = student.mask_id, student.seq_len  # algos read these off the module

    pool = attach_pool(config["pool"])
    n_requests = max(1, config["pool"]["num_workers"])
    key = f"{config['run_id']}/{method}"
    scfg = config["sampler_config"]
    budget = exp.query_budget
    metrics_log = MetricsLogger(run_path, flush_every=1_000_000) if rank == 0 else None
    progress = Progress(f"vidd {method}", budget, "queries") if rank == 0 else None
    t_start = time.perf_counter() - counters["wall_s"]

    def publish() -> None:
        if rank == 0:
            cpu = lambda m: {k: v.detach().cpu() for k, v in m.state_dict().items()}  # noqa: E731
            pool.publish(key, {"pretrained": bundle["state_dict"], "rollout": cpu(student if method == "ddpo" else rollout),
                               "student": cpu(student)})
        ddp.barrier()

    def all_sum(value: float) -> float:
        t = torch.tensor([float(value)], dtype=torch.float64)
        ddp.all_reduce_mean_([t])
        return float(t.item()) * world

    while counters["iteration"] < exp.max_iterations:
        remaining = budget - counters["queries"]
        if remaining < (1 if method == "ddpo" else 2) * world:
            break
        it = counters["iteration"] = counters["iteration"] + 1
        publish()
        coin = torch.Generator().manual_seed(seed * 100_003 + it)  # the same roll-in coin on every rank
        rank_seed = seed * 1_000_003 + int(method_id) * 100_019 + it * 1009 + rank * 101
        share = split_requests(exp.batch_size, world)[rank] if exp.batch_size >= world else 1
        rank_budget = remaining // world
        row: dict[str, Any] = {"method_id": method_id, "iteration": it}
        student.train()
        if method == "ddpo":
            n = int(min(share, rank_budget))
            reqs = [{"kind": "sample", "n": k, "seed": rank_seed + i, "model": "rollout", "record_trajectory": True,
                     "score": True, "max_queries": k} for i, k in enumerate(split_requests(n, n_requests))]
            results = pool.map("diffusion", reqs, config=scfg, weights=key)
            states = torch.as_tensor(np.concatenate([r["states"] for r in results], axis=1)).long()
            rewards = torch.as_tensor(np.concatenate([r["rewards"] for r in results]), dtype=torch.float32)
            queries = sum(r["queries"] for r in results)
            advantages = ddpo.normalized_advantages(rewards)
            T_steps, k = vcfg.num_sampling_steps, vcfg.steps_per_trajectory
            gen = torch.Generator().manual_seed(rank_seed)
            with torch.no_grad():
                old = ddpo.transition_log_probs(student, states, torch.arange(T_steps).expand(n, T_steps))
            for _ in range(vcfg.ddpo_inner_steps):
                steps = torch.rand(n, T_steps, generator=gen).argsort(dim=1)[:, :k]
                loss, step_metrics = ddpo.ppo_clip_loss(ddpo.transition_log_probs(model, states, steps),
                                                        old.gather(1, steps), advantages, vcfg.ddpo_clip)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                step_metrics["grad_norm"] = float(nn.utils.clip_grad_norm_(student.parameters(), vcfg.grad_clip))
                optimizer.step()
            row.update(step_metrics, train_reward_mean=float(rewards.mean()))
        else:
            use_rollout = bool(torch.rand((), generator=coin) < vcfg.beta)
            # each request needs >= 2 queries (one value pair): near the end of the budget use fewer requests
            chunks = split_requests(share, min(n_requests, max(1, rank_budget // 2)))
            allowances = split_requests(rank_budget, len(chunks))
            reqs = [{"kind": "vidd", "n": k, "seed": rank_seed + i, "model": "rollout" if use_rollout else "pretrained",
                     "steps_per_trajectory": vcfg.timesteps_per_trajectory, "max_queries": int(allowances[i]),
                     "value_estimator": vcfg.value_estimator, "greedy_tokens_per_step": vcfg.greedy_tokens_per_step,
                     "next_value": vcfg.next_value, "keep_teacher_log_probs": vcfg.exact_teacher_term,
                     # without refreshes p_out is p_pre, so pretrained roll-ins are p_out roll-ins too
                     "states_from_rollout_model": use_rollout or vcfg.refresh_interval is None}
                    for i, k in enumerate(chunks)]
            results = pool.map("diffusion", reqs, config=scfg, weights=key)
            batch = _vidd_batch(results)
            queries = sum(r["queries"] for r in results)
            for _ in range(vcfg.updates_per_batch):
                if len(batch):
                    loss, step_metrics = vidd_loss(model, batch, vcfg)
                else:  # nothing fitted this rank's share of the budget: a zero step keeps DDP ranks in lockstep
                    loss, step_metrics = model(torch.full((1, student.seq_len), student.mask_id)).sum() * 0.0, {}
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                step_metrics["grad_norm"] = float(nn.utils.clip_grad_norm_(student.parameters(), vcfg.grad_clip))
                optimizer.step()
            refreshed = vcfg.refresh_interval is not None and it % vcfg.refresh_interval == 0
            if refreshed:
                refresh_teacher(rollout, student)
            row.update({k: v for k, v in step_metrics.items() if math.isfinite(v)},
                       rollin_from_rollout_model=float(use_rollout), teacher_refreshed=float(refreshed),
                       transitions=float(batch.changed.sum()))
        info = _sum_info(results)
        counters["queries"] += int(all_sum(queries))
        row.update(queries=counters["queries"], **{f"train_{k}": all_sum(v) for k, v in sorted(info.items())})
        remaining = budget - counters["queries"]
        last = counters["iteration"] >= exp.max_iterations or remaining < (1 if method == "ddpo" else 2) * world
        if last or (exp.eval_every and it % exp.eval_every == 0):
            publish()  # the student after this update
            if rank == 0:
                ev, columns = evaluate_through_pool(pool, scfg, key, "student", exp.eval_samples, seed + 17, n_requests,
                                                    exp.task, pre, exp.nll_time_samples)
                counters["eval_queries"] += int(ev["eval_queries"])
                row.update(ev)
                write_samples(samples, columns, method, it, counters["queries"], seed)
                counters["sample_parts"] = samples.num_parts
        counters["wall_s"] = time.perf_counter() - t_start
        row.update(wall_s=counters["wall_s"], eval_queries_total=counters["eval_queries"])
        if metrics_log is not None:
            metrics_log.log(it, row)
            progress.update(counters["queries"], force=last, iteration=it,
                            **({"median": row["reward_median"]} if "reward_median" in row else {}))
        with ddp.checkpoint_dir() as d:
            if rank == 0:
                torch.save({"student": student.state_dict(), "rollout": rollout.state_dict(),
                            "optimizer": optimizer.state_dict(), "counters": counters}, d / "learner.pt")
                metrics_log.flush()
            ddp.report({k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and math.isfinite(float(v))},
                     checkpoint_dir=d)
        if last:
            break
    if metrics_log is not None:
        metrics_log.close()
        torch.save(student.state_dict(), run_path / f"finetuned-{method}.pt")


# ------------------------------------------------------------------------------------------ driver

def run_best_of_n(pool, exp: Config, scfg: dict, key: str, pre_model, seed: int, n_requests: int,
                  samples) -> list[dict]:
    """Best-of-N from p_pre through the pool: M = best_of_n_outputs outputs, N = budget // M candidates each.

    One draw of M * N scored candidates; the reward-vs-queries curve takes the first n candidates of every output
    for n = 1, 2, 4, ..., N (nested subsets of the same draw), each point costing M * n oracle queries.
    """
    import torch

    from algos.vidd.mdlm import nelbo
    M = exp.best_of_n_outputs
    N = exp.query_budget // M
    start = time.perf_counter()
    reqs = [{"kind": "sample", "n": k, "seed": seed * 31 + 5 + i, "model": "pretrained", "score": True,
             "max_queries": k} for i, k in enumerate(split_requests(M * N, n_requests))]
    results = pool.map("diffusion", reqs, config=scfg, weights=key)
    tokens = np.concatenate([r["tokens"] for r in results]).astype(np.int64).reshape(M, N, -1)
    rewards = np.concatenate([r["rewards"] for r in results]).reshape(M, N)
    sequences = np.array([s for r in results for s in r["sequences"]], dtype=object).reshape(M, N)
    queries = sum(r["queries"] for r in results)  # distinct sequences within each request: <= M * N
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
               "nll": float(nll.mean()), **set_metrics(exp.task, chosen_seq), "eval_queries": 0.0,
               "wall_s": sample_s * n / N + (time.perf_counter() - start - sample_s)}
        rows.append(row)
        if n == N:
            write_samples(samples, {"sequence": chosen_seq, "reward": rewards[np.arange(M), best],
                                    "nll": nll.numpy(), "tokens": chosen}, "best_of_n", i + 1, queries, seed)
    info = _sum_info(results)
    rows[-1].update({f"train_{k}": v for k, v in info.items()})
    return rows


def summarise(df, methods: list[str]) -> dict[str, dict]:
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
                  "diversity": _num(last["diversity"]), "validity": float(last["validity"]),
                  "uniqueness": float(last["uniqueness"]), "queries": int(rows["queries"].max()),
                  "wall_s": float(rows["wall_s"].max())}
    return out


def _num(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def plot_results(df, methods: list[str], pretrained: dict, plots: Path, title: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, m in enumerate(methods):
        ev = df[df["method_id"] == METHODS.index(m)].dropna(subset=["reward_median"]).sort_values("queries")
        ax.plot(ev["queries"], ev["reward_median"], marker="o", ms=3, label=m, color=f"C{i}")
    ax.axhline(pretrained["median_reward"], color="gray", ls="--", label="pretrained")
    ax.set_xlabel("oracle queries")
    ax.set_ylabel("median reward of samples")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    reward_plot = plots / "vidd_reward_vs_queries.png"
    fig.savefig(reward_plot, dpi=110)
    plt.close(fig)

    summary = summarise(df, methods)
    names = ["pretrained", *[m for m in methods if summary.get(m)]]
    values = [pretrained, *[summary[m] for m in names[1:]]]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, label in ((axes[0], "nll", "NELBO under the pretrained model (nats, lower = more natural)"),
                           (axes[1], "diversity", "diversity (higher = more diverse)")):
        ax.bar(range(len(names)), [v[key] if v[key] is not None else np.nan for v in values],
               color=[f"C{i}" if i else "gray" for i in range(len(names))])
        ax.set_xticks(range(len(names)), names, rotation=20)
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    quality_plot = plots / "vidd_quality.png"
    fig.savefig(quality_plot, dpi=110)
    plt.close(fig)
    return [str(reward_plot), str(quality_plot)]


def run(cfg: dict, ctx) -> dict[str, Any]:
    import torch

    from cluster.metrics import MetricsLogger, read_metrics
    from cluster.train import fit

    exp: Config = ctx.typed["experiment"]
    seed = cfg["seed"]
    run_path = ctx.run_dir.path
    pool = ctx.pool
    n_requests = ctx.typed["pool"].num_workers
    run_id = f"{cfg['experiment']['name']}/{ctx.run_dir.name}"
    pretrained_path = Path(exp.pretrained) if exp.pretrained else run_path / "pretrained.pt"
    if pretrained_path.is_file():
        bundle = torch.load(pretrained_path, weights_only=False)
        if bundle.get("task") != exp.task or bundle["denoiser"]["seq_len"] != exp.seq_len:
            from experiments.config import ConfigError
            raise ConfigError(f"experiment.pretrained: {pretrained_path} is a {bundle.get('task')} model of length "
                              f"{bundle['denoiser']['seq_len']}, not {exp.task} of length {exp.seq_len}")
        log.info("using the pretrained model %s", pretrained_path)
    else:
        bundle = pretrain_model(exp, load_task_data(exp, seed, run_path), seed, pretrained_path)
    pre_model = build_model(bundle)
    scfg = sampler_config(exp, bundle)
    methods = exp.method_list()
    samples = ctx.run_dir.store("samples")

    # pretrained reference and best-of-N run from the driver, before any learner writes metrics or samples
    pre_key = f"{run_id}/pretrained"
    pool.publish(pre_key, {"pretrained": bundle["state_dict"]})
    pre_metrics, columns = evaluate_through_pool(pool, scfg, pre_key, "pretrained", exp.eval_samples, seed + 17,
                                                 n_requests, exp.task, pre_model, exp.nll_time_samples)
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
                  "nll": pre_metrics["nll"], "diversity": _num(pre_metrics["diversity"]),
                  "validity": pre_metrics["validity"]}
    title = {"molecule": f"molecules ({exp.reward})", "dna": "DNA (liver-TF motif proxy)",
             "protein": "protein (beta-sheet propensity proxy)"}[exp.task]
    plots = plot_results(df, methods, pretrained, ctx.run_dir.plots, f"VIDD on {title}")
    summary = {"task": exp.task, "query_budget": exp.query_budget, "pretrained": pretrained,
               "methods": summarise(df, methods), "plots": plots}
    ctx.run_dir.write_json("pretrain_metrics.json", bundle.get("metrics", {}))
    print(f"VIDD {exp.task} ({exp.reward}), budget {exp.query_budget} oracle queries per method; pretrained median "
          f"{pretrained['median_reward']:.3f}, NLL {pretrained['nll']:.1f}", flush=True)
    for m, s in summary["methods"].items():
        if s:
            print(f"  {m:12s} median {s['median_reward']:.3f} top10 {s['top10_reward']:.3f} NLL {s['nll']:.1f} "
                  f"diversity {s['diversity']} validity {s['validity']:.2f} queries {s['queries']} "
                  f"wall {s['wall_s']:.0f} s", flush=True)
    return summary
