"""A run directory has one writer (docs/runs.md, "One writer"; storage/lease.py, flows/writer.py).

While one process works on a run, a second `discover resume` or `discover run` of it writes nothing
and says who holds it (host, pid, flow run), without cancelling the live one's flow run; a duplicate
attempt of the same flow run (a crash reported twice, restarted twice) ends at once without a state;
a flow run cancelled on the server stops at the next task boundary, and resumes later, and a second
resume of a resuming run is refused. Each run ends
with every task executed once and the archive of an uninterrupted run. The holds come from
tests/faults/sitecustomize.py (DISCOVER_HOLD_AT, released by RUN_DIR/.release).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
import yaml

from discover.run import TASKS
from storage.lease import RunBusy, acquire, read_holder, read_writers, this_process
from storage.manifest import read_manifest
from tests.conftest import archive_records, tiny_toy_config

FAULTS = Path(__file__).parent / "faults"
REPO = Path(__file__).resolve().parents[1]
WAIT_S = 600  # for a held run to reach its hold, or to finish, on a loaded machine


def test_the_lease_names_its_holder_and_is_released_when_the_holder_is_killed(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from storage.lease import acquire, this_process\n"
            f"lease = acquire({str(tmp_path)!r}, this_process(flow_run_name='brave-cat', flow_run_id='f00d'))\n"
            "print('held', flush=True); time.sleep(600)",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunBusy) as busy:
            acquire(tmp_path, this_process(), wait_s=0.5)
        message = str(busy.value)
        assert f"pid {holder.pid} on " in message and "flow run brave-cat f00d" in message, message
        assert busy.value.holder["pid"] == holder.pid
        holder.send_signal(signal.SIGKILL)  # as the OOM killer would: nothing is cleaned up
        holder.wait(timeout=30)
        with acquire(tmp_path, this_process(command="test")) as lease:  # the kernel released it
            assert read_holder(tmp_path)["pid"] == os.getpid() == lease.holder["pid"]
        assert read_holder(tmp_path) == {}
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_lease_waits_for_a_holder_that_lets_go(tmp_path: Path) -> None:
    first = acquire(tmp_path, this_process(command="first"))
    seen: list[dict] = []
    import threading

    threading.Timer(1.0, first.release).start()
    with acquire(tmp_path, this_process(command="second"), wait_s=60, on_wait=seen.append) as second:
        assert second.holder["command"] == "second"
    assert seen and seen[0]["command"] == "first"


# -- whole runs under the CLI, on the session's Prefect server --------------------------------------


def _discover(args: list[str], env: dict[str, str], **extra: str) -> subprocess.Popen:
    env = dict(env, PYTHONPATH=str(FAULTS), **extra)
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, err = proc.communicate(timeout=WAIT_S)
    return proc.returncode, out + err


def _wait_held(run_dir: Path, proc: subprocess.Popen) -> int:
    deadline = time.monotonic() + WAIT_S
    while not (run_dir / ".held").is_file():
        if proc.poll() is not None:
            pytest.fail(f"the held run ended with {proc.returncode}: {proc.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, "the run never reached its hold"
        time.sleep(0.2)
    return int((run_dir / ".held").read_text().split(":")[2])


def _release(run_dir: Path) -> None:
    (run_dir / ".release").touch()


def _executions(run_dir: Path) -> list[tuple[int, str]]:
    return sorted((e["step"], e["task"]) for e in read_manifest(run_dir / "manifest.json")["executions"])


def _flow_runs(api: str, run_dir: Path) -> list[dict]:
    found = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": {"name": {"any_": [run_dir.name]}}}, timeout=60).json()
    return sorted(found, key=lambda r: r["created"])


def _set_state(api: str, flow_run_id: str, state: str) -> None:
    answer = httpx.post(
        f"{api}/flow_runs/{flow_run_id}/set_state", json={"state": {"type": state, "message": "set by the test"}, "force": True}, timeout=60
    )
    assert answer.status_code in (200, 201), answer.text


@pytest.mark.slow
def test_one_writer_per_run_directory(tmp_path: Path, cli_env: dict[str, str], prefect_server: str) -> None:
    def config(name: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(tiny_toy_config(tmp_path / name, seed=11)))
        return path

    every_task_once = sorted((s, t) for s in range(2) for t in TASKS)
    code, out = _finish(_discover(["run", str(config("uninterrupted"))], cli_env))
    assert code == 0, out[-3000:]
    reference = archive_records(tmp_path / "uninterrupted" / "archive" / "0002.parquet")

    # 1. run, then resume and run again while it works: neither writes, both name the holder, and
    # neither cancels the live run's flow run.
    busy_dir = tmp_path / "busy"
    first = _discover(["run", str(config("busy"))], cli_env, DISCOVER_HOLD_AT="evaluate:1:start")
    pid = _wait_held(busy_dir, first)
    for args in (["resume", str(busy_dir)], ["run", str(tmp_path / "busy.yaml")]):
        code, out = _finish(_discover(args, cli_env, DISCOVER_LEASE_WAIT_S="2"))
        assert code != 0 and f"is being worked on by pid {pid} on " in out and "flow run busy" in out, out[-3000:]
    assert [r["state_type"] for r in _flow_runs(prefect_server, busy_dir)][0] == "RUNNING"
    _release(busy_dir)
    code, out = _finish(first)
    assert code == 0, out[-3000:]
    assert "superseded" not in out and [r["state_type"] for r in _flow_runs(prefect_server, busy_dir)] == ["COMPLETED", "FAILED", "FAILED"]
    assert _executions(busy_dir) == every_task_once
    assert archive_records(busy_dir / "archive" / "0002.parquet") == reference
    assert [(w["outcome"], w["pid"] == pid) for w in read_writers(busy_dir)] == [("writer", True), ("refused", False), ("refused", False)]

    # 2. A duplicate attempt of the same flow run, as a worker starts it when one crash is reported
    # twice (the server set it CRASHED, the restart automation SCHEDULED): it ends at once, exit 0,
    # with no state of its own; the live process sets its flow run RUNNING again at its next task.
    dup_dir = tmp_path / "duplicate"
    live = _discover(["run", str(config("duplicate"))], cli_env, DISCOVER_HOLD_AT="evaluate:1:start")
    _wait_held(dup_dir, live)
    (flow_run,) = _flow_runs(prefect_server, dup_dir)
    _set_state(prefect_server, flow_run["id"], "CRASHED")
    _set_state(prefect_server, flow_run["id"], "SCHEDULED")
    script = textwrap.dedent(
        f"""
        from prefect.client.orchestration import get_client
        from prefect.engine import handle_engine_signals
        from prefect.flow_engine import run_flow
        from flows.run_flow import discovery_run
        with get_client(sync_client=True) as client:
            flow_run = client.read_flow_run({flow_run["id"]!r})
        with handle_engine_signals(flow_run.id):  # what `prefect flow-run execute` does on a worker
            run_flow(discovery_run, flow_run=flow_run, parameters=flow_run.parameters)
        """
    )
    env = dict(cli_env, PREFECT_LOGGING_LEVEL="INFO")
    duplicate = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=WAIT_S)
    assert duplicate.returncode == 0, duplicate.stderr[-3000:]
    assert "this duplicate attempt" in duplicate.stdout + duplicate.stderr, duplicate.stderr[-3000:]
    _set_state(prefect_server, flow_run["id"], "CRASHED")  # a late report, while the live process holds the run
    _release(dup_dir)
    code, out = _finish(live)
    assert code == 0, out[-3000:]
    assert "set RUNNING again" in out, out[-3000:]
    assert [r["state_type"] for r in _flow_runs(prefect_server, dup_dir)] == ["COMPLETED"]
    assert [w["outcome"] for w in read_writers(dup_dir)] == ["writer", "duplicate"]
    assert _executions(dup_dir) == every_task_once
    assert archive_records(dup_dir / "archive" / "0002.parquet") == reference

    # 3. Cancelled on the server while its process (started by no worker) works: it stops before its
    # next task, CANCELLED, and a resume finishes the run as if nothing happened.
    cancel_dir = tmp_path / "cancelled"
    cancelled = _discover(["run", str(config("cancelled"))], cli_env, DISCOVER_HOLD_AT="evaluate:1:start")
    _wait_held(cancel_dir, cancelled)
    (flow_run,) = _flow_runs(prefect_server, cancel_dir)
    _set_state(prefect_server, flow_run["id"], "CANCELLING")  # what `prefect flow-run cancel` and the UI do
    _release(cancel_dir)
    code, out = _finish(cancelled)
    assert code != 0 and "was cancelled; stopped before update_archive of step 1" in out, out[-3000:]
    assert [r["state_type"] for r in _flow_runs(prefect_server, cancel_dir)] == ["CANCELLED"]
    assert (1, "update_archive") not in _executions(cancel_dir)
    (cancel_dir / ".release").unlink()
    (cancel_dir / ".held").unlink()
    # 4. resume, then resume again while the first works: the second is refused, naming the first
    # and a cancel after the resumed run's last task boundary (it holds inside train of the last step)
    # stops nothing: the run completes and its flow run is COMPLETED, not marked cancelled
    resumed = _discover(["resume", str(cancel_dir)], cli_env, DISCOVER_HOLD_AT="train:1:start")
    pid = _wait_held(cancel_dir, resumed)
    code, out = _finish(_discover(["resume", str(cancel_dir)], cli_env, DISCOVER_LEASE_WAIT_S="2"))
    assert code != 0 and f"is being worked on by pid {pid} on " in out, out[-3000:]
    (late,) = [r for r in _flow_runs(prefect_server, cancel_dir) if r["state_type"] == "RUNNING"]
    _set_state(prefect_server, late["id"], "CANCELLING")
    _release(cancel_dir)
    code, out = _finish(resumed)
    assert code == 0, out[-3000:]
    assert "was cancelled after its last task" in out, out[-3000:]
    assert [r["state_type"] for r in _flow_runs(prefect_server, cancel_dir) if r["id"] == late["id"]] == ["COMPLETED"]
    assert [w["outcome"] for w in read_writers(cancel_dir)] == ["writer", "writer", "refused"]
    assert _executions(cancel_dir) == every_task_once
    assert archive_records(cancel_dir / "archive" / "0002.parquet") == reference

    # 5. A copy of a live run directory (`cp -a`) resumed while the original works: the copy is a
    # writer of its own (its own writer.lock) that never touches the original's flow run, and the
    # original completes untouched; both archives are an uninterrupted run's.
    live_dir, copy_dir = tmp_path / "live", tmp_path / "copied" / "live"
    live = _discover(["run", str(config("live"))], cli_env, DISCOVER_HOLD_AT="evaluate:1:start")
    _wait_held(live_dir, live)
    (original,) = _flow_runs(prefect_server, live_dir)
    shutil.copytree(live_dir, copy_dir, symlinks=True)
    (copy_dir / ".held").unlink()  # the test's own marker, not the run's
    code, out = _finish(_discover(["resume", str(copy_dir)], cli_env))
    assert code == 0 and "superseded" not in out, out[-3000:]
    assert [r["state_type"] for r in _flow_runs(prefect_server, live_dir) if r["id"] == original["id"]] == ["RUNNING"]
    _release(live_dir)
    code, out = _finish(live)
    assert code == 0, out[-3000:]
    assert [r["state_type"] for r in _flow_runs(prefect_server, live_dir) if r["id"] == original["id"]] == ["COMPLETED"]
    for run_dir in (live_dir, copy_dir):
        assert _executions(run_dir) == every_task_once, run_dir
        assert archive_records(run_dir / "archive" / "0002.parquet") == reference, run_dir
