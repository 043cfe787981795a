"""Every `python -m experiments.run|sweep ...` command in the README composes and passes validation, so a README
example that orrery would reject fails CI. Placeholders (<run>, <local HF dir>, /path/seqs.fasta, $PWD) are given
real files of the kind the command expects."""
from __future__ import annotations

import logging
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from cluster.store import ParquetStore
from experiments.config import load
from experiments.sweep import _select_sweep, check

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[tuple[str, list[str]]]:
    """(module, overrides) of every command in the README's code blocks, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    out = []
    for block in blocks:
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split("  #", 1)[0]
            match = re.search(r"-m (experiments\.(?:run|sweep))\b(.*)$", line)
            if match:
                out.append((match.group(1), shlex.split(match.group(2))))
    return out


COMMANDS = readme_commands()


def test_the_readme_has_the_commands_this_test_checks():
    modules = [m for m, _ in COMMANDS]
    assert modules.count("experiments.run") >= 10 and modules.count("experiments.sweep") >= 2, COMMANDS


@pytest.fixture(scope="module")
def placeholders(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("readme")
    import torch
    pretrain = tmp / "lift_pretrain" / "run"  # what lift_finetune's check reads of a pretraining run (InvertedPendulum)
    pretrain.mkdir(parents=True)
    torch.save({}, pretrain / "policy.pt")
    torch.save({"arch": {"obs_dim": 4, "act_dim": 1, "critic_obs_dim": 4}}, pretrain / "agent.pt")
    ParquetStore(pretrain / "data" / "replay-rank0").append({"x": np.zeros(2)})
    fasta = tmp / "seqs.fasta"
    fasta.write_text(">a\nMKTAYIAKQRQISFVKSHFSRQ\n>b\nMKVLAAGIVGLLLAGCSS\n")
    hf = tmp / "hf-model"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "gpt2"}')
    return {"runs/lift_pretrain/<run>": str(pretrain), "/path/seqs.fasta": str(fasta),
            "/models/<local HF dir>": str(hf), "$PWD": str(ROOT), "<address>": "127.0.0.1:6379"}


@pytest.mark.parametrize("module, args", COMMANDS, ids=[" ".join(a)[:80] or m for m, a in COMMANDS])
def test_readme_command_is_a_valid_config(module, args, placeholders, caplog):
    """...and sized so that orrery does not warn about it (e.g. a VIDD budget too small for its teacher refreshes)."""
    args = [_fill(a, placeholders) for a in args]
    with caplog.at_level(logging.WARNING):
        if module == "experiments.sweep":
            check(load(_select_sweep(args)))
        else:
            load(args)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def _fill(arg: str, placeholders: dict[str, str]) -> str:
    for key, value in placeholders.items():
        arg = arg.replace(key, value)
    assert "<" not in arg, f"a README placeholder this test does not know: {arg}"
    return arg


def test_the_gpu_check_configs_are_valid(tmp_path_factory):
    """benchmarks/gpu_check.py runs only on a lent GPU machine: its configs must not fail there on a typo, and the
    Hugging Face model it builds (a real-size vocabulary) must work with orrery's codec and policy."""
    from algos.attnrl.lm import load_hf_policy
    from benchmarks.gpu_check import HF_VOCAB, build_hf_model, steps
    from cluster.train import torch_config
    from experiments.config import ConfigError
    tmp = tmp_path_factory.mktemp("gpu-check")
    hf_dir = build_hf_model(tmp / "qwen2-150k")
    policy = load_hf_policy(str(hf_dir))
    text = "x = 12 + 3\ny = x * 2\n"
    assert len(policy.codec.tokenizer) == HF_VOCAB and policy.codec.decode(policy.codec.encode(text)) == text
    assert policy.codec.delimiter_ids  # the step delimiter is a token
    for step in steps(tmp / "runs", hf_dir):
        overrides = [*step.overrides, *step.placement]
        if step.experiment == "lift_finetune":  # its pretraining run exists only once the steps before it ran
            with pytest.raises(ConfigError, match="experiment.pretrain_run: .* is not a directory"):
                load(overrides)
        else:
            train = load(overrides)["_typed"]["train"]
            learners_gpu = train.gpus_per_worker * train.num_workers if train.use_gpu else 0.0
            assert learners_gpu + 0.1 * 2 <= 1.0, step.name  # the learners and 2 model samplers share one GPU
            # two learners on one GPU: gloo (NCCL refuses two ranks on one GPU); one: scale=paper's own backend
            want = "cpu:gloo,cuda:nccl" if train.use_gpu and train.num_workers == 1 else "gloo"
            assert torch_config(train).backend == want, step.name