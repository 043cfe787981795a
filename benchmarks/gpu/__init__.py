"""The device tier of the GPU check: what one lent GPU shows about orrery's device code, in one command.

    bash benchmarks/first_gpu_run.sh "$OUT"                      # on the lent machine (its python3, no Ray)
    python -m benchmarks.gpu --device cuda --out DIR             # the same, by hand
    python -m benchmarks.gpu --device cpu --out DIR              # the rehearsal on a CPU

Only torch, transformers, tokenizers and numpy are imported (the lent image has them, and no Ray, gymnasium or
MuJoCo): what a row needs beyond that travels in the working tree (the physics prior's MuJoCo tables and terms,
``benchmarks/first_gpu_run_tables.npz``). Every row is a check that can fail; one that cannot run says "not run"
and why. Modules, one concept each: ``rows`` (a row's outcome, its error handling and the table), ``device`` (device
info, matmul), ``collectives`` (process groups of separate processes), ``hf_model`` (the local Qwen2), ``attnrl``
(generation, the learner's update, checkpoint and log-prob call), ``memory`` (peak-memory probes), ``vidd``,
``physics`` (LIFT's prior against MuJoCo's stored terms), ``tier`` (every row in order and the command line).
``tests/test_gpu_check.py`` plants a break for each row and sees it fail on the CPU.
"""
