"""The restart automation on a real Prefect server, fed the flow-run states a run goes through.

One server (on PostgreSQL), three `discovery-run` flow runs set through the REST API as their processes would:

- **a false crash, then a real one.** CRASHED (a server outage swallowed the heartbeats), RUNNING
  again (the live process came back), and 20 s later CRASHED for real (the process died). The real
  crash must be restarted, once. (The soak run of benchmarks/soak.py found it was not: the false
  crash's window, already answered by the RUNNING, swallowed the real report.)
- **a false crash alone.** CRASHED then RUNNING: never restarted (the process lives).
- **a crash just after a restart of the server** of a run that was RUNNING just before it: restarted
  after RESTART_DELAY_S (Prefect's default event ordering holds such a report back 15 minutes, and
  then its window is long closed: never restarted) (flows/event_ordering.py, which the server runs with, as docs/operations.md starts one).

The restart happens RESTART_DELAY_S after the report, checked by the server's proactive evaluation;
the waits are generous for a loaded machine (a slow machine makes the test slower, not failing).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flows.recovery import RESTART_CRASHED, RESTART_DELAY_S
from tests.conftest import start_prefect_server
from tests.postgres import postgres_database

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
RESTART_WAIT_S = 600  # the restart's RESTART_DELAY_S plus whatever a loaded server adds
RESTARTED = f"restarted after a crash (automation {RESTART_CRASHED})"


def test_real_crashes_are_restarted_once_after_a_false_one_and_after_a_server_restart_and_false_ones_never(tmp_path: Path) -> None:
    with postgres_database() as database:  # as in production (docs/operations.md: SQLite locks under the triggers' writes)
        _crashes(tmp_path, database)


def _crashes(tmp_path: Path, database: str) -> None:
    home = tmp_path / "server-home"
    home.mkdir()
    server = start_prefect_server(home, database=database)
    api = server["api"]
    port = int(api.rsplit(":", 1)[1].split("/")[0])
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(PREFECT_API_URL=api, PREFECT_HOME=str(tmp_path / "client-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
        made = subprocess.run(
            [sys.executable, "-c", "from flows.recovery import ensure_automations; print(ensure_automations())"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert made.returncode == 0 and RESTART_CRASHED in made.stdout, made.stdout + made.stderr
        with httpx.Client(base_url=api, timeout=60) as http:
            flow = http.post("/flows/", json={"name": "discovery-run"}).json()["id"]

            def new_run(name: str) -> str:
                created = http.post("/flow_runs/", json={"flow_id": flow, "name": name, "state": {"type": "RUNNING"}})
                assert created.status_code in (200, 201), created.text
                return created.json()["id"]

            def set_state(run: str, kind: str, message: str) -> None:
                done = http.post(f"/flow_runs/{run}/set_state", json={"state": {"type": kind, "message": message}, "force": True})
                assert done.status_code in (200, 201) and done.json()["status"] == "ACCEPT", done.text

            def restarts(run: str) -> int:
                history = http.get("/flow_run_states/", params={"flow_run_id": run})
                return sum(1 for s in history.json() if s["type"] == "SCHEDULED" and (s["message"] or "").startswith(RESTARTED))

            def restarted_once(run: str, crashed_at: float) -> None:
                deadline = crashed_at + RESTART_WAIT_S
                while restarts(run) == 0:
                    assert time.monotonic() < deadline, (
                        f"the crash of {run} was not restarted within {RESTART_WAIT_S} s\n"
                        + Path(server["log"]).read_text(errors="replace")[-3000:]
                    )
                    time.sleep(2)
                assert time.monotonic() - crashed_at >= RESTART_DELAY_S - 5, "restarted before the run could show a sign of life"

            # 1. a false crash, then a real one; and a false one alone
            real, false_only = new_run("false-then-real"), new_run("false-only")
            for run in (real, false_only):
                set_state(run, "CRASHED", "no heartbeat for 300 s (a server outage)")
            time.sleep(5)
            for run in (real, false_only):
                set_state(run, "RUNNING", "its process is alive")
            time.sleep(20)  # well inside the false crash's RESTART_DELAY_S window
            set_state(real, "CRASHED", "its process died")
            restarted_once(real, time.monotonic())
            time.sleep(RESTART_DELAY_S + 15)  # a second window would have closed by now
            assert restarts(real) == 1
            assert restarts(false_only) == 0
            assert http.get(f"/flow_runs/{false_only}").json()["state"]["type"] == "RUNNING"

            # 2. a run that was RUNNING before a restart of the server crashes just after it: its
            # Crashed event follows an event the new server process never saw (flows/event_ordering.py)
            after_restart = new_run("crashed-after-a-server-restart")
            os.killpg(server["pgid"], signal.SIGKILL)
            time.sleep(5)
            server = start_prefect_server(home, port, database=database)  # the same database, the same address
            set_state(after_restart, "CRASHED", "its process died while the server was away")
            restarted_once(after_restart, time.monotonic())
    finally:
        os.killpg(server["pgid"], signal.SIGKILL)
