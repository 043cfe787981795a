"""Task data and reward oracles: molecules (MOSES + RDKit), DNA (JASPAR motif proxy), protein (ProtParam proxy)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from envs.bio.dna import (
    DNA_VOCAB,
    EVAL_RELEASE,
    MotifProxyReward,
    dna_to_tokens,
    gc_content,
    generate_dna_corpus,
    kmer_correlation,
    load_liver_pfms,
    tokens_to_dna,
)
from envs.bio.molecules import (
    MoleculeReward,
    load_moses_smiles,
    make_molecule_dataset,
    molecule_metrics,
    tanimoto_diversity,
    parse_molecule,
    tokens_to_smiles,
)
from envs.bio.protein import (
    PROTEIN_VOCAB,
    BetaSheetProxyReward,
    hamming_diversity,
    protein_tokens,
    read_fasta,
    tokens_to_protein,
    write_synthetic_fasta,
)
from envs.bio.sequences import Vocab, build_vocab

torch.set_num_threads(1)


# --------------------------------------------------------------------------------------------------
# Shared vocabulary utilities
# --------------------------------------------------------------------------------------------------


def test_vocab_roundtrip_padding_and_errors():
    vocab = build_vocab([["b", "a", "a"], ["c"]], pad="<p>")
    assert vocab.symbols == ("a", "b", "c", "<p>") and vocab.pad_id == 3
    tokens = vocab.encode_batch([["a", "c"], ["b"]], length=4)
    assert tokens.tolist() == [[0, 2, 3, 3], [1, 3, 3, 3]]
    assert vocab.decode_batch(tokens) == [["a", "c"], ["b"]]
    with pytest.raises(ValueError, match="unknown"):
        vocab.encode(["z"])
    with pytest.raises(ValueError, match="longer"):
        vocab.encode(["a"] * 5, length=4)
    with pytest.raises(ValueError, match="outside"):
        vocab.decode([4])  # the diffusion mask id is not a symbol
    with pytest.raises(ValueError, match="duplicates"):
        Vocab(("a", "a"))


# --------------------------------------------------------------------------------------------------
# Molecules
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def molecule_data():
    return make_molecule_dataset(n_train=400, n_heldout=100, max_len=40)


def test_moses_subset_tokenises_and_roundtrips(molecule_data):
    data = molecule_data
    assert data.train_tokens.shape[1] == 40 and len(data.train_tokens) > 300
    assert data.vocab.pad == "[nop]" and "[C]" in data.vocab.symbols
    decoded = tokens_to_smiles(data.train_tokens[:50], data.vocab)
    for original, roundtrip in zip(data.train_smiles[:50], decoded):
        a, b = parse_molecule(original), parse_molecule(roundtrip)
        assert a is not None and b is not None
        from rdkit import Chem

        assert Chem.MolToSmiles(a) == Chem.MolToSmiles(b)
    assert set(data.heldout_smiles).isdisjoint(load_moses_smiles(400, "train"))


def test_molecule_rewards_match_rdkit_and_floor_bad_input(molecule_data):
    from rdkit import Chem
    from rdkit.Chem import QED

    qed = MoleculeReward(molecule_data.vocab, "qed")
    smiles = ["c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "", "not a molecule", "C1CC"]
    rewards, info = qed(smiles)
    assert rewards[0] == pytest.approx(QED.qed(Chem.MolFromSmiles("c1ccccc1O")))
    assert rewards[1] == pytest.approx(QED.qed(Chem.MolFromSmiles("CC(=O)Nc1ccc(O)cc1")))
    assert rewards[2] == rewards[3] == rewards[4] == 0.0
    assert info == {"n_queries": 5, "n_valid": 2, "n_empty": 1, "n_invalid": 2, "n_errors": 0}

    sa = MoleculeReward(kind="sa")
    composite = MoleculeReward(kind="composite", sa_weight=0.5)
    (sa_value,), _ = sa(["CC(=O)Nc1ccc(O)cc1"])
    (comp_value,), _ = composite(["CC(=O)Nc1ccc(O)cc1"])
    raw_sa = 10.0 - 9.0 * sa_value
    assert 1.0 <= raw_sa < 3.0  # paracetamol is easy to make
    assert comp_value == pytest.approx(rewards[1] - 0.5 * (raw_sa - 1.0) / 9.0)
    (floor,), _ = composite([""])
    assert floor == -0.5

    # token ids outside the vocabulary (e.g. a leftover mask) are counted as errors, never raised
    bad_tokens = torch.full((2, 40), molecule_data.vocab.size)
    values, info = qed(bad_tokens)
    assert (values == 0.0).all() and info["n_errors"] == 2
    # pickles for pool workers
    restored = pickle.loads(pickle.dumps(qed))
    assert np.allclose(restored(molecule_data.train_tokens[:8])[0], qed(molecule_data.train_tokens[:8])[0])
    with pytest.raises(ValueError, match="kind"):
        MoleculeReward(kind="logp")


def test_molecule_oracles_read_none_and_selfies_strings():
    from rdkit import Chem
    from rdkit.Chem import QED

    qed = MoleculeReward(kind="qed")
    # None (a failed decode) is an error row, not a TypeError
    rewards, info = qed([None])
    assert rewards.tolist() == [0.0] and info["n_errors"] == 1 and info["n_queries"] == 1
    rewards, info = qed([None, "CCO"])
    assert rewards[1] == pytest.approx(QED.qed(Chem.MolFromSmiles("CCO"))) and info["n_errors"] == 1
    # a SELFIES string is decoded, not parsed as SMILES
    ethanol = QED.qed(Chem.MolFromSmiles("CCO"))
    assert qed(["[C][=O]"])[0][0] == pytest.approx(QED.qed(Chem.MolFromSmiles("C=O")))
    assert qed(["[C][Branch1][C][O][C]"])[0][0] == pytest.approx(QED.qed(Chem.MolFromSmiles("CC(O)")))
    assert qed(["[C][C][O][nop]"])[0][0] == pytest.approx(ethanol)  # SELFIES padding
    # both readings valid and different (ethanol vs a carbon-radical chain): a clear error, unless told which
    with pytest.raises(ValueError, match="ambiguous.*input_format"):
        qed(["[C][C][O]"])
    assert MoleculeReward(kind="qed", input_format="selfies")(["[C][C][O]"])[0][0] == pytest.approx(ethanol)
    assert MoleculeReward(kind="qed", input_format="smiles")(["[C][C][O]"])[0][0] != pytest.approx(ethanol)
    # bracket atoms that read the same both ways are plain SMILES
    assert qed(["[Na+]"])[1]["n_valid"] == 1 and qed(["[13CH4]"])[1]["n_valid"] == 1
    with pytest.raises(ValueError, match="input_format"):
        MoleculeReward(kind="qed", input_format="inchi")
    # the other tasks' oracles read None as an invalid row too
    assert MotifProxyReward()([None])[1]["n_invalid"] == 1
    assert BetaSheetProxyReward()([None, "VVVV"])[1] == {"n_queries": 2, "n_valid": 1, "n_empty": 0,
                                                        "n_invalid": 1, "n_errors": 0}


def test_molecule_metrics(molecule_data):
    metrics = molecule_metrics(molecule_data.heldout_smiles[:60] + [None, ""])
    assert metrics["validity"] == pytest.approx(60 / 62)
    assert metrics["uniqueness"] == 1.0
    assert 0.7 < metrics["diversity"] < 1.0  # MOSES molecules are diverse
    assert 0.5 < metrics["qed_median"] < metrics["qed_top10_mean"] <= 1.0
    same = [parse_molecule("c1ccccc1O")] * 3
    assert tanimoto_diversity(same) == pytest.approx(0.0)
    assert molecule_metrics(["c1ccccc1O", "c1ccccc1O"])["uniqueness"] == 0.5


# --------------------------------------------------------------------------------------------------
# DNA
# --------------------------------------------------------------------------------------------------


def test_jaspar_liver_matrices_load_offline():
    pfms = load_liver_pfms()
    assert set(pfms) == {"HNF4A", "HNF1A", "FOXA2", "CEBPB"}
    for pfm in pfms.values():
        assert pfm.shape[0] == 4 and np.allclose(pfm.sum(axis=0), 1.0)
    consensus = "".join("ACGT"[i] for i in pfms["FOXA2"].argmax(axis=0))
    assert "TGTTTAC" in consensus or "GTAAACA" in consensus  # the forkhead core
    older = load_liver_pfms(EVAL_RELEASE)
    assert any(older[k].shape != pfms[k].shape for k in pfms)  # a genuinely different matrix set


def test_dna_corpus_and_motif_proxy_reward():
    seqs = generate_dna_corpus(300, seed=0, motif_rate=0.5)
    background = generate_dna_corpus(300, seed=1, motif_rate=0.0)
    assert all(len(s) == 200 and set(s) <= set("ACGT") for s in seqs)
    assert 0.3 < gc_content(background) < 0.5
    assert generate_dna_corpus(300, seed=0, motif_rate=0.5) == seqs  # deterministic given the seed
    reward = MotifProxyReward()
    planted, info = reward(seqs)
    plain, _ = reward(background)
    assert info["n_valid"] == 300
    assert planted.mean() > plain.mean() + 0.02  # planted sites raise the proxy
    assert (planted <= 1.0).all() and (plain >= 0.0).all()
    tokens = dna_to_tokens(seqs[:16])
    assert tokens_to_dna(tokens) == seqs[:16]
    assert np.allclose(reward(tokens)[0], planted[:16])

    # the consensus of every TF (either strand) gives the maximal proxy of 1
    consensus = ["".join("ACGT"[i] for i in p.argmax(axis=0)) for p in load_liver_pfms().values()]
    ideal = ("".join(consensus)).ljust(200, "A")
    (best,), _ = reward([ideal])
    assert best == pytest.approx(1.0)
    rc = ideal[::-1].translate(str.maketrans("ACGT", "TGCA"))
    assert reward([rc])[0][0] == pytest.approx(1.0)

    values, info = reward(["ACGN" * 50, "ACG", ideal])
    assert info["n_invalid"] == 2 and values[2] == pytest.approx(1.0) and values[0] == 0.0
    assert pickle.loads(pickle.dumps(reward))([ideal])[0][0] == pytest.approx(1.0)
    assert kmer_correlation(seqs, background) > 0.9
    assert DNA_VOCAB.size == 4

    # the site-count proxy leaves room: the corpus scores low, background lower, site-packed sequences near 1
    sites = MotifProxyReward(kind="sites")
    corpus_sites, _ = sites(generate_dna_corpus(300, seed=0))
    assert 0.05 < corpus_sites.mean() < 0.35 and sites(background)[0].mean() < corpus_sites.mean()
    packed = ("".join(consensus) * 5)[:200]
    assert sites([packed])[0][0] > 0.85 and sites([ideal])[0][0] < sites([packed])[0][0]
    held_out = MotifProxyReward(release=EVAL_RELEASE, kind="sites")
    assert held_out([packed])[0][0] > 0.5 and held_out(seqs)[0].mean() != pytest.approx(sites(seqs)[0].mean())
    restored = pickle.loads(pickle.dumps(sites))
    assert restored.kind == "sites" and restored([packed])[0][0] == pytest.approx(sites([packed])[0][0])
    with pytest.raises(ValueError, match="kind"):
        MotifProxyReward(kind="activity")


# --------------------------------------------------------------------------------------------------
# Protein
# --------------------------------------------------------------------------------------------------


def test_protein_fasta_roundtrip_and_errors(tmp_path):
    path = write_synthetic_fasta(tmp_path / "prot.fasta", n=20, min_len=10, max_len=30, seed=0)
    seqs = read_fasta(path)
    assert len(seqs) == 20 and all(10 <= len(s) <= 30 for s in seqs)
    tokens = protein_tokens(seqs, max_len=32)
    assert tokens.shape == (20, 32) and tokens_to_protein(tokens) == seqs
    with pytest.raises(ValueError, match="exceed"):
        protein_tokens(seqs, max_len=12)

    with pytest.raises(FileNotFoundError, match="not found"):
        read_fasta(tmp_path / "missing.fasta")
    (tmp_path / "empty.fasta").write_text("")
    with pytest.raises(ValueError, match="no FASTA records"):
        read_fasta(tmp_path / "empty.fasta")
    (tmp_path / "bad.fasta").write_text(">ok\nACDE\n>weird\nACXZ\n")
    with pytest.raises(ValueError, match="weird"):
        read_fasta(tmp_path / "bad.fasta")
    (tmp_path / "blank.fasta").write_text(">blank\n\n")
    with pytest.raises(ValueError, match="empty sequence"):
        read_fasta(tmp_path / "blank.fasta")


def test_beta_sheet_proxy_reward():
    reward = BetaSheetProxyReward()
    values, info = reward(["VIYFWL", "AAAAGG", "VVAA", "", "AXA"])
    assert values[:3].tolist() == pytest.approx([1.0, 0.0, 0.5])
    assert values[3] == values[4] == 0.0
    assert info["n_valid"] == 3 and info["n_empty"] == 1 and info["n_invalid"] == 1
    tokens = protein_tokens(["VIYFWL", "VVAA"], max_len=8)
    assert reward(tokens)[0].tolist() == pytest.approx([1.0, 0.5])
    all_pad = torch.full((1, 8), PROTEIN_VOCAB.pad_id)
    assert reward(all_pad)[1]["n_empty"] == 1
    assert hamming_diversity(["AAAA", "AAAA"]) == 0.0
    assert hamming_diversity(["AAAA", "CCCC"]) == 1.0


# --------------------------------------------------------------------------------------------------
# End-to-end plumbing: the diffusion model, VIDD and each task's oracle fit together
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["dna", "protein"])
def test_vidd_runs_end_to_end(task, tmp_path):
    from algos.vidd.config import VIDDConfig
    from algos.vidd.finetune import finetune
    from algos.vidd.mdlm import DenoiserConfig, MaskedDenoiser, PretrainConfig, pretrain
    from algos.vidd.sampling import sample

    if task == "dna":
        data, vocab_size, reward = dna_to_tokens(generate_dna_corpus(64, length=60, seed=0)), 4, MotifProxyReward()
    else:
        seqs = read_fasta(write_synthetic_fasta(tmp_path / "p.fasta", n=64, min_len=10, max_len=24))
        data, vocab_size, reward = protein_tokens(seqs, 24), PROTEIN_VOCAB.size, BetaSheetProxyReward()
    torch.manual_seed(0)
    model = MaskedDenoiser(DenoiserConfig(vocab_size=vocab_size, seq_len=data.shape[1], d_model=32,
                                          n_layers=1, n_heads=2))
    pretrain(model, data, PretrainConfig(steps=20, batch_size=16), torch.Generator().manual_seed(0))
    cfg = VIDDConfig(batch_size=8, max_iterations=3, num_sampling_steps=6, timesteps_per_trajectory=2,
                     refresh_interval=2, query_budget=200, lr=1e-3)
    result = finetune("vidd", model, reward, cfg)
    assert 0 < result.reward_queries <= 200 and result.iterations == 3
    assert all(np.isfinite(h["loss"]) for h in result.history)
    tokens = sample(result.model, 4, data.shape[1], 6, torch.Generator().manual_seed(0)).tokens
    rewards, info = reward(tokens)
    assert rewards.shape == (4,) and info["n_queries"] == 4
