"""A run directory that runs out of space (issue 44): the run stops with one line naming the
directory, what was being written, the free space and the fix; it is not retried meanwhile (nothing
changes until space is freed); and once space is freed, `discover resume` ends with the archive of
an uninterrupted run."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from discover.run import load_archive
from storage import atomic
from storage.atomic import DiskFull, atomic_write_json
from tests.conftest import tiny_toy_config

STEPS = 3


def test_a_write_that_finds_no_space_says_where_what_how_much_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(DiskFull) as raised:
        atomic_write_json(tmp_path / "steps" / "0003" / "rollouts.json", {"a": 1})
    text = str(raised.value)
    assert "\n" not in text and f"no space left in {tmp_path / 'steps' / '0003'} while writing rollouts.json" in text
    assert "MiB free there" in text and "discover resume RUN_DIR" in text
    assert [p.name for p in (tmp_path / "steps" / "0003").iterdir()] == []  # no temporary left behind


def _final_archive(run_dir: Path) -> list[tuple]:
    archive = load_archive(run_dir / "archive" / f"{STEPS:04d}.parquet")
    return [(s.id, s.reward, s.parent_id, s.visits) for s in archive.states.values()]


def _discover(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], env=env, capture_output=True, text=True, timeout=900)


def test_a_run_on_a_full_file_system_stops_with_one_line_and_resumes_once_space_is_freed(tmp_path: Path, cli_env: dict[str, str]) -> None:
    if os.geteuid() != 0:  # mounting a small file system needs root, which CI has
        if os.environ.get("CI"):
            pytest.fail("this test mounts a tmpfs: CI runs as root")
        pytest.skip("mounting a tmpfs needs root")
    ref_dir, small = tmp_path / "uninterrupted", tmp_path / "small"
    small.mkdir()
    run_dir = small / "run"
    for d in (ref_dir, run_dir):
        (tmp_path / f"{d.name}.yaml").write_text(yaml.safe_dump(tiny_toy_config(d, seed=5, steps=STEPS)))
    done = _discover(["run", str(tmp_path / "uninterrupted.yaml")], cli_env)
    assert done.returncode == 0, done.stderr[-3000:]
    used = sum(p.stat().st_size for p in ref_dir.rglob("*") if p.is_file())
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={used // 2}", "discover-test-full", str(small)], check=True)
    try:
        full = _discover(["run", str(tmp_path / "run.yaml")], cli_env)
        assert full.returncode != 0
        last = full.stderr.strip().splitlines()[-1]
        assert last.startswith("error: no space left in ") and str(run_dir) in last and "discover resume RUN_DIR" in last, full.stderr[
            -3000:
        ]
        assert "Traceback" not in full.stderr, full.stderr[-3000:]
        assert "Retrying" not in full.stderr and "AwaitingRetry" not in full.stderr  # nothing changes until space is freed
        subprocess.run(["mount", "-o", f"remount,size={used * 4}", str(small)], check=True)  # space freed
        resumed = _discover(["resume", str(run_dir)], cli_env)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert _final_archive(run_dir) == _final_archive(ref_dir)
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_a_damaged_manifest_is_one_line_in_status_and_resume(tmp_path: Path) -> None:
    """A truncated manifest.json (damage from outside: the project's writes are atomic) is named in
    one line by `discover status` and `discover resume`, with what to do, never a traceback."""
    from typer.testing import CliRunner

    from cli.app import app
    from discover import steps
    from discover.config import parse_config

    run = steps.create_run(parse_config(tiny_toy_config(tmp_path / "run", steps=1)))
    manifest = run.layout.manifest
    atomic_write_json(manifest, {"tasks": {"0/select_parents": {"step": 0}}, "executions": []})
    manifest.write_text(manifest.read_text()[:25])  # cut mid-record
    for args in (["status", str(run.root)], ["resume", str(run.root)]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code != 0, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and f"{manifest} is damaged" in lines[0] and "put back a copy" in lines[0], result.output
        assert "Traceback" not in result.output
