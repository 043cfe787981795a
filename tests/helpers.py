"""What several test modules build: a wait for a condition (and for a pool's two workers to serve), the tour's test
budget and its checks, the VIDD tiny space (81 sequences, exact distributions), a tiny local Qwen2 with a character
tokenizer, and an in-process stand-in for the pool's "lm" samplers. Fixtures live in conftest.py."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, proc: subprocess.Popen | None = None,
               every_s: float = 0.05) -> Any:
    """``predicate()``'s first truthy value, asked every ``every_s``; an AssertionError naming ``what`` after
    ``timeout_s``, or at once when ``proc`` (a process the condition depends on) has exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read()[-3000:] if proc.stdout else ""
            raise AssertionError(f"process exited ({proc.returncode}) before {what}:\n{out}")
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def wait_for_both_workers(serve: Callable[[], list[dict]], timeout_s: float, what: str) -> list[dict]:
    """The first output of ``serve()`` (a map on a 2-worker pool of echo requests) whose results came from two
    processes. After a worker dies its replacement may still be starting on a loaded machine, and until it serves
    the live worker takes every request of a map."""
    return wait_until(lambda: (out := serve()) and len({r["pid"] for r in out}) == 2 and out, timeout_s, what)


# -- the tour ----------------------------------------------------------------------------------------------------

TINY = ["experiment.tiny=true"]  # every stage's declared test budget (experiments/<method>/tour.py)


def one_rank_pendulum(run: Path, run_id: str, total_env_steps: int, eval_every_steps: int, seed: int = 0,
                      **experiment: Any) -> dict:
    """The config ``pretrain_learner.run_one_rank`` takes for a tiny Pendulum pretraining in this process (4 envs,
    rounds of 32 env steps, updates from 64 transitions on), with ``experiment`` keys over it."""
    exp = {"sac_preset": "pendulum", "sac": {"num_envs": 4, "batch_size": 32, "min_replay_size": 64, "bf16": False},
           "total_env_steps": total_env_steps, "steps_per_round": 8, "eval_every_steps": eval_every_steps,
           "eval_episodes": 1, "checkpoint_every_updates": 100_000, "parquet_chunk": 64, **experiment}
    return {"experiment": exp, "pool": {}, "run_path": str(run), "run_id": run_id, "task": "pendulum", "seed": seed,
            "torch_threads": 1, "change": None}


def registered_checkpoint(learner_dir: Path) -> dict | None:
    """The newest checkpoint Ray Train has registered for a learner (``checkpoint_dir_name``, ``metrics``): the one a
    resumed run restarts from. A checkpoint directory appears before the Train controller records it, so the
    directories alone do not tell (a test that read the newest directory failed when a kill fell between the two)."""
    try:
        snapshot = json.loads((learner_dir / "checkpoint_manager_snapshot.json").read_text())
        return snapshot["latest_checkpoint_result"] or None
    except (OSError, ValueError, KeyError):  # not written yet, or being replaced
        return None


def check_tour(tour_run: Path, methods: list[str] | None = None) -> None:
    """The tour's report has every section, plot and claim row, and each method's numbers are the ones in its runs'
    files (each method's own ``check``)."""
    from experiments.tour import _load_attr, tour_parts
    report_dir = tour_run / "report"
    report = (report_dir / "report.md").read_text()
    data = json.loads((report_dir / "report.json").read_text())
    assert data["failures"] == [], data["failures"]
    for heading in ("## What each paper claims", "## Shared pool", "## Runs", "## Plots"):
        assert heading in report
    for plot in data["plots"]:
        assert (report_dir / plot).stat().st_size > 5_000 and f"({plot})" in report
    for claim in data["claims"]:
        assert f"| {claim['paper']} | {claim['claim']} | {claim['observed']} | {claim['holds']} |" in report
    parts = tour_parts()
    for method in methods or list(parts):
        assert parts[method].check, f"{method} declares no tour check"
        _load_attr(parts[method].check)(tour_run, report, data)
        assert f"Rerun at paper scale: `{parts[method].paper_scale}`" in report


# -- VIDD: the tiny space ------------------------------------------------------------------------------------------

L, V, T = 4, 3, 4  # the tiny space: 3**4 = 81 sequences


class TableDenoiser(nn.Module):
    """Input-independent logits, so the one-step prediction x0hat is known by hand."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.seq_len, self.vocab_size = logits.shape
        self.mask_id = self.vocab_size
        self.logits = nn.Parameter(logits.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(x.shape[0], -1, -1)


def count_of_twos(tokens) -> tuple[np.ndarray, dict]:
    """Reward: fraction of positions holding token 2 (accepts a [B, L] tensor)."""
    tokens = torch.as_tensor(tokens)
    return (tokens == 2).float().mean(-1).double().numpy(), {"n_queries": len(tokens)}


def tiny_pretrained(seed: int = 0):
    """A MaskedDenoiser over the tiny space with a context-dependent, non-uniform "pretrained" law (fp32)."""
    from algos.vidd.mdlm import DenoiserConfig, MaskedDenoiser
    torch.manual_seed(seed)
    model = MaskedDenoiser(DenoiserConfig(vocab_size=V, seq_len=L, d_model=32, n_layers=1, n_heads=2,
                                          bf16=False))  # exact tiny-space checks: fp32 on every CPU
    with torch.no_grad():
        model.head.weight.mul_(3.0)  # a context-dependent, non-uniform "pretrained" law
    return model.eval()


# -- AttnRL --------------------------------------------------------------------------------------------------------

def write_tiny_qwen2(path: Path) -> Path:
    """A randomly initialised 2-layer Qwen2 (the paper's architecture) with a character tokenizer, built locally."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from envs.reasoning.task import CharTokenizer
    tok = CharTokenizer()
    backend = Tokenizer(models.WordLevel(vocab={s: i for i, s in enumerate(tok.itos)}, unk_token=tok.PAD))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=tok.EOS, pad_token=tok.PAD).save_pretrained(path)
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=256, bos_token_id=tok.eos_id, eos_token_id=tok.eos_id,
                                 pad_token_id=tok.pad_id, tie_word_embeddings=True)).save_pretrained(path)
    return path


class InProcessPool:
    """The pool's interface (publish by version, map over "lm" requests) with the real LMSampler, no Ray."""

    def __init__(self) -> None:
        self.published: dict[str, tuple[int, dict]] = {}
        self.sampler = None
        self.requests = 0

    def publish(self, key: str, weights: dict) -> int:
        version = self.published.get(key, (0, None))[0] + 1
        self.published[key] = (version, weights)
        return version

    def map(self, name: str, requests: list, config: dict, weights: str) -> list:
        from experiments.attnrl.sampler import LMSampler  # imports Ray: not at the top (spawned ranks import this)
        assert name == "lm"
        self.sampler = self.sampler or LMSampler(config)
        version, w = self.published[weights]
        if self.sampler.version != version:
            self.sampler.load_weights(w, version)
        self.requests += len(requests)
        return [self.sampler.sample(r) for r in requests]
