"""The GPU check: on a machine with one NVIDIA GPU (and ~16 cores), run what only a GPU can show.

    python -m benchmarks.gpu_check --tier device          # a lent GPU machine: its own torch, no Ray (~2 min)
    OMP_NUM_THREADS=1 python -m benchmarks.gpu_check [--tier all] [--minutes 16] [--record benchmarks/RESULTS.md]
    python -m benchmarks.gpu_check --tier device --device cpu   # rehearse the device rows on a CPU

Tier ``device`` (``benchmarks/gpu_rows.py``; torch, transformers and tokenizers only): the device, matmul TFLOP/s
in fp32/tf32/bf16, real multi-process collectives (gloo over GPU tensors with 2 ranks; ``cpu:gloo,cuda:nccl`` with
world size 1, all one GPU allows), AttnRL generation with FCI on the GPU from a bf16-saved Qwen2 with the real
vocabulary, one PPO update at lr 1e-6 (fp32 master weights, > 90 % of them must move), the log-prob temporaries'
bound, and the learner checkpoint resumed from the GPU onto the CPU.

Tier ``ray`` (needs orrery's whole environment: Ray, MuJoCo, rdkit): runs at ``scale=paper`` on a Ray head started
here with the GPU, each driver under ``CUDA_VISIBLE_DEVICES=""`` (a head without a GPU), mostly with every learner as
two Ray Train workers sharing the GPU (0.4 GPU each, gloo on CUDA tensors: NCCL refuses two ranks on one GPU):
  lift_pretrain -> one learner on ``cpu:gloo,cuda:nccl`` (the backend scale=paper uses; the learner logs the group
  it got) -> the two-learner run resumed from its GPU checkpoint -> resumed again with the learners on the CPU
  (GPU -> CPU through the same code path) -> lift_finetune (asserts the learners said they compute on the GPU) ->
  vidd_molecule (stage 0 reports from inside its Ray task that it ran on the GPU) -> attnrl on the bf16 Qwen2.
  Every row asserts exit 0, the DDP replicas identical (``param_max_abs_diff`` 0; AttnRL fails by itself when its
  ranks' digests differ), the precision ``bf16: auto`` chose on the learners' GPU, and what it is there to show.
Each row prints one line; the exit status is 1 if any row failed, 2 without CUDA for ``--device cuda`` (nothing
checked). ``tests/test_gpu_check.py`` puts known bugs back and sees rows fail; ``tests/test_readme_commands.py``
validates the configs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private head: no ~/.ray/auth_token left behind
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SECTION = "## GPU check (`benchmarks/gpu_check.py`)"
HF_VOCAB = 151_643  # Qwen2's tokenizer size (DeepSeek-R1-Distill-Qwen-1.5B); the embedding is padded to 151,936

# scale=paper placed on one GPU and 16 CPUs: 2 learners x (0.4 GPU, 2 CPUs) + 2 model samplers x 0.1 GPU
POOL = ["pool.num_workers=4", "pool.num_cpus=1", "pool.groups.gpu.num_workers=2", "pool.groups.gpu.num_cpus=1",
        "pool.groups.gpu.num_gpus=0.1"]
ONE_GPU = ["scale=paper", "train.num_workers=2", "train.gpus_per_worker=0.4", "train.cpus_per_worker=2",
           "train.backend=gloo", *POOL]
# one learner on the GPU with scale=paper's own backend, cpu:gloo,cuda:nccl (world size 1: all one GPU allows NCCL)
ONE_GPU_NCCL = ["scale=paper", "train.num_workers=1", "train.gpus_per_worker=0.8", "train.cpus_per_worker=2", *POOL]
# the same two learners on the CPU (the resume onto another device)
TWO_CPU_LEARNERS = ["scale=paper", "train.num_workers=2", "train.use_gpu=false", "train.cpus_per_worker=2",
                    "train.backend=gloo", *POOL]
PRETRAIN = ["experiment=lift_pretrain", "env=humanoid_state", "experiment.num_shards=2",
            "experiment.eval_every_steps=40000", "experiment.eval_episodes=4",
            "experiment.checkpoint_every_updates=180"]


@dataclass
class Step:
    """One run of ``experiments.run``: its overrides, time cap and what must hold afterwards."""

    name: str
    experiment: str
    overrides: list[str]
    timeout_s: float
    run_name: str
    checks: list[str] = field(default_factory=list)  # extra check names (CHECKS)
    needs_hf: bool = False
    placement: list[str] = field(default_factory=lambda: list(ONE_GPU))
    precision: bool = True  # the learners choose bf16/fp32 by ``bf16: auto`` (LIFT finetuning runs fp32 by design)
    replicas_in_metrics: bool = True  # AttnRL compares its ranks' parameter digests itself and fails if they differ


def steps(runs: Path, hf_dir: Path | None) -> list[Step]:
    pretrain_run = runs / "lift_pretrain" / "lift"
    hf = [f"experiment.hf_model={hf_dir}"] if hf_dir is not None else []
    return [
        Step("lift_pretrain", "lift_pretrain", [*PRETRAIN, "experiment.total_env_steps=60000"], 170, "lift"),
        Step("lift_pretrain cuda:nccl (1 learner)", "lift_pretrain",
             [*PRETRAIN, "experiment.total_env_steps=20000"], 110, "nccl",
             ["nccl_backend", "learner_on_gpu"], placement=list(ONE_GPU_NCCL)),
        Step("lift_pretrain resume", "lift_pretrain", [*PRETRAIN, "experiment.total_env_steps=80000", "resume=true"],
             110, "lift", ["resumed"]),
        Step("lift_pretrain resume GPU -> CPU", "lift_pretrain",
             [*PRETRAIN, "experiment.total_env_steps=90000", "resume=true"], 110, "lift", ["resumed", "learner_on_cpu"],
             precision=False, placement=list(TWO_CPU_LEARNERS)),
        Step("lift_finetune", "lift_finetune",
             ["experiment=lift_finetune", "env=humanoid_state", f"experiment.pretrain_run={pretrain_run}",
              "experiment.method=lift", "experiment.epochs=2", "experiment.real_steps_per_epoch=400",
              "experiment.prefill_steps=400", "experiment.hupt_schedule=[0,1,2,4]",
              "experiment.horizon_schedule=[0,1,1,3]",
              "experiment.wm_hidden=[200,200]", "experiment.wm_pretrain_steps=300", "experiment.wm_pretrain_rows=20000",
              "experiment.wm_retrain_steps=100", "experiment.wm_eval_every=50", "experiment.eval_episodes=2"],
             170, "finetune", ["learner_on_gpu"], precision=False),
        Step("vidd_molecule", "vidd_molecule",
             ["experiment=vidd_molecule", "experiment.method=vidd", "experiment.pretrain_steps=300",
              "experiment.query_budget=4096", "experiment.refresh_interval=1", "experiment.eval_samples=128",
              "experiment.best_of_n_outputs=128"], 130, "vidd", ["stage0_on_gpu"]),
        Step("attnrl (HF, 150k vocab)", "attnrl",
             ["experiment=attnrl", "experiment.methods=[attnrl]", *hf, "experiment.sft.max_steps=10",
              "experiment.rl.token_budget=20000", "experiment.rl.max_updates=4", "experiment.eval_every_updates=2",
              "experiment.eval_problems_per_difficulty=4", "experiment.sft.eval_problems_per_difficulty=4"],
             130, "attnrl", ["stage0_on_gpu"], needs_hf=True, replicas_in_metrics=False),
    ]


# ------------------------------------------------------------------------------------------------- the HF model

def build_hf_model(path: Path, vocab_size: int = HF_VOCAB, embedding_size: int = 151_936, hidden: int = 64,
                   save_dtype: str = "bfloat16") -> Path:
    """A small random-weight Qwen2 causal LM with a real-size vocabulary, saved locally (no hub) in ``save_dtype``,
    bf16 as DeepSeek-R1-Distill-Qwen-1.5B is stored (a loader that keeps the checkpoint's dtype then trains in pure
    bf16, which an fp32-saved model would hide). The tokenizer is byte-level like Qwen's (one token per byte, so
    newline, the step delimiter ``HFCodec`` looks for, is a token, and text round-trips), no merges, filler tokens
    up to ``vocab_size``; the logits are as wide as the 1.5B model's."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    byte_symbols = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(byte_symbols))}
    vocab.update({f"<|x{i}|>": i for i in range(len(vocab), vocab_size - 1)})
    vocab["<|endoftext|>"] = vocab_size - 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    cfg = Qwen2Config(vocab_size=max(embedding_size, vocab_size), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=True, eos_token_id=vocab_size - 1, pad_token_id=vocab_size - 1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Qwen2ForCausalLM(cfg).to(getattr(torch, save_dtype)).save_pretrained(path)
    fast.save_pretrained(path)
    return path


# ------------------------------------------------------------------------------------------------ device checks

def device_info() -> dict[str, Any]:
    import torch

    from algos.precision import use_bf16
    if not torch.cuda.is_available():
        return {"cuda": False}
    props = torch.cuda.get_device_properties(0)
    return {"cuda": True, "name": props.name, "memory_gb": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}", "bf16_auto": use_bf16("auto", "cuda"),
            "torch": torch.__version__, "cuda_version": torch.version.cuda}


def matmul_tflops(n: int = 4096, repeats: int = 20) -> dict[str, float]:
    import torch
    out = {}
    for name, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                              ("bf16", torch.bfloat16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a, b = torch.randn(n, n, device="cuda", dtype=dtype), torch.randn(n, n, device="cuda", dtype=dtype)
        a @ b
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        torch.cuda.synchronize()
        out[name] = 2 * n ** 3 * repeats / (time.perf_counter() - start) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


# ---------------------------------------------------------------------------------------------------- the runs

def replicas_identical(run_dir: Path) -> str | None:
    """None if the run's metrics report ``param_max_abs_diff`` and it is 0 everywhere, else what is wrong."""
    from cluster.metrics import read_metrics
    try:
        df = read_metrics(run_dir)
    except Exception as err:  # noqa: BLE001
        return f"no metrics ({err!r})"[:200]
    if "param_max_abs_diff" not in df or df["param_max_abs_diff"].dropna().empty:
        return "param_max_abs_diff not reported"
    worst = float(df["param_max_abs_diff"].dropna().abs().max())
    return None if worst == 0.0 else f"DDP replicas differ by {worst:g}"


def precision_as_expected(log: str, expect_bf16: bool) -> str | None:
    """None if the learners logged the precision ``bf16: auto`` should choose on this GPU, else what is wrong."""
    lines = [ln for ln in log.splitlines() if "precision on cuda:" in ln]
    if not lines:
        return "no 'precision on cuda' line: the learners did not compute on the GPU (or did not say)"
    want = "bf16" if expect_bf16 else "fp32"
    wrong = [ln for ln in lines if f"precision on cuda: {want}" not in ln]
    return None if not wrong else f"expected {want}: {wrong[0][-160:]}"


def resumed(run_dir: Path, log: str) -> str | None:
    from cluster.metrics import read_metrics
    df = read_metrics(run_dir)
    if "resumed_from" not in df or not (df["resumed_from"] > 0).any():
        return "the rerun did not resume from its checkpoint (resumed_from never > 0)"
    return None


def stage0_on_gpu(run_dir: Path, log: str) -> str | None:
    """Stage 0 ran as a Ray task and the task itself found a GPU to compute on (``cluster.train.stage0``): a task
    that asked for a GPU but computed on the CPU (CUDA unusable there) fails."""
    lines = [ln for ln in log.splitlines() if "stage 0 (" in ln and "ran on" in ln]
    if not lines:
        return "stage 0 did not run as a Ray task (no 'stage 0 (...) ran on' line)"
    return None if all("ran on cuda" in ln for ln in lines) else f"stage 0 computed off the GPU: {lines[0][-120:]}"


def _learners_on(log: str, device_type: str) -> str | None:
    lines = [ln for ln in log.splitlines() if "learner rank" in ln and "computes on" in ln]
    if not lines:
        return "the learners did not say where they compute (no 'learner rank N computes on' line)"
    wrong = [ln for ln in lines if f"computes on {device_type}" not in ln]
    return None if not wrong else f"a learner computes off {device_type}: {wrong[0][-120:]}"


def learner_on_gpu(run_dir: Path, log: str) -> str | None:
    return _learners_on(log, "cuda")


def learner_on_cpu(run_dir: Path, log: str) -> str | None:
    return _learners_on(log, "cpu")


def nccl_backend(run_dir: Path, log: str) -> str | None:
    """The learner's process group is ``cpu:gloo,cuda:nccl`` as the learner reports it (cluster.train)."""
    lines = [ln for ln in log.splitlines() if "process group backend" in ln]
    if not lines:
        return "the learners did not report their process group"
    return None if all("nccl" in ln for ln in lines) else f"not NCCL: {lines[0][-120:]}"


CHECKS: dict[str, Callable[[Path, str], str | None]] = {
    "resumed": resumed, "stage0_on_gpu": stage0_on_gpu, "learner_on_gpu": learner_on_gpu,
    "learner_on_cpu": learner_on_cpu, "nccl_backend": nccl_backend}


def run_step(step: Step, head, runs: Path, left_s: float, expect_bf16: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "experiments.run", *step.overrides, *step.placement, "cluster=remote",
           f"cluster.address={head.gcs_address}", f"output_dir={runs}", f"run_name={step.run_name}", "log_level=INFO"]
    env = {**head.env, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # the driver: a head without a GPU
    start = time.perf_counter()
    failures: list[str] = []
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=min(step.timeout_s, left_s))
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            failures.append(f"exit {proc.returncode}: {proc.stderr[-400:]!r}")
    except subprocess.TimeoutExpired as err:
        log = (err.stdout or b"").decode(errors="replace") + (err.stderr or b"").decode(errors="replace")
        failures.append(f"stopped at the {min(step.timeout_s, left_s):.0f} s cap")
    run_dir = runs / step.experiment / step.run_name
    if not failures:
        checks = [CHECKS[c] for c in step.checks]
        if step.replicas_in_metrics:
            checks.append(lambda d, lg: replicas_identical(d))
        if step.precision:
            checks.append(lambda d, lg: precision_as_expected(lg, expect_bf16))
        for check in checks:
            problem = check(run_dir, log)
            if problem:
                failures.append(problem)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return {"step": step.name, "ok": not failures, "status": "ok" if not failures else "; ".join(failures)[:600],
            "wall_s": round(time.perf_counter() - start, 1), "summary": _headline(summary)}


def run_all(minutes: float, workdir: Path, expect_bf16: bool) -> list[dict[str, Any]]:
    from cluster.deploy.local import LocalNode
    hf_dir = build_hf_model(workdir / "qwen2-150k")
    runs = workdir / "runs"
    head = LocalNode.head(Path(tempfile.mkdtemp(prefix="orr-gpu-", dir="/tmp")), num_cpus=os.cpu_count() or 16,
                          num_gpus=1)
    deadline = time.monotonic() + 60 * minutes
    rows = []
    try:
        for step in steps(runs, hf_dir):
            left = deadline - time.monotonic()
            if left < 30:
                rows.append({"step": step.name, "ok": False, "status": "skipped: out of time"})
                continue
            rows.append(run_step(step, head, runs, left, expect_bf16))
            print(f"[gpu_check] {rows[-1]}", flush=True)
    finally:
        head.stop()
    return rows


def _headline(summary: dict) -> str:
    keys = ("env_steps", "updates", "final_eval_return", "query_budget", "train_workers", "wall_s")
    return ", ".join(f"{k}={summary[k]}" for k in keys if summary.get(k) is not None)[:200]


def report(info: dict, tflops: dict, device_rows: list, rows: list[dict]) -> str:
    lines = [SECTION, "", f"Command: `python -m benchmarks.gpu_check {' '.join(sys.argv[1:])}`",
             "", f"Device: {json.dumps(info)}", ""]
    if tflops:
        lines += ["| matmul 4096^3 | TFLOP/s |", "|---|---|", *[f"| {k} | {v:.1f} |" for k, v in tflops.items()], ""]
    if device_rows:
        lines += ["| device row | ok | what it checked, the figure |", "|---|---|---|"]
        lines += [f"| {r.name} | {'ok' if r.ok else 'FAIL'} | {r.line} |" for r in device_rows] + [""]
    if rows:
        lines += ["| step (scale=paper on one GPU) | status | wall s | summary |", "|---|---|---|---|"]
        lines += [f"| {r['step']} | {r['status']} | {r.get('wall_s', '')} | {r.get('summary', '')} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tier", choices=("device", "ray", "all"), default="all",
                   help="device: no Ray needed (a lent GPU machine); ray: the scale=paper runs; all: both")
    p.add_argument("--device", default="cuda", help="cuda; cpu rehearses the device tier (no GPU figures)")
    p.add_argument("--minutes", type=float, default=16.0, help="time budget for the Ray runs")
    p.add_argument("--record", type=Path, default=None, help="write the section into this RESULTS.md")
    args = p.parse_args(argv)
    from benchmarks import gpu_rows
    on_cuda = args.device.startswith("cuda")
    info = device_info() if on_cuda else {"cuda": False, "device": args.device}
    print(f"[gpu_check] device: {info}", flush=True)
    if on_cuda and not info["cuda"]:
        print("[gpu_check] no CUDA device: nothing checked (the CPU paths are the test suite's)", flush=True)
        return 2
    tflops = matmul_tflops() if on_cuda else {}
    if tflops:
        print(f"[gpu_check] matmul TFLOP/s: { {k: round(v, 1) for k, v in tflops.items()} }", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="orrery-gpu-check-"))
    device_rows, rows = [], []
    try:
        if args.tier in ("device", "all"):
            device_rows = gpu_rows.run(args.device, workdir)
        if args.tier in ("ray", "all"):
            if on_cuda:
                rows = run_all(args.minutes, workdir, bool(info["bf16_auto"]))
            else:
                print("[gpu_check] the Ray tier needs a GPU: skipped", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    section = report(info, tflops, device_rows, rows)
    print(section)
    if args.record:
        from benchmarks.results_md import replace_section
        replace_section(args.record, SECTION, section)
    failed = [r.name for r in device_rows if not r.ok] + [r["step"] for r in rows if not r["ok"]]
    if failed:
        print(f"[gpu_check] FAILED: {', '.join(failed)}", flush=True)
        return 1
    print(f"[gpu_check] all {len(device_rows) + len(rows)} rows ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
