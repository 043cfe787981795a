"""Benchmark scripts; each records its command, machine and table in ``benchmarks/RESULTS.md``."""
