"""Stage 0 (VIDD pretraining, AttnRL SFT) runs where a learner would: a Ray task on one learner GPU at scale=paper
(train.stage0_on_worker), in the driver's process on CPU scales. Checked on the session cluster, which declares a
logical GPU: the task is placed with the GPU assigned (CUDA absent here, so it computes on the CPU, as the rehearsal
does)."""
from __future__ import annotations

import pytest

from cluster.train import TrainConfig, stage0_options
from experiments.config import load


@pytest.mark.parametrize("experiment", ["vidd_molecule", "vidd_dna"])
def test_paper_scale_asks_for_a_gpu_task_for_stage0(experiment):
    cfg = load([f"experiment={experiment}", "scale=paper"])
    assert stage0_options(cfg["_typed"]["train"]) == {"num_cpus": 8.0, "max_retries": 0, "num_gpus": 1.0}


def test_the_drivers_run_stage0_through_cluster_train_stage0():
    """VIDD's pretraining and AttnRL's SFT go through ``stage0`` (so scale=paper places them on a GPU)."""
    import inspect

    from experiments.attnrl import driver as attnrl_driver
    from experiments.vidd import driver as vidd_driver
    assert "stage0(pretrain_stage," in inspect.getsource(vidd_driver.run)
    assert "stage0(sft_stage," in inspect.getsource(attnrl_driver.run)


def test_cpu_scales_keep_stage0_in_the_driver():
    for scale in ("smoke", "rehearsal"):
        assert stage0_options(load(["experiment=vidd_molecule", f"scale={scale}"])["_typed"]["train"]) is None
    assert stage0_options(TrainConfig(stage0_on_worker=True)) == {"num_cpus": 0.5, "max_retries": 0}


def probe(tag: str) -> dict:
    """Where it ran: process, the GPUs Ray assigned, and the device orrery's code picks there."""
    import os

    import ray

    from cluster.devices import assigned_device
    return {"tag": tag, "pid": os.getpid(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "device": str(assigned_device())}


@pytest.mark.slow
@pytest.mark.cluster
def test_stage0_runs_as_a_task_holding_a_gpu(ray_cluster):
    """The session cluster declares one logical GPU: the stage-0 task gets it; a CPU scale stays in this process."""
    import os

    from cluster.train import stage0
    on_worker = stage0(probe, "paper", train=TrainConfig(use_gpu=True, gpus_per_worker=0.1, cpus_per_worker=0.25,
                                                         stage0_on_worker=True))
    in_driver = stage0(probe, "smoke", train=TrainConfig())
    assert on_worker["tag"] == "paper" and on_worker["pid"] != os.getpid() and on_worker["gpu_ids"] == ["0"]
    assert on_worker["device"] == "cpu"  # a logical GPU without CUDA: the CPU, as cluster.devices says
    assert in_driver["pid"] == os.getpid()
