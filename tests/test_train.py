"""Ray Train plumbing on the real cluster: 2 CPU workers (gloo DDP) keep identical parameters, checkpoints are
written, a re-run with the same name resumes from the last one, and the controller collects reports at
``train.report_poll_s``."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def _toy_train_fn(config):
    import torch
    from cluster import ddp
    ddp.set_threads(1)
    torch.manual_seed(ddp.rank())  # different init per rank: DDP must broadcast rank 0's
    model = ddp.wrap_ddp(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    with ddp.latest_checkpoint() as ckpt:
        if ckpt is not None:
            state = torch.load(ckpt / "state.pt")
            (model.module if hasattr(model, "module") else model).load_state_dict(state["model"])
            start = state["step"]
    g = torch.Generator().manual_seed(100 + ddp.rank())  # different data per rank: gradients must be averaged
    for step in range(start, start + config["steps"]):
        x = torch.randn(64, 3, generator=g)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        with ddp.checkpoint_dir() as d:
            torch.save({"model": (model.module if hasattr(model, "module") else model).state_dict(),
                        "step": step + 1}, d / "state.pt")
            ddp.report({"step": step + 1, "loss": loss.item(), "param_sum": flat.sum().item(),
                      "rank": ddp.rank()}, checkpoint_dir=d)
        if config["out"]:
            from cluster.train import REPORT_POLL_ENV
            poll = os.environ.get(REPORT_POLL_ENV)  # handed on by the controller
            (Path(config["out"]) / f"rank{ddp.rank()}.json").write_text(json.dumps({"params": flat.tolist(),
                                                                                   "poll": poll}))


def test_ddp_two_workers_identical_params_and_resume(ray_cluster, tmp_path):
    from cluster.train import fit
    from cluster.train import TrainConfig
    import ray
    from ray.util.state import list_actors
    session = ray.get_runtime_context().gcs_address  # by name: another lane's `ray start` nodes run beside this one

    def actors(cls: str) -> int:
        return len(list_actors(address=session, filters=[("class_name", "=", cls)], limit=10_000))

    def watchers() -> int:
        return actors("PreemptionWatcher")
    train = TrainConfig(num_workers=2, cpus_per_worker=0.5, report_poll_s=0.3)
    out = tmp_path / "params"
    out.mkdir()
    before = watchers()
    result = fit(_toy_train_fn, {"steps": 5, "out": str(out)}, name="toy", storage_path=tmp_path, train=train)
    assert watchers() == before, "train.preemption_watcher=false (the default) starts no watcher actor"
    assert actors("DatasetManager") == 0, "a fit without Ray Datasets starts no dataset manager (cluster.train)"
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["params"] == pytest.approx(r1["params"], abs=1e-7)
    assert r0["poll"] == r1["poll"] == "0.3", "the controller polls at train.report_poll_s (and hands it on)"
    assert result.metrics["step"] == 5 and result.checkpoint is not None
    result2 = fit(_toy_train_fn, {"steps": 3, "out": ""}, name="toy", storage_path=tmp_path,
                  train=TrainConfig(num_workers=1, cpus_per_worker=0.5, preemption_watcher=True))
    assert result2.metrics["step"] == 8, "the second fit must resume at step 5"
    assert watchers() == before + 1, "train.preemption_watcher=true starts Ray Train's watcher"


def test_train_config_refuses_a_poll_interval_out_of_range():
    from cluster.train import TrainConfig
    for bad in (0, -1, 600):
        with pytest.raises(ValueError, match="train.report_poll_s"):
            TrainConfig(report_poll_s=bad)
