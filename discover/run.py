"""The run directory's one owner: open and validate it, its id, its problem, which tasks have
finished and, for each task of a step, exactly which files the task reads and which file it writes.

A run is opened once per process entry point (a flow run, a CLI command) and the `Run` is passed
down: the step functions (discover/steps.py), the step's evaluation, the metrics, the report and
the status all take it, and none reads config.yaml again. That is safe because config.yaml never
changes after `Run.create`; the problem is built once per `Run`, on first use.

Each task of a step is declared once, here (`StepTask`: its name, the files it reads, the file it
writes; `STEP_TASKS` in order); discover/steps.py binds each to its function (`steps.runs`), the
flows make Prefect tasks of them, and nothing else spells a task's name. The step functions read
their inputs only through `Run.reads` (generate's digest of its inputs, which keeps an interrupted
generate's rollouts apart from another's, hashes exactly those files).

The manifest is the one record of what is finished: a task it records is never run again
(`finished_output`), whatever changed in the code or the environment since, and a task it does not
record runs (Prefect caches nothing of its own). `redo_from` is the one way to recompute steps on
purpose (docs/operations.md, "Upgrading during a run").
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from discover.archive import Archive, State
from discover.config import RunConfig, dump_config, load_config
from discover.records import Evaluation, Rollout
from evaluators.base import Problem, SeedState
from evaluators.registry import get_problem
from storage.atomic import atomic_write_json, atomic_write_text, content_hash
from storage.layout import RunLayout
from storage.manifest import forget_steps, read_manifest, redo_epoch, task_entry
from storage.tables import read_records, write_records

Ref = dict[str, str]


class RunDirError(RuntimeError):
    """A run directory that cannot be started or resumed as asked."""


@dataclass(frozen=True)
class Run:
    layout: RunLayout
    config: RunConfig
    run_id: str

    # -- opening and creating ---------------------------------------------------------------

    @classmethod
    def open(cls, run_dir: Path | str) -> Run:
        """The run in `run_dir`; RunDirError when it is not a (complete) run directory."""
        layout = RunLayout(Path(run_dir))
        if not layout.config.is_file() or not layout.run_info.is_file():
            raise RunDirError(f"{run_dir} is not a run directory (no config.yaml); start one with `discover run CONFIG`")
        return cls(layout, load_config(layout.config), json.loads(layout.run_info.read_text())["run_id"])

    @classmethod
    def create(cls, config: RunConfig) -> Run:
        """Create the run directory for `config`, or open it when it already holds the same run.

        run.json is written first and config.yaml last: a directory with config.yaml is a run.
        """
        layout = RunLayout(config.run_dir)
        if layout.config.is_file():
            existing = load_config(layout.config)
            same = {"run_dir", "evaluation", "metrics"}  # where a run is written, evaluated or logged never changes its results
            if existing.model_dump(exclude=same) != config.model_dump(exclude=same):
                raise RunDirError(
                    f"{config.run_dir} already holds a run with another configuration; "
                    "resume it with `discover resume`, or choose a new run_dir"
                )
            return cls.open(layout.root)
        layout.root.mkdir(parents=True, exist_ok=True)
        atomic_write_json(layout.run_info, {"run_id": uuid.uuid4().hex, "created": time.time()})
        atomic_write_text(layout.config, dump_config(config))
        return cls.open(layout.root)

    @property
    def root(self) -> Path:
        return self.layout.root

    # -- what each task reads and writes ----------------------------------------------------

    def reads(self, task: StepTask | str, step: int) -> dict[str, Path]:
        """The files `task` of `step` reads, by name (a checkpoint is a directory)."""
        return step_task(task).reads(self, step)

    def past_rollouts(self, step: int) -> dict[str, Path]:
        """Mixed groups (docs/method.md §6, MIGRATE) also read the rollouts that produced the best
        states of the archive entering `step`: files of earlier steps, never rewritten."""
        m = self.config.mixed
        archive = self.layout.archive(step)
        if not (m.greedy or m.neighbourhood) or not archive.is_file():
            return {}
        steps = sorted({s.step for s in load_archive(archive).best_non_seeds(max(m.greedy, 1))})  # discover/mixed.py reads these
        return {f"rollouts-{s:04d}": self.layout.rollouts(s) for s in steps}

    def writes(self, task: StepTask | str, step: int) -> Path:
        """The output of `task` of `step` that its reference points to and the next tasks read."""
        return step_task(task).writes(self.layout, step)

    def finished_output(self, task: StepTask | str, step: int) -> Ref | None:
        """The reference `task` of `step` returned when it finished (manifest.json), or None when it
        has not finished. A finished task is never run again: its output is used as it is, after
        checking that it is still the file the task wrote (RunDirError otherwise, saying how to
        recompute)."""
        task = step_task(task).name
        entry = task_entry(self.layout.manifest, step, task)
        if entry is None:
            return None
        ref: Ref = entry["output"]
        path = self.root / ref["path"]
        found = content_hash(path) if path.exists() else None
        if found != ref["sha256"]:
            what = "is missing" if found is None else "has changed"
            hashes = "" if found is None else f" (sha256 now {found[:12]}..., recorded {ref['sha256'][:12]}...)"
            raise RunDirError(
                f"{ref['path']} {what} since {task} of step {step} finished{hashes}; restore it, or recompute from "
                f"that step with `discover resume {self.root} --redo-from {step}`"
            )
        return ref

    def check_inputs(self, task: StepTask | str, step: int) -> None:
        """Each input of `task` of `step` is still the file the task that wrote it recorded (its sha256
        in manifest.json: the finished task's output, or the run's initial archive and adapter);
        RunDirError otherwise, in one line naming the file, the task about to run, its step and the fix.
        A truncated parquet or adapter is said here, not as a parser's error retried."""
        task = step_task(task).name
        manifest = read_manifest(self.layout.manifest)
        writers = {e["output"]["path"]: (e["task"], int(e["step"]), e["output"]["sha256"]) for e in manifest["tasks"].values()}
        for ref in manifest.get("initial", {}).values():
            writers.setdefault(ref["path"], ("initialise", -1, ref["sha256"]))
        for name, path in self.reads(task, step).items():
            rel = self.layout.relative(path)
            if rel not in writers:
                continue
            writer, written_at, sha = writers[rel]
            found = content_hash(path) if path.exists() else None
            if found == sha:
                continue
            what = "is missing" if found is None else f"has changed (sha256 now {found[:12]}..., recorded {sha[:12]}...)"
            if writer == "initialise":
                fix = "restore it, or start the run again in a new directory (it is written once, when the run starts)"
                since = "the run started"
            else:
                fix = f"restore it, or recompute from that step with `discover resume {self.root} --redo-from {written_at}`"
                since = f"{writer} of step {written_at} wrote it"
            raise RunDirError(f"{rel}, the {name} {task} of step {step} reads, {what} since {since}; {fix}")

    def finished_steps(self) -> int:
        """How many leading steps have all their tasks finished: the number of the first unfinished one."""
        done = read_manifest(self.layout.manifest)["tasks"]
        step = 0
        while all(f"{step}/{t}" in done for t in TASKS):
            step += 1
        return step

    def epoch(self) -> int:
        """How many times steps of this run were recomputed on purpose (`redo_from`; manifest.json
        `redos` says when and from which step)."""
        return redo_epoch(self.layout.manifest)

    def redo_from(self, step: int) -> Path:
        """Recompute the run from `step` on: every output of `step` and later steps (their step
        folders, the archives and checkpoints they wrote, the TensorBoard files) moves to
        RUN_DIR/discarded/<UTC time>/ with its relative path, nothing is deleted; the manifest
        forgets those steps' tasks and records the redo, which raises the cache epoch. Returns the folder that holds what
        was moved. The next `discover resume` runs `step` again from the archive and checkpoint it
        started from."""
        finished = self.finished_steps()
        started = max((s for s in self._started_steps()), default=-1)
        if not 0 <= step <= max(finished, started):
            raise RunDirError(
                f"cannot redo from step {step}: {self.root} has steps 0 to {max(finished, started)} started "
                f"({finished} finished); choose a step in that range"
            )
        L = self.layout
        moved = [L.step_dir(s) for s in range(step, self.config.steps)]
        moved += [L.archive(s + 1) for s in range(step, self.config.steps)]
        moved += [L.checkpoint(s + 1) for s in range(step, self.config.steps)]
        moved += [self.root / "tensorboard"]  # appended step by step; written again from step 0
        trash = self.root / "discarded" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for path in moved:
            if path.exists():
                target = trash / path.relative_to(self.root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(path), str(target))
        forget_steps(L.manifest, step, note=f"outputs moved to {trash.relative_to(self.root)}")
        return trash

    def _started_steps(self) -> list[int]:
        return sorted({int(key.split("/")[0]) for key in read_manifest(self.layout.manifest)["tasks"]})

    def input_hashes(self, task: StepTask | str, step: int) -> dict[str, str]:
        """Content hash of each input of a task ("missing" for one not written yet)."""
        return {name: content_hash(p) if p.exists() else "missing" for name, p in self.reads(task, step).items()}

    def ref(self, path: Path) -> Ref:
        return {"path": self.layout.relative(path), "sha256": content_hash(path)}

    # -- helpers the tasks share ------------------------------------------------------------

    def seed(self, purpose: str, step: int) -> int:
        """A seed for one purpose at one step, derived from the run seed."""
        return stream_seed(self.config.seed, purpose, step)

    @cached_property
    def _problem(self) -> Problem:
        return make_problem(self.config)

    def __getstate__(self) -> dict:
        """Pickled without the problem built so far (it may hold a dataset): a `Run` travels with
        the tasks a step submits to other processes, which build their own."""
        return {k: v for k, v in self.__dict__.items() if k != "_problem"}

    def problem(self) -> Problem:
        """The run's problem, built on first use and then kept (building some reads their data)."""
        return self._problem

    def newest_archive(self) -> Path:
        archives = sorted((self.root / "archive").glob("*.parquet"))
        if not archives:
            raise FileNotFoundError(f"{self.root} has no archive yet")
        return archives[-1]


@dataclass(frozen=True)
class StepTask:
    """One task of a step (docs/method.md §1), declared once: its name (also its Prefect task's and
    its key in manifest.json), the files it reads and the one file or folder it writes (train also
    writes its statistics, steps/NNNN/train.json, which nothing reads back)."""

    name: str
    reads: Callable[[Run, int], dict[str, Path]]
    writes: Callable[[RunLayout, int], Path]


SELECT_PARENTS = StepTask("select_parents", lambda run, s: {"archive": run.layout.archive(s)}, lambda L, s: L.parents(s))
GENERATE = StepTask(
    "generate",
    lambda run, s: {
        "parents": run.layout.parents(s),
        "checkpoint": run.layout.checkpoint(s),
        "archive": run.layout.archive(s),
        **run.past_rollouts(s),
    },
    lambda L, s: L.rollouts(s),
)
EVALUATE = StepTask(
    "evaluate", lambda run, s: {"archive": run.layout.archive(s), "rollouts": run.layout.rollouts(s)}, lambda L, s: L.evaluations(s)
)
UPDATE_ARCHIVE = StepTask(
    "update_archive",
    lambda run, s: {"archive": run.layout.archive(s), "parents": run.layout.parents(s), "evaluations": run.layout.evaluations(s)},
    lambda L, s: L.archive(s + 1),
)
TRAIN = StepTask(
    "train",
    lambda run, s: {
        "rollouts": run.layout.rollouts(s),
        "evaluations": run.layout.evaluations(s),
        "checkpoint": run.layout.checkpoint(s),
        "archive": run.layout.archive(s),
    },
    lambda L, s: L.checkpoint(s + 1),
)
STEP_TASKS = (SELECT_PARENTS, GENERATE, EVALUATE, UPDATE_ARCHIVE, TRAIN)  # in the order a step runs them
TASKS = tuple(t.name for t in STEP_TASKS)
_BY_NAME = {t.name: t for t in STEP_TASKS}

# Independent random streams per purpose: same run seed, same draws, whatever ran before.
_STREAMS = {
    "seeds": 0,
    SELECT_PARENTS.name: 1,
    GENERATE.name: 2,
    TRAIN.name: 3,
    "policy_init": 4,
    "seed_eval": 5,
    "neighbourhood": 6,
}


def step_task(task: StepTask | str) -> StepTask:
    """The declaration of `task` (itself, or by name); KeyError naming the tasks there are."""
    if isinstance(task, StepTask):
        return task
    try:
        return _BY_NAME[task]
    except KeyError:
        raise KeyError(f"no step task {task!r}; the tasks are {', '.join(TASKS)}") from None


def stream_seed(run_seed: int, purpose: str, step: int) -> int:
    """The seed of one purpose at one step of a run whose seed is `run_seed` (`Run.seed`)."""
    return int(np.random.SeedSequence([run_seed, _STREAMS[purpose], step]).generate_state(1)[0])


def draw_seeds(problem: Problem, config: RunConfig) -> list[SeedState]:
    """The run's initial states as its problem draws them (docs/method.md §5a: one per group, or
    `reuse.seed_states`), from the run's "seeds" stream."""
    rng = np.random.default_rng(stream_seed(config.seed, "seeds", 0))
    return problem.seeds(rng, config.reuse.seed_states or config.groups)


def make_problem(config: RunConfig) -> Problem:
    """The run's problem, with the configuration's sandbox limits where they are set."""
    s = config.sandbox
    return get_problem(config.problem, **config.problem_options).with_limits(
        timeout_s=s.timeout_s,
        memory_mb=s.memory_mb,
        cpus=s.cpus,
        max_output_bytes=s.max_output_bytes,
        max_processes=s.max_processes,
    )


# -- the archive and the step tables on disk ----------------------------------------------------

_TOTAL = "total_expansions"  # T, kept in the archive file's metadata


def load_archive(path: Path) -> Archive:
    states, meta = read_records(path, State)
    return Archive(states, int(meta.get(_TOTAL, 0)))


def save_archive(path: Path, archive: Archive) -> None:
    write_records(path, list(archive.states.values()), State, {_TOTAL: archive.total_expansions})


def read_rollouts(path: Path) -> list[Rollout]:
    return read_records(path, Rollout)[0]


def read_evaluations(path: Path) -> list[Evaluation]:
    return read_records(path, Evaluation)[0]
