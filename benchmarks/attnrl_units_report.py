"""The RESULTS.md section of AttnRL's second gate model (benchmarks/study/attnrl_units.py), from its records alone:
the unit tokens, the SFT model, the deciding gate and, only if FCI beat both orderings there, the RL runs."""
from __future__ import annotations

from pathlib import Path

from benchmarks.attnrl_study_report import _signed, main_tables, reported, sft_lines

TITLE = "## AttnRL's FCI gate on a unit-token 4-layer model (`python -m benchmarks.study attnrl_units`)"
COMMAND = ("nice -n 19 python -m benchmarks.study attnrl_units run   "
           "# then: python -m benchmarks.study attnrl_units report")
COLUMNS = ("fci", "earliest", "random", "fci_minus_earliest", "fci_minus_random")


def verdict(gate: dict | None) -> str:
    """One sentence: what the gate decided for the RL units of this model."""
    if gate is None:
        return "The gate has not run yet; the RL units wait on it."
    if gate["metrics"]["fci_beats_both"]:
        return "**FCI beats both orderings on the unit-token model: attn_tree, earliest_tree and attnrl run on it.**"
    return ("**FCI does not beat both orderings on the unit-token model either: its RL units refuse, and the attnrl "
            "study's mechanism-absent control reading stands.**")


def gate_lines(gate: dict | None, unit: str) -> list[str]:
    if gate is None:
        return [f"**Deciding gate** (`{unit}`): not run yet."]
    m, g, dec, im = gate["metrics"], gate["gate"], gate["decision"], gate["intervention_mean"]
    lines = [f"**Deciding gate** (`{unit}` unit, declared in code before it ran): the attnrl study's deciding "
             f"statistic and rule on fresh problems (seed {g['seed']}), {g['problems']} per difficulty (kept: "
             + ", ".join(f"{d} steps: {n}" for d, n in m["responses_kept"].items()) +
             f"), {g['interventions']} forced values per step, random ordering averaged over {g['random_draws']} "
             f"permutations; delta = {m['delta']}. Forced changes move the answer at "
             f"{im['cone'] or 0:.2f} of cone steps and {im['distractor'] or 0:.2f} of distractor steps.", "",
             "| difficulty | responses | FCI | earliest first | random | FCI - earliest | FCI - random |",
             "|---|---|---|---|---|---|---|"]
    for label, r in [("all", dec["overall"])] + list(dec["by_difficulty"].items()):
        lines.append(f"| {label} | {r['responses']} | " + " | ".join(_signed(r[k]) for k in COLUMNS) + " |")
    lines += ["", "Other deltas (all difficulties): " + "; ".join(
        f"delta {d}: FCI {_signed(r['fci'])}, FCI - earliest {_signed(r['fci_minus_earliest'])}, FCI - random "
        f"{_signed(r['fci_minus_random'])}" for d, r in gate["other_deltas"].items()) + "."]
    heads = gate.get("heads") or {}
    per_head = {k: v for k, v in heads.items() if k.startswith("L")}
    if per_head:
        best = max(per_head, key=per_head.get)
        lines += ["", "Per head, on the reference solutions: mean per-problem Spearman of the column sum (attention "
                      "later steps pay to a step) with membership in the answer's cone: "
                  + ", ".join(f"{k} {v:+.3f}" for k, v in heads.items()) + f"; best single head {best} "
                  f"{heads[best]:+.3f}."]
    return lines


def report(records: list[dict], out_dir: Path) -> str:  # noqa: ARG001 - the study writes no plot
    from benchmarks.study import attnrl_units as study
    units = {r["unit"]: r for r in records}
    sft, gate = units.get("sft"), units.get(study.GATE_UNIT)
    parts = [TITLE, "", f"Command (repo root): `{COMMAND}`. Records: `benchmarks/studies/attnrl_units/records/*.json`.", "",
             f"Why and what: issue 38's second model for the FCI gate. Task `{study.TASK}` written in its units "
             "(`envs/reasoning/tokens.py`: each two-letter name, two-digit value, operator and mark one token); model "
             f"`{study.MODEL}`. On the attnrl study's own task (one-letter names, one-digit values) the unit and "
             "character tokenizers coincide token for token, so this model uses two-letter names and two-digit "
             "values: it differs from the attnrl study's model in depth, in tokens and in the value range. A trace "
             "line is 16 tokens either way; the unit tokens change what a token carries, not how many a step has."]
    if sft is not None and "tokens" in sft:
        t = sft["tokens"]
        parts += ["", f"Unit tokens: vocabulary {t['vocab_size']}, {t['unit_share']:.0%} of a sample's tokens are "
                      "units of more than one character."]
    parts += [""] + [line.replace("benchmarks/studies/attnrl/", "benchmarks/studies/attnrl_units/")
                     for line in sft_lines(sft, gate)]
    parts += [""] + gate_lines(gate, study.GATE_UNIT) + ["", verdict(gate), ""]
    by, matched = reported(records)
    if by:
        tables, _ = main_tables(by, matched)
        parts += [f"RL on this model (lr {study.RL_LR:g}, no tuning round):", ""] + tables + [""]
    return "\n".join(parts).rstrip() + "\n"


def summary_line(results_dir: Path) -> str:
    """One line for the attnrl study's section: the second gate's outcome, read from this study's records."""
    from benchmarks.study.attnrl_units import GATE_UNIT
    from benchmarks.study.records import load_records
    gate = {r["unit"]: r for r in load_records(results_dir)}.get(GATE_UNIT)
    if gate is None:
        return ("**Second gate model** (unit tokens, 4 layers: `python -m benchmarks.study attnrl_units`): its gate "
                "has not run yet.")
    o = gate["decision"]["overall"]
    return (f"**Second gate model** (unit tokens, 4 layers, `attnrl_units`): FCI {_signed(o['fci'])}, FCI - earliest "
            f"{_signed(o['fci_minus_earliest'])}, FCI - random {_signed(o['fci_minus_random'])} over "
            f"{o['responses']} responses. " + verdict(gate))
