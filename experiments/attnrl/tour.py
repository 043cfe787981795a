"""AttnRL in the tour: attnrl in compare mode (AttnRL vs GRPO); its report section and the tour test's check."""
from __future__ import annotations

from pathlib import Path

from cluster.metrics import read_metrics
from experiments.tour import TourPart, TourStage
from experiments.tour_report import copy_plots, fmt, load_summary, paired_verdict

TOUR = TourPart(
    title="AttnRL",
    stages=(TourStage("attnrl",
                      overrides=("experiment.methods=[attnrl,grpo]", "experiment.rl.token_budget=20000",
                                 "experiment.eval_every_updates=2"),
                      tiny=("experiment.task.max_steps=3", "experiment.sft.max_steps=40",
                            "experiment.sft.eval_every=20", "experiment.sft.eval_problems_per_difficulty=4",
                            # one AttnRL batch's worst case (2 x 6 x 54 x 5 tokens): a batch starts only if it fits
                            "experiment.rl.prompts_per_batch=2", "experiment.rl.token_budget=3240",
                            "experiment.rl.max_updates=2",
                            "experiment.rl.max_prompts_per_batch=4", "experiment.eval_problems_per_difficulty=4",
                            "experiment.eval_every_updates=2")),),
    section="experiments.attnrl.tour:section",
    paper_scale="python -m experiments.run experiment=attnrl scale=paper cluster=remote "
                "experiment.hf_model=<local dir>",
    check="experiments.attnrl.tour:check",
)


# The tour runs one seed on the short chain task; the claim itself is tested seed-paired by the study.
STUDY_POINTER = ("one seed, a smoke run; the claim is tested on the cone task, seeds 10-14, against GRPO and entropy "
                 "branching in benchmarks/RESULTS.md (`python -m benchmarks.study attnrl report`)")


def section(stages, out: Path) -> tuple[list[str], list[dict], list[str]]:
    (st,) = stages
    lines, claims, plots = ["## AttnRL (attention-guided process-supervised RL)", ""], [], []
    s = load_summary(st.run_dir) if st.ok else None
    if not s:
        return lines, claims, plots
    plots += copy_plots(s.get("plots", []), out, "attnrl")
    diffs = sorted(s["sft"]["accuracy_by_difficulty"], key=lambda d: int(d))
    lines += [f"Generated-token budget per method: {s['token_budget']}. SFT accuracy {fmt(s['sft']['accuracy'])}. "
              f"Source: `{st.run_dir}/metrics`.", "",
              "| method | accuracy | " + " | ".join(f"{d} steps" for d in diffs) +
              " | tokens (of budget) | steps | valid ratio |",
              "|---|---|" + "---|" * len(diffs) + "---|---|---|"]
    rows = {"sft": {**s["sft"], "generated_tokens": 0, "steps": 0, "valid_ratio": None}, **s["methods"]}
    for name, m in rows.items():
        by = m["accuracy_by_difficulty"]
        lines.append(f"| {name} | {fmt(m['accuracy'])} | " + " | ".join(fmt(by.get(d)) for d in diffs) +
                     f" | {m['generated_tokens']}{share(m)} | {m['steps']} | {fmt(m['valid_ratio'])} |")
    lines.append("")
    methods = s["methods"]
    if "attnrl" in methods and "grpo" in methods:
        # runs end at different token counts: compare the last evaluations each made within the smaller total
        tokens = min(methods["attnrl"]["generated_tokens"], methods["grpo"]["generated_tokens"])
        df = read_metrics(st.run_dir)
        a, g = (accuracy_at_tokens(df, m, tokens) for m in ("attnrl", "grpo"))
        claims.append({"paper": "AttnRL", "claim": "more accurate than GRPO at equal generated tokens",
                       "observed": f"{fmt(a)} vs {fmt(g)} ({a - g:+.3f}) at <= {tokens} tokens "
                                   f"(last evaluations within the smaller run's total); {STUDY_POINTER}",
                       "holds": paired_verdict([a - g])})
    if "attnrl" in methods:
        a, b = methods["attnrl"]["accuracy"], s["sft"]["accuracy"]
        claims.append({"paper": "AttnRL", "claim": "RL improves accuracy over the SFT model",
                       "observed": f"{fmt(a)} vs {fmt(b)} ({a - b:+.3f})", "holds": "yes" if a > b else "no"})
    return lines, claims, plots


def share(m: dict) -> str:
    """The share of the token budget a method spent, as " (49%)" (a batch that could cross it never starts)."""
    return f" ({m['budget_share']:.0%})" if m.get("budget_share") is not None else ""


def accuracy_at_tokens(df, method: str, tokens: int) -> float:
    """Eval accuracy of ``method``'s last evaluation made after at most ``tokens`` generated tokens."""
    from algos.attnrl.config import METHODS
    ev = df[df["method_id"] == METHODS.index(method)].dropna(subset=["eval_accuracy"])
    ev = ev[ev["generated_tokens"] <= tokens]
    return float(ev.sort_values("generated_tokens")["eval_accuracy"].iloc[-1])


def check(tour_run: Path, report: str, data: dict) -> None:
    """The AttnRL table's accuracies are the run's own; the AttnRL-vs-GRPO claim compares the last evaluations within
    the smaller run's token total."""
    import json
    import re
    assert "## AttnRL" in report and "lm" in data["pool"]["per_sampler"], data["pool"]["per_sampler"]
    run = tour_run / "runs" / "attnrl" / "attnrl"
    attn = json.loads((run / "summary.json").read_text())
    for name, m in attn["methods"].items():
        row = re.search(rf"^\| {name} \| ([^|]+) \|", report, re.M)
        assert row and row.group(1).strip() == f"{m['accuracy']:.3g}"
    tokens = min(m["generated_tokens"] for m in attn["methods"].values())
    ev = read_metrics(run).dropna(subset=["eval_accuracy"])
    ev = ev[ev["generated_tokens"] <= tokens].sort_values("generated_tokens")
    acc = {m: ev[ev["method_id"] == i]["eval_accuracy"].iloc[-1] for i, m in enumerate(["attnrl", "grpo"])}
    claim = next(c for c in data["claims"] if c["claim"].startswith("more accurate than GRPO"))
    assert claim["observed"].startswith(f"{acc['attnrl']:.3g} vs {acc['grpo']:.3g}") and f"<= {tokens} tokens" in \
        claim["observed"], claim
    assert len([c for c in data["claims"] if c["paper"] == "AttnRL"]) >= 1
