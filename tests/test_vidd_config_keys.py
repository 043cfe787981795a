"""Every ``experiment.*`` key of vidd_dna / vidd_molecule / vidd_protein changes the run or is refused at validation.

A key is set to a non-default value (in the context where it applies) and one of three probes must see a change
against the same config without it: ``iterations`` (two real learner iterations of the method, in this process: the
learner's own step function, the pool sampler's code through ``cluster.local_pool.LocalPool``, a tiny fp32 denoiser;
fingerprint = the pool requests, the metrics rows, the student's and teacher's weights), ``evaluation`` (the learner's
evaluation on that pool) or a stage-specific one (pretraining, data, sampler config, schedule, validation outcome).
Otherwise the key must end in a ``ConfigError``. A key with no case fails ``test_every_key_has_a_case``. No Ray.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from types import SimpleNamespace

import pytest
import torch

from experiments.config import ConfigError, load
from experiments.vidd.config import Config

torch.set_num_threads(1)

# small sizes, so that one probe takes about a second; DNA reward "motif" (continuous: the weights vary)
SMALL = {"vidd_dna": ["experiment.n_train=40", "experiment.n_heldout=8", "experiment.seq_len=20",
                      "experiment.reward=motif", "experiment.batch_size=4", "experiment.num_sampling_steps=4",
                      "experiment.query_budget=400", "experiment.eval_samples=4", "experiment.refresh_check=off",
                      "experiment.pretrain_steps=2"],
         "vidd_molecule": ["experiment.n_train=40", "experiment.n_heldout=8", "experiment.seq_len=16",
                           "experiment.batch_size=4", "experiment.num_sampling_steps=4", "experiment.query_budget=400",
                           "experiment.eval_samples=4", "experiment.refresh_check=off", "experiment.pretrain_steps=2"],
         "vidd_protein": ["experiment.fasta=demo", "experiment.n_train=40", "experiment.n_heldout=8",
                          "experiment.seq_len=20", "experiment.batch_size=4", "experiment.num_sampling_steps=4",
                          "experiment.query_budget=400", "experiment.refresh_check=off", "experiment.pretrain_steps=2"]}
REFUSED = "refused"

# key -> [(experiment, context overrides, the key's value, probe)]; probe REFUSED: a ConfigError naming the key
CASES: dict[str, list[tuple[str, tuple[str, ...], str, str]]] = {
    # the algorithm (VIDDConfig fields): two learner iterations
    "alpha": [("vidd_dna", (), "10.0", "iterations")],
    "beta": [("vidd_dna", (), "0.0", "iterations")],
    "refresh_interval": [("vidd_dna", (), "1", "iterations")],
    "timesteps_per_trajectory": [("vidd_dna", (), "2", "iterations")],
    "batch_size": [("vidd_dna", (), "3", "iterations")],
    "lr": [("vidd_dna", (), "0.01", "iterations")],
    "updates_per_batch": [("vidd_dna", (), "4", "iterations")],  # the issue-24 hybrid's value
    "adam_eps": [("vidd_dna", (), "1.0", "iterations")],
    "grad_clip": [("vidd_dna", (), "0.001", "iterations")],
    "num_sampling_steps": [("vidd_dna", (), "3", "iterations")],
    "value_model": [("vidd_dna", (), "student", "iterations")],
    # the yaml's next_value/value_model are alg1's; a named scheme needs them unset (else refused as contradicting)
    "value_scheme": [("vidd_dna", ("experiment.next_value=null", "experiment.value_model=null",
                                   "experiment.value_scheme=alg1"), "official", "iterations"),
                     ("vidd_dna", (), "official", REFUSED)],
    "value_estimator": [("vidd_dna", (), "greedy", "iterations")],
    "greedy_tokens_per_step": [("vidd_dna", ("experiment.value_estimator=greedy",), "1", "iterations"),
                               ("vidd_dna", (), "1", REFUSED)],
    "next_value": [("vidd_dna", (), "completion", "iterations")],
    "max_log_weight": [("vidd_dna", (), "0.0", "iterations")],
    "self_normalize_weights": [("vidd_dna", ("experiment.batch_size=8",), "true", "iterations"),
                               ("vidd_dna", ("experiment.timesteps_per_trajectory=2",), "true", REFUSED)],
    "value_denominator": [("vidd_dna", (), "false", "iterations")],
    "distill_target": [("vidd_dna", (), "final_sample", "iterations")],
    "standardize_weights": [("vidd_dna", ("experiment.method=rw_mle",), "false", "iterations")],
    "exact_teacher_term": [("vidd_dna", (), "true", "iterations")],
    "ddpo_clip": [("vidd_dna", ("experiment.method=ddpo", "experiment.ddpo_inner_steps=2", "experiment.lr=0.01"),
                   "0.2", "iterations")],
    "ddpo_inner_steps": [("vidd_dna", ("experiment.method=ddpo",), "2", "iterations")],
    "ddpo_lr": [("vidd_dna", ("experiment.method=ddpo",), "0.01", "iterations")],
    "ddpo_variant": [("vidd_dna", ("experiment.method=ddpo",), "official", "iterations"),
                     ("vidd_dna", ("experiment.method=ddpo", "experiment.ddpo_inner_steps=2"), "official", REFUSED)],
    "method": [("vidd_dna", (), "ddpo", "iterations")],
    "reward": [("vidd_dna", (), "motif_sites", "iterations")],
    "dna_release": [("vidd_dna", (), "JASPAR2022", "iterations"), ("vidd_molecule", (), "JASPAR2022", REFUSED)],
    # budget and schedule: when the learner stops and evaluates
    "max_iterations": [("vidd_dna", (), "3", "schedule")],
    "query_budget": [("vidd_dna", (), "100", "schedule")],
    "eval_every": [("vidd_dna", (), "3", "schedule")],
    "methods": [("vidd_dna", (), "[vidd,ddpo]", "schedule")],
    "best_of_n_outputs": [("vidd_dna", ("experiment.method=best_of_n",), "8", "best_of_n")],
    # evaluation
    "eval_samples": [("vidd_dna", (), "6", "evaluation")],
    "nll_time_samples": [("vidd_dna", (), "1", "evaluation")],
    "dna_eval_release": [("vidd_dna", (), "JASPAR2024", "evaluation"), ("vidd_molecule", (), "JASPAR2024", REFUSED)],
    # data, denoiser, pretraining (stage 0)
    "n_train": [("vidd_dna", (), "30", "pretraining")],
    "n_heldout": [("vidd_dna", (), "5", "pretraining")],
    "seq_len": [("vidd_dna", (), "24", "pretraining")],
    "fasta": [("vidd_protein", (), "FASTA", "pretraining"), ("vidd_dna", (), "FASTA", REFUSED)],
    "d_model": [("vidd_dna", (), "32", "pretraining")],
    "n_layers": [("vidd_dna", (), "1", "pretraining")],
    "n_heads": [("vidd_dna", (), "2", "pretraining")],
    "bf16": [("vidd_dna", (), "false", "pretraining")],
    "pretrain_steps": [("vidd_dna", (), "3", "pretraining")],
    "pretrain_batch_size": [("vidd_dna", (), "3", "pretraining")],
    "pretrain_lr": [("vidd_dna", (), "0.01", "pretraining")],
    "sa_weight": [("vidd_molecule", ("experiment.reward=composite",), "0.9", "sampler"),
                  ("vidd_dna", (), "0.9", REFUSED)],
    # validation only
    "refresh_check": [("vidd_dna", ("experiment.query_budget=100",), "error", "validation")],
    "min_teacher_refreshes": [("vidd_dna", ("experiment.query_budget=100", "experiment.refresh_check=error"), "0",
                               "validation")],
    "task": [("vidd_dna", ("experiment.reward=qed",), "molecule", REFUSED)],  # the experiment's name decides it
    # an existing file replaces stage 0 (experiments/vidd/driver.py:run); a missing one is refused
    "pretrained": [("vidd_dna", (), "/no/such/pretrained.pt", REFUSED)],
    "scheme_resolved": [("vidd_dna", (), "alg1", REFUSED)],  # bookkeeping, not a setting
    "legacy_small_step_groups": [("vidd_dna", (), "true", REFUSED)],  # study records only
}


def keys_of_experiment() -> set[str]:
    return {f.name for f in dataclasses.fields(Config) if f.init}


def test_every_key_has_a_case():
    assert keys_of_experiment() == set(CASES), (keys_of_experiment() ^ set(CASES))


def test_the_yaml_defaults_follow_the_official_dna_script():
    """lr 1e-4 (scripts/dna.sh:11) and one Adam step per collected batch (finetune_reward.py:341-345)."""
    for name in SMALL:
        exp = load([f"experiment={name}", *(["experiment.fasta=demo"] if name == "vidd_protein" else [])])
        exp = exp["_typed"]["experiment"]
        assert exp.lr == 1e-4 and exp.updates_per_batch == 1, name
    assert Config.__dataclass_fields__["lr"].default == 1e-4
    assert Config.__dataclass_fields__["updates_per_batch"].default == 1


# ------------------------------------------------------------------------------------------------ probes

def _load(name: str, overrides: tuple[str, ...]) -> Config:
    return load([f"experiment={name}", *SMALL[name], *overrides])["_typed"]["experiment"]


@functools.cache
def _bundle(seq_len: int) -> dict:
    """A tiny untrained fp32 DNA denoiser in the run's bundle format (weights fixed by the seed)."""
    from algos.vidd.mdlm import DenoiserConfig, MaskedDenoiser
    from envs.bio.dna import DNA_VOCAB
    torch.manual_seed(0)
    dcfg = DenoiserConfig(vocab_size=DNA_VOCAB.size, seq_len=seq_len, d_model=16, n_layers=1, n_heads=2, bf16=False)
    model = MaskedDenoiser(dcfg)
    return {"task": "dna", "denoiser": dataclasses.asdict(dcfg),
            "vocab": {"symbols": list(DNA_VOCAB.symbols), "pad": DNA_VOCAB.pad},
            "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def _digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for v in model.state_dict().values():
        h.update(v.detach().float().numpy().tobytes())
    return h.hexdigest()


class RecordingPool:
    """``LocalPool`` (the pool workers' sampler code in this process) that keeps every request it serves."""

    def __init__(self) -> None:
        from cluster.local_pool import LocalPool
        self.pool = LocalPool({"diffusion": "experiments.vidd.sampler:DiffusionSampler"})
        self.requests: list = []

    def publish(self, key: str, weights: dict) -> int:
        return self.pool.publish(key, weights)

    def map(self, sampler: str, requests: list, config: dict, weights: str) -> list:
        self.requests.append((sampler, json.loads(json.dumps(requests, default=str)), config.get("reward"),
                              config.get("T")))
        return self.pool.map(sampler, requests, config=config, weights=weights)


def _learner(exp: Config, tmp_path):
    """What one rank of ``experiments.vidd.learner`` holds, on a tiny bundle and a recording in-process pool."""
    from algos.vidd.config import METHODS
    from algos.vidd.finetune import frozen_copy
    from cluster.store import ParquetStore
    from experiments.vidd.data import build_model, sampler_config
    from experiments.vidd.learner import make_optimizer
    bundle = _bundle(exp.seq_len)
    method = exp.method_list()[0]
    cfg = exp.for_method(method)
    student = build_model(bundle).train()
    pre = frozen_copy(build_model(bundle))
    return SimpleNamespace(exp=exp, cfg=cfg, method=method, method_id=METHODS.index(method), seed=3, rank=0, world=1,
                           run_path=tmp_path, bundle=bundle, pre=pre, student=student, teacher=frozen_copy(pre),
                           model=student, optimizer=make_optimizer(student, cfg),
                           counters={"iteration": 0, "queries": 0, "eval_queries": 0, "wall_s": 0.0},
                           pool=RecordingPool(), weights_key="run/m", sampler_config=sampler_config(exp, bundle),
                           n_requests=2, samples=ParquetStore(tmp_path / "samples"), task_metrics=None,
                           device=torch.device("cpu"))


def _publish(learner) -> None:  # learner.publish without the DDP barrier
    cpu = lambda m: {k: v.detach().cpu() for k, v in m.state_dict().items()}  # noqa: E731
    learner.pool.publish(learner.weights_key, {"pretrained": learner.bundle["state_dict"],
                                               "teacher": cpu(learner.teacher), "student": cpu(learner.student)})


def probe_iterations(exp: Config, tmp_path) -> str:
    """Two iterations of the method's own step (experiments.vidd.learner.step_of): requests, rows, weights."""
    from experiments.vidd.learner import step_of
    from experiments.vidd.sampler_requests import queries_of
    learner = _learner(exp, tmp_path)
    rows = []
    for it in (1, 2):
        _publish(learner)
        row: dict = {}
        results = step_of(learner.method, learner.cfg)(learner, it, row)
        learner.counters["queries"] += queries_of(results)
        rows.append(row)
    return json.dumps({"requests": learner.pool.requests, "rows": rows, "queries": learner.counters["queries"],
                       "student": _digest(learner.student), "teacher": _digest(learner.teacher)},
                      sort_keys=True, default=repr)


def probe_evaluation(exp: Config, tmp_path) -> str:
    from experiments.vidd.learner import evaluate
    learner = _learner(exp, tmp_path)
    _publish(learner)
    row: dict = {}
    evaluate(learner, 1, row)
    return json.dumps({"requests": learner.pool.requests, "row": row}, sort_keys=True, default=repr)


def probe_schedule(exp: Config, tmp_path) -> str:
    """Which methods run, when each stops (budget, iteration cap) and when it evaluates."""
    from experiments.vidd.learner import Learner, evaluation_due
    out = {}
    for method in exp.method_list():
        state = lambda it, q: SimpleNamespace(exp=exp, method=method, world=1,  # noqa: E731
                                              counters={"iteration": it, "queries": q})
        out[method] = {"finished": [Learner.finished(state(it, q)) for it in range(6) for q in (0, 99, 150, 399)],
                       "evaluates": [evaluation_due(exp, it, False) for it in range(1, 13)]}
    return json.dumps(out, sort_keys=True)


def probe_best_of_n(exp: Config, tmp_path) -> str:
    """The driver's best-of-N draw: M outputs of N = budget // M candidates each (requests only)."""
    from experiments.vidd.driver import run_best_of_n

    class Stop(Exception):
        pass

    seen = []

    class Pool:
        def map(self, sampler, requests, config, weights):
            seen.append(requests)
            raise Stop

    with pytest.raises(Stop):
        run_best_of_n(Pool(), exp, {}, "k", None, 0, 2, None)
    return json.dumps(seen, sort_keys=True)


def probe_pretraining(exp: Config, tmp_path) -> str:
    """Stage 0: the task's corpus (experiments.vidd.data.load_task_data) and a short fit of the denoiser."""
    from experiments.vidd.data import load_task_data, pretrain_model
    data = load_task_data(exp, 0, tmp_path)
    bundle = pretrain_model(exp, data, 0, tmp_path / "pretrained.pt")
    h = hashlib.sha256()
    for v in bundle["state_dict"].values():
        h.update(v.float().numpy().tobytes())
    return json.dumps({"train": data.train.tolist(), "heldout": data.heldout.tolist(), "denoiser": bundle["denoiser"],
                       "weights": h.hexdigest()}, sort_keys=True)


def probe_sampler(exp: Config, tmp_path) -> str:
    from experiments.vidd.data import sampler_config
    return json.dumps(sampler_config(exp, _bundle(exp.seq_len)), sort_keys=True)


def probe_validation(exp: Config, tmp_path) -> str:
    return "validated"  # the outcome itself is compared (load raised or not)


PROBES = {"iterations": probe_iterations, "evaluation": probe_evaluation, "schedule": probe_schedule,
          "best_of_n": probe_best_of_n, "pretraining": probe_pretraining, "sampler": probe_sampler,
          "validation": probe_validation}


_BASELINES: dict[tuple, str] = {}  # several keys share a context: its outcome is computed once


def _outcome(name: str, overrides: tuple[str, ...], probe: str, tmp_path, cache: bool = False) -> str:
    if cache and (name, overrides, probe) in _BASELINES:
        return _BASELINES[(name, overrides, probe)]
    out = _outcome_of(name, overrides, probe, tmp_path)
    if cache:
        _BASELINES[(name, overrides, probe)] = out
    return out


def _outcome_of(name: str, overrides: tuple[str, ...], probe: str, tmp_path) -> str:
    try:
        exp = _load(name, overrides)
    except ConfigError as err:
        return f"ConfigError: {err}"
    return PROBES[probe](exp, tmp_path)


def _value(value: str, tmp_path) -> str:
    if value == "FASTA":
        path = tmp_path / "user.fasta"
        path.write_text(">a\nMKTAYIAKQRQISFVKSHFSRQ\n>b\nMVLSEGEWQLVLHVWAKVEA\n>c\nMGSSHHHHHHSSGLVPRGSH\n"
                        ">d\nMADQLTEEQIAEFKEAFSLF\n>e\nMSKGEELFTGVVPILVELDG\n")
        return str(path)
    return value


CASE_LIST = [(key, *case) for key, cases in CASES.items() for case in cases]


@pytest.mark.parametrize("key, name, context, value, probe", CASE_LIST,
                         ids=[f"{c[0]}-{c[1]}-{c[4]}" for c in CASE_LIST])
def test_each_key_changes_the_run_or_is_refused(key, name, context, value, probe, tmp_path):
    value = _value(value, tmp_path)
    override = f"experiment.{key}={value}"
    if probe == REFUSED:
        with pytest.raises(ConfigError) as err:
            _load(name, (*context, override))
        # one line naming the key (or, for a contradiction, the key it contradicts and this one by name)
        assert str(err.value).startswith("experiment.") and key in str(err.value), str(err.value)
        assert "\n" not in str(err.value)
        return
    (tmp_path / "base").mkdir()
    (tmp_path / "set").mkdir()
    base = _outcome(name, context, probe, tmp_path / "base", cache=True)
    changed = _outcome(name, (*context, override), probe, tmp_path / "set")
    if probe == "validation":  # the key decides whether the run is refused
        assert {base.startswith("ConfigError"), changed.startswith("ConfigError")} == {True, False}, (base, changed)
        return
    assert not base.startswith("ConfigError") and not changed.startswith("ConfigError"), (base, changed)
    assert changed != base, f"experiment.{key}={value} did not change the run ({probe})"


def test_the_iteration_probe_is_reproducible(tmp_path):
    """Without it a change could be noise: the same config gives the same two iterations."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    exp = _load("vidd_dna", ())
    assert probe_iterations(exp, tmp_path / "a") == probe_iterations(exp, tmp_path / "b")
    assert probe_pretraining(exp, tmp_path / "a") == probe_pretraining(exp, tmp_path / "b")
