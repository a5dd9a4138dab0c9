"""Fault injection for the tests that kill runs; none of it is in the production code.

Python imports `sitecustomize` at start-up from the first directory of sys.path that has one; the
resume and server tests put this folder on PYTHONPATH of the processes they start (the CLI, a
worker and the flow runs it spawns), and only when one of these variables is set does it wrap
functions of discover/steps.py:

- DISCOVER_CRASH_AT="NAME:STEP:PHASE" SIGKILLs the process's whole group at that point;
- DISCOVER_HOLD_AT="NAME:STEP:start[,NAME:STEP:start...]" writes RUN_DIR/.held ("NAME:STEP:PID")
  at each of these points and sleeps there (up to 600 s), so a test can kill the worker that runs
  it, or start a second process on the run while it is held; the test lets it go on by creating
  RUN_DIR/.release (every point) or RUN_DIR/.release-NAME-STEP (that point, in every process).

NAME is a step task (select_parents, generate, evaluate, update_archive, train; PHASE start or
end: before the task runs, or after its output is written but before it is recorded), or a point
of the run's initialisation: create_run (end: config.yaml written), initialise (start),
save_archive (end: archive STEP written), atomic_dir (end: a checkpoint STEP written to its
temporary folder, not yet renamed), or `candidate` with PHASE a number N: right after the N-th
candidate result of step STEP is stored (storage/candidates.py), or `rollout` with PHASE a number
N: right after the N-th rollout of step STEP is stored while it is generated (storage/rollout_parts.py).

- DISCOVER_KILL_RANK="R:PATH": rank R of the resident trainer group (discover/policy/trainer_group.py)
  SIGKILLs itself when it starts accumulating gradients while the file PATH exists (and removes it:
  one kill per file), as a rank lost mid-step (the other ranks are waiting in its collectives).
- DISCOVER_LOAD_LOG=PATH appends one line "PID" to PATH each time a process reads a base model from
  disk (discover/policy/resident.py `load_base`, not a hit of its cache), so a test can count loads.

- DISCOVER_HOLD_RANK=PATH: a rank of the resident trainer group (`ResidentRank.step`)
  writes PATH and sleeps there; DISCOVER_HOLD_DECODE="N:PATH": the N-th `decode_batch` call of the
  generation replicas (discover/policy/replicas.py) that have it, counted together (in PATH.calls),
  does the same. Given to one Ray node's processes, so a test can kill that node while it holds the work.

- DISCOVER_EVAL_LOG=PATH appends one line "STEP KEY PID" to PATH each time a candidate is really
  evaluated (discover.evaluation.run_job), in whichever process runs it (engine workers too), so
  a test can count evaluations.
- DISCOVER_EVAL_ATTEMPTS=PATH appends one line "CHILD_ID PID" to PATH when an evaluation starts
  (every attempt, also one that fails); while the file PATH.fail holds "raise" the attempt then
  raises an OSError (an infrastructure failure, which Prefect retries), while it holds "exit" the
  process running it exits at once (a lost worker).
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
EVAL_LOG = os.environ.get("DISCOVER_EVAL_LOG", "")
EVAL_ATTEMPTS = os.environ.get("DISCOVER_EVAL_ATTEMPTS", "")
KILL_RANK = os.environ.get("DISCOVER_KILL_RANK", "")
LOAD_LOG = os.environ.get("DISCOVER_LOAD_LOG", "")
HOLD_RANK = os.environ.get("DISCOVER_HOLD_RANK", "")
HOLD_DECODE = os.environ.get("DISCOVER_HOLD_DECODE", "")


def _at(name: str, step: int, phase: str, run: object = None) -> None:
    """`run`: the opened run (discover.run.Run) the step functions take."""
    point = f"{name}:{step}:{phase}"
    if CRASH == point:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    if point in HOLD.split(",") and run is not None:
        root = Path(str(run.root))
        released = (root / ".release", root / f".release-{name}-{step}")
        if any(r.exists() for r in released):
            return
        (root / ".held").write_text(f"{name}:{step}:{os.getpid()}\n")
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not any(r.exists() for r in released):
            time.sleep(0.2)


def _step_of(path: object) -> int:
    name = Path(str(path)).stem
    return int(name) if name.isdigit() else -1


def _wrap_task(steps, name: str) -> None:
    original = steps.STEP_FUNCTIONS[name]

    @functools.wraps(original)
    def wrapped(run, step, **kwargs):
        _at(name, int(step), "start", run)
        ref = original(run, step, **kwargs)
        _at(name, int(step), "end", run)
        return ref

    steps.STEP_FUNCTIONS[name] = wrapped  # what the task runs (discover/steps.py `step_function`)


def _install() -> None:
    from discover import steps
    from discover.run import TASKS

    for name in TASKS:
        _wrap_task(steps, name)
    create_run, initialise, save_archive, atomic_dir = steps.create_run, steps.initialise, steps.save_archive, steps.atomic_dir

    @functools.wraps(create_run)
    def create(config):
        run = create_run(config)
        _at("create_run", 0, "end")
        return run

    @functools.wraps(initialise)
    def init(run):
        _at("initialise", 0, "start", run)
        return initialise(run)

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

    from storage.candidates import CandidateStore

    put, stored = CandidateStore.put, {}

    @functools.wraps(put)
    def counted_put(self, key, result):
        put(self, key, result)
        step = _step_of(self.folder.parent)
        stored[step] = stored.get(step, 0) + 1
        _at("candidate", step, str(stored[step]))

    CandidateStore.put = counted_put

    from storage.rollout_parts import RolloutParts

    put_rollout, generated = RolloutParts.put, {}

    @functools.wraps(put_rollout)
    def counted_rollout(self, group, index, rollout, inputs):
        put_rollout(self, group, index, rollout, inputs)
        step = _step_of(self.folder.parent)
        generated[step] = generated.get(step, 0) + 1
        _at("rollout", step, str(generated[step]))

    RolloutParts.put = counted_rollout


def _when_imported(name: str, patch) -> None:
    """Call `patch(module)` right after module `name` is first imported, without importing it here:
    every Python process started with this folder on PYTHONPATH runs this file (a Ray node's agents
    too, which must start within Ray's 30 s window), and most of them never evaluate anything."""
    import importlib.abc
    import importlib.util
    import sys

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                patch(module)

            spec.loader.exec_module = exec_and_patch  # this spec's own loader instance
            return spec

    sys.meta_path.insert(0, _Finder())


def _log_evaluations(evaluation) -> None:
    run_job = evaluation.run_job

    @functools.wraps(run_job)
    def logged(job):
        result = run_job(job)
        with open(EVAL_LOG, "a") as f:
            f.write(f"{job.step} {job.key} {os.getpid()}\n")
        return result

    evaluation.run_job = logged


def _fail_evaluations(evaluation) -> None:
    run_job = evaluation.run_job

    @functools.wraps(run_job)
    def attempted(job):
        with open(EVAL_ATTEMPTS, "a") as f:
            f.write(f"{job.child_id} {os.getpid()}\n")
        fail = Path(EVAL_ATTEMPTS + ".fail")
        mode = fail.read_text().strip() if fail.is_file() else ""
        if mode == "raise":
            raise OSError(f"injected infrastructure failure evaluating {job.child_id}")
        if mode == "exit":
            os._exit(1)
        return run_job(job)

    evaluation.run_job = attempted


def _kill_rank(trainer) -> None:
    accumulate = trainer.accumulate_gradients
    rank, trigger = KILL_RANK.split(":", 1)

    @functools.wraps(accumulate)
    def killed(*args, **kwargs):
        import torch.distributed as dist

        if kwargs.get("distributed") and dist.get_rank() == int(rank) and os.path.exists(trigger):
            os.unlink(trigger)
            os.kill(os.getpid(), signal.SIGKILL)
        return accumulate(*args, **kwargs)

    trainer.accumulate_gradients = killed


def _log_loads(resident) -> None:
    load_base = resident.load_base

    @functools.wraps(load_base)
    def logged(*args, **kwargs):
        before = resident.loads()
        out = load_base(*args, **kwargs)
        if resident.loads() > before:
            with open(LOAD_LOG, "a") as f:
                f.write(f"{os.getpid()}\n")
        return out

    resident.load_base = logged


def _held(path: str) -> None:
    Path(path).write_text(f"{os.getpid()}\n")
    time.sleep(600)


def _hold_rank(trainer_group) -> None:
    step = trainer_group.ResidentRank.step

    @functools.wraps(step)
    def held(self, *args, **kwargs):
        _held(HOLD_RANK)
        return step(self, *args, **kwargs)

    trainer_group.ResidentRank.step = held


def _hold_decode(replicas) -> None:
    decode_batch = replicas.GenerationReplica.decode_batch
    nth, path = HOLD_DECODE.split(":", 1)

    @functools.wraps(decode_batch)
    def held(self, *args, **kwargs):
        with open(path + ".calls", "a+") as f:  # the batch engine's calls come one at a time
            f.write(f"{os.getpid()}\n")
            f.seek(0)
            calls = len(f.read().splitlines())
        if calls == int(nth):
            _held(path)
        return decode_batch(self, *args, **kwargs)

    replicas.GenerationReplica.decode_batch = held


if CRASH or HOLD:
    _install()
if KILL_RANK:
    _when_imported("discover.policy.trainer", _kill_rank)
if LOAD_LOG:
    _when_imported("discover.policy.resident", _log_loads)
_patches = [patch for on, patch in ((EVAL_LOG, _log_evaluations), (EVAL_ATTEMPTS, _fail_evaluations)) if on]
if _patches:
    _when_imported("discover.evaluation", lambda module: [patch(module) for patch in _patches])
if HOLD_RANK:
    _when_imported("discover.policy.trainer_group", _hold_rank)
if HOLD_DECODE:
    _when_imported("discover.policy.replicas", _hold_decode)
