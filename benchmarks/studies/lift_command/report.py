"""lift_command's section from its records alone, whatever has finished: the start model and its checks, the gates,
each condition's table beside the same method's no-change arm, the declared predictions' verdicts, the budget spent.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.study.core import expected_core_s, measured_costs
from benchmarks.study.figures import save_figure
from benchmarks.study.stats import fmt_interval, paired, t_interval
from benchmarks.studies.lift_command import plan

OBJECTION = ("**The authors' first objection** (declared in `benchmarks/studies/lift_command/plan.py` before any seed "
             "ran): *the start model is not ours and the change is not ours* (LIFT pretrains a command-conditioned "
             "policy under domain randomisation for 40M+ steps and finetunes it to a command outside its range over "
             "a horizon ramp that reaches H = 20). **The design's answer:** the start model is command-conditioned "
             f"(v* ~ U{tuple(plan.COMMAND_RANGE)} m/s) and pretrained under LIFT's randomisation ranges as ratios "
             "(friction x U(1/3, 1), link masses x U(0.98, 1.02), torso +-5.15 %) by the learner users run, held by "
             "a rule declared before it ran; LIFT's own change (a command 1.5 x the range's edge) and one rigid-body "
             "change outside the randomisation (actuator gear); LIFT's whole horizon schedule (H 1 -> 20 over 11 "
             "epochs), HUPT x0.1 for every method alike; a no-change arm instead of a keep-threshold; "
             "`sac_deterministic` separates the model from deterministic acting. **Not answered:** "
             f"{plan.PRETRAIN_STEPS // 1000}k pretraining steps, not 40M; a planar walker; 2 SAC steps per real step "
             "at the ramp's end, not 20.")


@dataclass(frozen=True)
class Framing:
    """What differs between the studies this report renders (``lift_command`` and its second start model,
    ``lift_command_warm``): their heading, opening lines, how the start model was made, and their units."""
    study: str  # its name: the heading names the command that rewrites the section
    title: str
    opening: tuple[str, ...]
    start_model: str  # "from fresh weights", "from lift_official's start model", ...
    pretrain_steps: int
    figure_stem: str
    units: Callable[[], list] = plan.units
    budget_note: str = ""
    after_stop: str = ""  # what followed a stop (declared after it)
    earlier_core_h: float = 0.0  # the budget already spent before this study (a failed start model)


FRAMING = Framing(study="lift_command", title="LIFT on its own change, issue 47", opening=(OBJECTION,),
                  start_model="from fresh weights", pretrain_steps=plan.PRETRAIN_STEPS, figure_stem="lift_command",
                  after_stop="After this stop, and declared after it, the same design runs on a second start model: "
                             "[`../lift_command_warm/REPORT.md`](../lift_command_warm/REPORT.md).")
METRICS = (  # (record metric, column, format)
    *((f"return_at.{s}", f"return @{s}", "{:.0f}") for s in plan.FIXED_STEPS),
    ("run_mean_return", f"mean return over the run (area / {plan.REAL_STEPS} real steps)", "{:.0f}"),
    ("steps_to_80_censored", f"real steps to 80 % (censored at {plan.REAL_STEPS})", "{:.0f}"),
    ("falls_per_1000", "falls / 1000 real steps", "{:.2f}"),
)


def run_mean_return(record: dict) -> float | None:
    """The return over the whole run: the area under the evaluation curve (trapezoids over real steps, from the
    zero-shot evaluation at 0) divided by the run's real steps. Descriptive: no prediction reads it."""
    x, y = record.get("curves", {}).get("real_steps"), record.get("curves", {}).get("eval_return")
    if not x or not y or len(x) != len(y) or len(x) < 2 or x[-1] <= x[0]:
        return None
    area = sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(x, x[1:], y, y[1:]))
    return area / (x[-1] - x[0])


def value(record: dict, key: str) -> float | None:
    if key == "run_mean_return":
        return run_mean_return(record)
    node = record["metrics"]
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return float(node) if isinstance(node, (int, float)) and math.isfinite(node) else None


def by_seed(records: list[dict], condition: str, method: str, key: str) -> dict[int, float]:
    out = {}
    for r in records:
        if r["role"] == "report" and r["method"] == method and r["setting"]["condition"] == condition:
            v = value(r, key)
            if v is not None:
                out[r["seed"]] = v
    return out


def start_lines(recs: dict[str, dict], framing: Framing = FRAMING) -> list[str]:
    if "pretrain" not in recs:
        return [f"Start model: pretraining in progress ({framing.pretrain_steps} env steps declared, "
                f"{framing.start_model}; the learner `experiments/lift/pretrain_learner.run_one_rank`, checkpointed "
                "every <= 15 min)."]
    r = recs["pretrain"]
    m, evals = r["metrics"], r["curves"]["eval_return"]
    lines = [f"Start model: {m['env_steps']} env steps {framing.start_model} (its update count at the end "
             f"{m['updates']}) by the learner users run, on "
             f"Walker2d with a command v* ~ U{tuple(plan.COMMAND_RANGE)} under LIFT's randomisation; CPU "
             f"{m['learner_cpu_s'] / 3600:.2f} core-h for the learner with its env workers (in process), "
             f"{m.get('stage2_cpu_s', 0.0) / 60:.1f} core-min for stage 2; its last evaluations "
             f"{', '.join(f'{v:.0f}' for v in evals[-plan.HOLD_LAST:])}."]
    hold = m["hold"]
    lines.append(f"Hold rule (declared before it ran): {hold['why']}. **The start model "
                 f"{'holds' if hold['holds'] else 'does not hold: the study stops here'}.**")
    if "check-start" in recs:
        c = recs["check-start"]["metrics"]
        eps = recs["check-start"].get("episodes", {})
        falls = {k: f" ({v['falls']} of {len(v['returns'])} episodes fall)" for k, v in eps.items()}
        lines.append(f"Reference returns (unchanged, unrandomised env): {c['edge_return']:.0f} at the edge command "
                     f"{c['edge_command']} m/s{falls.get('edge', '')}; {c['in_range_return']:.0f} at "
                     f"{c['in_range_command']} m/s{falls.get('in_range', '')}.")
    return lines


def start_plot(recs: dict[str, dict], out: Path, name: str = "lift_command") -> Path | None:
    """Pretraining's evaluations against env steps with the hold rule drawn on them: the best, its
    ``HOLD_PEAK`` floor, and the last ``HOLD_LAST`` (the ones the rule reads)."""
    if "pretrain" not in recs:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    curves, hold = recs["pretrain"]["curves"], recs["pretrain"]["metrics"]["hold"]
    steps, returns = np.asarray(curves["env_steps"]) / 1000, np.asarray(curves["eval_return"])
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.plot(steps, returns, color="C0", marker=".", lw=1, label=f"evaluation ({plan.EVAL_EPISODES} episodes)")
    ax.plot(steps[-plan.HOLD_LAST:], returns[-plan.HOLD_LAST:], "o", color="C3", label=f"last {plan.HOLD_LAST}")
    ax.axhline(returns.max(), color="k", lw=0.7, ls=":", label="best")
    ax.axhline(plan.HOLD_PEAK * returns.max(), color="k", lw=0.7, ls="--", label=f"{plan.HOLD_PEAK:.0%} of best")
    ax.axhline(hold["mean"], color="C3", lw=0.7, label=f"mean of last {plan.HOLD_LAST}")
    verdict = "holds" if hold["holds"] else "does not hold"
    ax.set(title=f"{name} start model: {verdict}", xlabel="env steps (k)", ylabel="return (randomised env)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return save_figure(fig, out)


def gate_lines(recs: dict[str, dict], stopped: bool = False) -> list[str]:
    lines = ["| condition | zero-shot / reference (kept) | gate (<= 80 %) |", "|---|---|---|"]
    for condition in ("command", "gear"):
        g = recs.get(f"gate-{condition}")
        if g is None:
            lines.append(f"| {condition} | {'not run: the start model did not hold' if stopped else 'not run yet'} "
                         "| - |")
            continue
        m = g["metrics"]
        tried = ", ".join(f"x{t['rung']} {t['kept']:.0%}" for t in g["ladder"]) if condition == "gear" else ""
        lines.append(f"| {g['chosen']['label']} | {m['zero_shot_return']:.0f} / {m['reference_return']:.0f} "
                     f"({m['kept']:.0%}){' - rungs: ' + tried if tried else ''} | "
                     f"{'passed: runs' if m['passed'] else '**failed: not run**'} |")
    return lines


def reached_80(records: list[dict], condition: str, method: str) -> tuple[int, int]:
    """(runs that reached 80 % of the reference, runs) of a method under a condition."""
    runs = [r for r in records if r["role"] == "report" and r["method"] == method
            and r["setting"]["condition"] == condition]
    return sum(bool(r["metrics"].get("reached_80")) for r in runs), len(runs)


def lift_minus_sac(records: list[dict], condition: str, key: str) -> tuple[float, float, float]:
    """LIFT - SAC finetuning on ``key``, seed-paired (a descriptive figure beside the declared verdicts)."""
    return paired(by_seed(records, condition, "lift", key), by_seed(records, condition, "sac_finetune", key))


def condition_lines(records: list[dict], condition: str) -> list[str]:
    head = ["method", "seeds", "reached 80 %", *(t for _, t, _ in METRICS), "SAC steps / real step (last epoch)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in plan.METHODS[condition]:
        finals = by_seed(records, condition, method, f"return_at.{plan.REAL_STEPS}")
        seeds = by_seed(records, condition, method, "steps_to_80_censored")
        if not seeds:
            continue
        cells = [method, str(len(seeds)), f"{reached_80(records, condition, method)[0]}/{len(seeds)}"]
        cells += [fmt_interval(t_interval(list(by_seed(records, condition, method, k).values())), p)
                  for k, _, p in METRICS]
        cells.append(fmt_interval(t_interval(list(by_seed(records, condition, method,
                                                          "sac_steps_per_real_step_last_epoch").values())), "{:.2f}"))
        lines.append("| " + " | ".join(cells) + " |")
        if condition != "nochange" and method in plan.METHODS["nochange"] and finals:
            arm = by_seed(records, "nochange", method, f"return_at.{plan.REAL_STEPS}")
            if arm:  # only the final return: the arm sits under the method it is the no-change control of
                arm_cells = [f"↳ {method}, no-change arm", str(len(arm))] + ["-"] * (len(head) - 2)
                arm_cells[head.index(f"return @{plan.REAL_STEPS}")] = fmt_interval(t_interval(list(arm.values())),
                                                                                   "{:.0f}")
                lines.append("| " + " | ".join(arm_cells) + " |")
    return lines if len(lines) > 2 else ["No method unit of this condition has finished."]


def prediction_verdict(stat: tuple[float, float, float], margin: float, lower_is_better: bool) -> str:
    """'a better' / 'b better' when the paired interval lies beyond the margin on one side, 'equivalent' when it lies
    within +-margin, else 'undecided' (fewer than two seeds: 'too few seeds')."""
    _, low, high = stat
    if not (math.isfinite(low) and math.isfinite(high)):
        return "too few seeds"
    good_low, good_high = (-high, -low) if lower_is_better else (low, high)
    if good_low > margin:
        return "a better"
    if good_high < -margin:
        return "b better"
    if -margin <= good_low and good_high <= margin:
        return "equivalent"
    return "undecided"


def prediction_results(records: list[dict], recs: dict[str, dict]) -> list[dict]:
    """Each declared prediction's seed-paired interval, margin and verdict (``said`` None: no paired seeds yet)."""
    out = []
    check = recs.get("check-start", {}).get("metrics", {})
    for name, condition, key, a, b, expected, margin, lower in plan.PREDICTIONS:
        is_return = key.startswith("return_at")
        scale = check.get(plan.REFERENCE[condition]) if is_return else 1.0
        pairs = by_seed(records, condition, a, key), by_seed(records, condition, b, key)
        stat = paired(*pairs)
        row = {"name": name, "condition": condition, "key": key, "a": a, "b": b, "expected": expected,
               "stat": stat, "seeds": len(set(pairs[0]) & set(pairs[1])), "said": None, "width": None,
               "is_return": is_return, "margin": margin}
        if scale is not None and math.isfinite(stat[0]):
            row["width"] = margin * scale
            row["said"] = prediction_verdict(stat, row["width"], lower)
        out.append(row)
    return out


def _mark(row: dict) -> str:
    if row["said"] == row["expected"]:
        return "as predicted"
    return "open" if row["said"] in ("undecided", "too few seeds") else "against the prediction"


def prediction_lines(records: list[dict], recs: dict[str, dict]) -> list[str]:
    lines = ["| prediction (declared) | a - b, seed-paired [95 % t] | margin | expected | verdict |",
             "|---|---|---|---|---|"]
    for r in prediction_results(records, recs):
        label = f"{r['name']} ({r['a']} vs {r['b']}, {r['key']})"
        if r["said"] is None:
            lines.append(f"| {label} | - | - | {r['expected']} | no paired seeds yet |")
            continue
        share = f" ({r['margin']:.0%} of the reference)" if r["is_return"] else ""
        lines.append(f"| {label} | {fmt_interval(r['stat'], '{:+.2f}')} | +-{r['width']:.4g}{share} | "
                     f"{r['expected']} | {r['said']} ({_mark(r)}) |")
    return lines


def reading_lines(records: list[dict], recs: dict[str, dict]) -> list[str]:
    """The issue's two questions answered from the declared verdicts alone (fewer real samples or falls than SAC;
    the model or deterministic acting), and LIFT's falls and return over the run against SAC's beside them
    (descriptive: no prediction was declared on them). Says how many seeds each answer rests on, how many runs
    reached 80 % where the answer counts censored runs, and that it is partial until seeds 10-14 exist."""
    results = {r["name"].split()[0]: r for r in prediction_results(records, recs)}

    def said(tag: str) -> str:
        r = results[tag]
        if r["said"] is None:
            return f"{tag}: no paired seeds yet"
        line = (f"{tag} ({r['a']} - {r['b']}, {r['key']}) {fmt_interval(r['stat'], '{:+.2f}')} on {r['seeds']} "
                f"seed(s): **{r['said']}** ({_mark(r)})")
        if r["key"] == "steps_to_80_censored":  # censored runs count the budget: say how many reached at all
            reached = {m: reached_80(records, r["condition"], m) for m in (r["a"], r["b"])}
            counts = ", ".join(f"{m} {k}/{n}" for m, (k, n) in reached.items())
            neither = "; neither recovered within the budget: the difference is of two censored runs"
            line += f" [reached 80 %: {counts}{'' if any(k for k, _ in reached.values()) else neither}]"
        return line

    def lift_vs_sac(key: str, fmt: str) -> str:
        stats = {c: lift_minus_sac(records, c, key) for c in ("command", "gear")}
        out = [f"{c} {fmt_interval(s, fmt)}" for c, s in stats.items() if math.isfinite(s[0])]
        return "; ".join(out) if out else "no paired seeds yet"
    seeds = {r["seed"] for r in records if r["role"] == "report"}
    partial = set(plan.REPORT_SEEDS) - seeds
    lines = ["**Reading** (from the declared verdicts; " + (f"partial: seeds {sorted(seeds)} of "
             f"{list(plan.REPORT_SEEDS)} so far)" if partial else "seeds 10-14)"),
             f"- Fewer real samples than SAC finetuning to 80 % of the reference: {said('P1')} (LIFT's own change, a "
             f"command outside the range); {said('P5')} (gear). Ending higher: {said('P2')}.",
             f"- Falls, LIFT - SAC finetuning per 1000 real steps (seed-paired, descriptive): "
             f"{lift_vs_sac('falls_per_1000', '{:+.2f}')}. Return over the whole run, LIFT - SAC finetuning "
             f"(descriptive): {lift_vs_sac('run_mean_return', '{:+.0f}')}.",
             f"- The model or deterministic acting: {said('P3')} (command); {said('P4')} (gear): LIFT against "
             f"`sac_deterministic`, which acts deterministically without a model at LIFT's SAC steps per real step. "
             f"The refit: {said('P6')}.",
             f"- With no change: {said('P7')}."]
    if not partial:
        lines.append(answer_line(records, results))
    return lines


def answer_line(records: list[dict], results: dict[str, dict]) -> str:
    """The issue's question in one line once seeds 10-14 exist, from the same verdicts and intervals as above."""
    def said(tag: str) -> str:
        return results[tag]["said"] or "no paired seeds"

    reached = {c: reached_80(records, c, "lift")[0] for c in ("command", "gear")}
    fewer_samples = [c for tag, c in (("P1", "command"), ("P5", "gear")) if results[tag]["said"] == "a better"]
    falls = {c: lift_minus_sac(records, c, "falls_per_1000") for c in reached}
    fewer_falls = [c for c, s in falls.items() if math.isfinite(s[2]) and s[2] < 0]
    more_falls = [c for c, s in falls.items() if math.isfinite(s[1]) and s[1] > 0]
    higher = results["P2"]["said"] == "a better"
    n = len(plan.REPORT_SEEDS)
    samples = ", ".join(fewer_samples) or "on neither change"
    falls_said = ", ".join(fewer_falls) or "not resolved on either change"
    if more_falls:
        falls_said += "; more falls: " + ", ".join(more_falls)
    line = (f"- **The answer.** Fewer real samples than SAC finetuning: {samples} (LIFT's runs that reached 80 %: "
            f"command {reached['command']}/{n}, gear {reached['gear']}/{n}); ending higher on its own change: "
            f"{'yes' if higher else 'no'} (P2 {said('P2')}); fewer falls: {falls_said}. ")
    if fewer_samples or fewer_falls or higher:
        return line + (f"What carries it: P3 {said('P3')}, P4 {said('P4')} (the model against "
                       f"deterministic acting); P6 {said('P6')} (the refit).")
    return line + ("LIFT found nothing over SAC finetuning here, so there is nothing for the model or deterministic "
                   f"acting to carry (for the record: P3 {said('P3')}, P4 {said('P4')}; the "
                   f"refit against a frozen model, P6, {said('P6')}).")


def budget_lines(records: list[dict], stopped: bool = False, framing: Framing = FRAMING) -> list[str]:
    spent = sum(r.get("cpu_s", 0.0) for r in records) / 3600
    pending = [u for u in framing.units() if u.name not in {r["unit"] for r in records}]
    left = sum(u.est_core_s for u in pending) / 3600
    measured = measured_costs([r for r in records if r["role"] == "report"])
    projected = sum(expected_core_s(u, measured) for u in pending) / 3600
    fate = "never run (the study stopped)" if stopped else "not run yet"
    at_cost = "" if stopped or not measured else f", ~{projected:.2f} at the costs measured so far"
    total = spent + (0.0 if stopped else projected) + framing.earlier_core_h
    return [f"Budget: {spent:.2f} core-h measured over {len(records)} finished units; {len(pending)} units "
            f"(~{left:.2f} core-h declared{at_cost}) {fate}; "
            + (f"with {framing.earlier_core_h:.2f} core-h spent before this study, " if framing.earlier_core_h else "")
            + f"~{total:.2f} of the {plan.BUDGET_CORE_H:.0f} core-hours"
            + (f" (**over by {total - plan.BUDGET_CORE_H:.2f}**)" if total > plan.BUDGET_CORE_H else "")
            + ". What the budget "
            f"cut short, for every method alike: HUPT x0.1 (10 -> 100 branches: 2 SAC steps per real step at the "
            f"ramp's end, LIFT 20), {framing.pretrain_steps // 1000}k pretraining steps {framing.start_model} "
            f"(LIFT 40M+), {plan.EVAL_EPISODES} evaluation episodes per epoch (LIFT 1024), no tuning."
            + (f" {framing.budget_note}" if framing.budget_note else "")]


def plot(records: list[dict], out: Path) -> Path | None:
    """Per condition: return vs real steps (mean over seeds, the band from the lowest to the highest seed) with the
    80 % line of its reference, and below it the falls so far (mean over seeds)."""
    reported = [r for r in records if r["role"] == "report"]
    if not reported:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, len(plan.CONDITIONS), figsize=(5 * len(plan.CONDITIONS), 7.5), sharex="col",
                             height_ratios=(3, 2))
    for col, condition in enumerate(plan.CONDITIONS):
        top, bottom = axes[0, col], axes[1, col]
        for i, method in enumerate(plan.METHODS[condition]):
            runs = [r["curves"] for r in reported if r["method"] == method and r["setting"]["condition"] == condition]
            if not runs:
                continue
            n = min(len(c["eval_return"]) for c in runs)
            x = runs[0]["real_steps"][:n]
            returns = np.array([c["eval_return"][:n] for c in runs])
            top.plot(x, returns.mean(axis=0), color=f"C{i}", label=f"{method} ({len(runs)})")
            if len(runs) > 1:
                top.fill_between(x, returns.min(axis=0), returns.max(axis=0), color=f"C{i}", alpha=0.12, lw=0)
            if all(len(c.get("falls_total") or []) >= n for c in runs):
                bottom.plot(x, np.mean([c["falls_total"][:n] for c in runs], axis=0), color=f"C{i}")
        refs = [r["metrics"]["reference_return"] for r in reported if r["setting"]["condition"] == condition]
        if refs:
            top.axhline(plan.RECOVER_FRACTION * refs[0], color="k", ls="-.", lw=0.7, label="80 % of reference")
        top.set(title=condition, ylabel="deterministic return")
        bottom.set(xlabel="real env steps (prefill included)", ylabel="falls so far (real env)")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
        if top.get_legend_handles_labels()[0]:
            top.legend(fontsize=6)
    fig.tight_layout()
    return save_figure(fig, out)


TOUR_RUNS = Path(__file__).with_name("tour_lift_runs.json")


def tour_lines(path: Path = TOUR_RUNS) -> list[str]:
    """The main job's LIFT part over five runs (issue 47 asks for it beside the study: the demo a user meets first)."""
    if not path.exists():
        return []
    d = json.loads(path.read_text())
    runs, budget = d["runs"], d["runs"][0]["lift"]["real_steps"]
    lines = [f"**The main job's LIFT part, five runs** ({d['task']}, {d['change']['name']} x{d['change']['scale']}; "
             f"{d['what']}; {d['commit']}, {d['date']}, {d['machine']}). Rule, {d['rule']}.", "",
             "| run | start model (env steps) | zero-shot | LIFT: real steps to 80 % | SAC finetuning | LIFT falls "
             "| SAC falls |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['run']} | {r['pretrain_env_steps']} | {r['zero_shot_return']:.0f} | "
                     f"{r['lift']['real_steps_to_recover']} | {r['sac_finetune']['real_steps_to_recover']} | "
                     f"{r['lift']['falls']} | {r['sac_finetune']['falls']} |")
    def steps(r: dict, method: str) -> float:
        return math.inf if r[method]["real_steps_to_recover"] is None else r[method]["real_steps_to_recover"]
    failed = sum(steps(r, "lift") == math.inf
                 or r["lift"]["final_return"] < plan.RECOVER_FRACTION * r["pre_change_return"] for r in runs)
    late = sum(budget <= steps(r, "lift") < math.inf for r in runs)
    slower = sum(steps(r, "lift") > steps(r, "sac_finetune") for r in runs)
    more_falls = sum(r["lift"]["falls"] > r["sac_finetune"]["falls"] for r in runs)
    distinct = len({json.dumps({k: v for k, v in r.items() if k != "run"}, sort_keys=True) for r in runs})
    verdict = ("fired: its cause is to be found and mended" if failed >= 2
               else "did not fire, and the demo's change stays as declared")
    lines += ["", f"LIFT recovered in {len(runs) - failed} of {len(runs)} runs ({late} of them only at the last "
              f"evaluation, {budget} real steps), so the rule's trigger (>= 2 failures) {verdict}. LIFT recovered "
              f"later than SAC finetuning in {slower} and fell more in {more_falls} of {len(runs)}: the tour shows "
              f"the stages working together, not LIFT's claim. The runs share seed 0 but not their results "
              f"({distinct} distinct outcomes; even the start models differ, at "
              f"{', '.join(str(n) for n in sorted({r['pretrain_env_steps'] for r in runs}))} pretraining env steps)."]
    return lines


def report(records: list[dict], out_dir: Path, framing: Framing = FRAMING) -> str:
    recs = {r["unit"]: r for r in records}
    lines = [f"## {framing.title} (`python -m benchmarks.study {framing.study} report`)", "",
             *(p for line in framing.opening for p in (line, "")),
             *start_lines(recs, framing), ""]
    stopped = "pretrain" in recs and not recs["pretrain"]["metrics"]["holds"]
    if "check-start" in recs or "gate-command" in recs or "gate-gear" in recs:
        lines += [*gate_lines(recs, stopped), ""]
    here = out_dir.parent if out_dir.name == "records" else out_dir
    start_figure = start_plot(recs, here / f"{framing.figure_stem}_start.png", framing.figure_stem)
    if start_figure is not None:
        lines += [f"Plot: `{start_figure.name}` beside this report (pretraining's evaluations and the hold rule).", ""]
    tour = tour_lines()
    tail = ["", *tour] if tour else []
    if stopped:
        lines += ["No gate or method unit runs on a start model that did not hold (the rule is never relaxed): "
                  "no condition table and no prediction verdict exists for this start model.", "",
                  *([framing.after_stop, ""] if framing.after_stop else []),
                  *budget_lines(records, stopped=True, framing=framing), *tail]
        return "\n".join(lines) + "\n"
    figure = plot(records, here / f"{framing.figure_stem}.png")
    if figure is not None:
        lines += [f"Plot: `{figure.name}` beside this report (return vs real steps per condition).", ""]
    for condition in plan.CONDITIONS:
        lines += [f"**{condition}** (mean [95 % t-interval] over seeds; never-reached runs count {plan.REAL_STEPS})",
                  "", *condition_lines(records, condition), ""]
    lines += ["**Predictions** (declared in `benchmarks/studies/lift_command/plan.py` `PREDICTIONS` before any "
              "reported unit ran)", "", *prediction_lines(records, recs), "", *reading_lines(records, recs), "",
              *budget_lines(records, framing=framing),
              *tail]
    return "\n".join(lines) + "\n"
