"""Prepare, here, the cp312 wheels a lent GPU machine lacks for orrery's Ray tier, in batches that each fit one call.

    python -m benchmarks.device_wheels                 # download into .whl/all, lay out .whl/1, .whl/2, ... and print
    python -m benchmarks.device_wheels --plan-only     # the batches of what .whl/all already holds, nothing fetched

Why: the lent machine (``/work/.library/device/KINDS.md`` in this workplace) runs Python 3.12 with its own torch 2.11
+ CUDA 13, transformers, tokenizers, numpy, pandas, pyarrow, scipy, ..., reaches no package registry, and takes at
most 64 MiB per call: the working tree that travels with every call plus the ``carry``-ed folders. gpu_check's
device tier (``--tier device``) needs nothing beyond that image, so it needs none of this; the Ray tier
(``--tier ray``: Ray, MuJoCo, gymnasium, hydra, rdkit, ...) needs what this script fetches.

What is fetched: the resolution, for CPython 3.12 on manylinux x86-64, of pyproject.toml's dependencies (torch left
out: the image's CUDA build stays) under ``constraints-cpu.txt``'s pins, plus ``molsets`` (no dependencies, as
``experiments/venv.py`` installs it), minus every distribution the image already has (``IMAGE_PACKAGES``, or a
``pip list --format=freeze`` read there, given with ``--have``), minus torch's CUDA stack and minus ``NOT_NEEDED``
(pyjaspar; ``--all`` keeps it). The resolve and the downloads need PyPI (reachable here): this machine's local indexes
(/opt/pypi*) hold cp311 and pure-Python wheels only, no cp312 one. A second run downloads only what ``.whl/all`` lacks;
``--plan-only`` works offline.

Batches: each call may carry ``64 MiB - the working tree - a margin``; the tree is measured (``git ls-files -co
--exclude-standard``). Wheels are packed largest first into the fewest batches; a wheel bigger than one batch (Ray's
cp312 wheel, 75.6 MiB) is cut into byte-exact parts (``NAME.whl.part00``, ...) that ``--install`` joins again there. The
sizes of each batch and of the whole call are printed. On the device each call copies its batch into ``/tmp/whl``
(the machine stays the same while it is warm, 30 s after a call), and the last one joins the parts and installs
everything into a venv that also sees the image's packages (``--install``, see ``install``): the commands are printed
too.
"""
from __future__ import annotations

import argparse
import math
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ".whl"
MIB = 1 << 20
CALL_LIMIT = 64 * MIB  # what one device call may carry, the working tree included
MARGIN = 2 * MIB  # files others add to the tree between the measurement and the call
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_24_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_35_x86_64")
# The image's Python packages as listed in the device library's KINDS.md (read there 2026-11-17): never carried.
IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp
""".split())
# torch's own CUDA stack: the image's torch brings its own
CUDA_STACK = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")
EXTRA_NO_DEPS = ("molsets==0.3.1",)  # experiments/venv.py installs it without its ancient pins; vidd_molecule reads it
# Never imported by gpu_check's runs: pyjaspar (54.5 MiB, the JASPAR database) is imported lazily by envs/bio/dna.py,
# whose tasks gpu_check does not run. Everything else stays, small as most of it is, so that no import can fail there.
NOT_NEEDED = frozenset({"pyjaspar"})


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Piece:
    """A whole wheel (``part`` None) or one byte range of a wheel cut into ``parts`` parts."""

    file: str
    size: int
    part: int | None = None
    parts: int = 1

    @property
    def name(self) -> str:
        return self.file if self.part is None else f"{self.file}.part{self.part:02d}"


def plan_batches(sizes: dict[str, int], limit: int) -> list[list[Piece]]:
    """Pack files (name -> bytes) into the fewest batches of at most ``limit`` bytes each (first fit, largest first);
    a file over ``limit`` is cut into ``ceil(size / limit)`` near-equal parts, each packed like a file."""
    if limit <= 0:
        raise ValueError(f"no room for wheels in a call: limit {limit} bytes")
    pieces: list[Piece] = []
    for file, size in sizes.items():
        if size <= limit:
            pieces.append(Piece(file, size))
            continue
        n = math.ceil(size / limit)
        bounds = [size * i // n for i in range(n + 1)]
        pieces += [Piece(file, bounds[i + 1] - bounds[i], i, n) for i in range(n)]
    batches: list[list[Piece]] = []
    free: list[int] = []
    for piece in sorted(pieces, key=lambda p: (-p.size, p.name)):
        slot = next((i for i, room in enumerate(free) if piece.size <= room), None)
        if slot is None:
            batches.append([])
            free.append(limit)
            slot = len(batches) - 1
        batches[slot].append(piece)
        free[slot] -= piece.size
    return batches


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of what travels with every device call: tracked and untracked-not-ignored files."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True,
                         check=True).stdout.decode()
    return sum((root / p).stat().st_size for p in out.split("\0") if p and (root / p).is_file())


def requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [d for d in deps if not CUDA_STACK.match(normalize(re.split(r"[\s=<>!~;\[]", d, maxsplit=1)[0]))]


def _target_options(python_version: str) -> list[str]:
    return ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
            *[opt for plat in PLATFORMS for opt in ("--platform", plat)]]


def _uv() -> str:
    here = Path(sys.executable).with_name("uv")
    found = str(here) if here.exists() else shutil.which("uv")
    if found is None:
        raise SystemExit("uv is needed to resolve for another Python (python3 -m experiments.venv installs it into "
                         ".venv): run this with .venv/bin/python")
    return found


def resolve(python_version: str, constraints: Path) -> dict[str, str]:
    """name -> version of everything orrery (less torch) installs on that Python and platform. uv resolves for
    another interpreter even where a dependency is a source distribution only (hydra's antlr4-python3-runtime),
    which pip's ``--python-version`` resolver refuses."""
    pins = [ln for ln in constraints.read_text().splitlines()
            if ln.strip() and not ln.startswith("#") and not CUDA_STACK.match(normalize(re.split(r"[=<>!~ ]", ln)[0]))]
    with tempfile.TemporaryDirectory() as tmp:
        cfile, reqs = Path(tmp) / "constraints.txt", Path(tmp) / "requirements.in"
        cfile.write_text("\n".join(pins) + "\n")
        reqs.write_text("\n".join(requirements()) + "\n")
        cmd = [_uv(), "pip", "compile", "-q", "--no-header", "--no-annotate", "--python-version", python_version,
               "--python-platform", "x86_64-manylinux_2_28", "-c", str(cfile), str(reqs)]
        print("+", " ".join(cmd), flush=True)
        out = subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True).stdout
    pinned = [ln.split("==") for ln in out.splitlines() if "==" in ln and not ln.startswith("#")]
    return {normalize(name): version.split(";")[0].strip() for name, version in pinned}


def image_packages(have: Path | None) -> frozenset[str]:
    if have is None:
        return IMAGE_PACKAGES
    return frozenset(normalize(re.split(r"[=<>!~ @]", ln.strip())[0]) for ln in have.read_text().splitlines()
                     if ln.strip() and not ln.startswith("#"))


def missing(resolved: dict[str, str], image: frozenset[str], skip: frozenset[str] = NOT_NEEDED) -> list[str]:
    """The pins to carry: resolved distributions the image lacks, less ``skip``; torch's CUDA stack never."""
    wanted = [f"{n}=={v}" for n, v in sorted(resolved.items())
              if n not in image and n not in skip and not CUDA_STACK.match(n)]
    return wanted + [r for r in EXTRA_NO_DEPS if normalize(r.split("==")[0]) not in image]


def _wheel_key(path: Path) -> str:
    name, version = path.name.split("-")[:2]
    return f"{normalize(name)}=={version}"


def download(pins: list[str], dest: Path, python_version: str) -> None:
    """Fetch the cp312 manylinux wheel of each pin into ``dest``; a pin with no wheel anywhere (a pure-Python source
    distribution) is built into one here, and refused unless it came out ``none-any``."""
    dest.mkdir(parents=True, exist_ok=True)
    have = {_wheel_key(w) for w in dest.glob("*.whl")}
    todo = [p for p in pins if f"{normalize(p.split('==')[0])}=={p.split('==')[1]}" not in have]
    if not todo:
        return
    fetch = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest),
             *_target_options(python_version)]
    print(f"+ pip download {len(todo)} wheels", flush=True)
    if subprocess.run([*fetch, *todo], cwd=ROOT).returncode == 0:
        return
    for pin in todo:  # one of them has no wheel: find which, one at a time
        if subprocess.run([*fetch, pin], cwd=ROOT, capture_output=True).returncode == 0:
            continue
        print(f"+ no wheel of {pin}: building it here", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp, pin], check=True)
            built = list(Path(tmp).glob("*.whl"))
            if len(built) != 1 or not built[0].name.endswith("-none-any.whl"):
                raise SystemExit(f"{pin}: no {python_version} wheel and not pure Python: {built}")
            shutil.move(str(built[0]), dest / built[0].name)


def lay_out(batches: list[list[Piece]], src: Path, out: Path) -> None:
    """Write batch k into ``out/k`` (hard links for whole wheels, byte ranges for parts)."""
    for old in out.iterdir():
        if old.is_dir() and old.name.isdigit():
            shutil.rmtree(old)
    for k, batch in enumerate(batches, 1):
        folder = out / str(k)
        folder.mkdir()
        for piece in batch:
            if piece.part is None:
                (folder / piece.name).hardlink_to(src / piece.file)
                continue
            total = (src / piece.file).stat().st_size
            start = total * piece.part // piece.parts
            with open(src / piece.file, "rb") as f:
                f.seek(start)
                (folder / piece.name).write_bytes(f.read(piece.size))


def join_parts(folder: Path) -> list[str]:
    """Join every ``NAME.part00``, ``NAME.part01``, ... in ``folder`` back into ``NAME`` (parts removed); returns the
    joined names. Refuses a wheel whose parts are not all there (a call that was not made)."""
    joined = []
    for first in sorted(folder.glob("*.part00")):
        name = first.name.removesuffix(".part00")
        parts = sorted(folder.glob(f"{name}.part*"))
        if [q.name for q in parts] != [f"{name}.part{i:02d}" for i in range(len(parts))]:
            raise SystemExit(f"{name}: parts missing: {[q.name for q in parts]}")
        with open(folder / name, "wb") as out:
            for part in parts:
                out.write(part.read_bytes())
        for part in parts:
            part.unlink()
        joined.append(name)
    return joined


def install(folder: Path, venv_dir: Path) -> Path:
    """On the device, with its ``python3``: join the parts, make ``venv_dir`` (its own ``bin/ray`` beside its python,
    as ``cluster.deploy.local`` wants) that also sees the image's site-packages, and install every wheel into it.
    ``--system-site-packages`` would not do: the image's python3 is itself a venv (/opt/torch/.venv), and a venv made
    from it gets the base interpreter's site-packages, without the image's torch. A ``.pth`` that calls
    ``site.addsitedir`` on the image's folders puts them after the venv's own (and runs their ``.pth`` files)."""
    import site
    import sysconfig
    import venv as venv_module

    joined = join_parts(folder)
    wheels = sorted(folder.glob("*.whl"))
    print(f"joined {joined}; {len(wheels)} wheels, {sum(w.stat().st_size for w in wheels) / MIB:.1f} MiB", flush=True)
    venv_module.EnvBuilder(with_pip=True, clear=True).create(venv_dir)
    python = venv_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    image_sites = [p for p in [*site.getsitepackages(), sysconfig.get_paths()["purelib"]] if Path(p).is_dir()]
    (Path(purelib) / "device-image.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in dict.fromkeys(image_sites)) + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", *map(str, wheels)], check=True)
    return python


def device_commands(n_batches: int) -> list[str]:
    """The command of each device call: copy its batch to /tmp/whl; the last also installs them into /tmp/orr."""
    calls = []
    for k in range(1, n_batches + 1):
        cmd = f"mkdir -p /tmp/whl && cp .whl/{k}/* /tmp/whl/ && echo batch {k} of {n_batches} copied"
        if k == n_batches:
            cmd += (" && python3 -m benchmarks.device_wheels --install /tmp/whl --venv /tmp/orr"
                    " && /tmp/orr/bin/python -c 'import torch, ray, mujoco, gymnasium, hydra, rdkit;"
                    " print(\"torch\", torch.__version__, \"ray\", ray.__version__, \"mujoco\", mujoco.__version__)'")
        calls.append(cmd)
    return calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT, help="ignored folder for the wheels (default .whl)")
    p.add_argument("--python-version", default="3.12")
    p.add_argument("--have", type=Path, default=None, help="`pip list --format=freeze` of the device image")
    p.add_argument("--plan-only", action="store_true", help="batch what OUT/all holds; fetch nothing")
    p.add_argument("--all", action="store_true", help="also what gpu_check never imports (pyjaspar: the DNA tasks)")
    p.add_argument("--install", type=Path, default=None, metavar="DIR",
                   help="on the device: join the parts in DIR and install its wheels into --venv")
    p.add_argument("--venv", type=Path, default=Path("/tmp/orr"), help="the venv --install makes")
    args = p.parse_args(argv)
    if args.install is not None:
        print(f"ready: {install(args.install, args.venv)}", flush=True)
        return 0
    src = args.out / "all"
    if not args.plan_only:
        pins = missing(resolve(args.python_version, ROOT / "constraints-cpu.txt"), image_packages(args.have),
                       frozenset() if args.all else NOT_NEEDED)
        print(f"{len(pins)} distributions the image lacks: {' '.join(pins)}", flush=True)
        download(pins, src, args.python_version)
    sizes = {w.name: w.stat().st_size for w in sorted(src.glob("*.whl"))}
    tree = tree_bytes()
    limit = CALL_LIMIT - tree - MARGIN
    batches = plan_batches(sizes, limit)
    lay_out(batches, src, args.out)
    print(f"working tree {tree / MIB:.1f} MiB; room per call {limit / MIB:.1f} MiB; {len(sizes)} wheels, "
          f"{sum(sizes.values()) / MIB:.1f} MiB in {len(batches)} calls", flush=True)
    for k, (batch, cmd) in enumerate(zip(batches, device_commands(len(batches))), 1):
        size = sum(piece.size for piece in batch)
        print(f"call {k}: carry .whl/{k}: {len(batch)} files, {size / MIB:.1f} MiB (with the tree "
              f"{(size + tree) / MIB:.1f} of 64 MiB): {', '.join(piece.name for piece in batch[:6])}"
              f"{' ...' if len(batch) > 6 else ''}", flush=True)
        print(f"  command: {cmd}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
