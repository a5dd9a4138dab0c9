"""Prefect tasks: each calls one function of discover/steps.py and passes references.

Cache keys (DESIGN.md, "Retry, cache, resume"): run id, step, the hashes of the input files the
task reads, and the source of the task's function. What could go stale: a task whose inputs were
edited by hand without changing their content hash (impossible for files written by the run), or a
change in a helper module the function calls (the function's own source is hashed, its callees'
are not). Delete `prefect-results/` in the run directory to force every task to run again.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import signal
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, ContextManager

from prefect import task
from prefect.context import TaskRunContext

from discover import steps
from storage.atomic import content_hash
from storage.layout import RunLayout
from storage.manifest import record_task

CRASH_ENV = "DISCOVER_CRASH_AT"  # test hook: "TASK:STEP:PHASE" kills the run's process group there
HOLD_ENV = "DISCOVER_HOLD_AT"  # test hook: "TASK:STEP:PHASE" writes RUN_DIR/.held and waits there to be killed
# The global concurrency limit of the GPUs of this worker's pool (set in the pool's job variables,
# see prefect.yaml); an evaluate task of a problem that needs a GPU holds one slot per candidate it
# runs at once (sandbox.concurrency), so evaluations never exceed the pool's GPUs.
GPU_LIMIT_ENV = "DISCOVER_GPU_LIMIT"

# Failures of infrastructure are retried; a candidate's own failure is a reward of 0, never raised.
_NO_RETRY = (ValueError, KeyError, TypeError, steps.RunDirError)


def _retry_infrastructure_only(task: Any, task_run: Any, state: Any) -> bool:
    try:
        state.result()
    except _NO_RETRY:
        return False
    except Exception:
        return True
    return False


def _input_hashes(run_dir: Path, step: int, task_name: str) -> list[str]:
    layout = RunLayout(Path(run_dir))
    inputs = {
        "select_parents": [layout.archive(step)],
        "generate": [layout.parents(step), layout.checkpoint(step)],
        "evaluate": [layout.archive(step), layout.rollouts(step)],
        "update_archive": [layout.archive(step), layout.parents(step), layout.evaluations(step)],
        "train": [layout.rollouts(step), layout.evaluations(step), layout.checkpoint(step)],
    }[task_name]
    return [content_hash(p) if p.exists() else "missing" for p in inputs]


def _cache_key(fn: Callable[..., Any]) -> Callable[[TaskRunContext, dict[str, Any]], str]:
    source = hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()

    def key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
        run_dir, step = Path(parameters["run_dir"]), int(parameters["step"])
        parts = [steps.run_id(RunLayout(run_dir)), str(step), fn.__name__, source, *_input_hashes(run_dir, step, fn.__name__)]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()

    return key


def _maybe_crash(task_name: str, step: int, phase: str) -> None:
    """Fault injection for the resume tests: SIGKILL the whole process group, server included."""
    if os.environ.get(CRASH_ENV) == f"{task_name}:{step}:{phase}":
        os.killpg(os.getpgrp(), signal.SIGKILL)


def _maybe_hold(run_dir: str, task_name: str, step: int) -> None:
    """Fault injection for the worker-kill test: announce the task has started, then wait to be killed."""
    if os.environ.get(HOLD_ENV) == f"{task_name}:{step}:start":
        (Path(run_dir) / ".held").write_text(f"{task_name}:{step}:{os.getpid()}\n")
        time.sleep(600)


def _gpu_slots(run_dir: str, task_name: str) -> ContextManager[Any]:
    """Slots of the pool's GPU limit for an evaluate task whose problem needs a GPU; else nothing."""
    limit = os.environ.get(GPU_LIMIT_ENV)
    if task_name != "evaluate" or not limit:
        return nullcontext()
    config, _ = steps.open_run(Path(run_dir))
    if not steps.make_problem(config).needs_gpu:
        return nullcontext()
    from prefect.concurrency.sync import concurrency

    return concurrency(limit, occupy=config.sandbox.concurrency, strict=True)


def _wrap(fn: Callable[[Path, int], dict[str, str]]):
    name = fn.__name__

    def body(run_dir: str, step: int) -> dict[str, str]:
        started = time.time()
        _maybe_crash(name, step, "start")
        _maybe_hold(run_dir, name, step)
        with _gpu_slots(run_dir, name):
            ref = fn(Path(run_dir), step)
        _maybe_crash(name, step, "end")
        record_task(RunLayout(Path(run_dir)).manifest, step, name, ref, started, time.time())
        return ref

    body.__name__ = name
    body.__doc__ = fn.__doc__
    return task(
        body,
        name=name,
        cache_key_fn=_cache_key(fn),
        persist_result=True,
        retries=2,
        retry_delay_seconds=[10, 60],
        retry_condition_fn=_retry_infrastructure_only,
    )


select_parents = _wrap(steps.select_parents)
generate = _wrap(steps.generate)
evaluate = _wrap(steps.evaluate)
update_archive = _wrap(steps.update_archive)
train = _wrap(steps.train)


@task(name="init_run", retries=1, retry_delay_seconds=10, retry_condition_fn=_retry_infrastructure_only)
def init_run(config_yaml: str, run_dir: str) -> dict[str, Any]:
    """Create the run directory, its seeds and the initial adapter (idempotent)."""
    from discover.config import parse_config
    import yaml

    data = yaml.safe_load(config_yaml)
    data["run_dir"] = run_dir
    return steps.init_run(parse_config(data))
