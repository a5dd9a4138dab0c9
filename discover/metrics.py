"""One metrics record per step: every figure of a step under a namespaced key, computed once from
the files the step wrote and kept as RUN_DIR/steps/NNNN/metrics.json.

`discover status`, the run report and the flow's per-step artifacts read this record and nothing
else of a step's figures; with `metrics.tensorboard: true` each record is also appended to event
files in RUN_DIR/tensorboard (`tensorboard --logdir RUN_DIR/tensorboard` shows the curves live).

Keys (None where the file that gives it is not written yet):

    reward/best            best reward of the archive after the step (seeds included)
    reward/mean, reward/max, reward/valid_fraction   over the step's rollouts (invalid ones score 0)
    answer/edits_applied   only under `sampling.answer_format: edits`: the fraction of the step's
                           rollouts whose SEARCH/REPLACE blocks applied to their parent's program
                           (docs/method.md, "Answers as edits")
    archive/size           states in the archive after the step
    tokens/completion      completion tokens the step generated
    train/<name>           every number of the step's train.json (loss, beta_mean, beta_min,
                           beta_max, kl, logprob_gap, grad_norm, seconds, ...)
    time/<task>            seconds of each of the step's five tasks (manifest.json)
    problem/<name>         the mean over the step's valid candidates of the problem's
                           `summary_metrics` hook (docs/architecture.md, "Problem hooks")
    sandbox/unisolated     1 when the run's candidates ran without isolation (sandbox.isolation:
                           none, docs/sandbox.md), else 0

The record only reads files, so computing it again gives the same numbers; a step without a
metrics.json (unfinished, or written by an older version) gets its record computed on the fly.
Every function takes the opened run (discover/run.py `Run`); the problem is asked only for
`summary_metrics`, and only built when a step with valid candidates has no kept record.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from discover.edits import EDITS_NOT_APPLIED
from discover.run import TASKS, Run, read_evaluations
from storage.atomic import atomic_write_json, atomic_write_text
from storage.manifest import read_manifest

Record = dict[str, float | None]
METRICS_FILE = "metrics.json"
TENSORBOARD_DIR = "tensorboard"
_TB_WRITTEN = "written.json"  # inside TENSORBOARD_DIR: the last step appended to the event files


def metrics_path(run: Run, step: int) -> Path:
    """RUN_DIR/steps/NNNN/metrics.json: where a step's record lives."""
    return run.layout.step_dir(step) / METRICS_FILE


def _number(x: Any) -> float | None:
    """A finite float, or None (NaN and infinities are not figures; JSON has no NaN)."""
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _problem_means(run: Run, step: int) -> Record:
    """problem/<name>: the mean of `summary_metrics` over the step's valid candidates."""
    valid = [e for e in read_evaluations(run.layout.evaluations(step)) if e.valid]  # older files read as today's records
    if not valid:
        return {}
    problem = run.problem()
    sums: dict[str, list[float]] = {}
    for e in valid:
        for name, value in problem.summary_metrics(e.verdict()).items():
            v = _number(value)
            if v is not None:
                sums.setdefault(name, []).append(v)
    return {f"problem/{name}": float(np.mean(vs)) for name, vs in sums.items()}


def step_metrics(run: Run, step: int) -> Record:
    """The record of `step`, computed from the files the step wrote (see the module's keys)."""
    layout = run.layout
    record: Record = {
        "reward/best": None,
        "reward/mean": None,
        "reward/max": None,
        "reward/valid_fraction": None,
        "archive/size": None,
        "tokens/completion": None,
        "sandbox/unisolated": 1.0 if run.config.sandbox.isolation == "none" else 0.0,
    }
    edits = run.config.sampling.answer_format == "edits"
    if edits:
        record["answer/edits_applied"] = None
    if layout.evaluations(step).is_file():
        ev = pq.read_table(layout.evaluations(step), columns=["reward", "valid"] + (["reason"] if edits else []))
        rewards = ev.column("reward").to_numpy()
        if len(rewards):
            record["reward/mean"] = float(np.mean(rewards))
            record["reward/max"] = float(np.max(rewards))
            record["reward/valid_fraction"] = float(np.mean(ev.column("valid").to_numpy(zero_copy_only=False)))
            if edits:  # the reason of an answer whose edits failed begins with EDITS_NOT_APPLIED (discover/evaluation.py)
                failed = [r.startswith(EDITS_NOT_APPLIED) for r in ev.column("reason").to_pylist()]
                record["answer/edits_applied"] = 1.0 - float(np.mean(failed))
    if layout.archive(step + 1).is_file():
        archived = pq.read_table(layout.archive(step + 1), columns=["reward"]).column("reward").to_numpy()
        record["archive/size"] = float(len(archived))
        record["reward/best"] = float(archived.max()) if len(archived) else None
    if layout.rollouts(step).is_file():
        ids = pq.read_table(layout.rollouts(step), columns=["completion_ids"]).column("completion_ids")
        record["tokens/completion"] = float(sum(len(x) for x in ids.to_pylist()))
    if layout.train_stats(step).is_file():
        stats = json.loads(layout.train_stats(step).read_text())
        for name in ("beta_mean", "beta_min", "beta_max"):  # always there (None for no finite beta)
            record[f"train/{name}"] = None
        for name, value in stats.items():
            if isinstance(value, (int, float)) or value is None:  # not the objective's name
                record[f"train/{name}"] = _number(value)
    tasks = read_manifest(layout.manifest)["tasks"]
    for t in TASKS:
        e = tasks.get(f"{step}/{t}")
        record[f"time/{t}"] = None if e is None else round(e["finished"] - e["started"], 3)
    if layout.evaluations(step).is_file():
        record |= _problem_means(run, step)
    return record


def step_finished(run: Run, step: int) -> bool:
    tasks = read_manifest(run.layout.manifest)["tasks"]
    return all(f"{step}/{t}" in tasks for t in TASKS)


def write_step_metrics(run: Run, step: int) -> Record:
    """Compute the record of `step` and, once every task of the step has finished, keep it as
    steps/NNNN/metrics.json (atomically); an unfinished step's record is returned, not kept."""
    record = step_metrics(run, step)
    if step_finished(run, step):
        atomic_write_text(metrics_path(run, step), json.dumps(record, indent=2) + "\n")  # in the record's order
    return record


def read_step_metrics(run: Run, step: int) -> Record:
    """The kept record of `step`, or one computed now where none is kept."""
    path = metrics_path(run, step)
    if path.is_file():
        return json.loads(path.read_text())
    return step_metrics(run, step)


def started_steps(run: Run) -> list[int]:
    """The steps with at least one finished task, in order (those `discover status` lists)."""
    tasks = read_manifest(run.layout.manifest)["tasks"]
    out = []
    for step in range(run.config.steps):
        if not any(f"{step}/{t}" in tasks for t in TASKS):
            break
        out.append(step)
    return out


def run_metrics(run: Run) -> list[tuple[int, Record]]:
    """(step, record) of every started step, kept records read, the others computed."""
    return [(s, read_step_metrics(run, s)) for s in started_steps(run)]


# ---------------------------------------------------------------------------------------------
# TensorBoard: the records as scalars (tag = key, global step = step), written with the
# tensorboard package alone (no TensorFlow, no torch).


def tensorboard_dir(run: Run) -> Path:
    return run.root / TENSORBOARD_DIR


def _last_written(logdir: Path) -> int:
    path = logdir / _TB_WRITTEN
    return int(json.loads(path.read_text())["last_step"]) if path.is_file() else -1


def write_tensorboard(run: Run, records: list[tuple[int, Record]]) -> list[int]:
    """Append the records of steps after the last one already written, in step order, to a new
    event file in RUN_DIR/tensorboard; return the steps written.

    Idempotent: `written.json` beside the event files holds the last step written, so calling again
    (a resumed run publishing a step again) writes nothing twice. Steps are only ever appended in
    increasing order because TensorBoard reads a lower step after a higher one as a restart of the
    run and drops the later points. Should a crash fall between the event file and `written.json`,
    that step is written again on resume: TensorBoard then holds two equal points at the same step
    (both are shown; the curve is unchanged) — harmless.
    """
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    logdir = tensorboard_dir(run)
    logdir.mkdir(parents=True, exist_ok=True)
    last = _last_written(logdir)
    todo = [(s, r) for s, r in sorted(records) if s > last]
    if not todo:
        return []
    writer = EventFileWriter(str(logdir))
    try:
        for step, record in todo:
            values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in record.items() if v is not None]
            writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))
        writer.flush()
    finally:
        writer.close()
    atomic_write_json(logdir / _TB_WRITTEN, {"last_step": todo[-1][0]})
    return [s for s, _ in todo]


def publish_metrics(run: Run, step: int) -> list[tuple[int, Record]]:
    """After `step`: keep the record of every finished step up to it that has none yet (the step
    itself, and any an earlier failure skipped), append them to TensorBoard when the run's
    `metrics.tensorboard` is on, and return (step, record) of every started step."""
    for s in range(step + 1):
        if not metrics_path(run, s).is_file() and step_finished(run, s):
            write_step_metrics(run, s)
    records = run_metrics(run)
    if run.config.metrics.tensorboard:
        # only finished steps: an unfinished step's record would change, and TensorBoard keeps the first
        write_tensorboard(run, [(s, r) for s, r in records if s <= step and metrics_path(run, s).is_file()])
    return records
