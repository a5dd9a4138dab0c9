"""Each step's metrics record (discover/metrics.py): its keys on a real toy run taken through the step
functions (no Prefect), the TensorBoard event files read back, and `discover status`, the report and
the per-step artifacts reading the record."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from discover import metrics, steps
from discover.config import parse_config
from discover.run import TASKS, Run, load_archive, read_evaluations
from discover.status import step_rows, step_summaries
from evaluators.toy.digits import DigitsProblem
from storage.manifest import record_task
from tests.conftest import REPO, tiny_toy_config

FIXED_KEYS = {
    "reward/best",
    "reward/mean",
    "reward/max",
    "reward/valid_fraction",
    "archive/size",
    "tokens/completion",
    *(f"time/{t}" for t in TASKS),
}


def _digits(self, result):
    """A summary_metrics hook for the test: how many digits the child state holds."""
    return {"digits": float(len(result.construction or ""))}


def _run_task(run: Run, step: int, task: str) -> None:
    """One task, recorded in the manifest as the flow records it."""
    t0 = time.time()
    ref = getattr(steps, task)(run, step)
    record_task(run.layout.manifest, step, task, ref, t0, time.time())


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_cache: Path) -> Path:
    """A lenient toy run (nearly every rollout valid) with TensorBoard on: steps 0 and 1 finished,
    step 2 stopped after generating."""
    run_dir = tmp_path_factory.mktemp("metrics") / "run"
    config = parse_config(tiny_toy_config(run_dir, steps=3, problem_options={"lenient": True}, metrics={"tensorboard": True}))
    run = steps.create_run(config)
    steps.initialise(run)
    for step in (0, 1):
        for task in TASKS:
            _run_task(run, step, task)
    for task in TASKS[:2]:
        _run_task(run, 2, task)
    return run_dir


@pytest.fixture
def run(toy_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    """A fresh copy of that run for each test, with the toy problem summarising its verdicts."""
    monkeypatch.setattr(DigitsProblem, "summary_metrics", _digits)
    shutil.copytree(toy_run, tmp_path / "run")
    return Run.open(tmp_path / "run")


def test_the_record_holds_every_figure_of_the_step_under_its_namespace(run: Run) -> None:
    layout = run.layout
    record = metrics.step_metrics(run, 0)
    assert FIXED_KEYS <= set(record)
    assert {"train/loss", "train/beta_mean", "train/beta_min", "train/beta_max", "train/kl", "train/seconds"} <= set(record)
    assert all(k.split("/")[0] in {"reward", "archive", "tokens", "train", "time", "problem", "sandbox"} for k in record)
    assert record["sandbox/unisolated"] == 0.0  # the toy run's configuration leaves sandbox.isolation standard
    assert all(v is None or isinstance(v, float) for v in record.values())

    evaluations = read_evaluations(layout.evaluations(0))
    rewards = [e.reward for e in evaluations]
    assert record["reward/mean"] == pytest.approx(np.mean(rewards)) and record["reward/max"] == pytest.approx(max(rewards))
    assert record["reward/valid_fraction"] == pytest.approx(np.mean([e.valid for e in evaluations]))
    archive = load_archive(layout.archive(1))
    assert record["reward/best"] == pytest.approx(archive.best().reward) and record["archive/size"] == len(archive)
    ids = pq.read_table(layout.rollouts(0), columns=["completion_ids"]).column("completion_ids").to_pylist()
    assert record["tokens/completion"] == sum(len(x) for x in ids)
    train = json.loads(layout.train_stats(0).read_text())
    assert record["train/loss"] == pytest.approx(train["loss"]) and "train/objective" not in record  # numbers only
    assert all(record[f"time/{t}"] >= 0 for t in TASKS)
    valid = [e for e in evaluations if e.valid]
    assert valid, "the lenient toy makes nearly every rollout a candidate"
    assert record["problem/digits"] == pytest.approx(np.mean([len(e.construction) for e in valid]))

    unfinished = metrics.step_metrics(run, 2)  # generated, not evaluated
    assert unfinished["tokens/completion"] > 0 and unfinished["reward/mean"] is None and unfinished["time/train"] is None
    assert not any(k.startswith(("train/", "problem/")) for k in unfinished)


def test_publishing_keeps_the_finished_steps_records_and_writes_tensorboard_once(run: Run) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = dict(metrics.publish_metrics(run, 1))
    assert sorted(records) == [0, 1, 2]  # every started step, the unfinished one computed
    for step in (0, 1):
        kept = json.loads(metrics.metrics_path(run, step).read_text())
        assert kept == records[step] == metrics.step_metrics(run, step)
    assert not metrics.metrics_path(run, 2).exists()  # an unfinished step's record is not kept
    assert metrics.write_step_metrics(run, 2)["time/train"] is None and not metrics.metrics_path(run, 2).exists()

    metrics.publish_metrics(run, 1)  # again, as a resumed run would: nothing is written twice
    logdir = metrics.tensorboard_dir(run)
    events = EventAccumulator(str(logdir)).Reload()
    tags = set(events.Tags()["scalars"])
    assert tags == {k for r in (records[0], records[1]) for k, v in r.items() if v is not None}
    assert {"reward/best", "train/loss", "time/generate", "problem/digits"} <= tags
    for tag in tags:
        points = events.Scalars(tag)
        assert [p.step for p in points] == [s for s in (0, 1) if records[s].get(tag) is not None]
        for p in points:
            assert p.value == pytest.approx(records[p.step][tag], rel=1e-6, abs=1e-30)  # stored as float32
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 1


def test_status_and_the_report_read_the_kept_record(run: Run) -> None:
    from discover.report import write_report

    metrics.publish_metrics(run, 1)
    path = metrics.metrics_path(run, 0)
    record = json.loads(path.read_text())
    record |= {"reward/best": 0.123456, "train/beta_mean": 7.0, "train/beta_min": 6.0, "train/beta_max": 8.0, "time/generate": 42.0}
    path.write_text(json.dumps(record))
    rows = step_summaries(run)
    assert run.config.problem == "toy" and [r[0] for r in rows] == ["0", "1", "2"]
    assert rows[0][1] == "0.1235" and rows[0][4] == "7 (6–8)" and rows[0][6] == "42.0s"
    assert rows[2][4] == "–" and rows[2][-1] == "–"  # step 2 has not trained
    assert step_rows(run)[0] == {"step": 0, **record}
    assert "| 0 | 0.1235 |" in write_report(run).read_text()


def test_a_run_of_the_previous_version_gets_its_records_computed_and_kept(tmp_path: Path) -> None:
    """The v1 fixture run has no metrics.json and no metrics section: its records are computed on
    the fly, kept when next published, and TensorBoard stays off."""
    shutil.copytree(REPO / "tests" / "fixtures" / "v1-runs" / "complete", tmp_path / "run")
    run = Run.open(tmp_path / "run")
    computed = metrics.run_metrics(run)
    assert [s for s, _ in computed] == [0, 1, 2] and not metrics.metrics_path(run, 0).exists()
    assert dict(metrics.publish_metrics(run, 2)) == dict(computed)
    assert all(metrics.metrics_path(run, s).is_file() for s in (0, 1, 2))
    assert not metrics.tensorboard_dir(run).exists()


def test_publish_step_writes_the_records_before_the_artifacts(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows import artifacts

    calls = []

    def table(rows, key, description):
        calls.append(("table", rows))
        assert metrics.metrics_path(run, 1).is_file()  # the record first

    monkeypatch.setattr(artifacts, "create_table_artifact", table)
    monkeypatch.setattr(artifacts, "create_image_artifact", lambda *a, **k: calls.append(("image", None)))
    artifacts.publish_step(run, 1)
    assert [c[0] for c in calls] == ["table", "image"]
    rows = calls[0][1]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert len({tuple(r) for r in rows}) == 1  # one set of columns; None where a step lacks a figure
    assert rows[2]["train/loss"] is None and rows[0]["reward/best"] == json.loads(metrics.metrics_path(run, 0).read_text())["reward/best"]


def test_a_run_without_isolation_says_so_in_every_record(run: Run) -> None:
    import yaml

    config = yaml.safe_load(run.layout.config.read_text())
    config["sandbox"]["isolation"] = "none"  # asked for by name (docs/sandbox.md): trusted programs only
    run.layout.config.write_text(yaml.safe_dump(config))
    assert metrics.step_metrics(Run.open(run.layout.root), 0)["sandbox/unisolated"] == 1.0
