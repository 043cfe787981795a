"""E-CIT on a real embedded Ray cluster: the pool's "cit" sampler agrees with the pure function, retries and
repeated questions give the same p-value, data travels by spec or by publish, and both experiments run end to end."""
from __future__ import annotations

import json
import uuid

import pytest

from algos.ecit import ecit_pvalue
from envs.causal import make_dataset
from experiments.ecit.pool_tests import Question, ask, question_seed

SPEC = {"kind": "triplet", "n": 900, "seed": 5, "dependent": True, "dz": 1, "noise": "t3", "effect": 0.5,
        "nonlinear": True}


@pytest.fixture(scope="module")
def ecit_pool(ray_cluster):
    """One pool for this module's tests and runs (the runs attach to it by name, as runs share a cluster's pool):
    each pool costs a manager and two worker processes that import E-CIT's code on their first request, seconds of
    CPU each on CI's 2 shared cores."""
    from experiments.registry import attach_pool
    pool = attach_pool({"name": f"test-pool-ecit-{uuid.uuid4().hex[:6]}", "num_workers": 2, "num_cpus": 0.5})
    yield pool
    pool.shutdown()


def test_pool_ecit_equals_the_pure_function_by_spec_and_by_publish(ecit_pool):
    pool = ecit_pool
    fetches_before = sum(w.get("weight_fetches", 0) for w in pool.stats()["workers"])
    data = make_dataset(SPEC).data
    seed = question_seed(1, [0], [1], [2])
    assert seed == question_seed(1, [1], [0], [2])  # PC's (y, x) is the same question
    config = {"base": "kci", "options": {}}
    local_p, local_subsets = ecit_pvalue(data[:, :1], data[:, 1:2], data[:, 2:], base="kci", subset_size=200,
                                         rng=seed, return_subsets=True)
    by_spec = ask(pool, [Question([0], [1], [2], 900, seed, SPEC)], config, 200, per_request=2)[0]
    assert by_spec.pvalues == pytest.approx(local_subsets, rel=1e-12) and len(by_spec.pvalues) == 4
    assert by_spec.pvalue("stable", 1.75) == pytest.approx(local_p, rel=1e-12)
    assert by_spec.cpu_s > 0
    pool.publish("ecit-test-data", data)
    by_publish = ask(pool, [Question([0], [1], [2], 900, seed)], config, 200, per_request=3,
                     weights="ecit-test-data")[0]
    assert by_publish.pvalues == by_spec.pvalues  # other request sizes, same split and subset seeds
    again_published = ask(pool, [Question([0], [1], [2], 900, seed)], config, 200, per_request=1,
                          weights="ecit-test-data")[0]
    assert again_published.pvalues == by_spec.pvalues
    fetches = [w["weight_fetches"] for w in pool.stats()["workers"] if "weight_fetches" in w]
    assert fetches and sum(fetches) - fetches_before <= len(fetches)  # the data went to each worker at most once
    again = ask(pool, [Question([0], [1], [2], 900, seed, SPEC)], config, 200, per_request=1)[0]
    assert again.pvalues == by_spec.pvalues
    full = ask(pool, [Question([0], [1], [2], 900, seed, SPEC, full=True)], config, 200)[0]
    from algos.ecit import base_pvalue
    assert full.pvalues == [base_pvalue(data[:, :1], data[:, 1:2], data[:, 2:], "kci")]  # the base test, all rows


def test_a_bad_request_fails_with_the_samplers_error(ecit_pool):
    from cluster.pool_worker import SamplerError
    pool = ecit_pool
    with pytest.raises(SamplerError, match="outside the 4 subsets"):
        pool.map("cit", [{"data": SPEC, "x": [0], "y": [1], "z": [2], "split_seed": 1, "subset_size": 200,
                          "subsets": [3, 6]}], config={"base": "fisherz"})
    with pytest.raises(SamplerError, match="no 'data' spec and no published data"):
        pool.map("cit", [{"x": [0], "y": [1], "z": [2], "split_seed": 1, "subset_size": 200, "subsets": [0, 1]}],
                 config={"base": "fisherz"})


def test_ecit_experiment_end_to_end(tmp_path, ecit_pool):
    from cluster.metrics import read_metrics
    from experiments.run import main
    summary = main(["experiment=ecit", f"output_dir={tmp_path}", "run_name=e", f"pool.name={ecit_pool.name}",
                    "experiment.ns=[300,1200]", "experiment.reps=6", "experiment.base=fisherz",
                    "experiment.subset_size=150", "experiment.full_max_n=300", "experiment.data.nonlinear=false",
                    "experiment.data.effect=0.6", "experiment.data.noise=gaussian"])
    rows = summary["rows"]
    assert [r["n"] for r in rows] == [300, 1200] and [r["subsets"] for r in rows] == [2, 8]
    assert "full" in rows[0] and "full" not in rows[1] and rows[1]["full_cpu_s"] is None
    for r in rows:
        for m in ("stable", "cauchy", "fisher", "bonferroni", "one_subset"):
            assert r[m]["type1"]["n"] == 6 and r[m]["power"]["n"] == 6
            assert r[m]["type1"]["low"] <= r[m]["type1"]["rate"] <= r[m]["type1"]["high"]
    assert rows[1]["stable"]["power"]["rate"] >= 0.8  # a linear effect of 0.6 at n = 1200 is easy for Fisher-z
    df = read_metrics(tmp_path / "ecit" / "e")
    assert df["power"].tolist() == [r["stable"]["power"]["rate"] for r in rows]
    for plot in summary["plots"]:
        assert (tmp_path / "ecit" / "e" / "plots").exists() and __import__("os").path.getsize(plot) > 5_000
    assert json.loads((tmp_path / "ecit" / "e" / "summary.json").read_text())["rows"] == json.loads(json.dumps(rows))


def test_ecit_pc_recovers_a_linear_graph_and_publish_or_spec_give_the_same_graph(tmp_path, ecit_pool):
    from experiments.run import main
    common = [f"output_dir={tmp_path}", f"pool.name={ecit_pool.name}", "experiment=ecit_pc", "experiment.base=fisherz",
              "experiment.data={kind:sem,n:1200,d:5,degree:2.0,sem:linear,noise:gaussian}",
              "experiment.graphs=1", "experiment.subset_size=300"]
    published = main([*common, "run_name=pub"])
    by_spec = main([*common, "run_name=spec", "experiment.publish=false", "experiment.full=false"])
    e, f = published["methods"]["ecit"][0], published["methods"]["full"][0]
    assert f["f1"] >= 0.7 and e["f1"] >= 0.5, (e, f)
    assert e["tests"] > 0 and e["cpu_s"] > 0 and f["tests"] > 0
    s = by_spec["methods"]["ecit"][0]
    assert (s["shd"], s["f1"], s["tests"]) == (e["shd"], e["f1"], e["tests"])  # seeded by the question
    assert "full" not in by_spec["methods"]
    assert __import__("os").path.getsize(published["plots"][0]) > 5_000


def test_the_subset_size_by_combiner_sweep_runs_its_trials(tmp_path, ecit_pool):
    import os
    import subprocess
    import sys

    import ray
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    argv = [sys.executable, "-m", "experiments.sweep", "experiment=ecit", "sweep=ecit_subset_combiner",
            "sweep.max_concurrent=1", "sweep.space.experiment.subset_size.grid=[100]",
            "sweep.space.experiment.combine.grid=[stable,bonferroni]", "experiment.ns=[400]", "experiment.reps=3",
            "experiment.base=fisherz", "experiment.full_max_n=0", "experiment.data.nonlinear=false",
            f"pool.name={ecit_pool.name}", f"output_dir={tmp_path}", "run_name=sw",
            f"cluster.address={ray.get_runtime_context().gcs_address}"]
    done = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sweep = tmp_path / "ecit" / "sw"
    best = json.loads((sweep / "best.json").read_text())
    assert "calibrated_power" in json.dumps(best)
    summaries = sorted((sweep / "trials" / "ecit").glob("*/summary.json"))
    combos = {(json.loads(p.read_text())["subset_size"], json.loads(p.read_text())["combine"]) for p in summaries}
    assert combos == {(100, "stable"), (100, "bonferroni")}
