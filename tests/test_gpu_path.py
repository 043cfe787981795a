"""The GPU path checked on a CPU-only machine: device consistency under fake CUDA tensors (``tests/fake_cuda.py``),
checkpoint loading that does not depend on the saving process's devices, and precision chosen by the hardware."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_fake_cuda_check(name: str) -> None:
    """One check of ``tests.fake_cuda_checks`` in its own process (fake tensors can crash an interpreter's teardown)."""
    proc = subprocess.run([sys.executable, "-m", "tests.fake_cuda_checks", name], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and f"ok {name}" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.mark.parametrize("name", ["world_model_training", "mixing_is_a_runtime_error"])
def test_world_model_path_on_fake_cuda(name):
    run_fake_cuda_check(name)


# ------------------------------------------------------------------------------------------ checkpoints and devices

SOURCE_DIRS = ("algos", "cluster", "envs", "experiments", "benchmarks")


def torch_loads_without_map_location(path: Path) -> list[int]:
    """Line numbers of ``torch.load(...)`` calls in ``path`` that do not pass ``map_location``."""
    import ast
    tree = ast.parse(path.read_text(), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and not any(k.arg == "map_location" for k in node.keywords)):
            lines.append(node.lineno)
    return lines


def test_every_torch_load_passes_map_location():
    """A checkpoint saved on a GPU node is read on a CPU head (config checks, drivers) or by a restarted learner on
    another GPU layout: without map_location torch.load puts its tensors back on the saving process's device."""
    offenders = {}
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if lines := torch_loads_without_map_location(path):
                offenders[rel] = lines
    assert not offenders, f"torch.load without map_location: {offenders}"


def test_map_location_check_finds_a_bare_load(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nx = torch.load('a.pt', weights_only=True)\ny = torch.load('b.pt', map_location='cpu')\n")
    assert torch_loads_without_map_location(bad) == [2]


# ------------------------------------------------------------------------------------------------------ precision

@pytest.mark.parametrize("capability, native", [((7, 0), False), ((7, 5), False), ((8, 0), True), ((8, 6), True),
                                                ((9, 0), True), ((10, 0), True), ((6, 1), False)])
def test_bf16_auto_counts_only_native_cuda_bf16(capability, native):
    """V100 (7.0) and T4 (7.5) emulate bf16 (torch.cuda.is_bf16_supported() says yes): ``bf16: auto`` stays fp32."""
    from algos.precision import cuda_bf16_native
    assert cuda_bf16_native(capability) is native


# ------------------------------------------------------------------------------------------------- global sizes

def lift_totals(num_workers: int) -> dict[str, int]:
    """The run's totals as its ranks see them at scale=paper with ``num_workers`` Train workers."""
    from experiments.config import load
    from experiments.lift.pretrain_config import rank_share, split
    cfg = load(["experiment=lift_pretrain", "env=humanoid_state", "scale=paper", f"train.num_workers={num_workers}"])
    exp = cfg["_typed"]["experiment"]
    sac = exp.sac_config()
    shares = [rank_share(sac, num_workers, r) for r in range(num_workers)]
    shard_envs = [split(s.num_envs, exp.num_shards, i) for s in shares for i in range(exp.num_shards)]
    assert min(shard_envs) >= 1
    return {"envs": sum(s.num_envs for s in shares), "envs_in_shards": sum(shard_envs),
            "batch": sum(s.batch_size for s in shares), "replay": sum(s.replay_capacity for s in shares),
            "updates_per_round": exp.steps_per_round * shares[0].utd,  # every rank: the same DDP updates
            "env_steps_per_round": sac.num_envs * exp.steps_per_round}


def test_lift_paper_sizes_are_global_totals():
    """LIFT's 1000 envs and batch 1024 are the run's, not each learner's: 1, 2 or 4 Train workers make the same totals
    (so 4 learners do not run 4000 envs with a quarter of LIFT's gradient steps per env step)."""
    one = lift_totals(1)
    assert one == {"envs": 1000, "envs_in_shards": 1000, "batch": 1024, "replay": 1_000_000, "updates_per_round": 9,
                   "env_steps_per_round": 1000}
    for workers in (2, 4, 8):
        assert lift_totals(workers) == one, workers


def test_a_global_batch_that_does_not_split_is_refused():
    from experiments.config import ConfigError, load
    with pytest.raises(ConfigError, match="experiment.sac.batch_size: the global batch 1024 must split evenly over "
                                          "train.num_workers=3"):
        load(["experiment=lift_pretrain", "env=humanoid_state", "scale=paper", "train.num_workers=3"])


# -------------------------------------------------------------------------------------------- collective timeout

def test_ranks_wait_for_rank0s_stage2_fit_at_paper_scale():
    """At scale=paper the other ranks wait at a barrier while rank 0 fits LIFT's stage-2 world model (20k steps on
    1M rows): the process group's timeout (Ray's default 1800 s) is set to hours there, and reaches TorchConfig."""
    from cluster.train import TrainConfig, torch_config
    from experiments.config import load
    cfg = load(["experiment=lift_pretrain", "env=humanoid_state", "scale=paper"])
    train = cfg["_typed"]["train"]
    assert train.collective_timeout_s >= 6 * 3600
    assert torch_config(train).timeout_s == train.collective_timeout_s
    assert torch_config(train).backend == "cpu:gloo,cuda:nccl"
    assert torch_config(TrainConfig()).timeout_s == 1800 and torch_config(TrainConfig()).backend == "gloo"


def test_lm_sampler_cache_fits_a_gpu_workers_share_at_paper_scale():
    """A gpu pool worker caches up to max_samplers_per_worker LM samplers, each with its own model copy: at
    scale=paper a 1.5B model in bf16 (~3 GB, plus ~1 GB of KV cache and activations) times that bound must fit the
    worker's share of an 80 GB GPU (the smallest GPU the deploy files use)."""
    from experiments.config import load
    pool = load(["experiment=vidd_molecule", "scale=paper"])["_typed"]["pool"]
    per_sampler_gb = 1.5e9 * 2 / 1e9 + 1.0
    share_gb = pool.groups["gpu"]["num_gpus"] * 80
    assert pool.max_samplers_per_worker * per_sampler_gb <= share_gb, (pool.max_samplers_per_worker, share_gb)


# ------------------------------------------------------------------------------------- gpu_check's row assertions

def test_gpu_check_row_assertions_fail_when_they_should(tmp_path):
    """The checks gpu_check applies to each run, on run directories written the way learners write them."""
    from benchmarks.gpu_check import precision_as_expected, replicas_identical, resumed, stage0_on_gpu
    from cluster.metrics import MetricsLogger

    def run(name: str, rows: list[dict]) -> Path:
        logger = MetricsLogger(tmp_path / name, tensorboard=False)
        for i, row in enumerate(rows):
            logger.log(i, row)
        logger.close()
        return tmp_path / name

    good = run("good", [{"env_steps": 1.0, "resumed_from": -1.0}, {"resumed_from": 60.0, "param_max_abs_diff": 0.0}])
    assert replicas_identical(good) is None and resumed(good, "") is None
    assert "differ" in replicas_identical(run("apart", [{"param_max_abs_diff": 1e-3}]))
    assert "not reported" in replicas_identical(run("silent", [{"env_steps": 1.0}]))
    assert "did not resume" in resumed(run("fresh", [{"resumed_from": -1.0}]), "")
    log = "12:00:01 INFO algos.precision: precision on cuda: bf16 (NVIDIA H200, compute capability 9.0)"
    assert precision_as_expected(log, True) is None
    assert "expected fp32" in precision_as_expected(log, False)
    assert "no 'precision on cuda' line" in precision_as_expected("precision on cpu: fp32", True)
    assert stage0_on_gpu(good, "stage 0 (pretrain_stage) ran on cuda:0 (reported by the task)") is None
    assert stage0_on_gpu(good, "") is not None


def test_lift_finetune_sizes_are_global_totals():
    """LIFT finetuning's batch 256, 400 start states per branch and buffer capacities are the run's for 1-8 learners."""
    from experiments.lift.finetune_config import Config, rank_share

    def totals(world: int) -> dict[str, int]:
        shares = [rank_share(Config(model_buffer_capacity=400_000, env_buffer_capacity=60_000), world, r)
                  for r in range(world)]
        return {"batch": sum(s.finetune_sac()["batch_size"] for s in shares),
                "rollout_batch": sum(s.rollout_batch for s in shares),
                "model_buffer": sum(s.model_buffer_capacity for s in shares),
                "env_buffer": sum(s.env_buffer_capacity for s in shares)}

    one = totals(1)
    assert one == {"batch": 256, "rollout_batch": 400, "model_buffer": 400_000, "env_buffer": 60_000}
    for world in (2, 4, 8):
        assert totals(world) == one, world
