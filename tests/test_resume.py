"""A run killed with SIGKILL inside its initialisation and inside each of the five tasks resumes to
the same archive (docs/architecture.md, "Retry, cache, resume"). The kills come from tests/faults/sitecustomize.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from discover.run import TASKS, load_archive
from storage.manifest import read_manifest
from tests.conftest import tiny_toy_config

pytestmark = pytest.mark.slow

STEPS = 3
FAULTS = Path(__file__).parent / "faults"  # sitecustomize.py: the kill points


def _config(run_dir: Path) -> dict:
    return tiny_toy_config(run_dir, seed=7, steps=STEPS)


def _discover(args: list[str], env: dict[str, str], crash: str | None = None) -> subprocess.CompletedProcess:
    env = dict(env)
    if crash:
        env["DISCOVER_CRASH_AT"] = crash
        env["PYTHONPATH"] = os.pathsep.join([str(FAULTS), *filter(None, [env.get("PYTHONPATH")])])
    # A new session: the crash hook kills the whole group (the temporary Prefect server included).
    proc = subprocess.run(
        [sys.executable, "-m", "cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    return proc


def _final_archive(run_dir: Path) -> tuple[list[tuple], int]:
    archive = load_archive(run_dir / "archive" / f"{STEPS:04d}.parquet")
    return [
        (s.id, s.reward, s.parent_id, s.lineage, s.visits, s.best_child_reward) for s in archive.states.values()
    ], archive.total_expansions


@pytest.fixture
def env(cli_env: dict[str, str]) -> dict[str, str]:
    return cli_env  # the session's Prefect server: a killed run leaves it running for the resume


def test_sigkill_inside_every_task_then_resume_gives_the_same_archive(tmp_path: Path, env: dict[str, str]) -> None:
    ref_dir, crash_dir = tmp_path / "uninterrupted", tmp_path / "crashed"
    for d in (ref_dir, crash_dir):
        (tmp_path / f"{d.name}.yaml").write_text(yaml.safe_dump(_config(d)))

    done = _discover(["run", str(tmp_path / "uninterrupted.yaml")], env)
    assert done.returncode == 0, done.stderr[-3000:]

    # Kills inside the initialisation (config.yaml written; the seeds written; the initial adapter
    # written but not yet renamed into place), then one inside each task, at its start or after its
    # output is written but before it is recorded; each kill is followed by a resume that dies at
    # the next crash point.
    first = _discover(["run", str(tmp_path / "crashed.yaml")], env, crash="create_run:0:end")
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert (crash_dir / "config.yaml").is_file() and not (crash_dir / "archive").exists()
    crashes = [
        "save_archive:0:end",
        "atomic_dir:0:end",
        "initialise:0:start",
        "select_parents:0:start",
        "generate:0:end",
        "evaluate:1:start",
        "update_archive:1:end",
        "train:2:start",
    ]
    for crash in crashes:
        proc = _discover(["resume", str(crash_dir)], env, crash=crash)
        assert proc.returncode == -signal.SIGKILL, f"no crash at {crash}: {proc.stderr[-3000:]}"
    last = _discover(["resume", str(crash_dir)], env)
    assert last.returncode == 0, last.stderr[-3000:]

    assert _final_archive(crash_dir) == _final_archive(ref_dir)

    # Nothing that had finished ran again: each task of each step finished exactly once.
    executions = [(e["step"], e["task"]) for e in read_manifest(crash_dir / "manifest.json")["executions"]]
    assert sorted(executions) == sorted((s, t) for s in range(STEPS) for t in TASKS)

    # The trained adapters agree too (training is deterministic on CPU for a fixed seed).
    for step in range(STEPS + 1):
        a = (ref_dir / "checkpoints" / f"{step:04d}" / "adapter" / "adapter_model.safetensors").read_bytes()
        b = (crash_dir / "checkpoints" / f"{step:04d}" / "adapter" / "adapter_model.safetensors").read_bytes()
        assert a == b, f"adapter of step {step} differs"

    status = subprocess.run([sys.executable, "-m", "cli", "status", str(crash_dir)], env=env, capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    assert f"{STEPS}/{STEPS} steps" in status.stdout
