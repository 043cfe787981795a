"""The main job with tiny budgets (run by tests/test_rehearsal.py on the multi-node cluster): every method runs as its
own driver on one shared pool, the report has every section, plot and claim row, and its numbers are the ones in the
runs' metrics files."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from cluster.metrics import read_metrics

TINY = [
    'experiment.lift_pretrain=["experiment.total_env_steps=1536","experiment.eval_every_steps=512",'
    '"experiment.eval_episodes=3"]',
    'experiment.lift_finetune=["experiment.methods=[lift,sac_finetune]","experiment.epochs=2",'
    '"experiment.real_steps_per_epoch=200","experiment.prefill_steps=200","experiment.wm_pretrain_steps=100",'
    '"experiment.wm_retrain_steps=50","experiment.hupt_schedule=[0,1,2,2]","experiment.eval_episodes=2"]',
    'experiment.vidd=["experiment.methods=[vidd,best_of_n]","experiment.n_train=300","experiment.n_heldout=30",'
    '"experiment.seq_len=24","experiment.d_model=32","experiment.n_layers=1","experiment.n_heads=2",'
    '"experiment.pretrain_steps=20","experiment.num_sampling_steps=6","experiment.query_budget=96",'
    '"experiment.batch_size=8","experiment.timesteps_per_trajectory=2","experiment.best_of_n_outputs=16",'
    '"experiment.eval_samples=16","experiment.eval_every=0"]',
    'experiment.attnrl=["experiment.methods=[attnrl,grpo]","experiment.task.max_steps=3",'
    '"experiment.sft.max_steps=40","experiment.sft.eval_every=20","experiment.sft.eval_problems_per_difficulty=4",'
    '"experiment.rl.prompts_per_batch=2","experiment.rl.token_budget=600","experiment.rl.max_prompts_per_batch=4",'
    '"experiment.eval_problems_per_difficulty=4","experiment.eval_every_updates=2"]',
]


def _close(a: float, b: float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)


def check_tour(tour_run: Path) -> None:
    """The tour's report has every section, plot and claim row, and its numbers are the ones in the runs' metrics
    files. The tour itself runs on the multi-node rehearsal cluster (tests/test_rehearsal.py)."""
    report_dir = tour_run / "report"
    report = (report_dir / "report.md").read_text()
    data = json.loads((report_dir / "report.json").read_text())
    assert data["failures"] == [], data["failures"]
    for heading in ("## What each paper claims", "## LIFT", "## Shared pool", "## Runs", "## Plots"):
        assert heading in report
    for plot in data["plots"]:
        assert (report_dir / plot).stat().st_size > 5_000 and f"({plot})" in report
    for claim in data["claims"]:
        assert f"| {claim['paper']} | {claim['claim']} | {claim['observed']} | {claim['holds']} |" in report
    assert {"env", "diffusion", "lm"} <= set(data["pool"]["per_sampler"]), data["pool"]["per_sampler"]
    for heading in ("## VIDD", "## AttnRL"):
        assert heading in report

    runs = tour_run / "runs"
    pre = json.loads((runs / "lift_pretrain" / "lift_pretrain" / "summary.json").read_text())
    df = read_metrics(runs / "lift_pretrain" / "lift_pretrain").dropna(subset=["eval_return"])
    assert _close(pre["final_eval_return"], df["eval_return"].iloc[-1])
    assert f"eval return {pre['final_eval_return']:.3g}" in report
    fin = json.loads((runs / "lift_finetune" / "lift_finetune" / "summary.json").read_text())
    assert set(fin["methods"]) == {"lift", "sac_finetune"}
    for name, m in fin["methods"].items():
        row = re.search(rf"^\| {name} \| [^|]+ \| ([^|]+) \|", report, re.M)
        assert row and row.group(1).strip() == f"{m['final_return']:.3g}"

    vidd = json.loads((runs / "vidd_molecule" / "vidd_molecule" / "summary.json").read_text())
    for name, m in vidd["methods"].items():
        row = re.search(rf"^\| {name} \| ([^|]+) \| ([^|]+) \|", report, re.M)
        assert row and row.group(1).strip() == f"{m['median_reward']:.3g}"
        assert m["queries"] <= vidd["query_budget"]
    attn = json.loads((runs / "attnrl" / "attnrl" / "summary.json").read_text())
    for name, m in attn["methods"].items():
        row = re.search(rf"^\| {name} \| ([^|]+) \|", report, re.M)
        assert row and row.group(1).strip() == f"{m['accuracy']:.3g}"
    # the AttnRL-vs-GRPO claim compares the last evaluations within the smaller run's token total
    tokens = min(m["generated_tokens"] for m in attn["methods"].values())
    ev = read_metrics(runs / "attnrl" / "attnrl").dropna(subset=["eval_accuracy"])
    ev = ev[ev["generated_tokens"] <= tokens].sort_values("generated_tokens")
    acc = {m: ev[ev["method_id"] == i]["eval_accuracy"].iloc[-1] for i, m in enumerate(["attnrl", "grpo"])}
    claim = next(c for c in data["claims"] if c["claim"].startswith("more accurate than GRPO"))
    assert claim["observed"].startswith(f"{acc['attnrl']:.3g} vs {acc['grpo']:.3g}") and f"<= {tokens} tokens" in \
        claim["observed"], claim
    assert len([c for c in data["claims"] if c["paper"] == "VIDD"]) >= 1
    assert len([c for c in data["claims"] if c["paper"] == "AttnRL"]) >= 1


def test_status_line_reads_progress_behind_ray_prefixes(tmp_path):
    from experiments.tour import _last_progress
    log = tmp_path / "driver.log"
    log.write_text("\x1b[36m(RayTrainWorker pid=23530)\x1b[0m [vidd vidd] 1368/8192 queries (17%) 136.8 queries/s ETA 0:49\n"
                   "(raylet) WARNING: 14 PYTHON worker processes have been started\n")
    assert _last_progress(log) == "1368/8192 queries (17%) 136.8 queries/s ETA 0:49"
    log.write_text("[tour] cluster up\n")
    assert _last_progress(log) == "starting"


def test_a_paper_claim_holds_only_when_the_seed_paired_interval_excludes_zero():
    from experiments.tour_report import paired_verdict
    assert paired_verdict([0.3]).startswith("not shown at this budget (1 seed")  # one seed is never enough
    assert paired_verdict([0.10, 0.12, 0.09, 0.11, 0.10]) == "yes"
    assert paired_verdict([0.1, -0.2, 0.05, 0.0, -0.1]).startswith("not shown at this budget (5 seeds")
    assert paired_verdict([-0.10, -0.12, -0.11]) == "no (reversed)"
    assert paired_verdict([-300, -250, -280], higher_is_better=False) == "yes"  # fewer real steps is better
