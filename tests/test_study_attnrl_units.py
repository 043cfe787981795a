"""AttnRL's second gate model (benchmarks/study/attnrl_units.py): the unit tokenizer, the plan, and one unit of each
kind at tiny size (SFT stage, the gate, an RL unit refused after a failed gate and run after a passed one)."""
import importlib
import json
import random

import pytest
import torch

from benchmarks.study import attnrl as attnrl_study
from benchmarks.study import attnrl_units as study
from benchmarks.study.core import REPORTED_SEEDS, StudyError
from benchmarks.study.runner import run_unit_inline
from envs.reasoning.task import VARIABLE_NAMES, ReasoningTask, ReasoningTaskConfig
from envs.reasoning.tokens import UNIT_NAMES, UnitReasoningTask, UnitTokenizer, rename

TINY = {"sft_max_steps": 2, "sft_eval_problems": 2, "gate_problems": 2, "probe_interventions": 1, "head_problems": 2,
        "eval_per_difficulty": 1, "eval_longest_extra": 1, "eval_samples": 1, "tokens": 200, "prompts_per_batch": 2}


def test_unit_tokens_are_the_task_units():
    task, _ = study.tasks()
    problems = task.evaluation_problems(4, seed=0)
    tok = task.tokenizer
    for p in problems:
        text = p.prompt + p.solution
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        names = {n for n, _ in p.inputs} | {s.target for s in p.steps}
        assert all(len(n) == 2 for n in names) and names <= set(tok.stoi)  # one token per two-letter name
        assert sum(tok.itos[i] == p.fmt(p.answer) for i in ids) >= 2  # the answer value is one token (step + answer)
        assert len(ids) < len(text)
    assert task.unit_share(problems) > 0.5  # most tokens are units of two characters
    for d in range(study.TASK["min_steps"], study.TASK["max_steps"] + 1):  # the generation cap covers the references
        longest = max(len(tok.encode(p.solution)) + 1 for p in task.evaluation_problems(8, seed=1, difficulties=[d]))
        assert longest == task.max_response_chars(d)
    with pytest.raises(ValueError, match="no token"):
        tok.encode("ba=7")  # a one-digit value is not a unit of this task


def test_one_letter_names_and_one_digit_values_make_units_equal_characters():
    """The honest caveat: on the attnrl study's own task the unit tokenizer is the character tokenizer."""
    task = ReasoningTask(ReasoningTaskConfig(**attnrl_study.TASK))
    units = UnitTokenizer(VARIABLE_NAMES, task.cfg.modulus, task.cfg.value_width)
    for p in task.evaluation_problems(4, seed=0):
        text = p.prompt + p.solution
        ids = units.encode(text)
        assert [units.itos[i] for i in ids if units.itos[i] != "ans"] == list(text.replace("ans", ""))
        assert len(ids) == len(text) - 2 * text.count("ans")  # character for character, but the answer mark


def test_renaming_keeps_the_program():
    cfg = ReasoningTaskConfig(**study.TASK)
    chars, units = ReasoningTask(cfg), UnitReasoningTask(cfg)
    for a, b in zip(chars.sample(random.Random(3), 20), units.sample(random.Random(3), 20)):
        assert b == rename(a, dict(zip(VARIABLE_NAMES, UNIT_NAMES)))
        assert units.reward(b, b.solution) == 1.0 and units.reward(b, a.solution) == 0.0
        assert b.dependency_cone() == a.dependency_cone() and units.influence(b) == chars.influence(a)
        assert b.answer == a.answer and len(b.solution_lines()) == len(a.solution_lines())


def test_plan_is_valid_and_the_gate_is_declared():
    plan = study.STUDY.plan()
    assert [u.name for u in plan[:2]] == ["sft", study.GATE_UNIT]
    for u in plan:
        module, fn = u.fn.split(":")
        assert callable(getattr(importlib.import_module(module), fn)), u.fn
    rl = [u for u in plan if u.role == "report"]
    assert sorted((u.method, u.seed) for u in rl) == sorted((m, s) for m in study.RL_METHODS for s in REPORTED_SEEDS)
    assert all(study.GATE_UNIT in u.after and u.setting["lr"] == study.RL_LR for u in rl)
    assert study.MODEL["n_layer"] == 4 and study.TASK["modulus"] > 10
    assert study.GATE["seed"] not in (777, attnrl_study.GATE2["seed"])  # fresh problems
    assert {k: v for k, v in study.GATE.items() if k != "seed"} == {
        k: v for k, v in attnrl_study.GATE2.items() if k != "seed"}  # the attnrl deciding gate's statistic and sizes
    assert study.SFT["max_steps"] * 0.3 <= 3600 * 1.05  # ~0.3 CPU-s per step: within ~1 core-hour
    from benchmarks.study import STUDIES
    assert STUDIES["attnrl_units"] == "benchmarks.study.attnrl_units:STUDY"


def test_sft_stage_checkpoints_and_resumes(tmp_path):
    root = tmp_path / "results"
    sizes = TINY | {"sft_margin_s": 0.0}
    assert run_unit_inline(study.STUDY, "sft", results_root=root, overrides=sizes, call_s=0.0) is None
    art = root / "attnrl_units" / "records" / "artifacts" / "sft"
    assert torch.load(art / "checkpoint.pt", weights_only=False, map_location="cpu")["step"] == 0
    record = run_unit_inline(study.STUDY, "sft", results_root=root, overrides=sizes)
    assert record["calls"] == 2 and record["metrics"]["steps"] == 2 and (art / "model.pt").exists()
    assert record["tokens"]["unit_share"] > 0.5 and record["settings"]["tokenizer"] == "unit"


@pytest.mark.slow
def test_one_unit_of_each_kind_at_tiny_size(tmp_path):
    from benchmarks.attnrl_units_report import report, summary_line
    root = tmp_path / "results"
    run_unit_inline(study.STUDY, "sft", results_root=root, overrides=TINY)
    gate = run_unit_inline(study.STUDY, study.GATE_UNIT, results_root=root, overrides=TINY)
    assert gate["influence"] == "intervention" and gate["gate"] == study.GATE
    assert gate["metrics"]["fci_beats_both"] is False  # a 2-step SFT model ranks nothing
    assert "max (FCI)" in gate["heads"] and "sampled_longest" in gate["sft"]["eval"]
    out = root / "attnrl_units" / "records"
    with pytest.raises(StudyError, match="refused: FCI does not beat both") as refusal:
        run_unit_inline(study.STUDY, "attn_tree-s10", results_root=root, overrides=TINY)
    assert "\n" not in str(refusal.value) and not (out / "attn_tree-s10.json").exists()
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    section = report(records, out)
    assert section.startswith("## ") and "refuse" in section and "| all |" in section
    assert "refuse" in summary_line(out) and "not run yet" in summary_line(tmp_path / "nothing")

    # past the gate (its record edited: a 2-step model cannot pass it), the RL unit runs
    path = out / f"{study.GATE_UNIT}.json"
    path.write_text(json.dumps(gate | {"metrics": gate["metrics"] | {"fci_beats_both": True}}))
    run = run_unit_inline(study.STUDY, "attn_tree-s10", results_root=root, overrides=TINY)
    assert run["fci_room"] is True and run["lr"] == study.RL_LR and run["run"]["generated_tokens"] > 0
    assert run["start_sha"] == gate["start_sha"] and run["curves"]["eval"][0]["tokens"] == 0
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    assert "| attn_tree | 1 |" in report(records, out)


def test_forced_results_replace_the_whole_unit_value(monkeypatch):
    """The gate's intervention (algos/attnrl/diagnostics.py: _intervene) forces a step's result: with unit tokens the
    written value is one token, which must be replaced whole by another value of the task's width."""
    from types import SimpleNamespace

    from algos.attnrl import diagnostics
    task, _ = study.tasks()
    policy = study.new_policy(task)
    codec = policy.codec
    problem = task.evaluation_problems(1, seed=5, difficulties=[6])[0]
    ids = codec.encode(problem.solution) + [codec.eos_id]
    starts = [0] + [i + 1 for i, t in enumerate(ids[:-1]) if t in codec.delimiter_ids]
    kept = [SimpleNamespace(tag=0, prompt_ids=tuple(codec.encode(problem.prompt)), response_ids=ids,
                            step_starts=starts)]
    seen = []
    real = diagnostics.generate
    monkeypatch.setattr(diagnostics, "generate", lambda policy, requests, *a, **k: seen.extend(requests) or
                        real(policy, requests, *a, **k))
    shares = diagnostics._intervene(policy, task, [problem], kept, per_step=2, max_tokens=task.max_response_chars(),
                                    seed=0, max_batch_size=64)
    assert set(shares) == {(0, s) for s in range(1, problem.difficulty)} and len(seen) == 2 * (problem.difficulty - 1)
    lines = problem.solution_lines()
    for req in seen:
        s = req.tag[1]
        forced = codec.decode(req.prefix_ids).split("\n")
        assert forced[:s] == lines[:s] and forced[-1] == ""  # earlier lines untouched, the forced line ends the prefix
        head, value = forced[s][:-problem.value_width], forced[s][-problem.value_width:]
        assert head == lines[s][:-problem.value_width] and len(value) == 2 and value != lines[s][-2:]
        assert 0 <= int(value) < problem.modulus
