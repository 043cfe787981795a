#!/usr/bin/env bash
# The first GPU run, one command on a lent GPU machine (its image: Python 3.12, torch 2.11, transformers, tokenizers,
# numpy; no Ray, gymnasium or MuJoCo; no registry). Nothing travels but the working tree: the physics prior's MuJoCo
# tables and terms are benchmarks/first_gpu_run_tables.npz. With the device tool, from this repo:
#
#   run(command='bash benchmarks/first_gpu_run.sh "$OUT"', timeout_s=240)     # then give_back
#
# writes OUT/first_gpu_run.md (the table, rewritten after every row), OUT/rows.json and OUT/log.txt. Exit status:
# 0 every row ok, 1 a row failed or did not run, 2 no CUDA device, 124 the 170 s cap below (the rows done are kept).
# Rehearse it on a CPU: PYTHON=/path/to/python3.12 DEVICE=cpu bash benchmarks/first_gpu_run.sh /tmp/out
set -uo pipefail
out=${1:?usage: first_gpu_run.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} TOKENIZERS_PARALLELISM=false
python=${PYTHON:-python3}
{ nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
  "$python" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, "cuda", torch.cuda.is_available())'
} 2>&1 | tee "$out/log.txt"
start=$(date +%s)
timeout 170 "$python" -m benchmarks.gpu --device "${DEVICE:-cuda}" --out "$out" 2>&1 | tee -a "$out/log.txt"
status=${PIPESTATUS[0]}
echo "first_gpu_run: exit $status after $(( $(date +%s) - start )) s" | tee -a "$out/log.txt"
exit "$status"
