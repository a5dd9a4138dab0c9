"""Production shape on one machine: a real Prefect server, deployments from prefect.yaml, workers.

One test, in order: a server on loopback on PostgreSQL (Debian's server, a throwaway cluster;
docs/operations.md says why not SQLite) with authentication on (a request without the credentials
is refused; the CLI, the workers and the deployments carry them); `discover setup` (pools, limits,
the recovery automations) and every deployment of prefect.yaml; a process worker completes a
three-step toy run, named after its run directory, whose logs on the server hold the project's
progress lines; a second run is killed three times with no command typed afterwards: its flow
process alone (the worker reports the crash, twice), then its worker with it (no report: the
heartbeat automation notices), then its flow process alone again. Each time the automations start
exactly one new attempt, never while an earlier process of the run lives (RUN_DIR/writers.jsonl
counts them), and the run finishes with every task executed once, the archive of the uninterrupted
run and no task run left RUNNING; `discover schedule` gives a run a minutely re-evaluation, whose
scheduled flow run completes on a GPU pool's worker and writes its table. Every process group
started here is killed in a finally block.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from discover.run import TASKS
from storage.lease import read_writers
from storage.manifest import read_manifest
from tests.conftest import SERVER_STARTUP_TIMEOUT_S, free_port, tiny_toy_config
from tests.conftest import archive_records as read_archive
from tests.postgres import postgres_database

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
V1_COMPLETE = REPO / "tests" / "fixtures" / "v1-runs" / "complete"  # a toy run whose archive holds children
BIN = Path(sys.executable).parent
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# Every wait here is generous for a loaded 2-core machine (the server, its workers, their flow runs
# and a reference CLI run share it, beside other work): a slow machine only makes the test slower.
# A flow run, a held task, or the reference CLI run reaching its state:
RUN_WAIT_S = 900
# No heartbeat for this long marks a flow run crashed here (heartbeats every 30 s; production: 120 s).
SILENCE_S = 60
# One CLI command (`prefect deploy --all`, `discover setup`, ...), each starting a Python interpreter
# that imports Prefect and talks to the server:
COMMAND_TIMEOUT_S = 600
# One HTTP request to the server (SQLite, busy with the workers' flow runs):
HTTP_TIMEOUT_S = 60


STEPS = 3


def _config(run_dir: Path) -> dict:
    return tiny_toy_config(run_dir, seed=3, steps=STEPS)


def _wait(what: str, check: Callable[[], object], timeout: float, logs: Callable[[], str] = lambda: "") -> object:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{logs()[-4000:]}")


def _archive(run_dir: Path) -> list[tuple]:
    records, total = read_archive(run_dir / "archive" / f"{STEPS:04d}.parquet")
    return [(r["id"], r["reward"], r["parent_id"], r["lineage"], r["visits"]) for r in records] + [("T", total)]


class Processes:
    """Processes started in their own session, each with a log file; `kill_all` ends every group."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, tuple[subprocess.Popen, Path]] = {}

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = self.log_dir / f"{name}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = (proc, log)
        return proc

    def log(self, name: str) -> str:
        return self.procs[name][1].read_text(errors="replace") if name in self.procs else ""

    def kill(self, name: str) -> None:
        proc, _ = self.procs[name]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def kill_all(self, api: str) -> None:
        """Every process started here, then the flow runs their workers started (each in a session of
        its own: a killed worker leaves them, calling a server that is gone): those whose
        environment names `api`."""
        for name in list(self.procs):
            self.kill(name)
        mark = f"PREFECT_API_URL={api}".encode()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def test_deployments_workers_automatic_recovery_and_a_schedule_that_fires(tmp_path: Path, tiny_model_cache: Path) -> None:
    with postgres_database() as database:
        _production_shape(tmp_path, tiny_model_cache, database)


def _production_shape(tmp_path: Path, tiny_model_cache: Path, database: str) -> None:
    procs = Processes(tmp_path)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DISCOVER_"))}
    base_env.update(
        {
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DISCOVER_CACHE": str(tiny_model_cache),
            "OMP_NUM_THREADS": "1",
            "PREFECT_WORKER_QUERY_SECONDS": "2",  # workers poll often: the test waits less
        }
    )
    user, password = "discover", secrets.token_urlsafe(16)
    # Clients carry the credentials (docs/operations.md, "Securing the server and the cluster").
    env = dict(base_env, PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_API_URL=api, PREFECT_API_AUTH_STRING=f"{user}:{password}")
    http = httpx.Client(auth=(user, password), timeout=HTTP_TIMEOUT_S)
    for name in ("deployed", "killed"):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(_config(tmp_path / name)))

    def prefect(*args: str, timeout: float = COMMAND_TIMEOUT_S) -> str:
        proc = subprocess.run(
            [str(BIN / "prefect"), "--no-prompt", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert proc.returncode == 0, f"prefect {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout + proc.stderr

    def discover(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        )
        assert proc.returncode == 0, f"discover {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout + proc.stderr

    def run_deployment(name: str, **params: object) -> str:
        out = prefect("deployment", "run", name, "--params", json.dumps(params))
        return re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)

    def flow_run(flow_run_id: str) -> dict:
        return http.get(f"{api}/flow_runs/{flow_run_id}").json()

    def state(flow_run_id: str) -> str:
        try:
            return flow_run(flow_run_id)["state"]["type"]
        except httpx.TimeoutException:  # a server busy on SQLite's lock (the CI run with CPU hogs): ask again
            return ""

    def wait_state(flow_run_id: str, wanted: str, worker: str, timeout: float = RUN_WAIT_S, passing: frozenset = frozenset()) -> None:
        # `passing`: final states the run is expected to leave again (a crashed run the
        # automations reschedule), so meeting one is not the end of the wait.
        final = _wait(
            f"flow run {flow_run_id} to reach {wanted}",
            lambda: (s := state(flow_run_id)) in (TERMINAL - passing) | {wanted} and s,
            timeout,
            lambda: procs.log(worker),
        )
        assert final == wanted, f"flow run {flow_run_id} ended {final}, not {wanted}:\n{procs.log(worker)[-4000:]}"

    try:
        # 1. A server on loopback on PostgreSQL, authentication on, its scheduler looking every
        # few seconds; then pools, limits, automations and deployments.
        server_env = dict(
            env,
            PREFECT_UI_ENABLED="false",
            PREFECT_SERVER_API_AUTH_STRING=f"{user}:{password}",
            PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="5",
            PREFECT_API_DATABASE_CONNECTION_URL=database,
        )
        procs.start("server", [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)], server_env)

        def healthy() -> bool:
            # A server that exited fails at once instead of after the generous wait.
            server = procs.procs["server"][0]
            if server.poll() is not None:
                pytest.fail(f"the Prefect server exited with {server.returncode}:\n{procs.log('server')[-4000:]}")
            try:
                return httpx.get(f"{api}/health", timeout=HTTP_TIMEOUT_S).status_code == 200
            except httpx.HTTPError:
                return False

        _wait("the Prefect server to answer /api/health", healthy, SERVER_STARTUP_TIMEOUT_S, lambda: procs.log("server"))
        assert not (tmp_path / "prefect-home" / "prefect.db").exists()  # no SQLite database beside it
        # Without the credentials, or with wrong ones, the API refuses: over HTTP and from the CLI.
        assert httpx.post(f"{api}/deployments/filter", json={}, timeout=HTTP_TIMEOUT_S).status_code == 401
        assert httpx.post(f"{api}/deployments/filter", json={}, auth=(user, "wrong"), timeout=HTTP_TIMEOUT_S).status_code == 401
        assert http.post(f"{api}/deployments/filter", json={}).status_code == 200
        anonymous = {k: v for k, v in env.items() if k != "PREFECT_API_AUTH_STRING"}
        refused = subprocess.run(
            [str(BIN / "prefect"), "--no-prompt", "work-pool", "ls"],
            cwd=REPO,
            env=anonymous,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        assert refused.returncode != 0 and "401" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
        # The automations notice a run silent for SILENCE_S; the test's is short (heartbeats every 30 s).
        setup = discover("setup", "--silence", str(SILENCE_S))
        assert "discover-crash-silent-runs (created)" in setup and "discover-restart-crashed-runs (created)" in setup, setup
        assert "server telemetry: off" in setup, setup  # as the server section of docs/operations.md starts it
        prefect("deploy", "--all")

        worker_cmd = [str(BIN / "prefect"), "worker", "start", "--pool", "discover-process", "--type", "process"]
        procs.start("worker-1", worker_cmd, env)
        run_a = run_deployment("discovery-run/process", config_path=str(tmp_path / "deployed.yaml"))
        wait_state(run_a, "COMPLETED", "worker-1")
        deployed = tmp_path / "deployed"
        assert len(read_manifest(deployed / "manifest.json")["executions"]) == 5 * STEPS
        assert flow_run(run_a)["name"] == "deployed"  # named after its run directory
        # The project's progress lines are in the flow run's logs on the server, where Prefect users look.
        logs = _wait(
            "the run's logs on the server", lambda: "best state" in (out := prefect("flow-run", "logs", run_a)) and out, RUN_WAIT_S
        )
        assert all(f"step {s + 1}/{STEPS}" in logs for s in range(STEPS)), logs[-3000:]
        # a task's lines are in its step's subflow run, named after the run and the step
        steps_of_a = http.post(f"{api}/flow_runs/filter", json={"flow_runs": {"parent_flow_run_id": {"any_": [run_a]}}}).json()
        assert sorted(r["name"] for r in steps_of_a) == [f"deployed-step-{s}" for s in range(STEPS)], steps_of_a
        step_1 = next(r["id"] for r in steps_of_a if r["name"] == "deployed-step-1")
        assert "step 1 train" in prefect("flow-run", "logs", step_1)

        # The report: Markdown whose pictures exist beside it; artifacts on the server, keyed by the run.
        report = deployed / "report" / "report.md"
        images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report.read_text())
        assert images and all((report.parent / i).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
        keys = {a["key"] for a in http.post(f"{api}/artifacts/filter", json={}).json()}
        assert {k.rsplit("-", 1)[1] for k in keys if k and k.startswith("discover-deployed-")} >= {"steps", "rewards", "report"}

        # 2. A run killed three times inside a step's evaluate task (the task announces itself and
        # waits there until released, tests/faults/sitecustomize.py, on the workers' PYTHONPATH and
        # so on their flow runs'): its flow process alone, as the OOM killer would (the worker
        # reports the crash, twice), at step 0; the worker with it, as a machine that died (no
        # report: the heartbeat automation notices), at step 1; the flow process alone at step 2.
        # No command is typed: each time the automations start it again, and the new attempt
        # reaching the same point shows it resumed; the test then lets it go on.
        procs.kill("worker-1")
        faults = str(Path(__file__).parent / "faults")
        holds = ",".join(f"evaluate:{s}:start" for s in range(STEPS))
        held_env = dict(env, DISCOVER_HOLD_AT=holds, PYTHONPATH=faults)
        procs.start("worker-2", worker_cmd, held_env)
        killed = tmp_path / "killed"
        run_b = run_deployment("discovery-run/process", config_path=str(tmp_path / "killed.yaml"))

        def held_at(step: int, other_than: int = 0, worker: str = "worker-2") -> int:
            """The pid of the process held at step's evaluate task (another than `other_than`)."""

            def check() -> int:
                fields = (killed / ".held").read_text().split(":") if (killed / ".held").is_file() else []
                return int(fields[2]) if fields[:2] == ["evaluate", str(step)] and int(fields[2]) != other_than else 0

            return _wait(f"the run to hold at step {step}'s evaluate", check, RUN_WAIT_S, lambda: procs.log(worker))  # type: ignore[return-value]

        def kill_flow_process(pid: int) -> None:
            # The process worker starts each flow run in a session of its own: this kills it alone.
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

        first = held_at(0)
        kill_flow_process(first)  # kill 1: the flow process alone; worker-2 lives
        assert state(run_b) in ("RUNNING", "CRASHED")

        # 3. (set up while the automations of 2. do their work, a minute or two) A re-evaluation
        # scheduled with `discover schedule`, every minute, runs by itself on a worker of the H100
        # pool. Of a run whose archive certainly holds children (the v1 fixture's): whether the tiny
        # random model writes a valid child in a two-step run depends on the machine's arithmetic.
        rescored = tmp_path / "v1-complete"
        shutil.copytree(V1_COMPLETE, rescored)
        procs.start("gpu-worker", [str(BIN / "prefect"), "worker", "start", "--pool", "gpu-h100", "--type", "process"], env)
        scheduled = discover("schedule", str(rescored), "--pool", "gpu-h100", "--cron", "0 3 * * *", "--top-k", "3")
        assert "reevaluate/v1-complete-gpu-h100 created" in scheduled, scheduled
        scheduled = discover("schedule", str(rescored), "--pool", "gpu-h100", "--cron", "* * * * *", "--top-k", "3")
        assert "reevaluate/v1-complete-gpu-h100 updated" in scheduled, scheduled
        deployment = http.get(f"{api}/deployments/name/reevaluate/v1-complete-gpu-h100").json()
        schedules = [s["schedule"] for s in deployment["schedules"] if s["active"]]
        assert [(s.get("cron"), s.get("timezone")) for s in schedules] == [("* * * * *", "UTC")], schedules
        assert deployment["parameters"] == {"run_dir": str(rescored.resolve()), "top_k": 3, "gpu_limit": "gpu-h100"}

        def completed_scheduled_run() -> str | None:
            runs = http.post(f"{api}/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment["id"]]}}}).json()
            done = [r for r in runs if r["state"]["type"] == "COMPLETED" and r["auto_scheduled"]]
            return done[0]["id"] if done else None

        # 2. (continued) Restarted once by worker-2, the run holds at step 0 again: released, it
        # goes on to step 1, where worker-2 and the flow process die together (kill 2); worker-3
        # takes the restart, holds at step 1 again, goes on to step 2, and loses its flow process
        # (kill 3); the restart after that finishes the run.
        second = held_at(0, other_than=first)
        (killed / ".release-evaluate-0").touch()
        second = held_at(1)
        procs.start("worker-3", worker_cmd, held_env)
        procs.kill("worker-2")
        kill_flow_process(second)
        third = held_at(1, other_than=second, worker="worker-3")
        (killed / ".release-evaluate-1").touch()
        third = held_at(2, worker="worker-3")
        kill_flow_process(third)  # kill 3: worker-3 lives
        fourth = held_at(2, other_than=third, worker="worker-3")
        (killed / ".release-evaluate-2").touch()
        wait_state(run_b, "COMPLETED", "worker-3", passing=frozenset({"CRASHED"}))
        executions = sorted((e["step"], e["task"]) for e in read_manifest(killed / "manifest.json")["executions"])
        assert executions == sorted((s, t) for s in range(STEPS) for t in TASKS), executions
        assert _archive(killed) == _archive(deployed)
        # One restart per kill, each a new process once the one before was dead: four writers in
        # all, none refused and no duplicate attempt of the flow run.
        writers = read_writers(killed)
        assert [(w["outcome"], w["pid"]) for w in writers] == [("writer", p) for p in (first, second, third, fourth)], writers
        states = http.get(f"{api}/flow_run_states/", params={"flow_run_id": run_b}).json()
        restarts = [s for s in states if s["type"] == "SCHEDULED" and "restarted after a crash" in (s["message"] or "")]
        assert len(restarts) == 3, [(s["type"], s["message"]) for s in states]
        # The killed steps' runs end in a final state; each step's subflow is named after the run and the step.
        for step in range(STEPS):
            steps_runs = http.post(f"{api}/flow_runs/filter", json={"flow_runs": {"tags": {"all_": [f"step:{step}"]}}}).json()
            ours = [r for r in steps_runs if any(t.startswith("discover-run:killed-") for t in r["tags"])]
            assert {r["name"] for r in ours} == {f"killed-step-{step}"}, [(r["name"], r["state"]["type"]) for r in ours]
            assert sorted(r["state"]["type"] for r in ours) == ["COMPLETED", "CRASHED"], [(r["name"], r["state"]["type"]) for r in ours]
            live = http.post(
                f"{api}/task_runs/filter",
                json={
                    "flow_runs": {"id": {"any_": [r["id"] for r in ours]}},
                    "task_runs": {"state": {"type": {"any_": ["RUNNING", "PENDING"]}}},
                },
            ).json()
            assert live == [], [(t["name"], t["state"]["type"]) for t in live]

        # 3. (continued) The scheduled re-evaluation has fired and completed by itself.
        _wait("the scheduled re-evaluation to complete", completed_scheduled_run, RUN_WAIT_S, lambda: procs.log("gpu-worker"))
        tables = sorted((rescored / "reevaluations").glob("*-gpu-h100.parquet"))
        assert tables and tables[0].with_suffix(".md").is_file()
        import pyarrow.parquet as pq

        rows = pq.read_table(tables[0]).to_pylist()
        children = [r for r in read_archive(rescored / "archive" / "0003.parquet")[0] if not r["is_seed"]]
        best_first = sorted(children, key=lambda r: -r["reward"])
        assert [r["state_id"] for r in rows] == [c["id"] for c in best_first[:3]]
        assert all(r["valid"] and r["reward"] == pytest.approx(r["archived_reward"]) for r in rows)
        limit = http.get(f"{api}/v2/concurrency_limits/gpu-h100").json()
        assert limit["limit"] == 8 and limit["active_slots"] == 0  # slots taken per candidate, all given back
    finally:
        procs.kill_all(api)
        http.close()
