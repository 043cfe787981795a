"""The FCI gate's statistic (algos.attnrl.diagnostics.step_rank_correlations): per branched response, the rank
correlation of FCI, earliness and a random ordering with the measured influence of each step (the marginal
resampling importance flip(k) - flip(k + 1), or the suffix flip rate flip(k))."""
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
    rows = step_rank_correlations([late_matters, blind, flat], delta=2, seed=0, influence="suffix")
    assert [r["difficulty"] for r in rows] == [6, 7]
    assert rows[0]["fci"] == pytest.approx(1.0) and rows[0]["earliest"] == pytest.approx(-1.0) and rows[0]["steps"] == 4
    assert rows[1]["fci"] == 0.0 and rows[1]["earliest"] == pytest.approx(1.0)  # a blind FCI counts 0, not missing
    assert all(-1.0 <= r["random"] <= 1.0 for r in rows)


def test_random_ordering_is_seeded_and_not_positional():
    records = [_record([0.0, 0.25, 0.5, 0.75, 1.0], [0.1, 0.2, 0.3, 0.4, 0.5]) for _ in range(40)]
    a = step_rank_correlations(records, delta=2, seed=3, influence="suffix")
    assert a == step_rank_correlations(records, delta=2, seed=3, influence="suffix")
    b = step_rank_correlations(records, delta=2, seed=4, influence="suffix")
    assert [r["random"] for r in a] != [r["random"] for r in b]
    randoms = [r["random"] for r in a]
    assert len(set(randoms)) > 3 and abs(sum(randoms) / len(randoms)) < 0.3  # ~0 on average, not always +-1


def test_fci_keys_read_back_from_json():
    record = _record([0.0, 1.0, 0.5], [0.1, 0.9, 0.5])
    for s in record["steps"]:
        s["fci"] = {str(k): v for k, v in s["fci"].items()}  # a record that went through JSON
    assert step_rank_correlations([record], delta=2, influence="suffix")[0]["fci"] == pytest.approx(1.0)


def test_marginal_influence_is_what_resampling_the_step_itself_adds():
    # suffix flip rates fall with position (earlier resampling redoes more steps): earliness ranks them perfectly;
    # the marginal influence flip(k) - flip(k+1) is [0, 0.75, 0, 0.25]: step 2 and step 4 matter themselves
    record = _record([1.0, 1.0, 0.25, 0.25], [0.1, 0.9, 0.2, 0.5])
    record["steps"][-1]["flip"] = 0.0  # resampling only the answer line never changes the outcome here
    suffix = step_rank_correlations([record], delta=2, influence="suffix")[0]
    marginal = step_rank_correlations([record], delta=2)[0]  # the default
    assert suffix["earliest"] > 0.8 > suffix["fci"]
    assert marginal["fci"] > 0.8 and marginal["earliest"] < 0.0
    with pytest.raises(ValueError, match="influence must be"):
        step_rank_correlations([record], delta=2, influence="total")


def test_intervention_influence_ranks_by_forced_result_changes():
    # forced changes move the answer at steps 2 and 4 (the dependency), never at 1 and 3: FCI agrees, earliness not
    record = _record([0.5, 0.5, 0.5, 0.5], [0.1, 0.9, 0.2, 0.5])
    for s, moved in zip(record["steps"], [0.0, 1.0, 0.0, 1.0]):
        s["intervention"] = moved
    row = step_rank_correlations([record], delta=2, influence="intervention")[0]
    assert row["fci"] > 0.8 and row["earliest"] < 0.5
    del record["steps"][0]["intervention"]  # records made without interventions cannot be read this way
    with pytest.raises(ValueError, match="interventions"):
        step_rank_correlations([record], delta=2, influence="intervention")
