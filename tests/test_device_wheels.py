"""benchmarks/device_wheels.py: the batches that carry the device image's missing wheels fit one call each, a wheel
bigger than a call comes back byte-exact from its parts, and only what the image lacks is carried."""
from __future__ import annotations

import random
import subprocess

import pytest

from benchmarks.device_wheels import IMAGE_PACKAGES, join_parts, lay_out, missing, plan_batches, requirements, tree_bytes


def test_batches_fit_the_limit_and_hold_every_byte_once():
    rng = random.Random(0)
    sizes = {f"w{i}.whl": rng.randint(1, 40) for i in range(30)} | {"ray.whl": 75, "molsets.whl": 49}
    batches = plan_batches(sizes, limit=38)
    assert all(sum(p.size for p in batch) <= 38 for batch in batches)
    held: dict[str, int] = {}
    for piece in (p for batch in batches for p in batch):
        held[piece.file] = held.get(piece.file, 0) + piece.size
    assert held == sizes
    ray = sorted((p for batch in batches for p in batch if p.file == "ray.whl"), key=lambda p: p.part)
    assert [(p.name, p.size) for p in ray] == [("ray.whl.part00", 37), ("ray.whl.part01", 38)]  # ceil(75 / 38) = 2
    # first fit: no two batches could have been one (else a call is wasted)
    loads = [sum(p.size for p in batch) for batch in batches]
    assert all(a + b > 38 for i, a in enumerate(loads) for b in loads[i + 1:])


def test_small_wheels_share_a_batch_and_no_room_is_refused():
    assert [[p.name for p in b] for b in plan_batches({"a.whl": 5, "b.whl": 3, "c.whl": 2}, 10)] == [
        ["a.whl", "b.whl", "c.whl"]]
    with pytest.raises(ValueError):
        plan_batches({"a.whl": 1}, 0)


def test_parts_join_back_byte_exact_on_the_device_side(tmp_path):
    """lay_out writes the batches; copying them all into one folder and joining there (``--install``'s first step)
    gives back the original wheels; a missing part is refused."""
    src, out, device = tmp_path / "all", tmp_path / "out", tmp_path / "device"
    src.mkdir(), out.mkdir(), device.mkdir()
    rng = random.Random(1)
    files = {"big.whl": rng.randbytes(2500), "mid.whl": rng.randbytes(700), "tiny.whl": b"x"}
    for name, data in files.items():
        (src / name).write_bytes(data)
    batches = plan_batches({n: len(d) for n, d in files.items()}, limit=1000)
    lay_out(batches, src, out)
    assert sorted(p.name for p in out.iterdir()) == [str(k) for k in range(1, len(batches) + 1)]
    for folder in out.iterdir():
        assert sum(f.stat().st_size for f in folder.iterdir()) <= 1000
        for f in folder.iterdir():
            (device / f.name).write_bytes(f.read_bytes())
    assert join_parts(device) == ["big.whl"]
    assert {p.name: p.read_bytes() for p in device.iterdir()} == files
    lay_out(batches, src, out)
    partial = tmp_path / "partial"
    partial.mkdir()
    for f in out.glob("*/big.whl.part0[02]"):
        (partial / f.name).write_bytes(f.read_bytes())
    with pytest.raises(SystemExit, match="parts missing"):
        join_parts(partial)


def test_only_what_the_image_lacks_is_carried():
    resolved = {"ray": "2.60.0", "numpy": "2.4.6", "torch": "2.13.0", "nvidia-nccl-cu13": "2.29.7",
                "pyjaspar": "4.0.0", "hydra-core": "1.3.8"}
    assert "numpy" in IMAGE_PACKAGES
    assert missing(resolved, IMAGE_PACKAGES) == ["hydra-core==1.3.8", "ray==2.60.0", "molsets==0.3.1"]
    assert not [r for r in requirements() if r.startswith("torch")] and any(r.startswith("ray") for r in requirements())


def test_the_tree_that_travels_is_measured():
    try:
        size = tree_bytes()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert 0 < size < 64 << 20
