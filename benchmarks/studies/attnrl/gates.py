"""The attnrl report's lines on its start model and its FCI gates (SFT, the resampling gate, the probe of the heads, the
deciding intervention gate) and what a failed deciding gate says."""
from __future__ import annotations

import math

from benchmarks.studies.attnrl.runs import PRIMARY
from benchmarks.study.stats import fmt_interval


def fmt(stat, pattern: str = "{:.3f}") -> str:
    return fmt_interval(tuple(stat), pattern)


def signed(stat) -> str:
    return fmt(stat, "{:+.3f}")


def shown_word(stat) -> str:
    _, low, high = stat
    if not (math.isfinite(low) and math.isfinite(high)):
        return "n/a (fewer than 2 seeds)"
    return "shown" if low > 0 else ("reversed" if high < 0 else "not shown (interval spans 0)")


def sft_lines(sft: dict | None, gate: dict | None) -> list[str]:
    if sft is None:
        return ["SFT: not finished yet (its stage checkpoints into `benchmarks/studies/attnrl/records/artifacts/sft/`)."]
    m, s = sft["metrics"], sft.get("settings", {})
    lines = [f"SFT (`sft` stage, {sft.get('calls', 1)} call(s), {sft['cpu_s'] / 60:.0f} CPU-min): task "
             f"`{s.get('task')}`, model `{s.get('model')}`, {m['steps']} steps, stopped by the "
             f"{'step-error rule' if m['stopped_by'] == 'rule' else 'step cap'} (per-line error at T=1 on the longest "
             f"problems {m['step_error'] if m['step_error'] is not None else 'n/a'}); greedy accuracy by difficulty "
             "on its curriculum set: " + ", ".join(f"{d}: {v:.2f}" for d, v in m["greedy_by_difficulty"].items())
             + "."]
    if gate is not None:
        e = gate["sft"]["eval"]
        lines.append(f"SFT on the study's evaluation set: sampled accuracy on the longest problems {e[PRIMARY]:.3f}, "
                     f"greedy {e['greedy']:.3f} (by difficulty " +
                     ", ".join(f"{d}: {v:.2f}" for d, v in e["by_difficulty"].items()) + ").")
    return lines


def gate_lines(gate: dict | None) -> list[str]:
    if gate is None:
        return ["**FCI gate: not run yet.** No RL unit runs before it."]
    m, dec = gate["metrics"], gate["decision"]
    lines = [f"**First gate** (`gate` unit, resampling influence, delta = {m['delta']}): the SFT model's responses to "
             f"{m['problems_per_difficulty']} problems per difficulty (kept, line count matching the program: "
             + ", ".join(f"{d} steps: {n}" for d, n in m["responses_kept"].items()) +
             f") are branched at every computation step after the first, {m.get('continuations', 4)} continuations "
             "each; flip(k) = share of continuations from step k whose reward differs from the original's. A step's "
             "measured influence on the "
             "answer is flip(k) - flip(k + 1), what resampling the step itself adds (the resampling importance of "
             "Thought Anchors). Per response, Spearman correlation of each ordering of the steps with that influence "
             "(responses with a constant influence left out; a constant ordering counts 0); mean [95 % t-interval] "
             "over responses:", "",
             "| difficulty | responses | FCI | earliest first | random | FCI - earliest | FCI - random |",
             "|---|---|---|---|---|---|---|"]
    rows = [("all", dec["overall"])] + list(dec["by_difficulty"].items())
    for name, r in rows:
        cells = [signed(r[k]) for k in ("fci", "earliest", "random", "fci_minus_earliest", "fci_minus_random")]
        lines.append(f"| {name} | {r['responses']} | " + " | ".join(cells) + " |")
    if "suffix_flip" in gate:
        r = gate["suffix_flip"]
        lines += ["", f"Against flip(k) itself (positional by construction: earlier resampling redoes more steps), "
                      f"{r['responses']} responses: FCI {signed(r['fci'])}, earliest {signed(r['earliest'])}, random "
                      f"{signed(r['random'])}."]
    lines += ["", "FCI at other deltas (all difficulties): " + "; ".join(
        f"delta {d}: FCI {signed(r['fci'])}, FCI - earliest {signed(r['fci_minus_earliest'])}"
        for d, r in gate["other_deltas"].items()) + "."]
    sp = gate["summary"].get("spearman", {})
    truth = [(f"FCI (delta {d})", sp.get(f"fci(d={d})~cone")) for d in (1, 2, 4)] + [
        ("earliness", sp.get("earliness~cone")), ("the flip rate itself", sp.get("flip~cone"))]
    if any(v is not None for _, v in truth):
        lines += ["", "Against the true dependency (membership in the answer's cone, known to the generator), mean "
                      "per-response Spearman: " + ", ".join(f"{k} {v:+.3f}" for k, v in truth
                                                           if v is not None and math.isfinite(v)) + "."]
    rules = gate["summary"].get("rules", {})
    if rules:
        lines += ["", "Branch points each rule picks (N = 2) on the same responses: share in the answer's dependency "
                      "cone, mean outcome-flip rate, share of branch groups with mixed outcomes (the signal a tree "
                      "needs):", "", "| rule | in cone | flip rate | mixed groups |", "|---|---|---|---|"]
        for name, v in rules.items():
            lines.append(f"| {name} | {v['in_cone']:.2f} | {v['flip']:.3f} | {v['mixed']:.3f} |")
    o = dec["overall"]
    how = "; ".join(f"FCI - {k}: {signed(o[f'fci_minus_{k}'])}, " + (
        "worse" if o[f"fci_minus_{k}"][2] < 0 else "ahead" if o[f"fci_minus_{k}"][1] > 0 else "not separable at this "
        "precision") for k in ("earliest", "random"))
    verdict = ("**FCI beats both** (both paired intervals above 0)." if m["fci_beats_both"] else
               f"**FCI does not beat both** ({how}). Where an interval spans 0, the measurement could not separate the "
               "orderings: \"no room\" then means \"no room this measurement can see\", not a shown absence.")
    if not m.get("enough_responses", True):
        verdict += " Caution: some difficulty has fewer than 24 usable responses."
    return lines + ["", verdict]


def _heads(probe: dict | None) -> tuple[dict[str, float], str | None]:
    """The second look's per-head correlations on the study task, and the best single head (None without heads)."""
    heads = probe["variants"].get("study_task", next(iter(probe["variants"].values())))["heads"] if probe else {}
    per_head = {k: v for k, v in heads.items() if k.startswith("L")}
    return heads, max(per_head, key=per_head.get) if per_head else None


def gate_probe_lines(probe: dict | None) -> list[str]:
    """The second look (``gate-probe`` unit): influence by forced result changes, on the study task and on variants
    whose distractors are dead ends, with the per-head view of the attention."""
    if probe is None:
        return []
    lines = [f"**Second look** (`gate-probe` unit, same SFT model, delta = {probe['delta']}): a step's influence "
             "measured by forcing its written result to other values and letting the model finish greedily (share of "
             "forced values that change the answer line). Unlike resampling, this needs no model error, so every "
             "response counts and the measurement is nearly noise-free. Besides the study task, two variants whose "
             "distractors are read by nothing (dead ends: attention to them has no reason to exist; such programs are "
             "a subset of those the model was trained on):", "",
             "| task | responses | influence: cone / distractor steps | FCI | earliest first | random | "
             "FCI - earliest | FCI - random | FCI beats both |", "|---|---|---|---|---|---|---|---|---|"]
    for name, v in probe["variants"].items():
        o, im = v["decision"]["overall"], v["intervention_mean"]
        cells = [signed(o[k]) for k in ("fci", "earliest", "random", "fci_minus_earliest", "fci_minus_random")]
        shares = " / ".join("n/a" if im[k] is None else f"{im[k]:.2f}" for k in ("cone", "distractor"))
        lines.append(f"| {name} (`{v['task']}`) | {o['responses']} | {shares} | "
                     + " | ".join(cells) + f" | {'yes' if v['decision']['fci_beats_both'] else 'no'} |")
    heads, best = _heads(probe)
    lines += ["", "Which attention sees the dependency? On the reference solutions of the study task, mean "
                  "per-problem Spearman of each head's column sum (attention later steps pay to a step) with the step's "
                  "membership in the answer's cone: " + ", ".join(f"{k} {v:+.3f}" for k, v in heads.items()) +
              (f". The best single head ({best}, {heads[best]:+.3f})" if best else "") +
              " is what a per-head FCI could at most reach here."]
    return lines


def deciding_gate_lines(gate: dict | None, name: str) -> list[str]:
    """The gate the RL units wait on (``plan.GATE2``)."""
    if gate is None:
        return [f"**Deciding gate** (`{name}`): not run yet. No RL unit runs before it."]
    m, g, dec = gate["metrics"], gate["gate"], gate["decision"]
    im = gate["intervention_mean"]
    lines = [f"**Deciding gate** (`{name}` unit, declared after the second look and before it ran): the second look's "
             f"measure on fresh problems (seed {g['seed']}), {g['problems']} per difficulty (kept: "
             + ", ".join(f"{d} steps: {n}" for d, n in m["responses_kept"].items()) +
             f"), {g['interventions']} forced values per step, the random ordering's chance level averaged over "
             f"{g['random_draws']} permutations per response; delta = {m['delta']}. Forced changes move the answer "
             f"at {im['cone'] or 0:.2f} of cone steps and {im['distractor'] or 0:.2f} of distractor steps.", "",
             "| difficulty | responses | FCI | earliest first | random | FCI - earliest | FCI - random |",
             "|---|---|---|---|---|---|---|"]
    for label, r in [("all", dec["overall"])] + list(dec["by_difficulty"].items()):
        cells = [signed(r[k]) for k in ("fci", "earliest", "random", "fci_minus_earliest", "fci_minus_random")]
        lines.append(f"| {label} | {r['responses']} | " + " | ".join(cells) + " |")
    lines += ["", "Other deltas (all difficulties): " + "; ".join(
        f"delta {d}: FCI {signed(r['fci'])}, FCI - earliest {signed(r['fci_minus_earliest'])}, FCI - random "
        f"{signed(r['fci_minus_random'])}" for d, r in gate["other_deltas"].items()) + "."]
    lines.append("")
    lines.append("**FCI beats both: the RL units run.**" if m["fci_beats_both"] else
                 "**FCI does not beat both.** Since issue 38 the RL units run anyway, as the mechanism-absent control: "
                 "FCI has no room on this model, so they measure AttnRL's other parts (tree advantages, ADS, "
                 "off-policy) against GRPO at equal tokens, against predictions written before they ran (below).")
    return lines


def failed_gate_reading(gate: dict, probe: dict | None) -> list[str]:
    """What a failed deciding gate says, read off its numbers (and the second look's, when there is one)."""
    o, im = gate["decision"]["overall"], gate["intervention_mean"]
    at_chance = o["fci"][1] <= 0 <= o["fci"][2]
    lines = [f"- FCI's rank agreement with the steps' measured influence is {signed(o['fci'])} over {o['responses']} "
             f"responses against a chance level of {signed(o['random'])}"
             + (": indistinguishable from chance" if at_chance else "") +
             f"; earliest-first scores {signed(o['earliest'])}, so FCI - earliest ({signed(o['fci_minus_earliest'])}) "
             "says FCI is less tied to position than pure earliness, not that it finds the influential steps.",
             f"- The measurement is not what failed: forced changes move the answer at {im['cone'] or 0:.2f} of the "
             f"cone steps and {im['distractor'] or 0:.2f} of the distractors, so the influence being ranked is sharp "
             "and known; FCI does not follow it."]
    heads, best = _heads(probe)
    if best is not None:
        lines.append(f"- No head's attention follows the dependency either (best {best} {heads[best]:+.3f} with "
                     "cone membership), and making distractors dead ends did not change the picture (second look). Plausibly, a "
                     "step's look-ups are a few of its line's ~15 tokens; FCI's step-to-step attention averages over "
                     "every token of both steps and takes the max over heads, so what it measures here is attention "
                     "that does not follow the data flow.")
    lines.append("- So the RL units below are a control in which FCI has no signal to branch on (every record says "
                 "`fci_room: false`): ATB is expected to act as earliest-step branching with noise, and any AttnRL "
                 "effect against GRPO is the non-FCI parts'. FCI's own claim needs a model whose attention carries "
                 "step dependencies; the task alone could not give a 2-layer model's FCI room in three variants.")
    return lines
