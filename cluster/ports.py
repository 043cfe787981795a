"""Well-known ports (the dashboard's 8265, Prometheus's 9090) when they are free, another free one when they are not.

A second Ray or a second orrery run on the same machine holds 8265; Ray then refuses to start
(``ValueError: Failed to bind to 127.0.0.1:8265 because it's already occupied``). Every port orrery opens by default
goes through ``pick_port``, which keeps the usual number when it can (bookmarks keep working) and otherwise takes one
the OS hands out and says so in one line naming the override.
"""
from __future__ import annotations

import logging
import socket

log = logging.getLogger(__name__)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind ``host:port`` now (a listener on 0.0.0.0 or on ``host`` makes it taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def any_free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def pick_port(preferred: int, what: str, override: str, host: str = "127.0.0.1") -> int:
    """``preferred`` if free, else a free port, logged as one warning: ``<what>: port 8265 is taken; using 41231
    instead (<override> to choose one)``. Another process may still take the port before the caller binds it; that
    race is as narrow as Ray's own check."""
    if port_is_free(preferred, host):
        return preferred
    port = any_free_port(host)
    log.warning("%s: port %d is taken; using %d instead (%s to choose one)", what, preferred, port, override)
    return port
