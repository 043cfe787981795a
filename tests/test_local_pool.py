"""One rank in one process (what a study unit runs): the pool's interface served in process and Ray Train's
rank, report and checkpoint calls without Ray."""
from __future__ import annotations

import pytest

from cluster import ddp
from cluster.local_pool import LocalPool

ECHO = {"echo": "cluster.echo_sampler:EchoSampler"}


def test_map_keeps_order_and_loads_each_weight_version_once_per_instance():
    pool = LocalPool(ECHO)
    assert pool.publish("policy", {"w": 1}) == 1
    out = pool.map("echo", [{"i": i, "echo_weights": True} for i in range(3)], weights="policy")
    assert [r["request"]["i"] for r in out] == [0, 1, 2]
    assert all(r["weights_version"] == 1 and r["weights"] == {"w": 1} for r in out)
    sampler = next(iter(pool.samplers.values()))[0]
    loads = []
    sampler.load_weights = lambda w, v: loads.append(v)  # count what reaches the instance from here on
    pool.map("echo", [{}, {}], weights="policy")
    assert loads == []  # version 1 is loaded already
    assert pool.publish("policy", {"w": 2}) == 2
    pool.map("echo", [{}, {}], weights="policy")
    assert loads == [2]


def test_affinity_and_config_pick_separate_stateful_instances():
    pool = LocalPool(ECHO)
    pool.map("echo", [{}, {}], affinity=[0, 1])
    pool.map("echo", [{}], config={"x": 1})
    pool.map("echo", [{}], affinity=[0])
    assert len(pool.samplers) == 3  # slots 0 and 1 of the default config, and the other config's


def test_unknown_sampler_missing_weights_and_bad_affinity_are_errors():
    pool = LocalPool(ECHO)
    with pytest.raises(KeyError, match="unknown sampler"):
        pool.map("env", [{}])
    with pytest.raises(KeyError, match="no weights published"):
        pool.map("echo", [{}], weights="policy")
    with pytest.raises(ValueError, match="affinity"):
        pool.map("echo", [{}, {}], affinity=[0])
    with pytest.raises(RuntimeError, match="asked to fail"):
        pool.map("echo", [{"fail": "boom"}])


def test_local_session_is_rank_0_of_1_and_resumes_from_its_last_report(tmp_path):
    with ddp.local_session(tmp_path / "ckpt"):
        assert (ddp.rank(), ddp.world_size(), ddp.device().type) == (0, 1, "cpu")
        with ddp.latest_checkpoint() as ckpt:
            assert ckpt is None
        for step in (1, 2):
            with ddp.checkpoint_dir() as d:
                (d / "rank0.pt").write_text(str(step))
                ddp.report({"step": step}, checkpoint_dir=d)
        with pytest.raises(RuntimeError, match="already open"):
            with ddp.local_session(tmp_path / "other"):
                pass
    with ddp.local_session(tmp_path / "ckpt"):  # a second session on the same folder resumes from the last report
        with ddp.latest_checkpoint() as ckpt:
            assert ckpt is not None and (ckpt / "rank0.pt").read_text() == "2"
    assert not (tmp_path / "ckpt" / "latest.partial").exists()
