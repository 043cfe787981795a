"""envs/causal: seeded DAGs and SEMs, the CI triplets' truth, dataset specs, Sachs from the cdt wheel, graph scores."""
from __future__ import annotations

import numpy as np
import pytest

from envs.causal import ci_triplet, make_dataset, random_dag, sample_sem
from envs.causal.graphs import cpdag, shd, skeleton_scores
from envs.causal.sem import topological_order


def test_random_dags_are_acyclic_seeded_and_have_the_expected_degree():
    rng = np.random.default_rng(0)
    dags = [random_dag(12, 2.0, rng) for _ in range(50)]
    for adj in dags:
        assert len(topological_order(adj)) == 12 and not np.any(np.diag(adj))
    assert np.mean([2 * a.sum() / 12 for a in dags]) == pytest.approx(2.0, abs=0.25)
    assert np.array_equal(random_dag(8, 2.0, np.random.default_rng(3)), random_dag(8, 2.0, np.random.default_rng(3)))
    with pytest.raises(ValueError, match="expected_degree"):
        random_dag(5, 7.0, rng)


@pytest.mark.parametrize("kind,noise", [("linear", "gaussian"), ("nonlinear", "t3"), ("nonlinear", "laplace")])
def test_sem_nodes_are_standardised_and_children_depend_on_parents(kind, noise):
    rng = np.random.default_rng(1)
    adj = np.zeros((3, 3), dtype=bool)
    adj[0, 1] = adj[1, 2] = True
    data = sample_sem(adj, 20_000, rng, kind=kind, noise=noise)
    assert np.allclose(data.mean(0), 0, atol=1e-9) and np.allclose(data.std(0), 1, atol=1e-6)
    if kind == "linear":  # a chain: strong marginal correlation, none left given the middle node
        assert abs(np.corrcoef(data[:, 0], data[:, 1])[0, 1]) > 0.3
        resid = lambda a: a - np.polyval(np.polyfit(data[:, 1], a, 1), data[:, 1])  # noqa: E731
        assert abs(np.corrcoef(resid(data[:, 0]), resid(data[:, 2]))[0, 1]) < 0.03


def test_triplet_truth_shows_in_partial_correlation_of_the_linear_case():
    def partial(dependent: bool) -> float:
        x, y, z = ci_triplet(20_000, dependent, np.random.default_rng(2), noise="gaussian", nonlinear=False)
        zz = np.hstack([z, np.ones_like(z)])
        rx = x[:, 0] - zz @ np.linalg.lstsq(zz, x[:, 0], rcond=None)[0]
        ry = y[:, 0] - zz @ np.linalg.lstsq(zz, y[:, 0], rcond=None)[0]
        return abs(np.corrcoef(rx, ry)[0, 1])
    assert partial(False) < 0.03 and partial(True) > 0.2


def test_dataset_specs_rebuild_the_same_arrays_and_name_their_mistakes():
    spec = {"kind": "sem", "n": 500, "seed": 4, "d": 6, "sem": "nonlinear", "noise": "t3"}
    a, b = make_dataset(spec), make_dataset(dict(reversed(list(spec.items()))))
    assert a is b and a.data.shape == (500, 6) and a.dag.shape == (6, 6)
    assert not np.array_equal(make_dataset({**spec, "seed": 5}).data, a.data)
    t = make_dataset({"kind": "triplet", "n": 300, "seed": 1, "dependent": False, "dz": 2})
    assert t.data.shape == (300, 4) and t.names == ["x", "y", "z0", "z1"] and t.dependent is False
    with pytest.raises(ValueError, match="missing seed"):
        make_dataset({"kind": "triplet", "n": 10, "dependent": True})
    with pytest.raises(ValueError, match="unknown kind"):
        make_dataset({"kind": "csv"})


def test_file_datasets_load_a_2d_array(tmp_path):
    path = tmp_path / "d.npy"
    np.save(path, np.arange(12.0).reshape(4, 3))
    assert make_dataset({"kind": "file", "path": str(path)}).data.shape == (4, 3)


def test_sachs_ships_with_cdt_as_1755_general_rows_and_18_consensus_edges():
    ds = make_dataset({"kind": "sachs"})
    assert ds.data.shape == (1755, 11) and int(ds.dag.sum()) == 18 and np.all(np.isfinite(ds.data))
    assert ds.names[:3] == ["praf", "pmek", "plcg"]
    assert ds.dag[ds.names.index("PKA"), ds.names.index("praf")]
    assert make_dataset({"kind": "sachs", "rows": "all", "log": False}).data.shape == (7466, 11)


def test_graph_scores_on_a_known_cpdag():
    adj = np.zeros((3, 3), dtype=bool)
    adj[0, 2] = adj[1, 2] = True  # a collider: its CPDAG keeps both arrows
    truth = cpdag(adj)
    assert truth[2, 0] == 1 and truth[0, 2] == -1 and truth[2, 1] == 1
    assert shd(truth, truth) == 0
    chain = np.zeros((3, 3), dtype=bool)
    chain[0, 1] = chain[1, 2] = True  # a chain: its CPDAG is undirected
    undirected = cpdag(chain)
    assert undirected[0, 1] == -1 and undirected[1, 0] == -1
    est = truth.copy()
    est[2, 1] = est[1, 2] = 0  # one edge missing
    assert shd(truth, est) == 1
    s = skeleton_scores(truth, est)
    assert (s["precision"], s["recall"]) == (1.0, 0.5) and s["f1"] == pytest.approx(2 / 3)


def test_sachs_17_arc_dag_is_acyclic_and_differs_from_the_consensus_where_documented():
    from envs.causal.sachs import sachs_dag_17
    from envs.causal.sem import topological_order
    ds = make_dataset({"kind": "sachs"})
    dag = sachs_dag_17(ds.names)
    assert int(dag.sum()) == 17 and len(topological_order(dag)) == 11
    ix = ds.names.index
    only17 = {(ds.names[i], ds.names[j]) for i, j in zip(*np.nonzero(dag & ~ds.dag))}
    only18 = {(ds.names[i], ds.names[j]) for i, j in zip(*np.nonzero(ds.dag & ~dag))}
    assert only17 == {("PKC", "PKA"), ("p44/42", "pakts473"), ("plcg", "PIP3"), ("PIP3", "PIP2")}
    assert only18 == {("plcg", "PKC"), ("PIP2", "PKC"), ("PIP3", "pakts473"), ("PIP3", "plcg"), ("PIP2", "PIP3")}
    assert dag[ix("praf"), ix("pmek")] and ds.dag[ix("praf"), ix("pmek")]
    with pytest.raises(ValueError, match="no column named"):
        sachs_dag_17(["a", "b"])


def test_oriented_scores_count_only_directed_edges_in_the_reference_direction():
    from envs.causal.graphs import oriented_scores
    ref = np.zeros((3, 3), dtype=bool)
    ref[0, 1] = ref[1, 2] = True
    est = np.zeros((3, 3), dtype=int)
    est[1, 0], est[0, 1] = 1, -1        # 0 -> 1: right
    est[1, 2], est[2, 1] = 1, -1        # 2 -> 1: reversed
    est[0, 2] = est[2, 0] = -1          # undirected: counts nowhere
    s = oriented_scores(ref, est)
    assert (s["right"], s["directed"], s["precision"], s["recall"]) == (1, 2, 0.5, 0.5)
    none = oriented_scores(ref, np.where(est != 0, -1, 0))   # every edge undirected: no direction to judge
    assert np.isnan(none["precision"]) and none["recall"] == 0.0 and none["directed"] == 0


def test_determinism_dial_runs_from_x_free_of_z_to_x_set_by_z_and_keeps_the_dependence():
    def partial(x, y, z):
        rx = x[:, 0] - np.polyval(np.polyfit(z[:, 0], x[:, 0], 1), z[:, 0])
        ry = y[:, 0] - np.polyval(np.polyfit(z[:, 0], y[:, 0], 1), z[:, 0])
        return np.corrcoef(rx, ry)[0, 1], np.corrcoef(x[:, 0], z[:, 0])[0, 1]
    kw = dict(noise="gaussian", nonlinear=False, effect=0.5)
    free = partial(*ci_triplet(5000, False, np.random.default_rng(0), rho=0.0, **kw))
    tight = partial(*ci_triplet(5000, False, np.random.default_rng(0), rho=0.99, **kw))
    assert abs(free[1]) < 0.05 and tight[1] > 0.98 and abs(free[0]) < 0.05 and abs(tight[0]) < 0.05
    for rho in (0.0, 0.99):   # the alternative's dependence given Z does not fade as X becomes a function of Z
        assert partial(*ci_triplet(5000, True, np.random.default_rng(1), rho=rho, **kw))[0] > 0.3
    spec = {"kind": "triplet", "n": 50, "seed": 3, "dependent": True, "rho": 0.5}
    assert np.array_equal(make_dataset(spec).data, make_dataset(dict(spec)).data)
    assert not np.array_equal(make_dataset(spec).data, make_dataset({**spec, "rho": 0.9}).data)
    with pytest.raises(ValueError, match="rho"):
        ci_triplet(10, False, np.random.default_rng(0), rho=1.5)
