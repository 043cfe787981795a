"""The FCI gate's statistic (algos.attnrl.diagnostics.step_rank_correlations): per branched response, the rank
correlation of FCI, earliness and a random ordering with the measured influence (outcome-flip rate) of each step."""
import pytest

from algos.attnrl.diagnostics import step_rank_correlations


def _record(flips, fcis, difficulty=6):
    steps = [{"step": i + 1, "flip": f, "fci": {2: x}} for i, (f, x) in enumerate(zip(flips, fcis))]
    steps.append({"step": len(steps) + 1, "flip": 1.0, "fci": {2: 99.0}})  # the answer line: never a candidate
    return {"difficulty": difficulty, "steps": steps}


def test_rank_correlations_per_response():
    late_matters = _record([0.0, 0.25, 0.5, 1.0], [0.1, 0.2, 0.3, 0.4])  # FCI ranks like influence, later is more
    blind = _record([1.0, 0.5, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0], difficulty=7)  # FCI constant: ranks nothing
    flat = _record([0.5, 0.5, 0.5, 0.5], [0.1, 0.2, 0.3, 0.4])  # no influence ranking: left out
    rows = step_rank_correlations([late_matters, blind, flat], delta=2, seed=0)
    assert [r["difficulty"] for r in rows] == [6, 7]
    assert rows[0]["fci"] == pytest.approx(1.0) and rows[0]["earliest"] == pytest.approx(-1.0) and rows[0]["steps"] == 4
    assert rows[1]["fci"] == 0.0 and rows[1]["earliest"] == pytest.approx(1.0)  # a blind FCI counts 0, not missing
    assert all(-1.0 <= r["random"] <= 1.0 for r in rows)


def test_random_ordering_is_seeded_and_not_positional():
    records = [_record([0.0, 0.25, 0.5, 0.75, 1.0], [0.1, 0.2, 0.3, 0.4, 0.5]) for _ in range(40)]
    a = step_rank_correlations(records, delta=2, seed=3)
    assert a == step_rank_correlations(records, delta=2, seed=3)
    assert [r["random"] for r in a] != [r["random"] for r in step_rank_correlations(records, delta=2, seed=4)]
    randoms = [r["random"] for r in a]
    assert len(set(randoms)) > 3 and abs(sum(randoms) / len(randoms)) < 0.3  # ~0 on average, not always +-1


def test_fci_keys_read_back_from_json():
    record = _record([0.0, 1.0, 0.5], [0.1, 0.9, 0.5])
    for s in record["steps"]:
        s["fci"] = {str(k): v for k, v in s["fci"].items()}  # a record that went through JSON
    assert step_rank_correlations([record], delta=2)[0]["fci"] == pytest.approx(1.0)
