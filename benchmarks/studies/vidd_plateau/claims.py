"""The declared readings of ``vidd_plateau`` (plan.PREDICTIONS) as seed-paired primary - other differences, whether
each prediction was met, and the answer to each of the abstract's four claims (plan.CLAIM_READINGS)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from benchmarks.study.core import REPORTED_SEEDS
from benchmarks.study.stats import fmt_interval, paired
from benchmarks.studies.vidd_plateau import plan, rules


def runs_of(by_unit: dict, method: str, seeds=REPORTED_SEEDS, prefix: str = "") -> dict[int, dict]:
    return {s: by_unit[f"{prefix}{method}-s{s}"] for s in seeds if f"{prefix}{method}-s{s}" in by_unit}


def matched(run: dict, axis: str, target: float, metric: str = "reward_median") -> float | None:
    """``metric`` of a run where its ``axis`` curve first reaches ``target`` (None: outside its range)."""
    c = run["curves"]
    if axis not in c or metric not in c:
        return None
    return rules.value_at(c[axis], c[metric], target)


@dataclass(frozen=True)
class Reading:
    """One seed-paired primary - other difference: ``group`` names the prediction part it reads (plan.CLAIM_READINGS)."""
    group: str
    label: str
    stat: tuple[float, float, float]
    n: int  # seeds where both runs have the value
    better: str = "higher"
    margin: float | None = None

    @property
    def comparable(self) -> bool:
        return self.n >= plan.MIN_PAIRED_SEEDS and math.isfinite(self.stat[1])

    @property
    def verdict(self) -> str:
        if not self.comparable:
            return "not comparable"
        _, lo, hi = self.stat
        up, down = (lo > 0, hi < 0) if self.better == "higher" else (hi < 0, lo > 0)
        return "holds" if up else "reversed" if down else "not shown"

    @property
    def equivalent(self) -> bool:
        return self.comparable and self.margin is not None and -self.margin < self.stat[1] and self.stat[2] < self.margin

    def line(self) -> str:
        out = f"{fmt_interval(self.stat, '{:+.3f}')} (n={self.n}): claim {self.verdict}"
        if self.margin is not None and self.comparable:
            out += f"; equivalent within +-{self.margin:g}: {'yes' if self.equivalent else 'no'}"
        return out


def paired_n(a: dict, b: dict) -> tuple[tuple[float, float, float], int]:
    n = sum(1 for s, v in a.items() if v is not None and b.get(s) is not None)
    return paired(a, b), n


def readings(by_unit: dict, other: str = "ddpo", prefixes: tuple[str, str] = ("", "")) -> list[Reading]:
    """Every declared reading of primary - ``other`` (plan.PREDICTIONS), in the order the section prints them; a
    matched value that fewer than MIN_PAIRED_SEEDS seeds of both runs reach is "not comparable" (the declared rule).
    ``prefixes``: the (primary's, other's) unit-name prefixes (``posthoc-`` for the post-hoc runs)."""
    cap = by_unit["cap"]["metrics"]
    prim, oth = runs_of(by_unit, plan.PRIMARY, prefix=prefixes[0]), runs_of(by_unit, other, prefix=prefixes[1])
    final = lambda runs, k: {s: r["metrics"][k] for s, r in runs.items()}  # noqa: E731
    at = lambda runs, axis, t, m="reward_median": {s: matched(r, axis, t, m) for s, r in runs.items()}  # noqa: E731
    out = [Reading("P1", "largest drop", *paired_n(final(prim, "largest_drop"), final(oth, "largest_drop")),
                   better="lower", margin=0.02)]
    out += [Reading("P2", f"reward at {t} trajectories", *paired_n(at(prim, "trajectories", t), at(oth, "trajectories", t)))
            for t in plan.TRAJ_MATCH]
    out += [Reading("P2'", f"reward at {t} queries", *paired_n(at(prim, "queries", t), at(oth, "queries", t)))
            for t in plan.QUERY_MATCH]
    out += [Reading("P3", f"reward at KL {t:.3f}", *paired_n(at(prim, "kl", t), at(oth, "kl", t)),
                    margin=0.02 if math.isclose(t, cap["kappa"]) else None) for t in cap["kl_match"]]
    kappa = cap["kappa"]
    out.append(Reading("P4 at kappa", f"diversity at KL kappa ({kappa:.3f})",
                       *paired_n(at(prim, "kl", kappa, "diversity"), at(oth, "kl", kappa, "diversity")),
                       margin=plan.EQUIV_DIVERSITY_MARGIN))
    out.append(Reading("P4 at the plateau/cap", "diversity at the plateau/cap",
                       *paired_n(final(prim, "diversity"), final(oth, "diversity"))))
    out.append(Reading("final reward", "reward at the plateau/cap (descriptive)",
                       *paired_n(final(prim, "reward_median"), final(oth, "reward_median"))))
    control = runs_of(by_unit, "standard_ft_official")
    out.append(Reading("P5", "primary - no-refresh control, reward at the plateau/cap",
                       *paired_n(final(prim, "reward_median"), final(control, "reward_median"))))
    return out


def claim_answer(group_readings: list[Reading]) -> str:
    """plan.CLAIM_READINGS' rule over the deciding readings: holds / reversed / mixed / not shown / not comparable."""
    verdicts = {r.verdict for r in group_readings}
    if not group_readings or verdicts == {"not comparable"}:
        return "not comparable"
    if "holds" in verdicts and "reversed" in verdicts:
        return "mixed"
    return "holds" if "holds" in verdicts else "reversed" if "reversed" in verdicts else "not shown"


def deciding(rs: list[Reading], name: str) -> list[Reading]:
    if name == "P2 smallest comparable trajectories":
        return next(([r] for r in rs if r.group == "P2" and r.comparable), [])
    return [r for r in rs if r.group == name]


def predictions_met(rs: list[Reading]) -> dict[str, str]:
    """Each declared prediction (plan.PREDICTIONS' texts) against its readings: 'met', 'not met' or 'not comparable'."""
    def met(ok: bool | None) -> str:
        return "not comparable" if ok is None else "met" if ok else "not met"
    group = lambda g: [r for r in rs if r.group == g]  # noqa: E731
    p1 = group("P1")[0]
    traj = deciding(rs, "P2 smallest comparable trajectories")
    queries = [r for r in group("P2'") if r.comparable]
    kappa = next(r for r in group("P3") if r.margin is not None)
    div_kappa, div_final, p5 = group("P4 at kappa")[0], group("P4 at the plateau/cap")[0], group("P5")[0]
    return {
        "P1": met(p1.equivalent if p1.comparable else None),
        "P2 (ahead at the smallest comparable trajectory count)": met(traj[0].verdict == "holds" if traj else None),
        "P2 (behind at every comparable query count)": met(all(r.verdict == "reversed" for r in queries)
                                                            if queries else None),
        "P3 (equivalent at kappa)": met(kappa.equivalent if kappa.comparable else None),
        "P4 (more diverse at the plateau/cap)": met(div_final.verdict == "holds" if div_final.comparable else None),
        "P4 (equivalent at kappa)": met(div_kappa.equivalent if div_kappa.comparable else None),
        "P5": met(p5.verdict == "holds" if p5.comparable else None),
    }


def claims_table(rs: list[Reading], by_unit: dict, prefixes: tuple[str, str] = ("", "")) -> list[str]:
    lines = ["| claim | decided by | answer | beside it |", "|---|---|---|---|"]
    sd = {m: float(np.std([r["metrics"]["reward_median"] for r in runs_of(by_unit, m, prefix=p).values()], ddof=1))
          for m, p in zip((plan.PRIMARY, "ddpo"), prefixes)}
    descriptive = {"seed SD": f"seed-to-seed SD of the final reward median {sd[plan.PRIMARY]:.3f} against ddpo's "
                              f"{sd['ddpo']:.3f} (descriptive)"}
    for claim, rule in plan.CLAIM_READINGS.items():
        decide = [r for name in rule["decide"] for r in deciding(rs, name)]
        beside = [f"{r.label} {fmt_interval(r.stat, '{:+.3f}')}: {r.verdict}"
                  for name in rule["beside"] if name not in descriptive for r in deciding(rs, name)]
        beside += [descriptive[name] for name in rule["beside"] if name in descriptive]
        lines.append(f"| {claim} | " + "; ".join(f"{r.label} {fmt_interval(r.stat, '{:+.3f}')} (n={r.n})"
                                                 for r in decide) + f" | **{claim_answer(decide)}** | "
                     + ("; ".join(beside) or "-") + " |")
    return lines
