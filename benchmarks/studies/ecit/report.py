"""The E-CIT study's report from its records alone: type-I error and power per n and combiner, the mechanism (the
sub-test null's shift), cost, PC, the reading and the plots."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.studies.ecit.plan import (COMBINERS, CONTROL_DATA, LEVEL, PC_ECIT_N, PC_FULL_N, PC_GRAPH, PC_MAX_K,
                                          STUDY, SUBSET_SIZES, TUNE_N, TUNE_SEEDS, tuned_setting)
from benchmarks.study.ecit_data import null_shift


def _pooled(recs: list[dict], method: str) -> dict:
    from scipy.stats import binomtest
    out = {}
    for key in ("null", "alt"):
        r = sum(x["metrics"][method][f"{key}_reject"] for x in recs)
        t = sum(x["metrics"][method][f"{key}_total"] for x in recs)
        ci = binomtest(r, t).proportion_ci(0.95) if t else None
        out[key] = (r / t, ci.low, ci.high, t) if t else None
    return out


def _cell(v) -> str:
    return "n/a" if v is None else f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}] (N={v[3]})"


def report(records: list[dict], out_dir: Path) -> str:
    from benchmarks.study.stats import fmt_interval, paired, t_interval
    by = {r["unit"]: r for r in records}
    plan = STUDY.plan()
    reported = [u for u in plan if u.role == "report"]
    lines = ["## E-CIT: ensemble conditional independence tests and PC (`python -m benchmarks.study ecit report`)", "",
             "What it can show: type-I error above the level (an exact binomial interval that excludes it) and power "
             "or cost differences whose interval excludes 0. No equivalence margin was declared before the runs, so "
             "\"holds its level\" is read as \"not shown above it\", and PC at about equal CPU over five seeds is "
             "not resolved where its interval spans 0.", "",
             f"Records: `benchmarks/studies/ecit/records/` ({sum(u.name in by for u in plan)} of {len(plan)} units; reported "
             f"units {sum(u.name in by for u in reported)} of {len(reported)}"
             + ("" if all(u.name in by for u in reported) else ": **partial**, a table with missing units reads only "
                "what is there") + f"), {sum(r.get('cpu_s', 0.0) for r in records) / 3600:.2f} core-hours. Command: "
             "`nice -n 19 python -m benchmarks.study ecit run` (units), then `python -m benchmarks.study ecit report`.",
             ""]
    tunes = [r for r in records if r["role"] == "tune"]
    tuned = tuned_setting(by) if len(tunes) == len(SUBSET_SIZES) * len(TUNE_SEEDS) else None
    if tuned:
        lines += [f"Tuning (seeds {', '.join(map(str, TUNE_SEEDS))}, n={TUNE_N}): subsets of "
                  f"**{tuned['subset_size']}** rows, combiner **{tuned['combiner']}** (type-I "
                  f"{tuned['tune_type1']:.3f}, power {tuned['tune_power']:.3f}).", ""]
    cal = [r for r in records if r["unit"].startswith("cal-")]
    ns = sorted({r["n"] for r in cal})
    cal_by_n = {n: [r for r in cal if r["n"] == n] for n in ns}
    if cal:
        lines += [f"Type-I error and power at level {LEVEL}, pooled over reported seeds "
                  f"({', '.join(str(s) for s in sorted({r['seed'] for r in cal}))}), exact 95 % intervals; KCI base; "
                  f"`full` = KCI on all rows, `one_subset` = the first subset alone.", "",
                  "| n | method | type-I error | power | CPU s / test |", "|---|---|---|---|---|"]
        for n, recs in cal_by_n.items():
            methods = [m for m in [*COMBINERS, "one_subset", "full"] if all(m in r["metrics"] for r in recs)]
            for m in methods:
                p = _pooled(recs, m)
                key = "full_cpu_s" if m == "full" else "ecit_cpu_s"
                cpu = float(np.mean([r["metrics"][key] for r in recs]))
                mark = " (tuned)" if tuned and m == tuned["combiner"] else ""
                lines.append(f"| {n} | {m}{mark} | {_cell(p['null'])} | {_cell(p['alt'])} | {cpu:.3g} |")
        lines.append("")
    times = [r for r in records if r["unit"].startswith("time-")]
    if times:
        lines += ["CPU seconds of one test (median of 3 datasets, mean over seeds):", "",
                  "| n | KCI on all rows | E-KCI |", "|---|---|---|"]
        all_ns = sorted({int(n) for r in times for c in r["curves"].values() for n in c})
        mean = {c: {n: np.mean([r["curves"][c][str(n)] for r in times if str(n) in r["curves"][c]])
                    for n in all_ns if any(str(n) in r["curves"][c] for r in times)} for c in ("full", "ecit")}
        for n in all_ns:
            lines.append(f"| {n} | {mean['full'].get(n, float('nan')):.3g} | {mean['ecit'].get(n, float('nan')):.3g} |")
        fn = sorted(mean["full"])
        if len(fn) >= 2:
            slope = _loglog_slope(mean["full"])
            at = lambda n: mean["full"][fn[-1]] * (n / fn[-1]) ** slope  # noqa: E731
            lines += ["", f"KCI on all rows grows as n^{slope:.2f} here; extrapolated: {at(16000):.3g} s per test at "
                          f"n=16000 and {at(100000):.3g} s at n=100000, against E-KCI's "
                          f"{mean['ecit'].get(100000, float('nan')):.3g} s at n=100000."]
        lines.append("")
        _plot_time(mean, out_dir)
    pcs = {v: {r["seed"]: r["metrics"] for r in records if r["unit"].startswith(f"pc-{v}-")} for v in ("full", "ecit")}
    if pcs["full"] or pcs["ecit"]:
        lines += [f"PC (max_k {PC_MAX_K}) on one random {PC_GRAPH['d']}-node nonlinear SEM per seed: KCI on all "
                  f"{PC_FULL_N} rows vs E-KCI on {PC_ECIT_N} rows (about equal CPU by design). t-intervals over seeds.",
                  "", "| PC with | SHD | skeleton F1 | CPU s |", "|---|---|---|---|"]
        for v, rows in pcs.items():
            if rows:
                lines.append(f"| {v} | " + " | ".join(fmt_interval(t_interval([m[k] for m in rows.values()]), "{:.3g}")
                                                      for k in ("shd", "f1", "cpu_s")) + " |")
        if pcs["full"] and pcs["ecit"]:
            for k, better in (("shd", "lower"), ("f1", "higher")):
                d = paired({s: m[k] for s, m in pcs["ecit"].items()}, {s: m[k] for s, m in pcs["full"].items()})
                lines.append(f"\nE-CIT minus full, seed-paired {k}: {fmt_interval(d, '{:+.3g}')} ({better} is better).")
        lines.append("")
    controls = [r for r in records if r["unit"].startswith("control-")]
    # the control's part at each n, in the shape of a calibration record
    ctl_by_n = {n: [{"metrics": r["metrics"][str(n)], "tests": r["tests"][str(n)]} for r in controls
                    if str(n) in r["metrics"]] for n in sorted({int(n) for r in controls for n in r["metrics"]})}
    shifts = {name: {n: subset_null_shift([t for r in recs for t in r["tests"]["null"]]) for n, recs in by_n.items()}
              for name, by_n in (("study", cal_by_n), ("control", ctl_by_n))}
    if cal or controls:
        lines += _mechanism_lines(cal_by_n, ctl_by_n, shifts, sorted(r["seed"] for r in controls))
    if cal:
        _plot_calibration(cal, ns, out_dir, tuned)
        lines += ["![type-I error and power](ecit_error_power.png)", ""]
    if times:
        lines += ["![CPU time per test](ecit_time.png)", ""]
    if tuned and cal:
        lines += _reading(tuned, cal_by_n, ctl_by_n, shifts, mean if times else None, pcs)
    return "\n".join(lines)


def _loglog_slope(curve: dict[int, float]) -> float:
    """The exponent of CPU time in n, from a least-squares line on log-log axes."""
    ns = sorted(curve)
    return float(np.polyfit(np.log(ns), np.log([curve[n] for n in ns]), 1)[0])


def _reading(tuned: dict, cal_by_n: dict[int, list[dict]], ctl_by_n: dict[int, list[dict]], shifts: dict,
             time_mean: dict | None, pcs: dict) -> list[str]:
    """The reading, generated from the records: validity of the tuned E-KCI per n, why it fails where it does, what it
    costs and keeps, and PC. An interval decides: type-I 'above the level' only when its exact interval excludes it.
    ``shifts``: :func:`subset_null_shift` per n of the study ("study") and of the control ("control")."""
    from benchmarks.study.stats import fmt_interval, paired
    combiner, m = tuned["combiner"], tuned["subset_size"]
    ns = sorted(cal_by_n)
    pooled = {n: _pooled(cal_by_n[n], combiner) for n in ns}
    above = [n for n in ns if pooled[n]["null"][1] > LEVEL]
    held = [n for n in ns if n not in above]
    k = {n: n // m for n in ns}
    above_text = ", ".join(f"{n} ({pooled[n]['null'][0]:.3f}, K = {k[n]})" for n in above)
    out = ["### Reading", "",
           f"- **Validity** of the tuned E-KCI ({combiner}, subsets of {m} rows): the type-I error's exact 95 % "
           f"interval reaches the level {LEVEL} at n = {', '.join(map(str, held)) or 'none'}"
           + (f" and lies above it at n = {above_text}." if above else ".")
           + f" At n = {ns[-1]} (K = {k[ns[-1]]}) every combiner's type-I error: "
           + ", ".join(f"{c} {_pooled(cal_by_n[ns[-1]], c)['null'][0]:.3f}" for c in [*COMBINERS, "one_subset"])
           + "."]
    study_shift = shifts["study"]
    out.append(f"- **Why**: under the null, the subset KCI p-values are not uniform in their bulk: mean z = "
               f"{min(d['mean'] for d in study_shift.values()):+.2f} to {max(d['mean'] for d in study_shift.values()):+.2f} "
               f"across n (0 if uniform; intervals over datasets exclude 0: "
               f"{'yes' if all(d['low'] > 0 for d in study_shift.values()) else 'not at every n'}), while a single subset's "
               f"5 % tail looks fine (share <= 0.05: {min(d['share_below_level'] for d in study_shift.values()):.3f}-"
               f"{max(d['share_below_level'] for d in study_shift.values()):.3f}). That shift, multiplied by sqrt(K), predicts "
               f"the stable2 type-I error: "
               + ", ".join(f"n = {n}: {study_shift[n]['predicted_stouffer']:.2f} predicted vs "
                           f"{_pooled(cal_by_n[n], 'stable2')['null'][0]:.2f} observed" for n in ns)
               + ". So a base test calibrated at its own 5 % level is not enough for an ensemble of many subsets: "
                 "combining K p-values needs them uniform, and the error grows with K at a fixed subset size.")
    if ctl_by_n:
        cns = sorted(ctl_by_n)
        ctl = {n: _pooled(ctl_by_n[n], combiner) for n in cns}
        cshift = shifts["control"]
        big = cns[-1]
        study_big = pooled[big]["null"] if big in ns else None
        cells = [(n, c, _pooled(ctl_by_n[n], c)) for n in cns for c in [*COMBINERS, "one_subset", "full"]]
        high = [f"{c} at n = {n} ({p['null'][0]:.3f})" for n, c, p in cells if p["null"][1] > LEVEL]
        holds_big = ctl[big]["null"][1] <= LEVEL
        verdict = ""
        if study_big is not None and study_big[1] > LEVEL:
            verdict = (" With uniform inputs the growth with K does not appear: the failure lies in the subset KCI "
                       "p-values, not in the combination." if holds_big else
                       " The combiner also exceeds the level with uniform inputs at the largest K: the combination "
                       "itself contributes.")
        out.append("- **Control** (Fisher-z subsets on linear-Gaussian data, added after the table was seen): mean z "
                   + ", ".join(f"{cshift[n]['mean']:+.3f} [{cshift[n]['low']:+.3f}, {cshift[n]['high']:+.3f}] at n = {n}"
                               for n in cns)
                   + f"; the {combiner} combiner's type-I error "
                   + ", ".join(f"{_cell(ctl[n]['null'])} at n = {n} (K = {n // m})" for n in cns)
                   + (f", against {study_big[0]:.3f} with KCI subsets at n = {big}." if study_big is not None else ".")
                   + verdict + f" Control cells whose interval lies above the level: {len(high)} of {len(cells)}"
                   + (f" ({'; '.join(high)})" if high else "")
                   + f"; about {0.025 * len(cells):.1f} would be by chance if the cells were independent, but the "
                     f"methods at one n read the same 200 datasets, so one unlucky draw moves several cells together.")
    full_ns = [n for n in ns if all("full" in r["metrics"] for r in cal_by_n[n])]
    if full_ns:
        out.append("- **Power** (same datasets): " + "; ".join(
            f"n = {n}: E-KCI {pooled[n]['alt'][0]:.3f}, one subset "
            f"{_pooled(cal_by_n[n], 'one_subset')['alt'][0]:.3f}, KCI on all rows "
            f"{_pooled(cal_by_n[n], 'full')['alt'][0]:.3f}" for n in full_ns) + ". Of the power one "
            "subset loses against KCI on all rows, E-KCI wins back " + ", ".join(
                f"{_recovered(cal_by_n[n], combiner):.0%} at n = {n}" for n in full_ns) + ".")
    if time_mean and len(time_mean["full"]) >= 2:
        fn = sorted(time_mean["full"])
        slope = _loglog_slope(time_mean["full"])
        en = sorted(time_mean["ecit"])
        text = (f"- **Cost**: KCI on all rows grows as n^{slope:.2f} ({time_mean['full'][fn[-1]]:.3g} CPU s at n = "
                f"{fn[-1]}, {time_mean['full'][fn[-1]] * (100000 / fn[-1]) ** slope / 3600:.3g} h extrapolated to "
                f"n = 100000)")
        if len(en) >= 2:
            eslope = _loglog_slope(time_mean["ecit"])
            text += f"; E-KCI as n^{eslope:.2f} ({time_mean['ecit'][en[-1]]:.3g} s at n = {en[-1]})"
        out.append(text + ".")
    if pcs.get("full") and pcs.get("ecit"):
        d = {key: paired({s: v[key] for s, v in pcs["ecit"].items()}, {s: v[key] for s, v in pcs["full"].items()})
             for key in ("shd", "f1", "cpu_s")}
        out.append(f"- **PC at about equal CPU** (E-KCI on {PC_ECIT_N} rows vs KCI on {PC_FULL_N}): SHD "
                   f"{fmt_interval(d['shd'], '{:+.3g}')}, skeleton F1 {fmt_interval(d['f1'], '{:+.3g}')}, CPU "
                   f"{fmt_interval(d['cpu_s'], '{:+.3g}')} s (E-CIT minus full, seed-paired over "
                   f"{len(set(pcs['ecit']) & set(pcs['full']))} seeds; a claim only where the interval excludes 0)"
                   + (f". Each E-KCI test there combines {PC_ECIT_N // m} subsets, a K at which its type-I error is "
                      f"above the level (Validity): PC can then keep edges it should remove" if above and
                      PC_ECIT_N // m >= k[above[0]] else "") + ".")
    small = [n for n in held if k[n] <= 10]
    out += [f"- **Against the paper**: it reports type-I errors of 0.051-0.059 with m = 400 at K = 3-10 (n = 1200-4000; "
            f"up to 0.072 in some noise settings), and its validity theorem holds for exact sub-test p-values at any K "
            f"(power -> 1 as K grows at fixed m). Here the type-I error is not shown above the level at small K "
            f"(its interval reaches it; no margin was declared, so that is not a shown equality) "
            f"({', '.join(f'K = {k[n]}' for n in small) or 'none'})"
            + (f" and fails from K = {k[above[0]]}: the KCI sub-test's p-values are not exact, and what the theorem "
               f"assumes away adds up with K, so at a fixed subset size n cannot grow without the error growing." if above
               else "."), ""]
    return out


def _recovered(recs: list[dict], combiner: str) -> float:
    """Share of the power gap between one subset and the full-data test that the combiner closes."""
    one, full, ens = (_pooled(recs, c)["alt"][0] for c in ("one_subset", "full", combiner))
    return (ens - one) / (full - one) if full > one else float("nan")


def subset_null_shift(null_tests: list[list[float]], level: float = LEVEL) -> dict[str, float]:
    """:func:`null_shift` of subset p-values, in the units an averaging combiner adds up: with K subsets, Stouffer's
    sum (the stable law at alpha = 2) rejects at about Phi-bar((z_level - mean sqrt(K)) / sd), so a shift too small
    to see at one subset's 5 % tail grows with sqrt(K)."""
    from scipy.stats import norm
    shift = null_shift(null_tests, level)
    k = float(np.mean([len(t) for t in null_tests]))
    return {**shift, "k": k,
            "predicted_stouffer": float(norm.sf((norm.isf(level) - shift["mean"] * np.sqrt(k)) / shift["sd"]))}

def _mechanism_lines(cal_by_n: dict[int, list[dict]], ctl_by_n: dict[int, list[dict]], shifts: dict,
                     control_seeds: list[int]) -> list[str]:
    """The subset p-values under the null, KCI on the study's data against the Fisher-z control, and the control's
    type-I error per combiner."""
    out = ["Why the type-I error grows with n: the subset p-values of the null datasets, as z = Phi^-1(1 - p) "
           "(uniform p: mean 0, sd 1). Stouffer's sum over K subsets (the stable combiner at alpha = 2) rejects at "
           "about Phi-bar((1.645 - mean sqrt(K)) / sd), so a shift of the mean that one subset's 5 % tail hides "
           "grows with sqrt(K). The control (Fisher-z subsets on linear-Gaussian triplets, "
           f"effect {CONTROL_DATA['effect']}) was added after the table above was seen; it is outside design.json.", "",
           "| base test and data | n | K subsets | null subset p-values | share <= 0.05 | mean z [95 % over datasets] | sd z | "
           "stable2 type-I predicted | observed |", "|---|---|---|---|---|---|---|---|---|"]
    for label, name, by_n in (("KCI, post-nonlinear t3 (the study)", "study", cal_by_n),
                              ("Fisher-z, linear-Gaussian (control)", "control", ctl_by_n)):
        for n, recs in by_n.items():
            d, obs = shifts[name][n], _pooled(recs, "stable2")["null"][0]
            out.append(f"| {label} | {n} | {d['k']:.0f} | {d['count']} | {d['share_below_level']:.3f} | "
                       f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] | {d['sd']:.3f} | "
                       f"{d['predicted_stouffer']:.3f} | {obs:.3f} |")
    out.append("")
    if ctl_by_n:
        out += [f"The control's type-I error and power at level {LEVEL} (seeds "
                f"{', '.join(map(str, control_seeds))}), exact 95 % intervals; `full` = Fisher-z on all rows:", "",
                "| n | method | type-I error | power |", "|---|---|---|---|"]
        for n, recs in ctl_by_n.items():
            for m in [*COMBINERS, "one_subset", "full"]:
                p = _pooled(recs, m)
                out.append(f"| {n} | {m} | {_cell(p['null'])} | {_cell(p['alt'])} |")
        out.append("")
    return out


def _plot_calibration(cal: list[dict], ns: list[int], out_dir: Path, tuned: dict | None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, m in enumerate([*COMBINERS, "one_subset", "full"]):
        pts = [(n, _pooled([r for r in cal if r["n"] == n], m)) for n in ns
               if all(m in r["metrics"] for r in cal if r["n"] == n)]
        for ax, key in zip(axes, ("null", "alt")):
            if pts:
                ys = [p[1][key] for p in pts]
                ax.errorbar([p[0] for p in pts], [y[0] for y in ys],
                            yerr=[[y[0] - y[1] for y in ys], [y[2] - y[0] for y in ys]],
                            marker="o", ms=3, capsize=2, color=f"C{i}", label=m + (" (tuned)" if tuned and
                                                                                    m == tuned["combiner"] else ""))
    axes[0].axhline(LEVEL, color="gray", ls=":")
    for ax, title in zip(axes, ("type-I error", "power")):
        ax.set_xscale("log")
        ax.set_xlabel("n")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    fig.savefig(Path(out_dir) / "ecit_error_power.png", dpi=110)
    plt.close(fig)


def _plot_time(mean: dict, out_dir: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    for c, label in (("full", "KCI on all rows"), ("ecit", "E-KCI (m=400)")):
        xs = sorted(mean[c])
        ax.plot(xs, [mean[c][x] for x in xs], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("n")
    ax.set_ylabel("CPU s per test")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    fig.savefig(Path(out_dir) / "ecit_time.png", dpi=110)
    plt.close(fig)
