"""The ecit_power report's tables, its predictions judged, and its reading (each from whatever records exist)."""
from __future__ import annotations

import numpy as np

from benchmarks.studies.ecit_power.plan import (DIAL_K, DIAL_RHOS, DIAL_SUBTESTS, EQUAL_CPU_K, EQUAL_CPU_N, KS, LEVEL,
                                                M, PREDICTIONS, TARGET_POWER)
from benchmarks.studies.ecit_power.rows import (EMPIRICAL, RELEASED, Rows, _fmt, cell, combined, mean_z,
                                                  paired_diff, rate, size_threshold)

SUB_NAMES = {"kci_lp": "kci_lp (local-permutation null)", "kci": "KCI (gamma null)", "fisherz": "Fisher-z"}


def _effects(records: dict[str, dict], k: int) -> list[float | None]:
    return [next((r["effect"] for u, r in records.items() if u.startswith(f"power-k{k}-e{e}-")), None)
            for e in range(len(TARGET_POWER))]


def _seeds(records: dict[str, dict], prefix: str) -> str:
    seeds = sorted(r["seed"] for u, r in records.items() if u.startswith(prefix))
    return f"{len(seeds)}/5 seeds" + ("" if len(seeds) == 5 else " (**partial**)")


def tuning_lines(tunes: dict[str, dict], tuned: dict | None) -> list[str]:
    if not tunes:
        return ["**Tuning** (seeds 100-103): pending; the reported units wait on it.", ""]
    ks = sorted({k for r in tunes.values() for k in r["metrics"] if k != "cpu_s_per_subset"}, key=int)
    effects = sorted({float(e) for r in tunes.values() for k in ks for e in r["metrics"].get(k, {})})
    out = [f"**Tuning** (seeds {', '.join(str(r['seed']) for r in sorted(tunes.values(), key=lambda r: r['seed']))}"
           + ("" if tuned else ", **partial**") + "): kci_lp + stable1.75 power on alternative datasets of 64000 rows "
           "cut into 160 subsets; K = 10 / 40 / 160 combine disjoint groups of them (16 / 4 / 1 per draw: the trials "
           "cluster by draw, and a draw's functions set much of its power, so the intervals below are too narrow). "
           "This is also the fixed-effect view across K (tuning seeds, not a reported result).", "",
           "| effect | " + " | ".join(f"K = {k}" for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    for e in effects:
        cells = []
        for k in ks:
            hits = sum(r["metrics"].get(k, {}).get(str(e), [0, 0])[0] for r in tunes.values())
            trials = sum(r["metrics"].get(k, {}).get(str(e), [0, 0])[1] for r in tunes.values())
            cells.append(cell(rate(hits, trials)))
        out.append(f"| {e:g} | " + " | ".join(cells) + " |")
    out.append("")
    if tuned:
        out.append("Chosen by the declared rule (power curve interpolated at "
                   f"{' and '.join(str(t) for t in TARGET_POWER)}): " + "; ".join(
                       f"K = {k}: " + " / ".join(f"{e:g}" + (" (extrapolated)" if f else "")
                                                for e, f in zip(v["effects"], v["extrapolated"]))
                       for k, v in tuned.items()) + ".")
        flat = {k: max(v["curve"].values()) - min(v["curve"].values()) for k, v in tuned.items()}
        grid = [float(e) for e in next(iter(tuned.values()))["curve"]]
        if any(d < 0.25 for d in flat.values()):
            out.append(f"Over the whole grid (a factor {max(grid) / min(grid):.3g} in effect) the pooled power "
                       "moves by only " + ", ".join(
                           f"{d:.2f} at K = {k}" for k, d in flat.items())
                       + ": on this design a draw's functions, not the effect, set most of the power (draws of f that "
                         "hide X's effect stay undetected at every effect, the others are found at the smallest), so "
                         "the targets fall outside the grid and the rule's extrapolated effects are not known to give "
                         "mid power.")
        out.append("")
    return out


def power_lines(rows: Rows, tuned: dict | None, by: dict[str, dict]) -> list[str]:
    out = ["**Power and level at K = 10 / 40 / 160** (default width). Type-I: kci_lp and KCI from ecit_beyond's null "
           "rows (200 / 150 / 100 datasets), Fisher-z on the same datasets and subsets here. Power at the two tuned "
           "effects on the same alternative datasets for every sub-test. *Size-adjusted*: rejecting below the "
           "sub-test's own null 5 % quantile at that K (its null datasets above); gamma KCI's raw power is not "
           "reported, nor Fisher-z's where its type-I interval lies above the level.", "",
           "| K (n) | sub-test | type-I | power, effect 0 | size-adjusted | power, effect 1 | size-adjusted | seeds |",
           "|---|---|---|---|---|---|---|---|"]
    for k in KS:
        eff = _effects(by, k)
        if tuned and str(k) in tuned:
            eff = [e if e is not None else t for e, t in zip(eff, tuned[str(k)]["effects"])]
        for sub in ("kci_lp", "kci", "fisherz"):
            t1 = rows.type1(sub, k)
            raw_ok = sub != "kci" and t1 is not None and t1[1] <= LEVEL
            cells = []
            for e in range(len(TARGET_POWER)):
                raw = rows.power(sub, k, e)
                cells += [cell(raw) if raw_ok else ("(gamma null: size-adjusted only)" if sub == "kci" else
                                                    "n/a" if not raw else "(no type-I row yet)" if t1 is None else
                                                    "(type-I above the level)"),
                          cell(rows.power(sub, k, e, adjusted=True))]
            label = f"{k} ({M * k})" + (f", e = {' / '.join('%g' % x if x else '?' for x in eff)}" if any(eff)
                                         else "")
            out.append(f"| {label} | {SUB_NAMES[sub]} | {cell(t1)} | " + " | ".join(cells) + " | "
                       + " / ".join(_seeds(by, f"power-k{k}-e{e}-").split(" ")[0] for e in range(2)) + " |")
    out.append("")
    cost = []
    for k in KS:
        for e in range(len(TARGET_POWER)):
            lp, lp_adj = rows.paired_rejects("kci_lp", k, e), rows.paired_rejects("kci_lp", k, e, adjusted=True)
            kci_adj = rows.paired_rejects("kci", k, e, adjusted=True)
            if lp and kci_adj:
                cost.append(f"K = {k}, effect {e}: kci_lp minus KCI size-adjusted {_fmt(paired_diff(lp, kci_adj))}, "
                            f"of which kci_lp's own conservativeness (raw minus size-adjusted) "
                            f"{_fmt(paired_diff(lp, lp_adj))}")
    if cost:
        out += ["What the exact null costs, paired by dataset (t-intervals): " + "; ".join(cost) + ".", ""]
    return out


def width_lines(rows: Rows) -> list[str]:
    k = max(KS)
    have = [(s, w) for s in ("kci_lp", "kci") for w in (EMPIRICAL, RELEASED)
            if rows.type1(s, k, w) or rows.power(s, k, 0, w)]
    if not any(w == RELEASED for _, w in have):
        return [f"**Both widths at K = {k}**: the released-width units are pending.", ""]
    out = [f"**Both widths at K = {k}** (n = {M * k}). Empirical = causal-learn's default (every earlier E-CIT "
           "table); median = the released code's `est_width='median'` (GuanZhengkang/ECIT `ecit/cit/kcit.py:8,32`). "
           "The median null rows are the first 6 of ecit_beyond's null datasets per seed; the power rows are the "
           "same alternative datasets under both widths (effect 0).", "",
           "| sub-test | width | type-I | power, effect 0 | size-adjusted power |", "|---|---|---|---|---|"]
    for sub, width in have:
        raw = rows.power(sub, k, 0, width)
        out.append(f"| {SUB_NAMES[sub]} | {width} | {cell(rows.type1(sub, k, width))} | "
                   f"{'(size-adjusted only)' if sub == 'kci' else cell(raw)} | "
                   f"{cell(rows.power(sub, k, 0, width, adjusted=True))} |")
    d = paired_diff(rows.paired_rejects("kci_lp", k, 0, RELEASED), rows.paired_rejects("kci_lp", k, 0))
    out += ["", f"kci_lp's power, median minus empirical width, paired by dataset: {_fmt(d)}.", ""]
    return out


def equal_cpu_lines(records: list[dict]) -> list[str]:
    alt = [r for r in records if r["unit"].startswith(f"power-k{EQUAL_CPU_K}-")]
    null = [r for r in records if r["unit"].startswith(f"fznull-n{M * EQUAL_CPU_K}-") and r.get("full_kci")]
    if not alt and not null:
        return ["**Equal CPU**: pending.", ""]
    out = [f"**Equal CPU**: E-KCI-lp on n = {M * EQUAL_CPU_K} rows (K = {EQUAL_CPU_K}) against KCI (gamma null) on "
           f"the first {EQUAL_CPU_N} rows of the same datasets, the rows its CPU buys (declared from timings before "
           "the run; measured below).", "",
           "| test | rows | CPU s / test | type-I | power, effect 0 | power, effect 1 |", "|---|---|---|---|---|---|"]
    lp_cpu = [r["metrics"]["kci_lp"]["cpu_s_per_subset"] * r["k"] for r in alt]
    full_cpu = [c for r in alt + null for c in r["full_kci"]["cpu_s"]]
    full_null = [p for r in null for p in r["full_kci"]["null"]]

    def power_of(e: int, full: bool) -> tuple | None:
        recs = [r for r in alt if r["setting"]["effect_index"] == e]
        ps = [p for r in recs for p in r["full_kci"]["alt"]] if full else \
            [combined(s) for r in recs for s in r["tests"]["kci_lp"]["alt"]]
        return rate(sum(p <= LEVEL for p in ps), len(ps))

    out.append(f"| E-KCI-lp | {M * EQUAL_CPU_K} | {np.mean(lp_cpu):.3g} | (table above) | {cell(power_of(0, False))} "
               f"| {cell(power_of(1, False))} |" if lp_cpu else "| E-KCI-lp | - | - | - | - | - |")
    out.append(f"| KCI on all rows | {EQUAL_CPU_N} | {np.mean(full_cpu):.3g} | "
               f"{cell(rate(sum(p <= LEVEL for p in full_null), len(full_null)))} | {cell(power_of(0, True))} | "
               f"{cell(power_of(1, True))} |" if full_cpu else "| KCI on all rows | - | - | - | - | - |")
    out.append("")
    return out


def dial_lines(records: list[dict]) -> list[str]:
    dial = [r for r in records if r["unit"].startswith("dial-")]
    if not dial:
        return ["**The determinism dial**: pending.", ""]
    out = [f"**The determinism dial** (K = {DIAL_K}, n = {M * DIAL_K}; {_seeds({r['unit']: r for r in dial}, 'dial-')}"
           f", effect {dial[0]['effect']:g} = K = 10's tuned effect 1): X = f1(rho s(Za) + sqrt(1 - rho^2) s(e_x)), "
           "from X independent of Z (rho = 0) to X a function of Z; the alternative feeds Y X's own noise e_x, so "
           "the dependence given Z is the same at every rho (`envs/causal/triplets.py`). Subset mean z of the null "
           "subsets (0 if uniform; negative = conservative). KCI's power size-adjusted at each rho.", "",
           "| rho | R^2 | kci_lp type-I | kci_lp power | kci_lp null mean z | KCI type-I | KCI size-adj. power | "
           "KCI null mean z |", "|---|---|---|---|---|---|---|---|"]
    for rho in sorted({rho for r in dial for rho in r["tests"]}, key=float):
        t = {sub: {kind: [s for r in dial for s in r["tests"][rho][sub][kind]] for kind in ("null", "alt")}
             for sub in DIAL_SUBTESTS}
        cells = []
        for sub in DIAL_SUBTESTS:
            null, alt = [combined(s) for s in t[sub]["null"]], [combined(s) for s in t[sub]["alt"]]
            z = mean_z(t[sub]["null"])
            cut = size_threshold(null)
            pw = rate(sum(p <= LEVEL for p in alt), len(alt)) if sub == "kci_lp" else (
                rate(sum(p < cut for p in alt), len(alt)) if cut is not None else None)
            cells += [cell(rate(sum(p <= LEVEL for p in null), len(null))), cell(pw), _fmt(z)]
        out.append(f"| {float(rho):g} | {float(rho) ** 2:.2f} | " + " | ".join(cells) + " |")
    out.append("")
    return out


def _dial(records: list[dict], rho: float, sub: str, kind: str) -> list[list[float]]:
    return [s for r in records if r["unit"].startswith("dial-") for s in r["tests"].get(str(rho), {}).get(sub, {})
            .get(kind, [])]


def _dial_type1(records: list[dict], rho: float) -> tuple | None:
    """kci_lp's combined type-I rate at a dial point (None before its records exist)."""
    null = _dial(records, rho, "kci_lp", "null")
    return rate(sum(combined(s) <= LEVEL for s in null), len(null))


def predictions(rows: Rows, records: list[dict], partial: bool = False) -> list[str]:
    """Each declared prediction against what the records show (as predicted / not / undecided / no data)."""
    out = ["**Predictions** (declared in `plan.py` before any reported unit ran; judged by point estimate where the "
           "expectation says so, by interval otherwise" + ("; **provisional**: the records are partial" if partial
                                                            else "") + "):", ""]

    def line(key: str, verdict: str, measured: str) -> None:
        p = PREDICTIONS[key]
        out.append(f"- `{key}` ({p['claim']}; {p['expect']}, margin {p['margin']}): **{verdict}**: {measured}.")

    m = PREDICTIONS
    lv = [(f"K = {k} {w}", rows.type1("kci_lp", k, w)) for k in KS for w in (EMPIRICAL, RELEASED)]
    lv += [(f"rho = {rho}", _dial_type1(records, rho)) for rho in DIAL_RHOS]
    lv = [(name, v) for name, v in lv if v is not None]
    bad = [name for name, v in lv if v[0] > LEVEL + m["lp_level"]["margin"]]
    line("lp_level", "no data yet" if not lv else ("not as predicted" if bad else "as predicted"),
         ", ".join(f"{name} {v[0]:.3f}" for name, v in lv) or "-")
    diffs = [(k, e, paired_diff(rows.paired_rejects("kci_lp", k, e), rows.paired_rejects("kci", k, e, adjusted=True)))
             for k in KS for e in range(len(TARGET_POWER))]
    diffs = [(k, e, d) for k, e, d in diffs if d is not None]
    mg = m["exact_null_cost"]["margin"]
    verdict = "no data yet" if not diffs else ("not as predicted" if any(d[2] < -mg for _, _, d in diffs) else
                                               "as predicted" if all(d[1] >= -mg for _, _, d in diffs) else
                                               "undecided (an interval reaches past the margin)")
    line("exact_null_cost", verdict, ", ".join(f"K = {k} e{e} {_fmt(d)}" for k, e, d in diffs) or "-")
    fz = rows.type1("fisherz", max(KS))
    mg = m["fisherz_invalid"]["margin"]
    line("fisherz_invalid", "no data yet" if fz is None else ("as predicted" if fz[1] > LEVEL + mg else
                                                              "not as predicted" if fz[2] <= LEVEL + mg else
                                                              "undecided"), cell(fz))
    g = rows.type1("kci", max(KS), RELEASED)
    line("released_width_gamma", "no data yet" if g is None else ("as predicted" if g[1] > LEVEL else
                                                                  "not as predicted" if g[2] <= LEVEL else "undecided"),
         cell(g))
    d = paired_diff(rows.paired_rejects("kci_lp", max(KS), 0, RELEASED), rows.paired_rejects("kci_lp", max(KS), 0))
    mg = m["width_power"]["margin"]
    line("width_power", "no data yet" if d is None else ("as predicted" if d[1] >= -mg and d[2] <= mg else
                                                         "not as predicted" if d[1] > mg or d[2] < -mg else
                                                         "undecided"), _fmt(d))
    lo, hi = min(DIAL_RHOS), max(DIAL_RHOS)
    a = [float(combined(s) <= LEVEL) for s in _dial(records, lo, "kci_lp", "alt")]
    b = [float(combined(s) <= LEVEL) for s in _dial(records, hi, "kci_lp", "alt")]
    d = paired_diff(a, b)
    mg = m["dial_breaks_power"]["margin"]
    line("dial_breaks_power", "no data yet" if d is None else ("as predicted" if d[1] > mg else
                                                               "not as predicted" if d[2] <= mg else "undecided"),
         f"power(rho = {lo}) - power(rho = {hi}) {_fmt(d)}")
    eq = []
    for e in range(len(TARGET_POWER)):
        recs = [r for r in records if r["unit"].startswith(f"power-k{EQUAL_CPU_K}-e{e}-") and r.get("full_kci")]
        lp = [float(combined(s) <= LEVEL) for r in recs for s in r["tests"]["kci_lp"]["alt"]]
        full = [float(p <= LEVEL) for r in recs for p in r["full_kci"]["alt"]]
        if paired_diff(lp, full) is not None:
            eq.append((e, paired_diff(lp, full)))
    mg = m["equal_cpu"]["margin"]
    line("equal_cpu", "no data yet" if not eq else ("as predicted" if all(d[1] > mg for _, d in eq) else
                                                    "not as predicted" if any(d[2] <= mg for _, d in eq) else
                                                    "undecided"),
         ", ".join(f"effect {e}: {_fmt(d)}" for e, d in eq) or "-")
    return out + [""]


def _cpu_ratio(records: list[dict], k: int) -> str:
    """kci_lp's CPU per subset over the gamma KCI's, measured side by side in this study's power units at K."""
    pairs = [(m["kci_lp"]["cpu_s_per_subset"], m["kci"]["cpu_s_per_subset"])
             for r in records if r["unit"].startswith(f"power-k{k}-")
             and {"kci_lp", "kci"} <= set(m := r.get("metrics", {}))]
    if not pairs:
        return "an unmeasured multiple of"
    return f"{np.mean([a for a, _ in pairs]) / np.mean([b for _, b in pairs]):.2f}x"


def reading(rows: Rows, records: list[dict]) -> list[str]:
    """Where E-KCI-lp is the test to use and where it is not, from the intervals above."""
    out = ["### Reading", ""]
    margin = PREDICTIONS["lp_level"]["margin"]  # the declared level rule's
    held = [k for k in KS if (v := rows.type1("kci_lp", k)) is not None and v[0] <= LEVEL + margin]
    gamma_bad = [k for k in KS if (v := rows.type1("kci", k)) is not None and v[1] > LEVEL]
    if held:
        out.append(f"- **Level**: E-KCI-lp holds it at K = {', '.join(map(str, held))} (n = "
                   f"{', '.join(str(M * k) for k in held)}); the gamma sub-test's interval lies above it at K = "
                   f"{', '.join(map(str, gamma_bad)) or 'none'}: there only E-KCI-lp is a test at all.")
    over = [(rho, v) for rho in DIAL_RHOS if (v := _dial_type1(records, rho)) is not None and v[0] > LEVEL + margin]
    if over:
        out.append(f"- **Level on the dial** (K = {DIAL_K}): the point estimate exceeds level + {margin} at "
                   + "; ".join(f"rho = {rho}: {cell(v)}" for rho, v in over)
                   + (" (so `lp_level` fails by its declared point rule; the interval still covers the level)"
                      if all(v[1] <= LEVEL <= v[2] for _, v in over) else "") + ".")
    costs = [(k, e, paired_diff(rows.paired_rejects("kci_lp", k, e), rows.paired_rejects("kci", k, e, adjusted=True)))
             for k in KS for e in range(len(TARGET_POWER))]
    costs = [(k, e, d) for k, e, d in costs if d is not None]
    if costs:
        worst = min(costs, key=lambda c: c[2][0])
        gains = [(k, e) for k, e, d in costs if d[1] > 0]
        losses = [(k, e) for k, e, d in costs if d[2] < 0]
        out.append(f"- **Power**: against the gamma statistic at its exact size (an oracle no user has), kci_lp's "
                   f"power differs by {', '.join(f'{d[0]:+.2f} (K = {k}, e{e})' for k, e, d in costs)}; the smallest "
                   f"difference is at K = {worst[0]}, e{worst[1]} ({_fmt(worst[2])}). The exact null costs resolved "
                   f"power at {', '.join(f'K = {k} e{e}' for k, e in losses) or 'no K and effect'}; kci_lp is "
                   f"resolved more powerful at {', '.join(f'K = {k} e{e}' for k, e in gains) or 'none'}.")
    lo, hi = min(DIAL_RHOS), max(DIAL_RHOS)
    null_hi = _dial(records, hi, "kci_lp", "null")
    if null_hi:
        z = mean_z(null_hi)
        drop = paired_diff([float(combined(s) <= LEVEL) for s in _dial(records, lo, "kci_lp", "alt")],
                           [float(combined(s) <= LEVEL) for s in _dial(records, hi, "kci_lp", "alt")])
        lost = drop is not None and drop[1] > 0
        out.append(f"- **Where it breaks**: at rho = {hi} (X {hi ** 2:.0%} set by Z) kci_lp's null subset mean z is "
                   f"{_fmt(z)}" + (" (conservative: p-values pushed up)" if z and z[2] < 0 else "")
                   + f"; its power at rho = {lo} minus at rho = {hi}, paired by dataset: {_fmt(drop)}"
                   + (": power is lost there while the level holds, and a conservative shift adds up with sqrt(K), "
                      "so with X nearly a function of Z E-KCI-lp is not the test to use at many subsets."
                      if lost else ": no loss resolved at these N."))
    use = []
    for k in KS:
        ratio = _cpu_ratio(records, k)
        lp, g = rows.type1("kci_lp", k), rows.type1("kci", k)
        c = [paired_diff(rows.paired_rejects("kci_lp", k, e), rows.paired_rejects("kci", k, e, adjusted=True))
             for e in range(len(TARGET_POWER))]
        c = [d for d in c if d is not None]
        if lp is None or g is None:
            continue
        if g[1] > LEVEL and lp[0] <= LEVEL + margin:
            use.append(f"K = {k} (n = {M * k}): E-KCI-lp, the only one of the two that holds the level")
        elif c and any(d[2] < 0 for d in c):
            use.append(f"K = {k} (n = {M * k}): the gamma E-KCI (its level holds here, it is cheaper per subset "
                       "and kci_lp's exact null costs resolved power)")
        elif c and any(d[1] > 0 for d in c):
            use.append(f"K = {k} (n = {M * k}): E-KCI-lp (both hold the level, and kci_lp is resolved more "
                       "powerful at one effect at least, at " + ratio + " the CPU per subset)")
        else:
            use.append(f"K = {k} (n = {M * k}): either (both hold the level, no power difference resolved); the "
                       "gamma sub-test is cheaper per subset (kci_lp: " + ratio + " its CPU)")
    if use:
        out.append("- **Which test, where** (this design, default width): " + "; ".join(use) + ".")
    fz = rows.type1("fisherz", max(KS))
    if fz is not None:
        out.append(f"- **Fisher-z subsets** on these post-nonlinear triplets: type-I {cell(fz)} at K = {max(KS)}: "
                   "cheap, and not a test of conditional independence here.")
    return out + [""]
