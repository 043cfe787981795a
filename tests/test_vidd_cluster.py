"""VIDD on the real cluster: an end-to-end smoke run of vidd_molecule (pretraining, pool sampling, one Ray Train fit,
best-of-N from the driver, metrics + samples in Parquet, plots, summary), and the diffusion pool sampler's handling
of oracles that raise and of molecules that do not parse."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from algos.vidd.mdlm import DenoiserConfig, MaskedDenoiser
from cluster.metrics import read_metrics
from cluster.store import ParquetStore
from envs.bio.molecules import PAD, MoleculeReward, smiles_to_selfies_symbols
from envs.bio.sequences import build_vocab
from experiments.vidd.sampler import DiffusionSampler

torch.set_num_threads(1)

SMILES = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "CCN(CC)CC", "O=C(O)c1ccccc1"]


def _vocab():
    return build_vocab([smiles_to_selfies_symbols(s) for s in SMILES], pad=PAD)


class RaisingMoleculeReward:
    """QED, except that the oracle raises on any batch holding a row that starts with token 0 (a flaky oracle)."""

    def __init__(self, vocab) -> None:
        self.inner = MoleculeReward(vocab=vocab, kind="qed")

    def __call__(self, tokens):
        if (torch.as_tensor(tokens)[:, 0] == 0).any():
            raise RuntimeError("oracle crashed")
        return self.inner(tokens)


def raising_reward(vocab, **_):
    return RaisingMoleculeReward(vocab)


def _sampler_config(vocab, reward: dict) -> dict:
    return {"task": "molecule", "T": 4, "reward": reward, "vocab": {"symbols": list(vocab.symbols), "pad": vocab.pad},
            "denoiser": {"vocab_size": vocab.size, "seq_len": 12, "d_model": 16, "n_layers": 1, "n_heads": 2}}


def _weights(cfg: dict) -> dict:
    torch.manual_seed(0)
    state = MaskedDenoiser(DenoiserConfig(**cfg["denoiser"])).state_dict()
    return {"pretrained": state, "teacher": state}


def test_sampler_counts_oracle_errors_and_empty_molecules_without_crashing():
    vocab = _vocab()
    cfg = _sampler_config(vocab, {"kind": "custom", "factory": "tests.test_vidd_cluster:raising_reward"})
    sampler = DiffusionSampler(cfg)
    sampler.load_weights(_weights(cfg), 1)
    out = sampler.sample({"kind": "sample", "n": 48, "seed": 3, "model": "pretrained", "score": True})
    tokens = torch.as_tensor(out["tokens"]).long()
    unique = torch.unique(tokens, dim=0)
    crashing = int((unique[:, 0] == 0).sum())  # the oracle sees each distinct sequence once
    assert crashing > 0, "the random denoiser should start some rows with token 0 (else the test proves nothing)"
    info = out["reward_info"]
    assert info["n_errors"] == crashing  # every crashing row counted, the rest scored row by row
    assert out["queries"] == len(unique)
    assert np.all(out["rewards"][(tokens[:, 0] == 0).numpy()] == 0.0)
    assert np.isfinite(out["rewards"]).all() and out["num_samples"] == 48

    vidd = sampler.sample({"kind": "vidd", "n": 8, "seed": 1, "model": "pretrained", "steps_per_trajectory": 2,
                           "max_queries": 10})
    assert vidd["queries"] <= 10 and len(vidd["x_t"]) <= 16 and vidd["changed"].sum() * 2 <= 10

    # the real molecule oracle: an all-padding row decodes to the empty molecule and is counted, not fatal
    plain = DiffusionSampler(_sampler_config(vocab, {"kind": "qed"}))
    rewards, info = plain.oracle(torch.full((3, 12), vocab.pad_id))
    assert info["n_empty"] == 3 and info["n_valid"] == 0
    assert np.all(rewards == plain.oracle.floor)



def test_closeness_of_recorded_trajectories_is_zero_against_itself_and_positive_against_another_model():
    """The evaluation's KL: the sampler's recorded states [T + 1, n, L] give KL 0 for the model that drew them
    against itself, a positive KL against a differently initialised model, and the model's train mode is restored."""
    from experiments.vidd.sampler_requests import closeness
    cfg = _sampler_config(_vocab(), {"kind": "qed"})
    sampler = DiffusionSampler(cfg)
    sampler.load_weights(_weights(cfg), 1)
    res = sampler.sample({"kind": "sample", "n": 8, "seed": 1, "model": "pretrained", "record_trajectory": True,
                          "score": False})
    assert res["states"].shape == (cfg["T"] + 1, 8, 12)
    model = MaskedDenoiser(DenoiserConfig(**cfg["denoiser"]))
    model.load_state_dict(_weights(cfg)["pretrained"])
    torch.manual_seed(1)
    other = MaskedDenoiser(DenoiserConfig(**cfg["denoiser"])).train()
    assert closeness(model, model, res["states"]) == {"kl": 0.0, "kl_se": 0.0, "kl_rb": 0.0}
    far = closeness(other, model, res["states"])
    assert far["kl"] > 0 and far["kl_se"] > 0 and other.training


def test_sampler_final_sample_requests_stay_within_their_allowance():
    vocab = _vocab()
    cfg = _sampler_config(vocab, {"kind": "qed"})
    sampler = DiffusionSampler(cfg)
    sampler.load_weights(_weights(cfg), 1)
    out = sampler.sample({"kind": "x0", "n": 8, "seed": 1, "model": "pretrained", "steps_per_trajectory": 2,
                          "max_queries": 10, "value_model": "pretrained"})
    assert out["queries"] <= 10 and 1 <= len(out["x_t"]) == len(out["r_final"]) == len(out["v_current"])
    assert out["valid"].dtype == bool and (out["x_t"] == vocab.size).any(axis=1).all()
    free = sampler.sample({"kind": "x0", "n": 8, "seed": 1, "model": "pretrained", "steps_per_trajectory": 2,
                           "max_queries": 100, "value_model": None})  # RW_MLE: final samples only
    assert free["queries"] <= len(np.unique(free["final_tokens"], axis=0)) and (free["v_current"] == 0).all()


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")  # meta stands in for the GPU
def test_diffusion_sampler_runs_in_the_gpu_group_on_its_assigned_device(monkeypatch):
    import experiments.vidd.sampler as sampler_module
    from cluster.devices import pick_device
    from experiments.vidd import SAMPLERS
    assert SAMPLERS["diffusion"] == ("experiments.vidd.sampler:DiffusionSampler", "gpu")
    # the selection logic picks the GPU Ray assigned when CUDA works (checked without CUDA)
    assert pick_device([0], cuda_available=True) == torch.device("cuda", 0)
    assert pick_device([], cuda_available=True) == torch.device("cpu")
    calls = []
    monkeypatch.setattr(sampler_module, "assigned_device", lambda: calls.append(1) or torch.device("meta"))
    cfg = _sampler_config(_vocab(), {"kind": "qed"})
    sampler = DiffusionSampler(cfg)
    sampler.load_weights(_weights(cfg), 1)
    assert calls == [1] and sampler.device == torch.device("meta")
    assert all(p.device.type == "meta" for m in sampler.models.values() for p in m.parameters())


def test_paper_presets_keep_the_teacher_refreshing_and_small_budgets_are_flagged(caplog):
    from experiments.config import ConfigError, load
    for name, extra in (("vidd_dna", []), ("vidd_molecule", []), ("vidd_protein", ["experiment.fasta=demo"])):
        exp = load([f"experiment={name}", "scale=paper", *extra])["_typed"]["experiment"]
        assert exp.refresh_check == "error" and exp.expected_refreshes("vidd")[1] >= exp.min_teacher_refreshes >= 5
        assert exp.bf16 == "auto"  # precision by hardware, not by hand
        # the old paper sizes (all T steps per trajectory): a handful of iterations, 0-1 refreshes, refused
        with pytest.raises(ConfigError, match="teacher refreshes"):
            load([f"experiment={name}", "scale=paper", "experiment.timesteps_per_trajectory=null", *extra])
    with caplog.at_level("WARNING"):
        load(["experiment=vidd_molecule", "experiment.query_budget=512"])
    assert "degenerates into standard fine-tuning" in caplog.text


def test_vidd_molecule_end_to_end_through_pool_and_train(tmp_path, pool_name):
    from experiments.run import main
    pool, budget = pool_name, 96
    summary = main([
        "experiment=vidd_molecule", f"output_dir={tmp_path}", "run_name=smoke", f"pool.name={pool}",
        "experiment.methods=[vidd,best_of_n,ddpp]", "experiment.n_train=300", "experiment.n_heldout=30",
        "experiment.seq_len=24", "experiment.d_model=32", "experiment.n_layers=1", "experiment.n_heads=2",
        "experiment.pretrain_steps=20", "experiment.num_sampling_steps=6", f"experiment.query_budget={budget}",
        "experiment.batch_size=8", "experiment.timesteps_per_trajectory=2", "experiment.refresh_interval=2",
        "experiment.best_of_n_outputs=16", "experiment.eval_samples=16", "experiment.eval_every=2",
        "experiment.nll_time_samples=1"])
    from experiments.registry import attach_pool
    shared = attach_pool({"name": pool})
    stats = shared.stats()
    # a crashing oracle inside a pool worker: the request succeeds and the errors come back as counts
    cfg = _sampler_config(_vocab(), {"kind": "custom", "factory": "tests.test_vidd_cluster:raising_reward"})
    shared.publish("raising", _weights(cfg))
    (res,) = shared.map("diffusion", [{"kind": "sample", "n": 48, "seed": 3, "model": "pretrained"}], config=cfg,
                        weights="raising")
    assert set(summary) == {"task", "query_budget", "pretrained", "methods", "plots"}
    assert summary["task"] == "molecule" and summary["query_budget"] == budget
    assert set(summary["pretrained"]) == {"median_reward", "top10_reward", "nll", "kl", "diversity", "validity"}
    assert summary["pretrained"]["kl"] == 0.0  # the pretrained model against itself
    assert set(summary["methods"]) == {"vidd", "best_of_n", "ddpp"}
    keys = {"median_reward", "top10_reward", "mean_reward", "nll", "kl", "diversity", "validity", "uniqueness",
            "queries", "wall_s"}
    for m, s in summary["methods"].items():
        assert set(s) == keys, m
        assert 0 < s["queries"] <= budget, (m, s)
        assert 0.0 <= s["median_reward"] <= 1.0 and s["nll"] > 0
    assert summary["methods"]["vidd"]["queries"] >= budget - 1  # VIDD spends its budget (pairs of 2)
    # closeness: the trained models moved off p_pre along their own trajectories; best-of-N sits at its bound
    from algos.vidd.closeness import best_of_n_kl_bound
    assert summary["methods"]["vidd"]["kl"] > 0 and summary["methods"]["ddpp"]["kl"] > 0
    assert summary["methods"]["best_of_n"]["kl"] == best_of_n_kl_bound(budget // 16)
    assert any(p.endswith("vidd_reward_vs_kl.png") for p in summary["plots"])
    for plot in summary["plots"]:
        assert plot.endswith((".png",)) and __import__("os").path.getsize(plot) > 5_000

    run = tmp_path / "vidd_molecule" / "smoke"
    df = read_metrics(run)
    vidd_rows = df[df["method_id"] == 0]
    assert vidd_rows["queries"].is_monotonic_increasing and vidd_rows["queries"].max() <= budget
    assert vidd_rows["reward_median"].notna().sum() >= 2  # evaluated on schedule and at the end
    assert {-1.0, 0.0, 1.0, 4.0} <= set(df["method_id"].unique())  # pretrained, vidd, best_of_n, ddpp
    ddpp_rows = df[df["method_id"] == 4]
    assert ddpp_rows["queries"].max() <= budget and ddpp_rows["teacher_refreshed"].fillna(0).sum() >= 1
    samples = ParquetStore(run / "data" / "samples").read().to_pandas()
    assert set(samples["method"]) == {"pretrained", "best_of_n", "vidd", "ddpp"}
    assert (samples.groupby("method").size() >= 16).all()
    assert samples["reward"].between(0, 1).all() and samples["sequence"].str.len().gt(0).any()
    # all diffusion sampling went through the pool: pretrained eval, best-of-N candidates, roll-ins, evaluations
    diffusion = stats["per_sampler"]["diffusion"]
    iterations = int(vidd_rows["iteration"].max())
    assert diffusion["requests"] >= 2 + 2 * iterations and diffusion["samples"] >= 16 + 96 + 8 * iterations
    assert (run / "checkpoints" / "learner-vidd").is_dir() and (run / "pretrained.pt").is_file()
    tokens = torch.as_tensor(np.array(res["tokens"])).long()
    unique = torch.unique(tokens, dim=0)
    assert res["reward_info"]["n_errors"] == int((unique[:, 0] == 0).sum()) > 0
    assert res["queries"] == len(unique) and np.isfinite(res["rewards"]).all()
