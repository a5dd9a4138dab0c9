"""A run's local Dask cluster (flows/engines.py `_dask`) listens on the loopback only and serves no
page: no dashboard, no info pages, no metrics, and no fixed port (Dask's scheduler serves its info
pages and metrics on 8787 even without a dashboard, so two runs on one machine clashed; issue 44)."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import psutil

from discover.config import parse_config
from discover.evaluation import Resources
from flows import engines
from tests.conftest import tiny_toy_config


def _listening() -> set[tuple[str, int]]:
    me = psutil.Process()
    ports = set()
    for p in [me, *me.children(recursive=True)]:
        try:
            for c in p.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN:
                    ports.add((c.laddr.ip, c.laddr.port))
        except psutil.Error:
            pass
    return ports


def _page(ip: str, port: int, path: str) -> str:
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}{path}", timeout=5) as answer:
            return f"served {answer.status}"
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}"
    except Exception as err:  # noqa: BLE001  (a Dask comm port is not HTTP)
        return type(err).__name__


def test_the_local_dask_cluster_serves_no_page_and_no_fixed_port(tmp_path: Path) -> None:
    config = parse_config({**tiny_toy_config(tmp_path / "run", steps=1), "evaluation": {"runner": "dask", "workers": 1}})
    before = _listening()
    with engines._dask(config, Resources(cpus=1, memory_mb=1, gpus=0)) as address:
        opened = _listening() - before
        pages = {(port, path): _page(ip, port, path) for ip, port in opened for path in ("/info/main/workers.html", "/metrics", "/status")}
    assert address.startswith("tcp://127.0.0.1:")
    assert opened and all(ip == "127.0.0.1" for ip, _ in opened), opened
    assert 8787 not in {port for _, port in opened}
    served = {where: what for where, what in pages.items() if what.startswith("served")}
    assert not served and any(what == "HTTP 404" for what in pages.values()), pages  # its HTTP servers answer, with nothing
