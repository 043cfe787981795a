"""Compose the hydra config and validate it before any Ray work starts.

The schema is hydra's own: every section's dataclass (``cluster.connect.ClusterConfig``, ``cluster.pool.PoolConfig``,
``cluster.train.TrainConfig``, each experiment's ``Config``) is registered in hydra's ``ConfigStore``, so composing
already rejects unknown keys and values of the wrong type, in the YAML files and in overrides alike. What is left by
hand is what a type cannot say: the dataclasses' ``__post_init__`` (ranges, one field against another) and each
experiment's ``check(exp, raw)`` (one section against another, files on disk).

Every mistake ends in one ``ConfigError`` line naming the key: ``pool.num_workers: must be >= 1, got 0``.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import re
import types
import typing
from pathlib import Path
from typing import Any

from cluster.connect import ClusterConfig
from cluster.pool_config import PoolConfig
from cluster.train import TrainConfig

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


class ConfigError(ValueError):
    """A bad config; the message is one line that names the offending key."""


@dataclasses.dataclass
class RootConfig:
    experiment: Any = None  # the chosen experiment's own Config (its schema is attached by configs/config.yaml)
    cluster: ClusterConfig = dataclasses.field(default_factory=ClusterConfig)
    scale: dict = dataclasses.field(default_factory=dict)
    pool: PoolConfig = dataclasses.field(default_factory=PoolConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
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


# ------------------------------------------------------------------------------------------- schemas for hydra

def _omegaconf_type(hint: Any) -> Any:
    """The annotation OmegaConf can enforce for ``hint``: Literal -> the type of its values (membership is checked
    after), tuple -> list, nested dataclasses -> their schema; unions keep their members."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return Any
    if dataclasses.is_dataclass(hint):
        return schema_of(hint)
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        return kinds.pop() if len(kinds) == 1 else Any
    if origin in (typing.Union, types.UnionType):
        members = [_omegaconf_type(a) for a in args]
        containers = [m for m in members if m in (list, dict) or typing.get_origin(m) in (list, dict)
                      or dataclasses.is_dataclass(m) or m is Any]
        if containers:  # OmegaConf cannot merge a mapping into an Optional[dict] node holding None: check by hand
            return Any
        return typing.Union[tuple(members)]
    if origin in (list, tuple) or hint in (list, tuple):
        inner = [a for a in args if a is not Ellipsis]
        return list[_omegaconf_type(inner[0])] if len(inner) == 1 or (inner and origin is list) else list
    if origin is dict or hint is dict:
        return dict[args[0], _omegaconf_type(args[1])] if args else dict
    return hint


def _default(f: dataclasses.Field) -> dataclasses.Field:
    from omegaconf import MISSING
    if f.default is not dataclasses.MISSING:
        value = f.default
        if isinstance(value, tuple):  # OmegaConf has lists, not tuples
            return dataclasses.field(default_factory=lambda: list(value))
        return dataclasses.field(default=value)
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(value):
            nested = schema_of(type(value))
            return dataclasses.field(default_factory=lambda: nested(**_schema_values(value)))
        return dataclasses.field(default_factory=lambda: value.copy() if hasattr(value, "copy") else value)
    return dataclasses.field(default=MISSING)


def _schema_values(obj: Any) -> dict[str, Any]:
    return {f.name: (list(v) if isinstance(v := getattr(obj, f.name), tuple) else v)
            for f in dataclasses.fields(obj) if f.init}


@functools.cache
def schema_of(cls: type, name: str | None = None) -> type:
    """A copy of dataclass ``cls`` that OmegaConf/hydra can use as a schema (same fields, types and defaults, no
    ``__post_init__``); ``name`` adds the ``name`` key an experiment's YAML carries."""
    hints = typing.get_type_hints(cls)
    fields = [(f.name, _omegaconf_type(hints[f.name]), _default(f)) for f in dataclasses.fields(cls) if f.init]
    if name is not None:
        fields.insert(0, ("name", str, dataclasses.field(default=name)))
    return dataclasses.make_dataclass(f"{cls.__name__}Schema", fields)


@functools.cache
def register_schemas() -> None:
    """Put the root schema and one schema per experiment (group ``experiment_schema``) into hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    from experiments.registry import experiment_modules
    store = ConfigStore.instance()
    store.store(name="root_schema", node=schema_of(RootConfig))
    for name, module in experiment_modules().items():
        store.store(group="experiment_schema", name=name, node=schema_of(importlib.import_module(module).Config, name))


# ------------------------------------------------------------------------------------------------ compose

def compose(overrides: list[str] | None = None, config_name: str = "config") -> dict[str, Any]:
    """Hydra-compose ``configs/config.yaml`` with command-line style overrides into a resolved plain dict."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register_schemas()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides or []))
        return OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(_one_line(err)) from None


_ARTICLE = {"Integer": "an integer", "Float": "a number", "Boolean": "true/false", "String": "a string"}


def _one_line(err: BaseException, prefix: str = "") -> str:
    """One line naming the key, from a hydra/OmegaConf error (which nests the reason and spreads it over lines)."""
    chain, e = [], err
    while e is not None:
        chain.append(e)
        e = e.__cause__ or e.__context__
    text = "\n".join(str(e) for e in chain)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    missing = re.search(r"Could not find '([\w/]+)'", text)
    if missing:
        group = missing.group(1).rsplit("/", 1)[0].replace("experiment_schema", "experiment")
        option = missing.group(1).rsplit("/", 1)[-1]
        folder = CONFIG_DIR / group
        options = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
        return f"Could not find '{group}/{option}'" + (f" (available: {', '.join(options)})" if options else "")
    key_match = re.search(r"full_key: (\S+)", text)
    key = ".".join(filter(None, [prefix, key_match.group(1) if key_match else ""]))
    unknown = re.search(r"Key '(\w+)' (?:is )?not in (?:struct|'(\w+)')", text)
    if unknown:
        schema = getattr(next((e for e in chain if getattr(e, "object_type", None)), None), "object_type", None)
        valid = sorted(f.name for f in dataclasses.fields(schema)) if dataclasses.is_dataclass(schema) else []
        return f"{key or unknown.group(1)}: unknown key" + (f" (valid keys: {', '.join(valid)})" if valid else "")
    converted = re.search(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", text)
    if converted:
        return f"{key}: expected {_ARTICLE.get(converted.group(2), converted.group(2))}, got {converted.group(1)!r}"
    reason = next((ln for ln in lines if not ln.startswith(("full_key", "object_type", "reference_type"))), text)
    return f"{key}: {reason}" if key else reason


# ----------------------------------------------------------------------------------------- typed sections

def from_dict(cls: type, data: dict[str, Any] | None, prefix: str) -> Any:
    """Build dataclass ``cls`` from ``data``: OmegaConf checks the keys and types against ``cls``'s schema, then
    ``cls``'s own ``__post_init__`` checks ranges; every error names its key (``prefix.key``)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    data = dict(data or {})
    try:
        node = OmegaConf.merge(OmegaConf.structured(schema_of(cls)), data)
        values = OmegaConf.to_container(node, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(_one_line(err, prefix)) from None
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name not in data:
            continue  # the dataclass's own default (fresh mutable defaults, nested defaults)
        key = f"{prefix}.{f.name}" if prefix else f.name
        kwargs[f.name] = _typed_value(values[f.name], hints[f.name], key)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError, FileNotFoundError) as err:
        msg = str(err)
        names_key = re.match(r"^[\w.\[\]]+: ", msg) is not None
        raise ConfigError(msg if names_key or not prefix else f"{prefix}: {msg}") from None


def _typed_value(value: Any, hint: Any, key: str) -> Any:
    """What OmegaConf does not do: Literal membership, tuples, nested dataclasses built with their own checks."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if value is None:
        return None
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        return _typed_value(value, members[0], key) if len(members) == 1 else value
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, key)
    if origin is typing.Literal and value not in args:
        raise ConfigError(f"{key}: must be one of {list(args)}, got {value!r}")
    if (origin is dict or hint is dict) and not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a mapping, got {value!r}")
    if (origin in (list, tuple) or hint in (list, tuple)) and not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}: expected a list, got {value!r}")
    if origin is tuple or hint is tuple:
        return tuple(value)
    return value


# ------------------------------------------------------------------------------------------------ validate

def experiment_module(name: str) -> Any:
    from experiments.registry import experiment_modules
    modules = experiment_modules()
    if name not in modules:
        raise ConfigError(f"experiment.name: unknown experiment {name!r} (available: {', '.join(sorted(modules))})")
    return importlib.import_module(modules[name])


def validate(raw: dict[str, Any]) -> dict[str, Any]:
    """Check every section; returns the config with typed sections (dataclasses) under ``_typed``."""
    exp = dict(raw.get("experiment") or {})
    name = exp.pop("name", None)
    if name is None:
        raise ConfigError("experiment.name: missing")
    module = experiment_module(name)
    root = from_dict(RootConfig, {k: v for k, v in raw.items() if k != "experiment"}, "")
    typed = {"experiment": from_dict(module.Config, exp, "experiment"), "cluster": root.cluster, "pool": root.pool,
             "train": root.train}
    check = getattr(module, "check", None)
    if check is not None:
        check(typed["experiment"], raw)
    return {**raw, "_typed": typed, "_module": module}


def load(overrides: list[str] | None = None) -> dict[str, Any]:
    return validate(compose(overrides))
