"""A Prefect server restart is an ordinary event (issue 44, flows/server_api.py): a run started by
the CLI rides through OUTAGE_S_HERE of no server at all (the server SIGKILLed mid-run, started again
on the same database and port) with no command typed, each task executed once, and ends with the
archive of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from discover.run import TASKS, load_archive
from storage.manifest import read_manifest
from tests.conftest import start_prefect_server, tiny_toy_config

pytestmark = pytest.mark.slow

STEPS = 4
OUTAGE_S_HERE = 60  # longer than Prefect's own retries (5: about a minute) would carry a new client
MARK = f"step 3/{STEPS}"  # the server goes away once the run has begun its third step


def _final_archive(run_dir: Path) -> tuple[list[tuple], int]:
    archive = load_archive(run_dir / "archive" / f"{STEPS:04d}.parquet")
    return [(s.id, s.reward, s.parent_id, s.lineage, s.visits) for s in archive.states.values()], archive.total_expansions


def test_a_cli_run_rides_through_a_prefect_server_restart(tmp_path: Path, tiny_model_cache: Path) -> None:
    home = tmp_path / "server-home"
    home.mkdir()
    server = start_prefect_server(home)
    port = int(server["api"].rsplit(":", 1)[1].split("/")[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DISCOVER_"))}
    env.update(
        PREFECT_API_URL=server["api"],
        PREFECT_HOME=str(tmp_path / "client-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DISCOVER_CACHE=str(tiny_model_cache),
    )
    ref_dir, run_dir = tmp_path / "uninterrupted", tmp_path / "restarted"
    for d in (ref_dir, run_dir):
        (tmp_path / f"{d.name}.yaml").write_text(yaml.safe_dump(tiny_toy_config(d, seed=3, steps=STEPS)))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "cli", "run", str(tmp_path / "uninterrupted.yaml")], env=env, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, done.stderr[-3000:]

        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "run", str(tmp_path / "restarted.yaml")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        lines: list[str] = []
        reached = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if MARK in line:
                    reached.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert reached.wait(600), "".join(lines)[-3000:]
        os.killpg(server["pgid"], signal.SIGKILL)  # the server and its database connections, at once
        time.sleep(OUTAGE_S_HERE)
        assert proc.poll() is None, "the run ended while the server was away: " + "".join(lines)[-3000:]
        server = start_prefect_server(home, port)  # the same database, the same address
        rc = proc.wait(timeout=900)
        reader.join(timeout=30)
        out = "".join(lines)
        assert rc == 0, out[-4000:]
        # (who waited, Prefect's retrying client or the run's own wait that says so, depends on which call met the outage)
    finally:
        if proc.poll() is None if "proc" in locals() else False:
            os.killpg(proc.pid, signal.SIGKILL)
        os.killpg(server["pgid"], signal.SIGKILL)

    assert _final_archive(run_dir) == _final_archive(ref_dir)
    executions = [(e["step"], e["task"]) for e in read_manifest(run_dir / "manifest.json")["executions"]]
    assert sorted(executions) == sorted((s, t) for s in range(STEPS) for t in TASKS)  # nothing ran twice
