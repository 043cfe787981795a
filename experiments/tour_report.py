"""The tour's report: ``report.md`` + PNG plots, built only from the runs' own ``summary.json`` and metrics files.

Every number in the report is read from a run directory that the report names, so a reader can check it (the tour
test does) and rerun any part with the command shown next to it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from cluster.metrics import read_metrics

PAPER_SCALE = {
    "lift": "python -m experiments.run experiment=lift_pretrain env=humanoid_state scale=paper cluster=remote; then "
            "experiment=lift_finetune env=humanoid_state scale=paper experiment.pretrain_run=<run dir>",
    "vidd": "python -m experiments.run experiment=vidd_molecule scale=paper cluster=remote",
    "attnrl": "python -m experiments.run experiment=attnrl scale=paper cluster=remote experiment.hf_model=<local dir>",
}


def _load(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


STUDY = "benchmarks/RESULTS.md"  # where each method's multi-seed study says whether its claim holds


def paired_verdict(differences: list[float], higher_is_better: bool = True) -> str:
    """Whether a comparative claim holds, from seed-paired differences (method minus baseline): "yes" only when the
    95 % t-interval of their mean excludes zero in the claimed direction, "no (reversed)" when it excludes zero the
    other way, else "not shown at this budget". One seed has no interval: never "yes"."""
    import math
    import statistics
    diffs = [d if higher_is_better else -d for d in differences if d is not None and math.isfinite(d)]
    if len(diffs) < 2:
        return f"not shown at this budget ({len(diffs)} seed; the multi-seed study is in {STUDY})"
    from scipy import stats
    mean, sem = statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))
    half = stats.t.ppf(0.975, len(diffs) - 1) * sem
    if mean - half > 0:
        return "yes"
    if mean + half < 0:
        return "no (reversed)"
    return f"not shown at this budget ({len(diffs)} seeds, 95 % interval {mean - half:+.3g} .. {mean + half:+.3g})"


def _copy_plots(paths: list[str | None], out: Path, prefix: str) -> list[str]:
    copied = []
    for p in paths:
        if p and Path(p).exists():
            target = out / f"{prefix}_{Path(p).name}"
            shutil.copyfile(p, target)
            copied.append(target.name)
    return copied


def lift_section(stages, out: Path) -> tuple[list[str], list[dict], list[str]]:
    pre, fin = stages
    lines, claims, plots = ["## LIFT (humanoid-control recipe on a fast MuJoCo task)", ""], [], []
    s_pre = _load(pre.run_dir) if pre.ok else None
    if s_pre:
        plots += _copy_plots([s_pre.get("plot")], out, "lift")
        lines += [f"Pretraining on **{s_pre['task']}**: eval return {_fmt(s_pre['final_eval_return'])} "
                  f"(best {_fmt(s_pre['best_eval_return'])}) after {s_pre['env_steps']} env steps and "
                  f"{s_pre['updates']} SAC updates in {_fmt(s_pre['wall_s'])} s. Source: `{pre.run_dir}/metrics`.", ""]
        claims.append({"paper": "LIFT", "claim": "large-batch high-UTD SAC pretraining learns the task",
                       "observed": f"eval return {_fmt(s_pre['first_eval_return'])} -> {_fmt(s_pre['best_eval_return'])} "
                                   f"in {s_pre['env_steps']} env steps",
                       "holds": "yes" if s_pre["best_eval_return"] is not None and s_pre["first_eval_return"]
                       is not None and s_pre["best_eval_return"] > s_pre["first_eval_return"] else "no"})
    s_fin = _load(fin.run_dir) if fin.ok else None
    if s_fin:
        plots += _copy_plots([s_fin.get("plot")], out, "lift")
        methods = s_fin["methods"]
        lines += [f"Finetuning in the changed task (**{s_fin['change']}**): pre-change return "
                  f"{_fmt(s_fin['pre_change_return'])}, zero-shot in the changed task {_fmt(s_fin['zero_shot_return'])}. "
                  f"Source: `{fin.run_dir}/metrics`.", "",
                  "| method | real steps to recover 80% | final return | best return | real-env falls | real steps |",
                  "|---|---|---|---|---|---|"]
        for name, m in methods.items():
            lines.append(f"| {name} | {_fmt(m['real_steps_to_recover'])} | {_fmt(m['final_return'])} | "
                         f"{_fmt(m['best_return'])} | {m['falls']} | {m['real_steps']} |")
        lines.append("")
        lift, sac = methods.get("lift"), methods.get("sac_finetune")
        if lift and sac:
            a, b = lift["real_steps_to_recover"], sac["real_steps_to_recover"]
            pre_c, zero = s_fin["pre_change_return"], s_fin["zero_shot_return"]
            # a change that costs the pretrained policy under 10 % of its return leaves nothing to recover
            unhurt = zero >= pre_c - 0.1 * abs(pre_c)
            observed = f"{_fmt(a)} vs {_fmt(b)} real steps ({_ratio(a, b)})"
            if unhurt:
                observed += (f"; the change did not hurt the pretrained policy (zero-shot {_fmt(zero)} vs "
                             f"{_fmt(pre_c)}): pick a harsher experiment.change")
            claims.append({"paper": "LIFT", "claim": "finetuning recovers with fewer real steps than stochastic SAC "
                                                     "finetuning", "observed": observed,
                           "holds": "n/a" if unhurt else paired_verdict(
                               [None if a is None or b is None else a - b], higher_is_better=False)})
            claims.append({"paper": "LIFT", "claim": "safer: fewer real-env falls than stochastic SAC finetuning",
                           "observed": f"{lift['falls']} vs {sac['falls']} falls",
                           "holds": paired_verdict([lift["falls"] - sac["falls"]], higher_is_better=False)})
    return lines, claims, plots


def vidd_section(stages, out: Path) -> tuple[list[str], list[dict], list[str]]:
    (st,) = stages
    lines, claims, plots = ["## VIDD (reward-guided discrete diffusion, molecules)", ""], [], []
    s = _load(st.run_dir) if st.ok else None
    if not s:
        return lines, claims, plots
    plots += _copy_plots(s.get("plots", []), out, "vidd")
    pre = s["pretrained"]
    lines += [f"Oracle-query budget per method: {s['query_budget']}. Pretrained model: median reward "
              f"{_fmt(pre['median_reward'])}, NLL {_fmt(pre['nll'])}, diversity {_fmt(pre['diversity'])}. "
              f"Source: `{st.run_dir}/metrics`.", "",
              "| method | median reward | top-10% reward | NLL | diversity | validity | queries | wall s |",
              "|---|---|---|---|---|---|---|---|"]
    for name, m in s["methods"].items():
        lines.append(f"| {name} | {_fmt(m['median_reward'])} | {_fmt(m['top10_reward'])} | {_fmt(m['nll'])} | "
                     f"{_fmt(m['diversity'])} | {_fmt(m['validity'])} | {m['queries']} | {_fmt(m['wall_s'])} |")
    lines.append("")
    short = {k: m["queries"] for k, m in s["methods"].items() if m["queries"] < 0.95 * s["query_budget"]}
    if short:
        lines += ["Stopped short of the query budget (iteration cap or time limit): " +
                  ", ".join(f"{k} ({q} queries)" for k, q in short.items()) + ".", ""]
    methods = s["methods"]
    if "vidd" in methods:
        v = methods["vidd"]["median_reward"]
        others = {k: m["median_reward"] for k, m in methods.items() if k != "vidd"}
        if others:
            best_other = max(others, key=others.get)
            claims.append({"paper": "VIDD", "claim": "higher reward than every baseline at the same oracle budget",
                           "observed": f"median {_fmt(v)} vs best baseline {best_other} {_fmt(others[best_other])} "
                                       f"({v - others[best_other]:+.3f})",
                           "holds": paired_verdict([v - others[best_other]])})
        if "ddpo" in methods:
            a, b = methods["vidd"]["nll"], methods["ddpo"]["nll"]
            claims.append({"paper": "VIDD", "claim": "stays closer to the pretrained model (NLL no worse than "
                                                     "DDPO-style)", "observed": f"NLL {_fmt(a)} vs {_fmt(b)}",
                           "holds": paired_verdict([a - b], higher_is_better=False)})
    return lines, claims, plots


def attnrl_section(stages, out: Path) -> tuple[list[str], list[dict], list[str]]:
    (st,) = stages
    lines, claims, plots = ["## AttnRL (attention-guided process-supervised RL)", ""], [], []
    s = _load(st.run_dir) if st.ok else None
    if not s:
        return lines, claims, plots
    plots += _copy_plots(s.get("plots", []), out, "attnrl")
    diffs = sorted(s["sft"]["accuracy_by_difficulty"], key=lambda d: int(d))
    lines += [f"Generated-token budget per method: {s['token_budget']}. SFT accuracy {_fmt(s['sft']['accuracy'])}. "
              f"Source: `{st.run_dir}/metrics`.", "",
              "| method | accuracy | " + " | ".join(f"{d} steps" for d in diffs) + " | tokens | steps | valid ratio |",
              "|---|---|" + "---|" * len(diffs) + "---|---|---|"]
    rows = {"sft": {**s["sft"], "generated_tokens": 0, "steps": 0, "valid_ratio": None}, **s["methods"]}
    for name, m in rows.items():
        by = m["accuracy_by_difficulty"]
        lines.append(f"| {name} | {_fmt(m['accuracy'])} | " + " | ".join(_fmt(by.get(d)) for d in diffs) +
                     f" | {m['generated_tokens']} | {m['steps']} | {_fmt(m['valid_ratio'])} |")
    lines.append("")
    methods = s["methods"]
    if "attnrl" in methods and "grpo" in methods:
        # runs end at different token counts: compare the last evaluations each made within the smaller total
        tokens = min(methods["attnrl"]["generated_tokens"], methods["grpo"]["generated_tokens"])
        df = read_metrics(st.run_dir)
        a, g = (accuracy_at_tokens(df, m, tokens) for m in ("attnrl", "grpo"))
        claims.append({"paper": "AttnRL", "claim": "more accurate than GRPO at equal generated tokens",
                       "observed": f"{_fmt(a)} vs {_fmt(g)} ({a - g:+.3f}) at <= {tokens} tokens "
                                   f"(last evaluations within the smaller run's total)",
                       "holds": paired_verdict([a - g])})
    if "attnrl" in methods:
        a, b = methods["attnrl"]["accuracy"], s["sft"]["accuracy"]
        claims.append({"paper": "AttnRL", "claim": "RL improves accuracy over the SFT model",
                       "observed": f"{_fmt(a)} vs {_fmt(b)} ({a - b:+.3f})", "holds": "yes" if a > b else "no"})
    return lines, claims, plots


def accuracy_at_tokens(df, method: str, tokens: int) -> float:
    """Eval accuracy of ``method``'s last evaluation made after at most ``tokens`` generated tokens."""
    from algos.attnrl.config import METHODS
    ev = df[df["method_id"] == METHODS.index(method)].dropna(subset=["eval_accuracy"])
    ev = ev[ev["generated_tokens"] <= tokens]
    return float(ev.sort_values("generated_tokens")["eval_accuracy"].iloc[-1])


SECTIONS = {"lift": lift_section, "vidd": vidd_section, "attnrl": attnrl_section}


def pool_load_plot(pool_stats: dict, out: Path) -> str | None:
    per = pool_stats.get("per_sampler", {})
    if not per:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = sorted(per)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, key, label in zip(axes, ("requests", "samples", "busy_s"), ("requests", "samples", "worker busy (s)")):
        ax.bar(names, [per[n][key] for n in names], color=["C0", "C1", "C2", "C3"][:len(names)])
        ax.set_title(label)
    fig.suptitle("shared pool load per sampler type")
    fig.tight_layout()
    fig.savefig(out / "pool_load.png", dpi=110)
    plt.close(fig)
    return "pool_load.png"


def write_report(out: Path, stages: dict, pool_stats: dict, cfg: dict, wall_s: float) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# orrery tour report", "",
             f"{len(stages)} method(s) ({', '.join(stages)}) ran concurrently as separate drivers on one Ray cluster, "
             f"sharing the pool "
             f"`{pool_stats.get('name')}` ({pool_stats.get('num_workers')} workers). Wall time {wall_s:.0f} s, "
             f"seed {cfg['seed']}, scale `{cfg['scale']['name']}`.", ""]
    claims: list[dict] = []
    plots: list[str] = []
    failures = []
    status_rows = ["| method | stage | status | seconds | run directory | log |", "|---|---|---|---|---|---|"]
    for method, sts in stages.items():
        for st in sts:
            status = "ok" if st.ok else ("not run" if st.returncode is None else f"FAILED: {st.error}")
            status_rows.append(f"| {method} | {st.experiment} | {status} | {st.seconds:.0f} | `{st.run_dir}` | "
                               f"`{st.log_path}` |")
            if st.returncode is not None and not st.ok:
                failures.append({"method": method, "stage": st.experiment, "error": st.error, "log": str(st.log_path)})
    sections = {}
    for method, sts in stages.items():
        sec_lines, sec_claims, sec_plots = SECTIONS[method](sts, out)
        if not any(st.ok for st in sts):
            sec_lines += [f"**Failed** — see `{sts[0].log_path}`.", ""]
        sections[method] = sec_lines
        claims += sec_claims
        plots += sec_plots
    pool_plot = pool_load_plot(pool_stats, out)
    if pool_plot:
        plots.append(pool_plot)

    lines += ["## What each paper claims, and what this run shows", "",
              "| paper | claim (direction) | this run | holds here |", "|---|---|---|---|"]
    lines += [f"| {c['paper']} | {c['claim']} | {c['observed']} | {c['holds']} |" for c in claims]
    lines += ["", "Smoke-scale budgets are tiny: a 'no' here says the direction did not show at this budget, "
              "not that the paper is wrong. Rerun any part at paper scale with the commands below.", ""]
    for method in stages:
        lines += sections[method]
        lines += [f"Rerun at paper scale: `{PAPER_SCALE[method]}`", ""]
    lines += ["## Shared pool", "",
              f"{pool_stats.get('requests')} requests, {pool_stats.get('samples')} samples, "
              f"{pool_stats.get('retries')} retries, {pool_stats.get('restarts')} restarts.", "",
              "| sampler | requests | samples | worker busy s |", "|---|---|---|---|"]
    for name, st in sorted(pool_stats.get("per_sampler", {}).items()):
        lines.append(f"| {name} | {st['requests']} | {st['samples']} | {st['busy_s']:.1f} |")
    lines += ["", "## Runs", ""] + status_rows + [""]
    if failures:
        lines += ["## Failures", ""] + [f"- {f['method']} / {f['stage']}: {f['error']} (log: `{f['log']}`)"
                                        for f in failures] + [""]
    lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    lines += ["## Config", "", "```", json.dumps({k: v for k, v in cfg.items() if not k.startswith("_")},
                                                  indent=1, default=str)[:4000], "```", ""]
    (out / "report.md").write_text("\n".join(lines))
    summary = {"report": str(out / "report.md"), "claims": claims, "failures": failures, "plots": plots,
               "pool": {k: v for k, v in pool_stats.items() if k not in ("workers",)}, "wall_s": wall_s}
    (out / "report.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
