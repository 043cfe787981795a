"""Start an embedded local Ray cluster or join an existing one.

Token authentication (Ray 2.60's default) is left on: an embedded cluster writes its token to ``~/.ray/auth_token``
and every client of it agrees. Joining a remote cluster needs the same ``RAY_AUTH_MODE`` / token as its head.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

log = logging.getLogger(__name__)

NAMESPACE = "orrery"
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class ClusterConfig:
    """``address``: None for an embedded cluster, else ``auto`` / ``ray://host:10001`` / ``host:6379``."""

    address: str | None = None
    num_cpus: int | None = 2
    num_gpus: int | None = None
    object_store_mb: int | None = 512
    include_dashboard: bool = True
    dashboard_port: int = 8265
    temp_dir: str | None = None
    namespace: str = NAMESPACE
    env_vars: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.address in ("", "local", "null"):
            self.address = None
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ValueError(f"cluster.num_cpus: must be >= 1, got {self.num_cpus}")
        if self.object_store_mb is not None and self.object_store_mb < 64:
            raise ValueError(f"cluster.object_store_mb: must be >= 64, got {self.object_store_mb}")


def _runtime_env(cfg: ClusterConfig) -> dict[str, Any]:
    # Workers of an embedded cluster import the repo's packages from its root, whatever the install mode.
    env_vars = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    env_vars.update(cfg.env_vars)
    return {"env_vars": env_vars}


def connect(cfg: ClusterConfig | dict | None = None) -> dict[str, Any]:
    """Connect this process to Ray and return ``{"address", "dashboard_url", "embedded", "resources"}``.

    Reuses an existing connection (e.g. a test fixture's, or the job supervisor's) when Ray is already up.
    """
    if cfg is None:
        cfg = ClusterConfig()
    elif isinstance(cfg, dict):
        cfg = ClusterConfig(**cfg)
    if ray.is_initialized():
        ctx = ray.get_runtime_context()
        info = _info(embedded=False, gcs=ctx.gcs_address)
        log.debug("reusing Ray connection %s", info["address"])
        return info
    if cfg.address is None and os.environ.get("RAY_ADDRESS"):
        # Inside `ray job submit` the supervisor points us at the cluster; obey it rather than start another.
        cfg.address = "auto"
    if cfg.address is None:
        dashboard_port = cfg.dashboard_port
        if cfg.include_dashboard:  # 8265 held by another Ray or orrery run: take a free port rather than fail
            from cluster.ports import pick_port
            dashboard_port = pick_port(cfg.dashboard_port, "Ray dashboard", "cluster.dashboard_port=<port>")
            # Inherited by the cluster's processes: Ray's state-API clients there (Ray Train's PlacementGroupCleaner)
            # would otherwise fail with `Found multiple active Ray instances` beside another Ray on the machine.
            os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{dashboard_port}"
        kwargs: dict[str, Any] = dict(
            address="local",  # never join a stale cluster recorded in /tmp/ray/ray_current_cluster
            num_cpus=cfg.num_cpus,
            num_gpus=cfg.num_gpus,
            include_dashboard=cfg.include_dashboard,
            dashboard_host="127.0.0.1",
            dashboard_port=dashboard_port,
            namespace=cfg.namespace,
            runtime_env=_runtime_env(cfg),
            log_to_driver=True,
        )
        if cfg.object_store_mb:
            kwargs["object_store_memory"] = cfg.object_store_mb * 1024 * 1024
        if cfg.temp_dir:
            kwargs["_temp_dir"] = str(Path(cfg.temp_dir).resolve())
        ctx = ray.init(**kwargs)
        info = _info(embedded=True, gcs=ctx.address_info.get("gcs_address"), dashboard=ctx.dashboard_url)
    else:
        ctx = ray.init(address=cfg.address, namespace=cfg.namespace)
        info = _info(embedded=False, gcs=getattr(ctx, "address_info", {}).get("gcs_address", cfg.address),
                     dashboard=getattr(ctx, "dashboard_url", None))
    log.info("Ray %s cluster at %s, dashboard %s", "embedded" if info["embedded"] else "remote",
             info["address"], info["dashboard_url"] or "off")
    return info


def _info(embedded: bool, gcs: str | None, dashboard: str | None = None) -> dict[str, Any]:
    url = None
    if dashboard:
        url = dashboard if dashboard.startswith("http") else f"http://{dashboard}"
    return {"address": gcs, "dashboard_url": url, "embedded": embedded, "resources": ray.cluster_resources()}


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()
