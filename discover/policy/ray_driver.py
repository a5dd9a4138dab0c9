"""The Ray connection a step's process drives the cluster's actors through (replicas, trainer ranks)."""

from __future__ import annotations

from typing import Any


def connected_ray(setting: str) -> Any:
    """The `ray` module, connected: the run's flow opened the connection (flows/engines.py
    `ray_connection`). `setting` names the configuration that needs Ray, for the errors."""
    try:
        import ray
    except ImportError:
        raise ValueError(f"{setting} needs the `ray` extra: pip install 'ttt-discover[ray]'") from None
    if not ray.is_initialized():
        raise RuntimeError(
            f"{setting}: Ray is not initialised in this process; the run flow connects to the cluster "
            "(flows/engines.py `ray_connection`), so run the step inside `discover run` or `discovery_run`"
        )
    return ray


def loopback_host(address: str) -> str | None:
    """The host of an address on the loopback (127/8): the cluster's nodes are on this machine, and
    the driver joins them under that address (Ray would otherwise look for a node at the machine's
    routable address). None for any other address."""
    host = address.removeprefix("ray://").rsplit(":", 1)[0]
    return host if host.startswith("127.") else None
