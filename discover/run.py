"""The run directory's one owner: open and validate it, its id, its problem and, for each task of a
step, exactly which files the task reads and which file it writes.

The five step functions (discover/steps.py) read their inputs only through `Run.reads`, and the
Prefect cache key of a task (flows/cache.py) hashes exactly those files, so a step that starts to
read a new file cannot leave its cache key stale: the file has to be declared here first.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from discover.archive import Archive, State
from discover.config import RunConfig, dump_config, load_config
from discover.records import Evaluation, Rollout
from evaluators.base import Problem
from evaluators.registry import get_problem
from storage.atomic import atomic_write_json, atomic_write_text, content_hash
from storage.layout import RunLayout
from storage.tables import read_records, write_records

TASKS = ("select_parents", "generate", "evaluate", "update_archive", "train")
# Independent random streams per purpose: same run seed, same draws, whatever ran before.
_STREAMS = {"seeds": 0, "select_parents": 1, "generate": 2, "train": 3, "policy_init": 4, "seed_eval": 5, "neighbourhood": 6}

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

    def reads(self, task: str, step: int) -> dict[str, Path]:
        """The files `task` of `step` reads, by name (a checkpoint is a directory)."""
        L = self.layout
        return {
            "select_parents": {"archive": L.archive(step)},
            "generate": {
                "parents": L.parents(step),
                "checkpoint": L.checkpoint(step),
                "archive": L.archive(step),
                **self._past_rollouts(step),
            },
            "evaluate": {"archive": L.archive(step), "rollouts": L.rollouts(step)},
            "update_archive": {"archive": L.archive(step), "parents": L.parents(step), "evaluations": L.evaluations(step)},
            "train": {
                "rollouts": L.rollouts(step),
                "evaluations": L.evaluations(step),
                "checkpoint": L.checkpoint(step),
                "archive": L.archive(step),
            },
        }[task]

    def _past_rollouts(self, step: int) -> dict[str, Path]:
        """Mixed groups (docs/method.md §6, MIGRATE) also read the rollouts that produced the best
        states of the archive entering `step`: files of earlier steps, never rewritten."""
        m = self.config.mixed
        archive = self.layout.archive(step)
        if not (m.greedy or m.neighbourhood) or not archive.is_file():
            return {}
        steps = sorted({s.step for s in load_archive(archive).best_non_seeds(max(m.greedy, 1))})  # discover/mixed.py reads these
        return {f"rollouts-{s:04d}": self.layout.rollouts(s) for s in steps}

    def writes(self, task: str, step: int) -> Path:
        """The output of `task` of `step` that its reference points to and the next tasks read
        (train also writes its statistics, steps/NNNN/train.json, which nothing reads back)."""
        L = self.layout
        return {
            "select_parents": L.parents(step),
            "generate": L.rollouts(step),
            "evaluate": L.evaluations(step),
            "update_archive": L.archive(step + 1),
            "train": L.checkpoint(step + 1),
        }[task]

    def input_hashes(self, task: str, step: int) -> dict[str, str]:
        """Content hash of each input of a task ("missing" for one not written yet)."""
        return {name: content_hash(p) if p.exists() else "missing" for name, p in self.reads(task, step).items()}

    def ref(self, path: Path) -> Ref:
        return {"path": self.layout.relative(path), "sha256": content_hash(path)}

    # -- helpers the tasks share ------------------------------------------------------------

    def seed(self, purpose: str, step: int) -> int:
        """A seed for one purpose at one step, derived from the run seed."""
        return int(np.random.SeedSequence([self.config.seed, _STREAMS[purpose], step]).generate_state(1)[0])

    def problem(self) -> Problem:
        return make_problem(self.config)

    def newest_archive(self) -> Path:
        archives = sorted((self.root / "archive").glob("*.parquet"))
        if not archives:
            raise FileNotFoundError(f"{self.root} has no archive yet")
        return archives[-1]


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
