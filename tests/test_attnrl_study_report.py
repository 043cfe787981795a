"""AttnRL's study report (benchmarks/studies/attnrl/report.py) on synthetic records in tmp_path: the RL table of the
mechanism-absent control, each declared prediction beside what happened, and the claim rows."""
import json

from benchmarks.studies.attnrl import report as rep_report
from benchmarks.studies.attnrl import plan as at_plan

NAN = (float("nan"),) * 3


def _gate(beats: bool) -> dict:
    row = {"responses": 100, "fci": (0.001, -0.03, 0.03), "earliest": (-0.2, -0.25, -0.15),
           "random": (0.0, -0.01, 0.01),
           "fci_minus_earliest": (0.2, 0.15, 0.25), "fci_minus_random": (0.001, -0.03, 0.03)}
    return {"unit": at_plan.DECIDING_GATE, "role": "gate", "method": "fci_gate", "seed": None, "cpu_s": 60.0,
            "metrics": {"fci_beats_both": beats, "beats_earliest": beats, "beats_random": beats, "delta": 2,
                        "enough_responses": True, "problems_per_difficulty": 4, "responses_kept": {"6": 4}},
            "gate": at_plan.GATE2, "decision": {"overall": row, "by_difficulty": {"6": row}},
            "other_deltas": {"2": row}, "intervention_mean": {"cone": 0.9, "distractor": 0.05}}


def _run(method: str, seed: int, final: float) -> dict:
    """A reported unit whose primary metric climbs linearly from 0.3 to ``final`` over 1000 tokens."""
    curve = [{"tokens": 250 * i, "updates": 2 * i, "sampled_longest": 0.3 + (final - 0.3) * i / 4,
              "greedy_longest": 0.5, "greedy": 0.6, "by_difficulty": {"6": 0.6}} for i in range(5)]
    return {"unit": f"{method}-s{seed}", "role": "report", "method": method, "seed": seed, "cpu_s": 100.0,
            "lr": 1e-4, "fci_room": False, "curves": {"eval": curve},
            "run": {"generated_tokens": 1000, "train_cpu_s": 50.0, "valid_ratio": 0.5, "valid_token_ratio": 0.4}}


# per method: final accuracy per seed offset (seeds 10-14). attn_tree ~ earliest_tree (P1 holds), attn_tree well above
# random_tree (P2 does not hold), entropy_tree ~ random_tree (P4 holds); attnrl above grpo.
FINALS = {"attnrl": [0.70, 0.72, 0.69, 0.71, 0.70], "grpo": [0.60, 0.61, 0.59, 0.60, 0.62],
          "attn_tree": [0.65, 0.66, 0.64, 0.65, 0.66], "earliest_tree": [0.66, 0.65, 0.64, 0.66, 0.65],
          "random_tree": [0.50, 0.51, 0.49, 0.50, 0.52], "entropy_tree": [0.51, 0.50, 0.50, 0.52, 0.49]}


def _records(seeds=range(10, 15)) -> list[dict]:
    return [_gate(False)] + [_run(m, s, FINALS[m][s - 10]) for m in FINALS for s in seeds]


def _row(section: str, key: str) -> str:
    return next(line for line in section.splitlines() if line.startswith(f"| {key} |"))


def test_prediction_outcome_rules():
    # "no difference" needs a margin declared before the runs: without one an interval spanning 0 is not resolved
    assert rep_report.prediction_outcome((0.01, -0.02, 0.04), "equal", 5, 5).startswith("not resolved")
    assert rep_report.prediction_outcome((0.01, -0.02, 0.04), "equal", 5, 5, margin=0.05) == "held"
    assert rep_report.prediction_outcome((0.01, -0.02, 0.04), "equal", 5, 5, margin=0.03) == "not resolved"
    assert rep_report.prediction_outcome((0.01, -0.02, 0.04), "not_above", 5, 5).startswith("not resolved")
    assert rep_report.prediction_outcome((0.05, 0.01, 0.09), "equal", 5, 5) == "did not hold"
    assert rep_report.prediction_outcome((-0.05, -0.09, -0.01), "equal", 5, 5) == "did not hold"
    assert rep_report.prediction_outcome((-0.05, -0.09, -0.01), "not_above", 5, 5) == "held"
    assert rep_report.prediction_outcome((0.05, 0.01, 0.09), "not_above", 5, 5) == "did not hold"
    assert (rep_report.prediction_outcome((0.05, 0.01, 0.09), "not_above", 3, 5)
            == "pending (3 of 5 seeds; so far did not hold)")
    assert rep_report.prediction_outcome(NAN, "equal", 1, 5) == "pending (1 of 5 seeds)"
    assert set(rep_report.PREDICTION_RULES) == set(at_plan.PREDICTIONS)  # every declared prediction has a reading rule


def test_report_of_the_control_sets_predictions_beside_outcomes(tmp_path):
    section = rep_report.report(_records(), tmp_path)
    assert section.startswith("## ") and "mechanism-absent control" in section
    assert "refuse" not in section and "no RL unit ran" not in section.lower()
    assert "| attnrl | 5 |" in section and "| grpo | 5 |" in section  # the RL table, seeds 10-14
    assert section.splitlines()[2].startswith("**This study does not test the paper's claim.**")  # its power first
    assert _row(section, "P1").endswith("| not resolved (no equivalence margin declared) |")
    assert _row(section, "P2").endswith("| did not hold |")
    assert "attnrl - grpo: +0.08" in _row(section, "P3")
    assert _row(section, "P3").endswith("| not resolved (no equivalence margin declared) |")
    assert _row(section, "P4").endswith("| not resolved (no equivalence margin declared) |")
    assert (tmp_path / rep_report.PLOT).exists()


def test_predictions_pending_while_seeds_are_missing(tmp_path):
    section = rep_report.report(_records(seeds=(10, 11, 12)), tmp_path)
    assert "pending (3 of 5 seeds; so far not resolved" in _row(section, "P1")
    none_yet = rep_report.report([_gate(False)], tmp_path)
    assert "No reported RL unit" in none_yet and "pending (0 of 5 seeds)" in _row(none_yet, "P4")


def test_the_first_paragraph_says_what_the_study_can_show(tmp_path):
    """A failed deciding gate makes the RL table a control: the report says first that the claim is not tested; with
    the gate passed it states only how far RL moved the model and that "no difference" is not resolved."""
    control = rep_report.report(_records(), tmp_path).splitlines()[2]
    assert control.startswith("**This study does not test the paper's claim.**") and "by construction" in control
    passed = rep_report.report([_gate(True)] + _records()[1:], tmp_path).splitlines()[2]
    assert passed.startswith("RL barely moved the model") and "does not test" not in passed
    assert "attnrl - grpo" not in passed.lower() or "not resolved" in passed


def test_claim_rows_say_the_control_ran(tmp_path):
    for r in _records():
        (tmp_path / f"{r['unit']}.json").write_text(json.dumps(r))
    claims = rep_report.study_claims(tmp_path)
    assert len(claims) == 2
    for c in claims:
        assert "mechanism-absent control" in c["observed"] and "no RL seed" not in c["observed"]
        assert "seeds [10, 11, 12, 13, 14]" in c["observed"]
    assert claims[0]["holds"].startswith("shown, without FCI (control)")  # attnrl well above grpo on every seed
    passed = tmp_path / "passed"
    passed.mkdir()
    for r in [_gate(True), _run("attnrl", 10, 0.7)]:
        (passed / f"{r['unit']}.json").write_text(json.dumps(r))
    assert all(c["observed"].startswith("pending (1 of 5") for c in rep_report.study_claims(passed))
