"""Compose the hydra config and validate it before any Ray work starts.

Every mistake ends in one ``ConfigError`` line naming the key: an unknown experiment or group option, an unknown
key (a typo would otherwise be silently ignored), a value of the wrong type, a value out of range, a missing file.
"""
from __future__ import annotations

import dataclasses
import importlib
import re
import types
import typing
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"

class ConfigError(ValueError):
    """A bad config; the message is one line that names the offending key."""


def compose(overrides: list[str] | None = None, config_name: str = "config") -> dict[str, Any]:
    """Hydra-compose ``configs/config.yaml`` with command-line style overrides into a resolved plain dict."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides or [])
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=overrides)
        return OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
        first = lines[0]
        if first.startswith("Could not override") and len(lines) > 1:
            first = f"{first} {lines[1]}"  # hydra puts the reason ("Key 'x' is not in struct") on line 2
        options = _group_options(first)
        raise ConfigError(first + (f" (available: {', '.join(options)})" if options else "")) from None


def _group_options(message: str) -> list[str]:
    # "Could not find 'experiment/foo'" -> list configs/experiment/*.yaml
    if "Could not find '" not in message:
        return []
    group = message.split("Could not find '")[1].split("'")[0].rsplit("/", 1)[0]
    folder = CONFIG_DIR / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def _check_type(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_type(value, arg, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key}: must not be null")
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return from_dict(hint, value, key)
    if origin in (list, tuple) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_check_type(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (origin is tuple or hint is tuple) else items
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return value
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{key}: must be one of {list(args)}, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return int(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    return value


def from_dict(cls: type, data: dict[str, Any] | None, prefix: str) -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys, bad types and ``__post_init__`` errors name the key."""
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{prefix}.{unknown[0]}: unknown key (valid keys: {', '.join(sorted(names))})")
    kwargs = {k: _check_type(v, hints[k], f"{prefix}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (ValueError, TypeError, FileNotFoundError) as err:
        msg = str(err)
        names_key = re.match(r"^[\w.\[\]]+: ", msg) is not None
        raise ConfigError(msg if names_key else f"{prefix}: {msg}") from None


@dataclasses.dataclass
class RootConfig:
    experiment: dict
    cluster: dict
    scale: dict
    pool: dict
    train: dict
    seed: int = 0
    output_dir: str = "runs"
    run_name: str | None = None
    resume: bool = False
    log_level: str = "INFO"
    torch_threads: int = 1
    env: dict | None = None
    sweep: dict | None = None

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"seed: must be >= 0, got {self.seed}")
        if self.torch_threads < 1:
            raise ValueError(f"torch_threads: must be >= 1, got {self.torch_threads}")


def experiment_module(name: str) -> Any:
    from experiments.registry import experiment_modules
    modules = experiment_modules()
    if name not in modules:
        raise ConfigError(f"experiment.name: unknown experiment {name!r} (available: {', '.join(sorted(modules))})")
    return importlib.import_module(modules[name])


def validate(raw: dict[str, Any]) -> dict[str, Any]:
    """Check every section; returns the config with typed sections (dataclasses) under ``_typed``."""
    from cluster.connect import ClusterConfig
    from cluster.pool import PoolConfig
    from cluster.train import TrainConfig

    root = from_dict(RootConfig, raw, "config")
    exp = dict(root.experiment)
    name = exp.pop("name", None)
    if name is None:
        raise ConfigError("experiment.name: missing")
    module = experiment_module(name)
    typed = {
        "experiment": from_dict(module.Config, exp, "experiment"),
        "cluster": from_dict(ClusterConfig, root.cluster, "cluster"),
        "pool": from_dict(PoolConfig, root.pool, "pool"),
        "train": from_dict(TrainConfig, root.train, "train"),
    }
    check = getattr(module, "check", None)
    if check is not None:
        check(typed["experiment"], raw)
    return {**raw, "_typed": typed, "_module": module}


def load(overrides: list[str] | None = None) -> dict[str, Any]:
    return validate(compose(overrides))
