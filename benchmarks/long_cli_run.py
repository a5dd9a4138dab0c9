"""A CLI run of several minutes beside `discover setup`'s automations: is it ever marked crashed?

    python benchmarks/long_cli_run.py [--hold-minutes 6.5] [--steps 3] [--out benchmarks/results]

Prefect's flow runs send a heartbeat every 180 s unless told otherwise, and `discover setup`'s
silence automation marks a run CRASHED after 120 s without one (its restart automation then
schedules a second attempt). The CLI sets 30 s for the runs it starts (cli/app.py). This starts a
Prefect server on PostgreSQL (a throwaway cluster of Debian's server, as tests/postgres.py starts
one), runs `discover setup` with its default silence, then `discover run` on a toy configuration
whose `generate` of step 1 is held for `--hold-minutes` (tests/faults/sitecustomize.py
DISCOVER_HOLD_AT: one task far longer than the silence, the case where a missing heartbeat shows),
and reads the flow run's whole state history from the server afterwards. Writes long_cli_run.json
and long_cli_run.md to `--out`: the run's length, its states in order, how many were CRASHED, its
run_count and the heartbeat events the server recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import free_port, tiny_toy_config  # noqa: E402
from tests.postgres import postgres_database  # noqa: E402

BIN = Path(sys.executable).parent
HOLD = "generate:1:start"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hold-minutes", type=float, default=6.5, help="how long generate of step 1 is held")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="discover-long-cli-"))
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DISCOVER_"))}
    env.update(
        PREFECT_HOME=str(work / "prefect-home"),
        PREFECT_API_URL=api,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DISCOVER_CACHE=str(work / "cache"),
        OMP_NUM_THREADS="1",
    )
    procs: list[subprocess.Popen] = []
    with postgres_database() as database:
        try:
            with open(work / "server.log", "w") as log:
                procs.append(
                    subprocess.Popen(
                        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                        env={**env, "PREFECT_UI_ENABLED": "false", "PREFECT_API_DATABASE_CONNECTION_URL": database},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            deadline = time.monotonic() + 600
            while True:
                try:
                    if httpx.get(f"{api}/health", timeout=10).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the Prefect server did not start")
                time.sleep(1)
            setup = subprocess.run([sys.executable, "-m", "cli", "setup"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
            if setup.returncode != 0:
                raise SystemExit(f"discover setup failed:\n{setup.stdout}{setup.stderr}")
            automations = [line for line in setup.stdout.splitlines() if line.startswith("automation")]
            run_dir = work / "long"
            (work / "long.yaml").write_text(yaml.safe_dump(tiny_toy_config(run_dir, seed=5, steps=args.steps)))
            held_env = {**env, "PYTHONPATH": str(REPO / "tests" / "faults"), "DISCOVER_HOLD_AT": HOLD}
            started = time.monotonic()
            with open(work / "run.log", "w") as log:
                run = subprocess.Popen(
                    [sys.executable, "-m", "cli", "run", str(work / "long.yaml")],
                    cwd=REPO,
                    env=held_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            procs.append(run)
            while not (run_dir / ".held").is_file():
                if run.poll() is not None:
                    raise SystemExit(f"the run ended before its hold:\n{(work / 'run.log').read_text()[-3000:]}")
                time.sleep(1)
            held_at = time.monotonic()
            print(f"held at {HOLD} after {held_at - started:.0f} s; releasing in {args.hold_minutes:g} minutes", flush=True)
            time.sleep(args.hold_minutes * 60)
            (run_dir / ".release").touch()
            rc = run.wait(timeout=1800)
            seconds = time.monotonic() - started
            (flow_run,) = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": {"name": {"any_": ["long"]}}}, timeout=60).json()
            history = httpx.get(f"{api}/flow_run_states/", params={"flow_run_id": flow_run["id"]}, timeout=60).json()
            events = httpx.post(
                f"{api}/events/filter",
                json={
                    "filter": {
                        "event": {"name": ["prefect.flow-run.heartbeat"]},
                        "resource": {"id": [f"prefect.flow-run.{flow_run['id']}"]},
                    }
                },
                timeout=60,
            )
            heartbeats = len(events.json().get("events", [])) if events.status_code == 200 else None
        finally:
            for proc in procs:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    doc = {
        "exit_code": rc,
        "run_seconds": round(seconds, 1),
        "held_seconds": round(args.hold_minutes * 60, 1),
        "automations": automations,
        "states": [s["type"] for s in sorted(history, key=lambda s: s["timestamp"])],
        "crashed": sum(1 for s in history if s["type"] == "CRASHED"),
        "run_count": flow_run["run_count"],
        "heartbeat_events": heartbeats,
        "final_state": flow_run["state"]["type"],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "long_cli_run.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = "\n".join(
        [
            "# A CLI run of several minutes beside discover setup's automations",
            "",
            "`python benchmarks/long_cli_run.py` (the module says what it does). One run, one machine (2 cores).",
            "",
            f"- `discover run` on the toy, {args.steps} steps, its generate of step 1 held {args.hold_minutes:g} minutes: "
            f"exit code {doc['exit_code']}, {doc['run_seconds']:.0f} s in all",
            f"- automations (`discover setup`, default silence): {'; '.join(a.removeprefix('automation ') for a in automations)}",
            f"- the flow run's states in order: {' -> '.join(doc['states'])}; CRASHED {doc['crashed']} times; run_count {doc['run_count']}",
            f"- heartbeat events the server recorded for it: {doc['heartbeat_events']}",
            "",
        ]
    )
    (args.out / "long_cli_run.md").write_text(md)
    print(md)
    return 0 if rc == 0 and doc["crashed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
