"""Fault injection for the tests that kill runs; none of it is in the production code.

Python imports `sitecustomize` at start-up from the first directory of sys.path that has one; the
resume and server tests put this folder on PYTHONPATH of the processes they start (the CLI, a
worker and the flow runs it spawns), and only when one of these variables is set does it wrap
functions of discover/steps.py:

- DISCOVER_CRASH_AT="NAME:STEP:PHASE" SIGKILLs the process's whole group at that point;
- DISCOVER_HOLD_AT="NAME:STEP:start" writes RUN_DIR/.held ("NAME:STEP:PID") and sleeps there,
  so a test can kill the worker that runs it.

NAME is a step task (select_parents, generate, evaluate, update_archive, train; PHASE start or
end: before the task runs, or after its output is written but before it is recorded), or a point
of the run's initialisation: create_run (end: config.yaml written), initialise (start),
save_archive (end: archive STEP written), atomic_dir (end: a checkpoint STEP written to its
temporary folder, not yet renamed).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from pathlib import Path

CRASH = os.environ.get("DISCOVER_CRASH_AT", "")
HOLD = os.environ.get("DISCOVER_HOLD_AT", "")
TASKS = ("select_parents", "generate", "evaluate", "update_archive", "train")


def _at(name: str, step: int, phase: str, run_dir: object = None) -> None:
    point = f"{name}:{step}:{phase}"
    if CRASH == point:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    if HOLD == point and run_dir is not None:
        (Path(str(run_dir)) / ".held").write_text(f"{name}:{step}:{os.getpid()}\n")
        time.sleep(600)


def _step_of(path: object) -> int:
    name = Path(str(path)).stem
    return int(name) if name.isdigit() else -1


def _wrap_task(steps, name: str) -> None:
    original = getattr(steps, name)

    @functools.wraps(original)  # the cache key hashes the unwrapped source: keys are unchanged
    def wrapped(run_dir, step):
        _at(name, int(step), "start", run_dir)
        ref = original(run_dir, step)
        _at(name, int(step), "end", run_dir)
        return ref

    setattr(steps, name, wrapped)


def _install() -> None:
    from discover import steps

    for name in TASKS:
        _wrap_task(steps, name)
    create_run, initialise, save_archive, atomic_dir = steps.create_run, steps.initialise, steps.save_archive, steps.atomic_dir

    @functools.wraps(create_run)
    def create(config):
        run = create_run(config)
        _at("create_run", 0, "end")
        return run

    @functools.wraps(initialise)
    def init(run_dir):
        _at("initialise", 0, "start", run_dir)
        return initialise(run_dir)

    @functools.wraps(save_archive)
    def save(path, archive):
        save_archive(path, archive)
        _at("save_archive", _step_of(path), "end")

    @contextlib.contextmanager
    def atomic(path):
        with atomic_dir(path) as tmp:
            yield tmp
            _at("atomic_dir", _step_of(path), "end")

    steps.create_run, steps.initialise, steps.save_archive, steps.atomic_dir = create, init, save, atomic


if CRASH or HOLD:
    _install()
