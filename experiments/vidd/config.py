"""``experiment.*`` of vidd_molecule, vidd_dna and vidd_protein: the task, its data and denoiser, evaluation, and the
algorithm's own settings (every :class:`algos.vidd.config.VIDDConfig` field, under the same name)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from algos.vidd.config import METHODS, VIDDConfig

log = logging.getLogger(__name__)

TASK_OF_EXPERIMENT = {"vidd_molecule": "molecule", "vidd_dna": "dna", "vidd_protein": "protein"}
# dna: motif = best site score per TF (saturated: the corpus scores ~0.85); motif_sites = soft count of strong sites
# (the corpus scores ~0.15: room to fine-tune). envs/bio/dna.py
REWARD_KINDS = {"molecule": ("qed", "sa", "composite"), "dna": ("motif", "motif_sites"), "protein": ("beta_sheet",)}


@dataclass
class Config(VIDDConfig):
    """Every VIDDConfig field and check (with the defaults of configs/experiment/vidd_*.yaml), plus the task, its
    data, the denoiser, its pretraining and the evaluation."""

    key_prefix: ClassVar[str] = "experiment."

    task: str = "molecule"  # molecule | dna | protein (set by the experiment's yaml)
    method: str = "vidd"
    methods: list[str] = field(default_factory=list)  # compare mode when non-empty
    pretrained: str | None = None  # a saved pretrained.pt (from an earlier run) to skip pretraining
    fasta: str | None = None  # protein corpus; "demo" writes a small synthetic FASTA into the run dir
    # data and reward
    n_train: int = 4000
    n_heldout: int = 200
    seq_len: int = 40  # molecules: max SELFIES symbols; DNA: sequence length; proteins: max residues
    reward: str = "qed"  # molecule: qed | sa | composite; dna: motif | motif_sites; protein: beta_sheet
    sa_weight: float = 0.5  # composite = QED - sa_weight (SA - 1) / 9
    dna_release: str = "JASPAR2024"  # the training oracle's matrices
    dna_eval_release: str = "JASPAR2022"  # the held-out evaluation oracle's (reported, never queried in training)
    # denoiser and pretraining
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    bf16: bool | str = "auto"  # bf16 autocast: auto = where the hardware has it natively (algos/precision.py)
    pretrain_steps: int = 400
    pretrain_batch_size: int = 64
    pretrain_lr: float = 2e-3
    # evaluation (every eval_every iterations and at the end; its oracle calls are outside the budget)
    eval_samples: int = 64
    nll_time_samples: int = 4
    # VIDDConfig fields whose default differs here
    num_sampling_steps: int = 8  # T
    query_budget: int = 8192  # oracle queries per method (training; evaluation reported apart)
    max_iterations: int = 200
    timesteps_per_trajectory: int | None = None  # null = all T
    # lr (1e-4) and updates_per_batch (1) are VIDDConfig's: the official DNA script's (algos/vidd/README.md)
    self_normalize_weights: bool = False  # True: mean 1 within each reverse step (needs groups >= 8, issue 37)
    value_scheme: str = "custom"  # the yaml's next_value / value_model as given (a named scheme refuses other values)
    next_value: Literal["denoised", "completion"] | None = "completion"  # completion: r of one completion of xbar
    value_model: Literal["teacher", "student"] | None = "teacher"
    exact_teacher_term: bool = True  # control variate for the w = 1 part
    eval_every: int = 5
    # a budget that leaves VIDD fewer teacher refreshes than min_teacher_refreshes turns it into standard FT: warn
    # (smoke sizes), refuse ("error", the paper presets) or say nothing ("off")
    refresh_check: str = "warn"
    min_teacher_refreshes: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        self.methods = list(self.methods)
        check = self._check
        check(self.task in TASK_OF_EXPERIMENT.values(), "task", "must be molecule, dna or protein")
        for m in [self.method, *self.methods]:
            if m not in METHODS:
                raise ValueError(f"experiment.method: unknown method {m!r} (choose from {', '.join(METHODS)})")
        check(len(set(self.methods)) == len(self.methods), "methods", "has duplicates")
        check(self.reward in REWARD_KINDS[self.task], "reward",
              f"{self.task} rewards are {', '.join(REWARD_KINDS[self.task])}")
        for key in ("n_train", "n_heldout", "d_model", "n_layers", "n_heads", "pretrain_steps", "pretrain_batch_size",
                    "eval_samples", "nll_time_samples"):
            check(getattr(self, key) >= 1, key, "must be >= 1")
        check(self.seq_len >= 2, "seq_len", "must be >= 2")
        check(self.d_model % self.n_heads == 0, "d_model", f"must be divisible by n_heads={self.n_heads}")
        check(self.pretrain_lr > 0, "pretrain_lr", "must be > 0")
        check(self.bf16 in (True, False, "auto"), "bf16", "must be true, false or auto")
        check(self.query_budget >= self.best_of_n_outputs or "best_of_n" not in self.method_list(), "query_budget",
              f"must be >= best_of_n_outputs={self.best_of_n_outputs} for best_of_n (one candidate per output)")
        check(self.task != "dna" or self.seq_len >= 20, "seq_len", "DNA sequences need >= 20 bp")
        check(self.refresh_check in ("warn", "error", "off"), "refresh_check", "must be warn, error or off")
        check(self.min_teacher_refreshes >= 0, "min_teacher_refreshes", "must be >= 0")

    def queries_per_trajectory(self, method: str) -> int:
        """About how many oracle queries one roll-in trajectory costs ``method`` (an upper bound: duplicates are
        free): VIDD's eq. 7 with one-step values pays T + 1 for all T steps (the roll-in's states are shared) or
        2 per distilled step; with completion values and for final-sample losses, 1 final sample plus one value
        per distilled step (none without the denominator); DDPO and RW_MLE 1."""
        cfg = self.for_method(method)
        k, T = cfg.steps_per_trajectory, self.num_sampling_steps
        if method in ("ddpo", "rw_mle"):
            return 1
        if cfg.distill_target == "final_sample" or cfg.next_value == "completion":
            return 1 + (k if cfg.value_denominator or method == "ddpp" else 0)
        return T + 1 if k == T else 2 * k

    def expected_refreshes(self, method: str) -> tuple[int, int]:
        """``(iterations, teacher refreshes)`` the budget buys ``method`` at about ``queries_per_trajectory``."""
        cfg = self.for_method(method)
        per_iteration = self.batch_size * self.queries_per_trajectory(method)
        iterations = min(self.max_iterations, self.query_budget // max(1, per_iteration))
        return iterations, (iterations // cfg.refresh_interval if cfg.refresh_interval else 0)

    def method_list(self) -> list[str]:
        return self.methods or [self.method]


# keys a run would otherwise ignore: (key, applies(exp), why) -- refused when set away from the default where they do
# not apply, so that no experiment.* key is silently ignored (tests/test_vidd_config_keys.py)
_DEFAULTS = Config.__dataclass_fields__
CONDITIONAL_KEYS = (
    ("fasta", lambda e: e.task == "protein", "applies to task protein only"),
    ("dna_release", lambda e: e.task == "dna", "applies to task dna only"),
    ("dna_eval_release", lambda e: e.task == "dna", "applies to task dna only"),
    ("sa_weight", lambda e: e.task == "molecule" and e.reward == "composite",
     "applies to task molecule with reward=composite only"),
    ("greedy_tokens_per_step", lambda e: e.value_estimator == "greedy", "applies to value_estimator=greedy only"),
)


def check(exp: Config, raw: dict) -> None:
    """What the fields alone cannot say: the experiment's task, the pretrained model and the FASTA file on disk; keys
    that would not change this run."""
    from experiments.config import ConfigError
    given = raw["experiment"]
    if given.get("scheme_resolved") is not None:
        raise ConfigError("experiment.scheme_resolved: bookkeeping of value_scheme, not a setting (set "
                          "experiment.value_scheme)")
    if given.get("legacy_small_step_groups"):
        raise ConfigError("experiment.legacy_small_step_groups: only rebuilds the issue-24 study records "
                          "(benchmarks/study), never a cluster run")
    for key, applies, why in CONDITIONAL_KEYS:
        if getattr(exp, key) != _DEFAULTS[key].default and not applies(exp):
            raise ConfigError(f"experiment.{key}: {why} (this run: task={exp.task}, reward={exp.reward}, "
                              f"value_estimator={exp.value_estimator}), got {getattr(exp, key)!r}")
    check_refreshes(exp)
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


def check_refreshes(exp: Config) -> None:
    """VIDD (and RW_MLE) refresh the teacher every K iterations; a budget that buys fewer than
    ``min_teacher_refreshes`` refreshes silently degenerates into standard fine-tuning. Warn, or refuse."""
    from experiments.config import ConfigError
    if exp.refresh_check == "off":
        return
    for method in exp.method_list():
        if method not in ("vidd", "rw_mle") or exp.for_method(method).refresh_interval is None:
            continue
        iterations, refreshes = exp.expected_refreshes(method)
        if refreshes >= exp.min_teacher_refreshes:
            continue
        message = (f"experiment.query_budget: {exp.query_budget} queries buy {method} about {iterations} iterations "
                   f"({exp.batch_size} trajectories x ~{exp.queries_per_trajectory(method)} queries each) and "
                   f"{refreshes} teacher refreshes at refresh_interval={exp.refresh_interval}, fewer than "
                   f"min_teacher_refreshes={exp.min_teacher_refreshes}: the teacher stays ~p_pre and VIDD degenerates "
                   f"into standard fine-tuning. Raise the budget, distill fewer steps per trajectory "
                   f"(timesteps_per_trajectory), use next_value=completion, or lower refresh_interval")
        if exp.refresh_check == "error":
            raise ConfigError(message)
        log.warning("!!! %s", message)
