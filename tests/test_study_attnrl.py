"""AttnRL's study (benchmarks/studies/attnrl/): its plan, and one unit of each kind at tiny size through the
runner's inline helper (SFT stage, FCI gate, a tuning unit, a reported unit), then the report from those records."""
import json

import pytest
import torch

from benchmarks.studies.attnrl import plan as at_plan
from benchmarks.study.core import REPORTED_SEEDS, StudyError
from benchmarks.study.runner import run_unit_inline

# tokens: one AttnRL batch's worst case at 1 prompt (6 x 135 x 5); a smaller token budget is refused
TINY = {"sft_max_steps": 2, "sft_eval_problems": 2, "gate_problems": 2, "gate_continuations": 1,
        "eval_per_difficulty": 1, "eval_longest_extra": 1, "eval_samples": 1, "tokens": 4050, "prompts_per_batch": 1}


def test_plan_is_valid():
    plan = at_plan.STUDY.plan()  # unique names, dependencies listed earlier
    assert [u.name for u in plan[:4]] == ["sft", "gate", "gate-probe", at_plan.DECIDING_GATE]
    assert plan[0].role == "stage" and plan[1].role == plan[2].role == plan[3].role == "gate"
    for u in plan:
        if u.role in ("tune", "report"):
            assert at_plan.DECIDING_GATE in u.after, u.name  # no RL unit before the gate
    for method in at_plan.MAIN_METHODS:
        assert sorted(u.seed for u in plan if u.role == "report" and u.method == method) == list(REPORTED_SEEDS)
    for method, (_, _, seeds) in at_plan.EXTRA_METHODS.items():
        assert sorted(u.seed for u in plan if u.role == "report" and u.method == method) == list(seeds)
    tunes = [u for u in plan if u.role == "tune"]
    assert tunes and all(u.seed >= 100 for u in tunes)
    grids = {}
    for u in tunes:
        grids.setdefault(u.method, set()).add(u.setting["lr"])
    assert all(g == set(at_plan.LR_GRID) for g in grids.values()), grids  # the same grid for every tuned method
    assert set(grids) == set(at_plan.MAIN_METHODS) | set(at_plan.EXTRA_METHODS)  # every method is tuned
    for u in plan:
        if u.role == "report":
            assert {t.name for t in tunes if t.method == u.method} <= set(u.after), u.name


def test_lr_choice_reads_the_tuning_records():
    def rec(method, lr, accs):
        curve = [{"tokens": 100 * i, "sampled_longest": a} for i, a in enumerate(accs)]
        return {"role": "tune", "method": method, "setting": {"lr": lr}, "curves": {"eval": curve}}
    records = {"a": rec("attnrl", 1e-4, [0.2, 0.3, 0.3]), "b": rec("attnrl", 3e-4, [0.2, 0.5, 0.6]),
               "c": rec("grpo", 1e-4, [0.2, 0.6, 0.7]), "d": rec("grpo", 3e-4, [0.2, 0.1, 0.1])}
    assert at_plan.chosen_lr(records, "attnrl")[0] == 3e-4
    assert at_plan.chosen_lr(records, "grpo")[0] == 1e-4
    with pytest.raises(StudyError, match="no tuning record"):
        at_plan.chosen_lr(records, "entropy_tree")


def test_gate_decision_needs_fci_ahead_of_both_orderings():
    rows = [{"difficulty": 6 + i % 2, "fci": 0.6 + 0.01 * i, "earliest": 0.1 - 0.01 * i, "random": 0.02 * (-1) ** i}
            for i in range(10)]
    good = at_plan.gate_decision(rows, min_per_difficulty=5)
    assert good["fci_beats_both"] and good["enough_responses"]
    tied = at_plan.gate_decision([r | {"earliest": r["fci"] + 0.05 * (-1) ** i} for i, r in enumerate(rows)], 5)
    assert tied["beats_random"] and not tied["beats_earliest"] and not tied["fci_beats_both"]
    assert not at_plan.gate_decision(rows, min_per_difficulty=6)["enough_responses"]
    assert not at_plan.gate_decision(rows, 5, difficulties=(6, 7, 8))["enough_responses"]  # no 8-step response
    assert not at_plan.gate_decision([], 0 + 1, difficulties=(6,))["enough_responses"]


def test_sft_stage_checkpoints_when_its_call_runs_out_and_resumes(tmp_path):
    root = tmp_path / "results"
    sizes = TINY | {"sft_margin_s": 0.0}
    assert run_unit_inline(at_plan.STUDY, "sft", results_root=root, overrides=sizes, call_s=0.0) is None  # no time
    art = root / "attnrl" / "records" / "artifacts" / "sft"
    state = torch.load(art / "checkpoint.pt", weights_only=False, map_location="cpu")
    assert state["step"] == 0 and not state["done"] and not (art / "model.pt").exists()
    record = run_unit_inline(at_plan.STUDY, "sft", results_root=root, overrides=sizes)
    assert record["calls"] == 2 and record["metrics"]["steps"] == 2
    assert (art / "model.pt").exists()


@pytest.mark.slow
def test_one_unit_of_each_kind_at_tiny_size(tmp_path):
    from benchmarks.studies.attnrl.report import report, study_claims
    root = tmp_path / "results"
    sft = run_unit_inline(at_plan.STUDY, "sft", results_root=root, overrides=TINY)
    assert sft["metrics"]["steps"] == 2 and sft["metrics"]["stopped_by"] == "max_steps"
    art = root / "attnrl" / "records" / "artifacts" / "sft"
    assert (art / "model.pt").exists() and (art / "checkpoint.pt").exists()

    gate = run_unit_inline(at_plan.STUDY, "gate", results_root=root, overrides=TINY)
    assert gate["start_sha"] and gate["metrics"]["fci_beats_both"] is False  # an untrained model ranks nothing
    decider = run_unit_inline(at_plan.STUDY, at_plan.DECIDING_GATE, results_root=root, overrides=TINY)
    assert decider["metrics"]["fci_beats_both"] is False and decider["influence"] == "intervention"
    tune_name = f"tune-grpo-lr{at_plan._lr_name(at_plan.LR_GRID[0])}-s{at_plan.TUNING_SEEDS[0]}"
    control = run_unit_inline(at_plan.STUDY, tune_name, results_root=root, overrides=TINY)  # a failed gate: a control
    assert control["fci_room"] is False and control["run"]["generated_tokens"] > 0
    probe = run_unit_inline(at_plan.STUDY, "gate-probe", results_root=root, overrides=TINY)
    assert set(probe["variants"]) == set(at_plan.PROBE_VARIANTS) and probe["start_sha"] == gate["start_sha"]
    assert "max (FCI)" in probe["variants"]["study_task"]["heads"]
    (root / "attnrl" / "records" / f"{tune_name}.json").unlink()
    refused = report([sft, gate, probe, decider], root / "attnrl" / "records")
    assert "FCI does not beat both" in refused and "No reported RL unit" in refused and "Second look" in refused
    assert "mechanism-absent control" in refused and "| P1 |" in refused
    claims = study_claims(root / "attnrl" / "records")
    assert all(c["observed"].startswith("FCI gate failed") and "control" in c["observed"] for c in claims)
    assert not any("no RL seed" in c["observed"] for c in claims)

    # past the gate (its record is edited here: a 2-step SFT model cannot pass it), every RL kind runs
    path = root / "attnrl" / "records" / f"{at_plan.DECIDING_GATE}.json"
    path.write_text(json.dumps(decider | {"metrics": decider["metrics"] | {"fci_beats_both": True}}))
    for lr in at_plan.LR_GRID:
        for method in ("grpo", "attnrl"):
            name = f"tune-{method}-lr{at_plan._lr_name(lr)}-s{at_plan.TUNING_SEEDS[0]}"
            tuned = run_unit_inline(at_plan.STUDY, name, results_root=root, overrides=TINY)
            assert tuned["lr"] == lr and tuned["run"]["generated_tokens"] > 0
            curve = tuned["curves"]["eval"]
            assert curve[0]["tokens"] == 0 and curve[-1]["tokens"] == tuned["run"]["generated_tokens"]
    ablation = run_unit_inline(at_plan.STUDY, f"tune-attnrl_offpolicy_only-lr{at_plan._lr_name(at_plan.LR_GRID[0])}-s100",
                               results_root=root, overrides=TINY)
    assert ablation["algo"] == "attnrl" and ablation["run"]["rl"]["ads"] == "off"
    runs = [run_unit_inline(at_plan.STUDY, f"{m}-s10", results_root=root, overrides=TINY) for m in ("grpo", "attnrl")]
    assert all(r["lr"] in at_plan.LR_GRID and r["start_sha"] == gate["start_sha"] for r in runs)
    records = [json.loads(p.read_text()) for p in sorted((root / "attnrl" / "records").glob("*.json"))]
    section = report(records, root / "attnrl" / "records")
    assert section.startswith("## ") and "| grpo | 1 |" in section and "| attnrl - grpo |" in section
    assert (root / "attnrl" / "records" / "attnrl.png").exists()
    claims = study_claims(root / "attnrl" / "records")  # the tour's claim rows: one AttnRL seed is too few to pair
    assert len(claims) == 2 and all(c["observed"].startswith("pending (1 of 5") for c in claims)
