"""A task the manifest records as finished never runs again, whatever changed in the code since;
`discover resume --redo-from STEP` is the one way to recompute on purpose; and a step opens its
run once (docs/operations.md, "Upgrading during a run")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from discover import run as run_module
from discover import steps
from discover.config import parse_config
from discover.run import TASKS, Run, RunDirError, read_evaluations
from storage.atomic import content_hash
from storage.manifest import read_manifest
from tests.conftest import tiny_toy_config

pytestmark = pytest.mark.slow


def _executions(run: Run) -> list[tuple[int, str]]:
    return [(e["step"], e["task"]) for e in read_manifest(run.layout.manifest)["executions"]]


def _outputs(run: Run) -> tuple[dict[str, str], list[tuple]]:
    """The content hash of each output of step 0 but the evaluations, and the evaluations' verdicts
    (an evaluation also records the seconds it took, which differ between any two runs)."""
    hashes = {t: content_hash(run.writes(t, 0)) for t in TASKS if t != "evaluate"}
    verdicts = [(e.child_id, e.reward, e.valid, e.reason, e.code) for e in read_evaluations(run.layout.evaluations(0))]
    return hashes, verdicts


@pytest.fixture(scope="module")
def step0(tmp_path_factory: pytest.TempPathFactory, tiny_model_cache: Path, prefect_api: str) -> Path:
    """A toy run whose step 0 ran through the step flow (every task recorded in the manifest)."""
    from flows import tasks
    from flows.step_flow import discovery_step

    config = parse_config(tiny_toy_config(tmp_path_factory.mktemp("finished") / "run", steps=2))
    run = steps.create_run(config)
    tasks.initialise.fn(run)  # as the run flow does: written, and recorded in the manifest
    discovery_step(str(run.root), 0)
    return run.root


@pytest.fixture
def run(step0: Path, tmp_path: Path) -> Run:
    shutil.copytree(step0, tmp_path / "run")
    return Run.open(tmp_path / "run")


def test_a_finished_task_is_not_run_again_when_the_code_changed(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """After an upgrade the step functions are other code: the tasks the manifest records are still
    not executed again, and their outputs stay as they were."""
    from discover import steps
    from flows.step_flow import discovery_step

    def later_release(*args: object, **kwargs: object) -> None:
        raise AssertionError("a task the manifest records as finished ran again")

    for name in TASKS:
        monkeypatch.setitem(steps.STEP_FUNCTIONS, name, later_release)
    before = _executions(run)
    outputs = {t: content_hash(run.writes(t, 0)) for t in TASKS}

    refs = discovery_step(str(run.root), 0)
    assert _executions(run) == before == [(0, t) for t in TASKS]
    assert {t: content_hash(run.writes(t, 0)) for t in TASKS} == outputs  # not even rewritten
    assert refs["rollouts"] == read_manifest(run.layout.manifest)["tasks"]["0/generate"]["output"]


def test_an_output_changed_after_its_task_finished_stops_the_resume_naming_the_fix(run: Run) -> None:
    from flows.step_flow import discovery_step

    rollouts = run.layout.rollouts(0)
    rollouts.write_bytes(rollouts.read_bytes() + b"\0")
    with pytest.raises(RunDirError, match=r"steps/0000/rollouts.parquet has changed since generate of step 0 finished.*--redo-from 0"):
        discovery_step(str(run.root), 0)
    rollouts.unlink()
    with pytest.raises(RunDirError, match="is missing"):
        run.finished_output("generate", 0)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    ("damaged", "task"),
    [("archive/0001.parquet", "select_parents"), ("checkpoints/0001/adapter/adapter_model.safetensors", "generate")],
    ids=["archive", "adapter"],
)
def test_a_damaged_input_stops_its_task_in_one_line_naming_file_task_step_and_fix(run: Run, damaged: str, task: str) -> None:
    """Step 1 reads the archive and the adapter step 0 wrote: truncated after step 0 finished, the
    task about to read it stops at once, not retried, and `discover resume` says in one line which
    file, which task of which step, and how to recompute it (never the parser's own error)."""
    from cli.app import app

    _truncate(run.root / damaged)
    result = CliRunner().invoke(app, ["resume", str(run.root)])
    assert result.exit_code != 0, result.output
    last = result.output.strip().splitlines()[-1]
    written = "checkpoints/0001" if task == "generate" else damaged  # a checkpoint is checked as the folder train wrote
    assert last.startswith(f"error: {written}, the ") and f" {task} of step 1 reads, has changed" in last, result.output[-3000:]
    assert "since update_archive of step 0 wrote it" in last or "since train of step 0 wrote it" in last, last
    assert last.endswith(f"`discover resume {run.root} --redo-from 0`"), last
    assert "Traceback" not in result.output and "Retrying" not in result.output, result.output[-3000:]
    executions = _executions(run)
    assert executions == [(0, t) for t in TASKS] + ([(1, "select_parents")] if task == "generate" else []), executions


def test_a_damaged_initial_archive_is_named_with_its_fix(run: Run) -> None:
    """The run's initial archive is written once, when the run starts (no step recomputes it): a
    changed one is named with the two ways out."""
    from flows.step_flow import discovery_step

    run.redo_from(0)
    _truncate(run.layout.archive(0))
    with pytest.raises(
        RunDirError,
        match=r"^archive/0000.parquet, the archive select_parents of step 0 reads, has changed .* since the run started; "
        r"restore it, or start the run again in a new directory",
    ):
        discovery_step(str(run.root), 0)


def test_redo_from_moves_the_outputs_aside_and_recomputes_the_step(run: Run) -> None:
    """The outputs of the step move to discarded/ (nothing is deleted), the manifest forgets the
    step, and the next resume runs all its tasks again, to the same outputs on this machine."""
    trash = run.redo_from(0)
    moved = sorted(p.relative_to(run.root) for p in (run.root / "discarded").rglob("*") if p.is_file())
    assert moved and trash.parent == run.root / "discarded"
    stamp = moved[0].parts[1]
    assert {Path("discarded", stamp, "steps", "0000", "rollouts.parquet"), Path("discarded", stamp, "archive", "0001.parquet")} <= set(
        moved
    )
    assert Path("discarded", stamp, "checkpoints", "0001", "adapter", "adapter_model.safetensors") in moved
    assert not run.layout.rollouts(0).exists() and not run.layout.archive(1).exists()
    assert run.layout.archive(0).is_file() and run.layout.checkpoint(0).is_dir()  # what step 0 starts from
    manifest = read_manifest(run.layout.manifest)
    assert manifest["tasks"] == {} and manifest["redos"][0]["from_step"] == 0 and run.epoch() == 1
    assert _executions(run) == [(0, t) for t in TASKS]  # the history stays


def test_after_a_redo_the_step_runs_again_and_computes_the_same(run: Run, prefect_api: str) -> None:
    from flows.step_flow import discovery_step

    outputs, verdicts = _outputs(run)
    run.redo_from(0)
    discovery_step(str(run.root), 0)  # Prefect's cache holds every task of step 0: the epoch keeps it out
    assert _executions(run) == [(0, t) for t in TASKS] * 2
    assert _outputs(run) == (outputs, verdicts)


def test_redo_from_a_step_not_started_is_refused(run: Run) -> None:
    from cli.app import app

    with pytest.raises(RunDirError, match=r"cannot redo from step 5: .* has steps 0 to 1 started \(1 finished\)"):
        run.redo_from(5)
    result = CliRunner().invoke(app, ["resume", str(run.root), "--redo-from", "-1"])
    assert result.exit_code == 2 and "cannot redo from step -1" in result.output
    assert not (run.root / "discarded").exists() and run.epoch() == 0


def test_a_step_opens_its_run_once_and_builds_its_problem_once(run: Run, monkeypatch: pytest.MonkeyPatch, prefect_api: str) -> None:
    """Every task of the step gets the `Run` the step flow opened: config.yaml is read and validated
    once for the five tasks, cache keys included, and the problem is built once."""
    from flows.step_flow import discovery_step

    opened, loaded, built = [], [], []
    open_, load, make = Run.open.__func__, run_module.load_config, run_module.make_problem
    monkeypatch.setattr(Run, "open", classmethod(lambda cls, d: opened.append(d) or open_(cls, d)))
    monkeypatch.setattr(run_module, "load_config", lambda *a, **k: loaded.append(a) or load(*a, **k))
    monkeypatch.setattr(run_module, "make_problem", lambda c: built.append(c) or make(c))
    discovery_step(str(run.root), 1)
    assert _executions(run)[-5:] == [(1, t) for t in TASKS]
    assert len(opened) == 1 and len(loaded) == 1 and len(built) == 1, (opened, loaded, built)
