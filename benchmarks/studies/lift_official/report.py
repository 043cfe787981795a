"""``lift_official``'s report from its records alone: the start model, the gates, per change the methods' means and
seed-paired differences, the reading, the plot, and the official table the study's settings come from."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from benchmarks.studies.lift_official.plan import (APPENDIX_METHODS, CHANGES, CONTROL_KEEP, EVAL_EPISODES, HOLD_SPREAD,
                                                   METHODS, PRETRAIN_CAP, ROOM_SEED, start_accepted)
from benchmarks.study.figures import save_figure
from benchmarks.study.lift_stages import band_plot, by_seed, recovery_panel
from benchmarks.study.stats import NOT_RESOLVED, fmt_interval, paired, t_interval, verdict


# (record metric, column title, format, lower is better): what every method unit reports
REPORT_METRICS = (
    ("return_at.1500", "return @1500", "{:.0f}", False),
    ("return_at.2000", "return @2000", "{:.0f}", False),
    ("return_at.3000", "return @3000", "{:.0f}", False),
    ("return_at.4000", "return @4000", "{:.0f}", False),
    ("real_steps_to_recover_censored", "real steps to 80 % (censored at 4000)", "{:.0f}", True),
    ("falls_per_1000", "falls / 1000 real steps", "{:.2f}", True),
)
PAIRED_AGAINST = ("sac_finetune", "sac_finetune_matched", "lift_frozen_model")


def _by_name(records: list[dict]) -> dict[str, dict]:
    return {r["unit"]: r for r in records}


def start_lines(recs: dict[str, dict]) -> list[str]:
    lines = []
    if "pretrain" not in recs:
        return ["Start model: pretraining in progress (the 200k model did not hold: history below)."]
    m = recs["pretrain"]["metrics"]
    evals = recs["pretrain"]["curves"]["eval_return"]
    stage2 = m.get("stage2", {}).get("physics", {})
    lines.append(f"Start model: {m['env_steps']} env steps of SAC on Walker2d with a velocity command; its last three "
                 f"evaluations ({EVAL_EPISODES} episodes each) {', '.join(f'{v:.0f}' for v in evals[-3:])}; "
                 f"stage-2 physics model 1-step error {stage2.get('error_1step', float('nan')):.3f}.")
    if "check-start" in recs:
        c = recs["check-start"]["metrics"]
        shares = ", ".join(f"seed {k} {v:.0%}" for k, v in c["kept_by_seed"].items())
        lines.append(f"Check (declared before it ran): last three within {HOLD_SPREAD:.0%} of their mean (spread "
                     f"{c['spread']:.1%}) and a matched SAC finetune in the unchanged env, {c['control_real_steps']} "
                     f"real steps and {c['control_sac_steps']} SAC steps with LIFT's coefficients, keeping a mean >= "
                     f"{CONTROL_KEEP:.0%} of the pre-change {c['pre_change_return']:.0f} ({shares}; mean "
                     f"{c['mean_kept']:.1%}). **The start model {'holds' if c['holds'] else 'does not hold'}.**")
        accepted, why = start_accepted(c, m["env_steps"])
        if not c["holds"]:
            lines.append(f"Decision (declared after this check, before any method unit ran; the module's history): "
                         f"{why}. {'The method units run on it' if accepted else 'No method unit runs'}; every "
                         f"return below is read against this no-change loss (mean {1 - c['mean_kept']:.0%}).")
    return lines


def superseded_lines(out_dir: Path) -> list[str]:
    """The 200k start model's checks (``superseded/200k/``), one line each: why the start model was extended."""
    superseded = out_dir / "records" / "superseded"
    old = {p.stem: json.loads(p.read_text()) for p in sorted((superseded / "200k").glob("*.json"))}
    if not old:
        return []
    lines = ["History (superseded, `benchmarks/studies/lift_official/records/superseded/200k/`): the 200k start model "
             "did "
             "not hold."]
    if "check-start" in old:
        c = old["check-start"]["metrics"]
        lines.append(f"- check-start, one control seed (LIFT's coefficients): kept {c['control_kept']:.0%}.")
    if "check-start-seeds" in old:
        c = old["check-start-seeds"]["metrics"]
        lines.append("- the control on seeds " + ", ".join(c["kept_by_seed"]) + ": "
                     + ", ".join(f"{v:.0%}" for v in c["kept_by_seed"].values())
                     + f", mean {c['mean_kept']:.1%}.")
    if "check-start-coefs" in old:
        c = old["check-start-coefs"]["metrics"]
        lines.append("- with the pretrained temperature and tau 0.005 (a diagnostic seed had pointed at LIFT's "
                     "coefficients) on seeds " + ", ".join(c["kept_by_seed"]) + ": "
                     + ", ".join(f"{v:.0%}" for v in c["kept_by_seed"].values())
                     + f", mean {c['mean_kept']:.1%}: not the coefficients; the study kept LIFT's.")
    if "room-friction" in old:
        m = old["room-friction"]["metrics"]
        lines.append(f"- room-friction's first run: refit / frozen {m['refit_1step']:.4f} / {m['frozen_1step']:.4f} "
                     "at epoch 2; every refit had kept the stage-2 model (its patience counted from the incoming "
                     "model, which a fresh Adam's first steps always lose to). The refit now counts its patience "
                     "from its first check, as LIFT's.")
    lines.append("- the remedy the issue names, more pretraining: the 200k agent resumed to "
                 f"{PRETRAIN_CAP // 1000}k (its replay refilled by the policy: it had gone with its machine).")
    rooms = {p.stem: json.loads(p.read_text())["metrics"]
             for p in sorted((out_dir / "records" / "superseded" / "room-convergence").glob("*.json"))}
    if rooms:
        lines.append("- the room gates on the 300k model first ran with orrery's old convergence reference (a gain "
                     "measured from the lowest check, not LIFT's last counted gain): "
                     + ", ".join(f"{k.removeprefix('room-')} refit / frozen {m['ratio']:.2f}x"
                                 for k, m in rooms.items())
                     + "; run again with LIFT's rule and the rollout fixes (table above).")
    return lines + [""]


def gate_lines(recs: dict[str, dict]) -> list[str]:
    lines = ["| change | zero-shot gate: rung (pre-change -> zero-shot, kept) | room gate at epoch 2: refit / frozen "
             "1-step error | verdict |", "|---|---|---|---|"]
    for c in CHANGES:
        g, r = recs.get(f"gate-{c}"), recs.get(f"room-{c}")
        zero = (f"{g['chosen']['label']} ({g['metrics']['pre_change_return']:.0f} -> "
                f"{g['metrics']['zero_shot_return']:.0f}, {g['metrics']['kept']:.0%})"
                + (" **too weak: every rung kept >= 80 %**" if g["metrics"]["too_weak"] else "")) if g else "not run"
        room = (f"{r['metrics']['refit_1step']:.4f} / {r['metrics']['frozen_1step']:.4f} "
                f"({r['metrics']['ratio']:.2f}x)") if r else "not run"
        verdict = "-" if r is None else ("room (the refit beats the frozen model)" if r["metrics"]["passed"]
                                         else "no room: method units refuse")
        if r is not None:
            returns = ", ".join(f"{v:.0f}" for v in r["run"]["curves"]["eval_return"])
            verdict += f"; LIFT's return in this run (seed {ROOM_SEED}): {returns}"
        lines.append(f"| {c} | {zero} | {room} | {verdict} |")
    return lines


def method_lines(records: list[dict], change: str) -> list[str]:
    head = ["method", "seeds", "recovered"] + [t for _, t, _, _ in REPORT_METRICS] + ["model error refit / frozen"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in METHODS + APPENDIX_METHODS:
        seeds = by_seed(records, change, m, "final_return")
        if not seeds:
            continue
        recovered = by_seed(records, change, m, "real_steps_to_recover")
        cells = [m, str(len(seeds)), f"{len(recovered)}/{len(seeds)}"]
        cells += [fmt_interval(t_interval(list(by_seed(records, change, m, k).values())), p)
                  for k, _, p, _ in REPORT_METRICS]
        ratios = [a / b for r in records if r["role"] == "report" and r["method"] == m
                  and r["setting"]["change"] == change
                  for a, b in zip(r["curves"]["wm_heldout_1step"], r["curves"]["wm_stage2_heldout_1step"])
                  if a is not None and b]
        cells.append(f"{np.mean(ratios):.2f}x over {len(ratios)} epochs" if ratios else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def model_error_lines(records: list[dict], change: str) -> list[str]:
    """LIFT's refit model against the frozen stage-2 model on each epoch's fresh real data (mean over seeds)."""
    runs = [r["curves"] for r in records if r["role"] == "report" and r["method"] == "lift"
            and r["setting"]["change"] == change]
    if not runs:
        return []
    epochs = sorted({int(e) for c in runs for e in c["epoch"] if e is not None and e >= 0})
    cells = []
    for e in epochs:
        pairs = [(c["wm_heldout_1step"][c["epoch"].index(e)], c["wm_stage2_heldout_1step"][c["epoch"].index(e)])
                 for c in runs if e in c["epoch"]]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        if pairs:
            cells.append(f"{e}: {np.mean([a for a, _ in pairs]):.4f} / {np.mean([b for _, b in pairs]):.4f}")
    return [f"LIFT's model, 1-step error on each epoch's fresh real data, refit / frozen stage 2 (mean over "
            f"{len(runs)} seeds), by epoch: " + "; ".join(cells) + ".", ""]


def paired_lines(records: list[dict], change: str) -> tuple[list[str], dict[str, dict[str, tuple]]]:
    keys = [("return_at.4000", "{:+.0f}", False), ("real_steps_to_recover_censored", "{:+.0f}", True),
            ("falls_per_1000", "{:+.2f}", True)]
    lines = ["| lift − (seed-paired, 95 % t) | return @4000 | real steps to 80 % | falls / 1000 |",
             "|---|---|---|---|"]
    effects: dict[str, dict[str, tuple]] = {}
    for other in PAIRED_AGAINST:
        if not by_seed(records, change, other, "final_return") or not by_seed(records, change, "lift", "final_return"):
            continue
        row, effects[other] = [], {}
        for key, pattern, lower in keys:
            stat = paired(by_seed(records, change, "lift", key), by_seed(records, change, other, key))
            effects[other][key] = (*stat, verdict(stat, lower))
            row.append(f"{fmt_interval(stat, pattern)} {verdict(stat, lower)}" if math.isfinite(stat[0]) else "-")
        lines.append(f"| lift − {other} | " + " | ".join(row) + " |")
    return lines, effects


def reading(change: str, effects: dict[str, dict[str, tuple]]) -> str:
    """Which comparison carries an effect, in words, from the intervals alone."""
    if not effects:
        return f"{change}: no paired comparison yet."
    parts = []
    names = {"sac_finetune": "SAC finetuning", "sac_finetune_matched": "SAC at LIFT's update count",
             "lift_frozen_model": "LIFT with the stage-2 model frozen"}
    for other, e in effects.items():
        said = [f"{label} {e[key][3]}" for key, label in (("return_at.4000", "return"),
                                                         ("real_steps_to_recover_censored", "recovery"),
                                                         ("falls_per_1000", "falls"))
                if e[key][3] != NOT_RESOLVED]
        unresolved = "not resolved (no equivalence margin was declared)"
        parts.append(f"vs {names[other]}: " + (", ".join(said) if said else unresolved))
    return f"{change}: LIFT " + "; ".join(parts) + "."


def plot(records: list[dict], gates: dict[str, dict], out: Path) -> Path | None:
    """Per change: deterministic return vs real steps (mean and 95 % t-band over seeds) of every method with the
    pre-change and 80 % lines; last panel: LIFT's refit vs frozen model error per epoch."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    changes = [c for c in CHANGES if any(r["role"] == "report" and r["setting"]["change"] == c for r in records)]
    if not changes:
        return None
    fig, axes = plt.subplots(1, len(changes) + 1, figsize=(5 * (len(changes) + 1), 4))
    for ax, change in zip(axes, changes):
        for i, m in enumerate(METHODS + APPENDIX_METHODS):
            runs = [r["curves"] for r in records if r["role"] == "report" and r["method"] == m
                    and r["setting"]["change"] == change]
            if not runs:
                continue
            n = min(len(c["eval_return"]) for c in runs)
            band_plot(ax, runs[0]["real_steps"][:n], np.array([c["eval_return"][:n] for c in runs]), f"C{i}", m)
        recovery_panel(ax, gates.get(change), "real env steps (prefill included)")
    ax = axes[-1]
    for j, change in enumerate(changes):
        runs = [r["curves"] for r in records if r["role"] == "report" and r["method"] == "lift"
                and r["setting"]["change"] == change]
        for key, ls in (("wm_heldout_1step", "-"), ("wm_stage2_heldout_1step", ":")):
            points = {}
            for c in runs:
                for e, v in zip(c["epoch"], c[key]):
                    if v is not None and e is not None and e >= 0:
                        points.setdefault(int(e), []).append(v)
            if points:
                ax.plot(sorted(points), [np.mean(points[e]) for e in sorted(points)], ls=ls, color=f"C{j}",
                        label=f"{change}: {'refit' if key == 'wm_heldout_1step' else 'frozen'}")
    ax.set(xlabel="epoch", ylabel="1-step error on the epoch's fresh real data", title="LIFT's model")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    return save_figure(fig, out)


def official_table_lines(readme: Path = Path(__file__).resolve().parents[3] / "algos" / "lift" / "README.md"
                         ) -> list[str]:
    """The official-vs-orrery tables of ``algos/lift/README.md`` (its sections from "The loop" up to "Methods beside
    LIFT"), headings demoted, so the study's section shows the table its one source holds."""
    text = readme.read_text()
    start, end = text.find("## The loop"), text.find("## Methods beside LIFT")
    if start < 0 or end < start:
        raise ValueError(f"{readme} lacks its '## The loop' ... '## Methods beside LIFT' sections")
    body = [("###" + line[2:]) if line.startswith("## ") else line for line in text[start:end].strip().splitlines()]
    return ["**Settings beside the official code** (bigai-ai/LIFT-humanoid@32fab57; from `algos/lift/README.md`):",
            "", *body, ""]



def power_lines(recs: dict[str, dict], records: list[dict]) -> list[str]:
    """What this study can and cannot show, read off its own records; the report's first paragraph."""
    lines = []
    check, pre = recs.get("check-start"), recs.get("pretrain")
    if check and pre and not check["metrics"]["holds"]:
        accepted, why = start_accepted(check["metrics"], pre["metrics"]["env_steps"])
        if accepted:
            lines.append(f"**Post-hoc: the start model failed its declared check and was {why.split(':')[0]}, under a "
                         "rule declared after that check and before any method unit ran (both are reported below).**")
    reported = [r for r in records if r["role"] == "report"]
    for c in CHANGES:
        runs = [r for r in reported if r["setting"]["change"] == c]
        gate = recs.get(f"gate-{c}")
        if not runs or gate is None:
            continue
        label, kept = gate["chosen"]["label"], gate["metrics"]["kept"]
        recovered = sum(bool(r["metrics"].get("recovered")) for r in runs)
        if gate["metrics"]["too_weak"]:
            lines.append(f"**{label} cannot test recovery:** the pretrained policy keeps {kept:.0%} of its return "
                         "under it, so there is nothing to recover; it measures how far each method drifts.")
        elif recovered * 5 < len(runs):
            lines.append(f"**{label}: real steps to 80 % recovery cannot discriminate:** {recovered} of {len(runs)} "
                         "runs recovered within the budget, so that column is the censoring value for nearly every "
                         "run; only the returns and falls can separate the methods.")
    lines.append("No comparison declared an equivalence margin before the runs: an interval that spans 0 is "
                 "\"not resolved\", never \"no difference\".")
    return [" ".join(lines), ""]

def report(records: list[dict], out_dir: Path) -> str:
    recs = _by_name(records)
    lines = ["## LIFT finetuning as its authors run it (`python -m benchmarks.study lift_official report`)", "",
             *power_lines(recs, records),
             "Command (repo root): `nice -n 19 python -m benchmarks.study lift_official run`, then `python -m "
             "benchmarks.study lift_official report`.", "",
             "Walker2d-v5 with a velocity command (1.0 m/s, inside the pretraining range). One loop: every unit ran "
             "the learner a cluster job runs (`finetune_learner.run_epochs`, one rank in process). Settings beside "
             "the official code, with every departure: `algos/lift/README.md`. Schedule (declared in "
             "`benchmarks/studies/lift_official/plan.py`): 1000-step prefill, 6 epochs of 500 real steps, H 1 -> 20 "
             "over 10 "
             "epochs (LIFT's), HUPT 10 -> 100 over 4 epochs (LIFT's x0.1): LIFT does 0.4 -> 4 SAC steps per real "
             "step; LIFT's finetuning coefficients; 10 deterministic evaluation episodes per epoch. Supersedes the "
             "first Walker2d study (issue 23, "
             "below), whose loop was a second copy.", "", *start_lines(recs), "", *gate_lines(recs), "",
             *superseded_lines(out_dir), "", *official_table_lines()]
    reported = [r for r in records if r["role"] == "report"]
    if not reported:
        accepted = ("check-start" in recs and "pretrain" in recs
                    and start_accepted(recs["check-start"]["metrics"], recs["pretrain"]["metrics"]["env_steps"])[0])
        lines.append("Method units: " + ("none has finished yet." if accepted or "check-start" not in recs
                                         else "the start model does not hold: none runs on it."))
        return "\n".join(lines) + "\n"
    gates = {c: recs[f"gate-{c}"] for c in CHANGES if f"gate-{c}" in recs}
    figure = plot(records, gates, out_dir / "lift_official.png")
    if figure is not None:
        lines += [f"Plot: `benchmarks/studies/lift_official/{figure.name}` (return vs real steps per change; LIFT's "
                  "model error, refit vs frozen, per epoch).", ""]
    for c in CHANGES:
        if not any(r["setting"]["change"] == c for r in reported):
            continue
        label = recs[f"gate-{c}"]["chosen"]["label"] if f"gate-{c}" in recs else c
        pl, effects = paired_lines(records, c)
        lines += [f"**{label}** (mean [95 % t-interval] over seeds; never-recovered runs count 4000)", "",
                  *method_lines(records, c), "", *model_error_lines(records, c), *pl, "", reading(label, effects), ""]
        if f"gate-{c}" in recs and recs[f"gate-{c}"]["metrics"]["too_weak"]:
            lines += [f"{label} leaves the policy {recs[f'gate-{c}']['metrics']['kept']:.0%} of its return: a "
                      "near-no-change condition, read as each method's drift from a policy that need not change, "
                      "not as recovery.", ""]
    return "\n".join(lines) + "\n"
