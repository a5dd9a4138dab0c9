"""Runs written by an older version stay usable, and the refactored code computes what the old one
did. The fixtures in tests/fixtures/v1-runs/ were written by the code of commit 3980862, the last
version before records carried a schema version (tests/fixtures/make_v1_runs.py says how):
`complete/` is a whole 3-step toy run, `killed/` the same configuration SIGKILLed at the start of
step 1's train task."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from discover.records import Evaluation, State
from discover.run import TASKS, load_archive, read_evaluations, read_rollouts
from storage.manifest import read_manifest
from storage.tables import SchemaError, read_records, write_records

pytestmark = pytest.mark.slow

V1 = Path(__file__).parent / "fixtures" / "v1-runs"
STEPS = 3
# What a verdict is, without the time it took (which differs between any two runs).
VERDICT = ("child_id", "parent_id", "group", "index", "reward", "valid", "reason", "code", "construction", "metrics", "observation")


def _discover(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _verdicts(path: Path) -> list[tuple]:
    return [tuple(getattr(e, f) for f in VERDICT) for e in read_evaluations(path)]


def assert_same_run(run: Path, reference: Path) -> None:
    """The same rollouts, verdicts, archives and trained adapters, step by step."""
    for step in range(STEPS):
        assert read_rollouts(run / "steps" / f"{step:04d}" / "rollouts.parquet") == read_rollouts(
            reference / "steps" / f"{step:04d}" / "rollouts.parquet"
        ), f"rollouts of step {step} differ"
        assert _verdicts(run / "steps" / f"{step:04d}" / "evaluations.parquet") == _verdicts(
            reference / "steps" / f"{step:04d}" / "evaluations.parquet"
        ), f"evaluations of step {step} differ"
    for step in range(STEPS + 1):
        ours, theirs = load_archive(run / "archive" / f"{step:04d}.parquet"), load_archive(reference / "archive" / f"{step:04d}.parquet")
        assert list(ours.states.values()) == list(theirs.states.values()), f"archive {step} differs"
        assert ours.total_expansions == theirs.total_expansions
        a = load_file(run / "checkpoints" / f"{step:04d}" / "adapter" / "adapter_model.safetensors")
        b = load_file(reference / "checkpoints" / f"{step:04d}" / "adapter" / "adapter_model.safetensors")
        assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a), f"adapter of step {step} differs"


def test_records_written_by_v1_read_with_the_new_fields_at_their_defaults() -> None:
    evaluations = read_evaluations(V1 / "complete" / "steps" / "0000" / "evaluations.parquet")
    assert evaluations and all(isinstance(e, Evaluation) for e in evaluations)
    assert any(e.valid for e in evaluations) and all(e.reward == 0.0 for e in evaluations if not e.valid)
    # version 1 called the candidate's output `logs`; it is read into `observation`
    archive = load_archive(V1 / "complete" / "archive" / "0003.parquet")
    assert all(isinstance(s, State) for s in archive.states.values()) and archive.total_expansions == 6


def test_a_missing_column_takes_its_default_and_a_newer_file_is_refused(tmp_path: Path) -> None:
    @dataclasses.dataclass
    class Old:
        id: str

    @dataclasses.dataclass
    class New:
        SCHEMA_VERSION = 2
        id: str
        score: float = 0.5
        tags: list[str] = dataclasses.field(default_factory=list)

    write_records(tmp_path / "old.parquet", [Old("a"), Old("b")], Old)
    records, meta = read_records(tmp_path / "old.parquet", New)
    assert records == [New("a"), New("b")] and meta["schema_version"] == "1"

    write_records(tmp_path / "new.parquet", [New("a", 1.0)], New)
    with pytest.raises(SchemaError, match="newer"):
        read_records(tmp_path / "new.parquet", Old)

    @dataclasses.dataclass
    class Required:
        id: str
        score: float  # no default: an old file without it cannot be read

    with pytest.raises(SchemaError, match="score"):
        read_records(tmp_path / "old.parquet", Required)


def test_a_run_killed_under_v1_resumes_and_finishes_as_the_uninterrupted_one(tmp_path: Path, cli_env: dict[str, str]) -> None:
    run = tmp_path / "killed"
    shutil.copytree(V1 / "killed", run)
    before = read_manifest(run / "manifest.json")["tasks"]
    assert "1/train" not in before and "1/update_archive" in before  # killed at the start of step 1's train

    resumed = _discover(["resume", str(run)], tmp_path, cli_env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    tasks = read_manifest(run / "manifest.json")["tasks"]
    assert all(f"{step}/{t}" in tasks for step in range(STEPS) for t in TASKS)
    assert_same_run(run, V1 / "complete")


def test_the_new_code_computes_the_run_v1_computed(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """The same archive, rollouts and adapter as the code before the refactoring, for the toy run
    with a fixed seed; its config.yaml, written by v1 with every default, still loads."""
    config = yaml.safe_load((V1 / "complete" / "config.yaml").read_text())
    config["run_dir"] = str(tmp_path / "fresh")
    (tmp_path / "fresh.yaml").write_text(yaml.safe_dump(config))
    done = _discover(["run", str(tmp_path / "fresh.yaml")], tmp_path, cli_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_run(tmp_path / "fresh", V1 / "complete")
