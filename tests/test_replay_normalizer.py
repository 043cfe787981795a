"""ReplayBuffer (ring semantics, exact resume) and RunningNormalizer (running moments, merge across ranks)."""

import numpy as np
import pytest
import torch

from algos.normalizer import RunningNormalizer
from algos.lift.replay import ReplayBuffer

torch.set_num_threads(1)

SPECS = {"obs": ((3,), torch.float32), "done": ((), "bool"), "step": ((), torch.int64)}


def rows(start: int, n: int) -> dict[str, torch.Tensor]:
    """n transitions whose `step` field is start..start+n-1 (obs encodes the same number)."""
    step = torch.arange(start, start + n)
    return {"obs": step[:, None].float().repeat(1, 3), "done": step % 2 == 0, "step": step}


def test_replay_wraps_around_and_overwrites_oldest():
    buf = ReplayBuffer(5, SPECS)
    buf.add(rows(0, 3))
    assert len(buf) == 3 and buf.ptr == 3
    buf.add(rows(3, 4))  # 0..6 written into 5 slots: 5, 6 overwrite 0, 1
    assert len(buf) == 5 and buf.ptr == 2
    assert buf.storage["step"].tolist() == [5, 6, 2, 3, 4]
    assert torch.equal(buf.storage["obs"][:, 0], buf.storage["step"].float())
    assert buf.storage["done"].tolist() == [False, True, True, False, True]

    buf.add(rows(7, 12))  # more than capacity at once: only the newest 5 survive, in ring order
    assert sorted(buf.storage["step"].tolist()) == [14, 15, 16, 17, 18]
    assert buf.ptr == (2 + 12) % 5
    assert buf.storage["step"][(buf.ptr - 1) % 5].item() == 18  # newest just before the pointer


def test_replay_sample_only_filled_rows_and_numpy_input():
    buf = ReplayBuffer(100, SPECS)
    batch = {k: v.numpy() for k, v in rows(0, 7).items()}
    buf.add(batch)
    sample = buf.sample(1000, torch.Generator().manual_seed(0))
    assert sample["obs"].shape == (1000, 3) and sample["done"].dtype == torch.bool
    assert set(sample["step"].tolist()) == set(range(7))  # uniform over the 7 filled rows, never empty slots
    assert torch.equal(sample["obs"][:, 0], sample["step"].float())  # fields of one transition stay aligned


def test_replay_rejects_malformed_batches():
    buf = ReplayBuffer(10, SPECS)
    with pytest.raises(ValueError, match="keys"):
        buf.add({"obs": torch.zeros(2, 3)})
    bad = rows(0, 2)
    bad["obs"] = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="obs"):
        buf.add(bad)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(1)


def test_replay_state_dict_round_trip_is_exact():
    buf = ReplayBuffer(8, SPECS)
    buf.add(rows(0, 6))
    buf.add(rows(6, 5))  # wrapped: ptr = 3
    state = buf.state_dict()

    restored = ReplayBuffer(8, SPECS)
    restored.load_state_dict(state)
    assert (restored.ptr, len(restored)) == (buf.ptr, len(buf)) == (3, 8)
    for name in SPECS:
        assert torch.equal(restored.storage[name], buf.storage[name])

    # Continuing both gives identical futures: same overwrite position and same samples.
    for b in (buf, restored):
        b.add(rows(100, 2))
    assert torch.equal(restored.storage["step"], buf.storage["step"])
    s1, s2 = (b.sample(50, torch.Generator().manual_seed(3)) for b in (buf, restored))
    assert all(torch.equal(s1[k], s2[k]) for k in SPECS)

    # A partly filled buffer round-trips too, and a different layout is refused.
    partial = ReplayBuffer(8, SPECS)
    partial.add(rows(0, 2))
    again = ReplayBuffer(8, SPECS)
    again.load_state_dict(partial.state_dict())
    assert len(again) == 2 and again.ptr == 2 and again.storage["step"][:2].tolist() == [0, 1]
    with pytest.raises(ValueError, match="layout"):
        ReplayBuffer(9, SPECS).load_state_dict(state)


def test_normalizer_matches_numpy_over_several_updates():
    rng = np.random.default_rng(0)
    norm = RunningNormalizer(4)
    seen = []
    for n in (1, 7, 100, 3, 250):
        x = rng.normal(loc=[0.0, 5.0, -3.0, 1e3], scale=[1.0, 0.1, 10.0, 50.0], size=(n, 4))
        norm.update(torch.as_tensor(x, dtype=torch.float32))
        seen.append(x.astype(np.float32).astype(np.float64))
        pooled = np.concatenate(seen)
        np.testing.assert_allclose(norm.mean.numpy(), pooled.mean(0), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(norm.var.numpy(), pooled.var(0), rtol=1e-8, atol=1e-12)
        assert norm.count.item() == len(pooled)

    x = torch.as_tensor(rng.normal(size=(5, 4)), dtype=torch.float32)
    expected = (x.double().numpy() - pooled.mean(0)) / pooled.std(0)
    np.testing.assert_allclose(norm.normalize(x).numpy(), expected, rtol=1e-5, atol=1e-5)
    assert norm.normalize(x).dtype == torch.float32


def test_normalizer_batch_dims_identity_start_and_std_clip():
    norm = RunningNormalizer((2,))
    x = torch.randn(3, 2)
    assert torch.equal(norm.normalize(x), x)  # no data yet: identity
    norm.update(torch.ones(4, 5, 2) * torch.tensor([2.0, -1.0]))  # (envs, time, feat); constant features
    assert norm.count.item() == 20
    assert torch.allclose(norm.std, torch.full((2,), 1e-6, dtype=torch.float64))  # clipped, not zero
    with pytest.raises(ValueError, match="trailing shape"):
        norm.update(torch.zeros(3, 5))


def test_normalizer_merge_equals_pooled_statistics_and_round_trips():
    rng = np.random.default_rng(1)
    chunks = [rng.normal(size=(n, 3)) * [1.0, 2.0, 3.0] + [0.0, 10.0, -5.0] for n in (10, 1, 57)]
    ranks = []
    for chunk in chunks:  # one normalizer per rank, each fed its own (disjoint) data in two batches
        rank = RunningNormalizer(3)
        rank.update(chunk[: len(chunk) // 2])
        rank.update(chunk[len(chunk) // 2:])
        ranks.append(rank)

    merged = RunningNormalizer(3)
    merged.merge_(ranks[0]).merge_(ranks[1].state_dict()).merge_(
        {k: v.numpy() for k, v in ranks[2].state_dict().items()}
    )
    merged.merge_(RunningNormalizer(3))  # an empty rank changes nothing
    pooled = np.concatenate(chunks)
    np.testing.assert_allclose(merged.mean.numpy(), pooled.mean(0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(merged.var.numpy(), pooled.var(0), rtol=1e-10)
    assert merged.count.item() == len(pooled)

    copy = RunningNormalizer(3)
    copy.load_state_dict(merged.state_dict())
    x = torch.randn(4, 3)
    assert torch.equal(copy.normalize(x), merged.normalize(x))
    with pytest.raises(ValueError, match="shape"):
        merged.merge_(RunningNormalizer(2))


def test_a_resized_buffer_keeps_the_newest_rows_in_order():
    import torch

    from algos.lift.replay import ReplayBuffer
    buf = ReplayBuffer(5, {"x": ((1,), torch.float32)})
    buf.add({"x": torch.arange(7.0).reshape(-1, 1)})  # the ring wrapped: it holds 2..6
    bigger, smaller = buf.resized(8), buf.resized(3)
    assert bigger.storage["x"][: len(bigger), 0].tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert smaller.storage["x"][: len(smaller), 0].tolist() == [4.0, 5.0, 6.0]
    bigger.add({"x": torch.tensor([[7.0]])})
    assert len(bigger) == 6 and bigger.storage["x"][5, 0] == 7.0
    assert len(ReplayBuffer(4, buf.specs).resized(2)) == 0
