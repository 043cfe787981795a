"""The GPU check: on a machine with an NVIDIA GPU, run what only a GPU can show, in one short script.

    OMP_NUM_THREADS=1 python -m benchmarks.gpu_check [--minutes 9] [--record benchmarks/RESULTS.md]

1. the device: name, memory, compute capability, bf16 support and what ``bf16: auto`` chooses;
2. a 4096^3 matmul in fp32, tf32 and bf16 (TFLOP/s): the precision choice in numbers;
3. collectives: a NCCL process group (CUDA tensors) and the mixed ``cpu:gloo,cuda:nccl`` backend orrery uses at
   paper scale (CPU and CUDA tensors in one group), with a one-process group (one GPU cannot hold two NCCL ranks);
4. every experiment at ``scale=paper`` on a Ray head started here with the GPU (learners on the GPU, model samplers
   on fractional GPUs, env shards on CPU workers), each for a few minutes at most, with resource overrides that fit
   one GPU and the machine's CPUs; AttnRL uses a small random-weight Qwen2 model built locally (no hub).
Each step reports and goes on if another failed; the table goes to stdout and, with ``--record``, to RESULTS.md.
Without CUDA it stops at step 1 and says so (it is meant for the lent GPU machine; CPU checks are the test suite).
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
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private head: no ~/.ray/auth_token left behind
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SECTION = "## GPU check (`benchmarks/gpu_check.py`)"

# scale=paper, with the placement shrunk to one GPU and the host's CPUs (16 on the lent H200 machine)
FIT_ONE_GPU = ["train.num_workers=1", "train.cpus_per_worker=4", "train.gpus_per_worker=0.5", "pool.num_workers=4",
               "pool.num_cpus=1", "pool.groups.gpu.num_workers=2", "pool.groups.gpu.num_cpus=1",
               "pool.groups.gpu.num_gpus=0.2"]
EXPERIMENTS: dict[str, list[str]] = {
    "collect": ["experiment=collect", "experiment.num_transitions=64000", "experiment.num_shards=8"],
    "lift_pretrain": ["experiment=lift_pretrain", "env=humanoid_state", "experiment.total_env_steps=300000",
                      "experiment.num_shards=4", "experiment.eval_every_steps=100000", "experiment.eval_episodes=4"],
    # budgets cut to minutes, refresh intervals cut with them (the configs refuse runs with < 5 teacher refreshes)
    "vidd_molecule": ["experiment=vidd_molecule", "experiment.query_budget=8192", "experiment.refresh_interval=2",
                      "experiment.eval_samples=256"],
    "vidd_dna": ["experiment=vidd_dna", "experiment.query_budget=32768", "experiment.refresh_interval=1",
                 "experiment.eval_samples=128"],
    "attnrl": ["experiment=attnrl", "experiment.rl.token_budget=60000", "experiment.sft.max_steps=100"],
}
TIMEOUT_S = {"collect": 90, "lift_pretrain": 200, "vidd_molecule": 150, "vidd_dna": 120, "attnrl": 150}


def device_info() -> dict[str, Any]:
    import torch

    from algos.precision import use_bf16
    if not torch.cuda.is_available():
        return {"cuda": False}
    props = torch.cuda.get_device_properties(0)
    return {"cuda": True, "name": props.name, "memory_gb": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}", "bf16_supported": torch.cuda.is_bf16_supported(),
            "bf16_auto": use_bf16("auto", "cuda"), "torch": torch.__version__, "cuda_version": torch.version.cuda}


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


def collectives() -> dict[str, str]:
    """One-process NCCL and mixed-backend groups: the backend strings orrery passes to Ray Train at paper scale."""
    import torch
    import torch.distributed as dist
    out = {}
    for backend in ("nccl", "cpu:gloo,cuda:nccl"):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + len(out)))
        try:
            dist.init_process_group(backend=backend, rank=0, world_size=1)
            cuda = torch.ones(4, device="cuda")
            dist.all_reduce(cuda)
            result = f"all_reduce on cuda ok ({float(cuda.sum()):.0f})"
            if "gloo" in backend:
                cpu = torch.ones(4)
                dist.all_reduce(cpu)
                result += f", on cpu ok ({float(cpu.sum()):.0f})"
            out[backend] = result
        except Exception as err:  # noqa: BLE001 - reported, the check goes on
            out[backend] = f"failed: {err!r}"[:300]
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    return out


def tiny_qwen2(path: Path) -> Path:
    """A small random-weight Qwen2 causal LM with a character tokenizer, saved locally (no hub)."""
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from tokenizers import Tokenizer, models, pre_tokenizers

    from envs.reasoning.task import CharTokenizer
    chars = CharTokenizer()
    vocab = {tok: i for i, tok in enumerate(chars.symbols)} if hasattr(chars, "symbols") else {
        chr(i): i - 32 for i in range(32, 127)}
    vocab.setdefault("<eos>", len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")
    cfg = Qwen2Config(vocab_size=len(vocab), hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    fast.save_pretrained(path)
    return path


def run_experiments(minutes: float, workdir: Path) -> list[dict[str, Any]]:
    from cluster.deploy.local import LocalNode
    head = LocalNode.head(Path(tempfile.mkdtemp(prefix="orr-gpu-", dir="/tmp")), num_cpus=os.cpu_count() or 16,
                          num_gpus=1)
    deadline = time.monotonic() + 60 * minutes
    rows = []
    try:
        for name, overrides in EXPERIMENTS.items():
            left = deadline - time.monotonic()
            if left < 30:
                rows.append({"experiment": name, "status": "skipped (time budget)"})
                continue
            extra = [f"experiment.hf_model={tiny_qwen2(workdir / 'qwen2-tiny')}"] if name == "attnrl" else []
            cmd = [sys.executable, "-m", "experiments.run", *overrides, *extra, "scale=paper", *FIT_ONE_GPU,
                   "cluster=remote", f"cluster.address={head.gcs_address}", f"output_dir={workdir / 'runs'}",
                   f"run_name={name}"]
            start = time.perf_counter()
            try:
                proc = subprocess.run(cmd, cwd=ROOT, env={**head.env, "OMP_NUM_THREADS": "1"}, capture_output=True,
                                      text=True, timeout=min(TIMEOUT_S[name], left))
                status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr[-300:]!r}"
                log = proc.stdout + proc.stderr
            except subprocess.TimeoutExpired as err:
                status, log = f"stopped at the {TIMEOUT_S[name]} s cap", (err.stdout or b"").decode(errors="replace")
            summary_path = workdir / "runs" / overrides[0].split("=", 1)[1] / name / "summary.json"
            summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
            precision = next((ln.split("precision on", 1)[1].strip() for ln in log.splitlines()
                              if "precision on" in ln), "not logged")
            rows.append({"experiment": name, "status": status, "wall_s": round(time.perf_counter() - start, 1),
                         "precision": precision, "summary": _headline(summary)})
            print(f"[gpu_check] {name}: {rows[-1]}", flush=True)
    finally:
        head.stop()
    return rows


def _headline(summary: dict) -> str:
    keys = ("env_steps", "updates", "final_eval_return", "transitions", "query_budget", "token_budget", "wall_s")
    return ", ".join(f"{k}={summary[k]}" for k in keys if summary.get(k) is not None)[:200]


def report(info: dict, tflops: dict, comms: dict, rows: list[dict]) -> str:
    lines = [SECTION, "", f"Command: `OMP_NUM_THREADS=1 python -m benchmarks.gpu_check {' '.join(sys.argv[1:])}`",
             "", f"Device: {json.dumps(info)}", ""]
    if tflops:
        lines += ["| matmul 4096^3 | TFLOP/s |", "|---|---|", *[f"| {k} | {v:.1f} |" for k, v in tflops.items()], ""]
    if comms:
        lines += ["| process group | result |", "|---|---|", *[f"| {k} | {v} |" for k, v in comms.items()], ""]
    if rows:
        lines += ["| experiment (scale=paper, one GPU) | status | wall s | precision | summary |", "|---|---|---|---|---|"]
        lines += [f"| {r['experiment']} | {r['status']} | {r.get('wall_s', '')} | {r.get('precision', '')} | "
                  f"{r.get('summary', '')} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=9.0, help="time budget for the experiment runs")
    p.add_argument("--record", type=Path, default=None, help="write the section into this RESULTS.md")
    args = p.parse_args(argv)
    info = device_info()
    print(f"[gpu_check] device: {info}", flush=True)
    tflops, comms, rows = {}, {}, []
    if info["cuda"]:
        tflops = matmul_tflops()
        print(f"[gpu_check] matmul TFLOP/s: {tflops}", flush=True)
        comms = collectives()
        print(f"[gpu_check] collectives: {comms}", flush=True)
        workdir = Path(tempfile.mkdtemp(prefix="orrery-gpu-check-"))
        try:
            rows = run_experiments(args.minutes, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    else:
        print("[gpu_check] no CUDA device: nothing to check here (the CPU paths are the test suite's)", flush=True)
    section = report(info, tflops, comms, rows)
    print(section)
    if args.record and info["cuda"]:
        _record(args.record, section)


def _record(path: Path, section: str) -> None:
    from benchmarks.results_md import replace_section
    replace_section(path, SECTION, section)


if __name__ == "__main__":
    main()
