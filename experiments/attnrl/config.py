"""The ``attnrl`` experiment's section: which methods, the task, model, SFT and RL settings, evaluation cadence.

The nested sections are plain dicts here and become the typed configs of ``envs``/``algos`` on demand, so a key
left ``null`` in the YAML keeps that dataclass's default.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from algos.attnrl.config import METHODS


@dataclass
class Config:
    method: str = "attnrl"  # single-method run (used when ``methods`` is empty)
    methods: list[str] = field(default_factory=list)  # compare mode: each method in turn from the same SFT model
    task: dict = field(default_factory=dict)  # envs.reasoning.task.ReasoningTaskConfig fields
    model: dict = field(default_factory=dict)  # algos.attnrl.gpt.GPTConfig fields (vocab_size comes from the task)
    sft: dict = field(default_factory=dict)  # algos.attnrl.sft.SFTConfig fields
    rl: dict = field(default_factory=dict)  # algos.attnrl.config.RLConfig fields; rl.ads: AdaptiveSamplingConfig
    hf_model: str | None = None  # local Hugging Face causal-LM dir (eager attention) instead of the char GPT
    sft_model: str | None = None  # a saved SFT model (<run>/sft_model.pt) to start from, skipping SFT
    eval_problems_per_difficulty: int = 16
    eval_every_updates: int = 5
    checkpoint_every_updates: int = 20
    requests_per_worker: int = 1  # a generation call = (workers of the lm sampler's pool group) x this pool requests
    sampler_max_batch: int | None = None  # rollouts decoded together in a worker (None: the whole request)
    # Teacher-forced passes of the learner (reference log-probs, and the PPO micro-batches) cover at most this many
    # padded tokens each, bounding the (tokens x vocabulary) logits; None: all sequences (a mini-batch) at once.
    max_tokens_per_forward: int | None = None
    autocast_bf16: bool | str = "auto"  # "auto": bf16 where the device runs it natively (algos.precision.use_bf16)
    eval_seed: int = 12345

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"experiment.method: must be one of {list(METHODS)}, got {self.method!r}")
        bad = [m for m in self.methods if m not in METHODS]
        if bad or len(set(self.methods)) != len(self.methods):
            raise ValueError(f"experiment.methods: distinct entries of {list(METHODS)}, got {self.methods}")
        for key in ("eval_problems_per_difficulty", "eval_every_updates", "checkpoint_every_updates",
                    "requests_per_worker"):
            if getattr(self, key) < 1:
                raise ValueError(f"experiment.{key}: must be >= 1, got {getattr(self, key)}")
        for key in ("sampler_max_batch", "max_tokens_per_forward"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"experiment.{key}: must be >= 1 or null, got {getattr(self, key)}")
        if self.autocast_bf16 not in (True, False, "auto", None):  # null: auto
            raise ValueError(f"experiment.autocast_bf16: must be true, false or auto, got {self.autocast_bf16!r}")
        if self.hf_model is not None and not (Path(self.hf_model) / "config.json").is_file():
            raise FileNotFoundError(f"experiment.hf_model: {self.hf_model} is not a local Hugging Face model "
                                    "directory (no config.json in it); models are read from disk, never downloaded")
        if self.sft_model is not None and not Path(self.sft_model).is_file():
            raise FileNotFoundError(f"experiment.sft_model: {self.sft_model} does not exist")

    @property
    def run_methods(self) -> list[str]:
        return list(self.methods) or [self.method]

    def task_config(self):
        from envs.reasoning.task import ReasoningTaskConfig
        return _typed(ReasoningTaskConfig, self.task, "experiment.task")

    def gpt_config(self, vocab_size: int):
        from algos.attnrl.gpt import GPTConfig
        return _typed(GPTConfig, {**self.model, "vocab_size": vocab_size}, "experiment.model")

    def sft_config(self):
        from algos.attnrl.sft import SFTConfig
        return _typed(SFTConfig, self.sft, "experiment.sft")

    def rl_config(self, method: str, seed: int):
        """RLConfig for ``method``; rl.ads keys left null keep the method's default (AttnRL: all ADS parts on)."""
        from algos.attnrl.config import AdaptiveSamplingConfig, RLConfig
        rl = {k: v for k, v in self.rl.items() if v is not None and k != "ads"}
        cfg = _typed(RLConfig, {"seed": seed, **rl}, "experiment.rl")
        ads_over = {k: v for k, v in (self.rl.get("ads") or {}).items() if v is not None}
        if ads_over:
            base = cfg.resolved(method).ads
            cfg.ads = _typed(AdaptiveSamplingConfig, {**dataclasses.asdict(base), **ads_over}, "experiment.rl.ads")
        return cfg


def _typed(cls, data: dict, prefix: str):
    from experiments.config import from_dict
    return from_dict(cls, {k: v for k, v in (data or {}).items() if v is not None}, prefix)


def check(exp: Config, raw: dict) -> None:
    from experiments.config import ConfigError
    from algos.attnrl.budget import budget_error
    from envs.reasoning.task import ReasoningTask
    exp.task_config(), exp.sft_config()
    for m in exp.run_methods:
        rl = exp.rl_config(m, 0)
        error = budget_error(m, rl, rl.max_response_tokens or ReasoningTask(exp.task_config()).max_response_chars(),
                             prefix="experiment.rl.")
        if error:
            raise ConfigError(error)
    if exp.hf_model is None:
        from envs.reasoning.task import CharTokenizer
        exp.gpt_config(CharTokenizer().vocab_size)
    scale = (raw.get("scale") or {}).get("name")
    if scale == "paper" and exp.hf_model is None:
        raise ConfigError("experiment.hf_model: scale=paper trains a Hugging Face model (the paper: "
                          "DeepSeek-R1-Distill-Qwen-1.5B): pass experiment.hf_model=<local model directory>")
    # any train.num_workers: rank 0 runs the pipeline, every rank trains on its share of each mini-batch
    # (experiments.attnrl.ranks)
