"""Prefect tasks: each calls one function of discover/steps.py and passes references.

Cache keys come from flows/cache.py (the task's source, its step function's source, the run id,
the step and the hashes of exactly the files the task reads). Retries are for infrastructure only:
a candidate's own failure is a reward of 0 inside `evaluate`, never an exception.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, ContextManager

from prefect import task

from discover import steps
from discover.run import Run, RunDirError
from flows.cache import step_cache_policy
from storage.manifest import record_task

# The global concurrency limit of the GPUs of this worker's pool (set in the pool's job variables,
# see prefect.yaml); an evaluate task of a problem that needs a GPU holds one slot per candidate it
# runs at once (sandbox.concurrency), so evaluations never exceed the pool's GPUs.
GPU_LIMIT_ENV = "DISCOVER_GPU_LIMIT"

# Failures of infrastructure are retried; a bad configuration or run directory is not.
_NO_RETRY = (ValueError, KeyError, TypeError, RunDirError)


def _retry_infrastructure_only(task: Any, task_run: Any, state: Any) -> bool:
    try:
        state.result()
    except _NO_RETRY:
        return False
    except Exception:
        return True
    return False


def _gpu_slots(run: Run, name: str) -> ContextManager[Any]:
    """Slots of the pool's GPU limit for a task that evaluates (evaluate, and initialise, which scores
    program seeds) when the problem needs a GPU; else nothing."""
    limit = os.environ.get(GPU_LIMIT_ENV)
    if name not in ("evaluate", "initialise") or not limit or not run.problem().needs_gpu:
        return nullcontext()
    from prefect.concurrency.sync import concurrency

    return concurrency(limit, occupy=run.config.sandbox.concurrency, strict=True)


def _run_step(name: str, run_dir: str, step: int) -> dict[str, str]:
    """Call `discover.steps.<name>` and record it in the run's manifest."""
    run = Run.open(Path(run_dir))
    started = time.time()
    with _gpu_slots(run, name):
        ref = getattr(steps, name)(Path(run_dir), step)
    record_task(run.layout.manifest, step, name, ref, started, time.time())
    return ref


def _step_task(name: str) -> Callable[[Callable[..., Any]], Any]:
    return task(
        name=name,
        cache_policy=step_cache_policy(name),
        persist_result=True,
        retries=2,
        retry_delay_seconds=[10, 60],
        retry_condition_fn=_retry_infrastructure_only,
    )


@_step_task("select_parents")
def select_parents(run_dir: str, step: int) -> dict[str, str]:
    return _run_step("select_parents", run_dir, step)


@_step_task("generate")
def generate(run_dir: str, step: int) -> dict[str, str]:
    return _run_step("generate", run_dir, step)


@_step_task("evaluate")
def evaluate(run_dir: str, step: int) -> dict[str, str]:
    return _run_step("evaluate", run_dir, step)


@_step_task("update_archive")
def update_archive(run_dir: str, step: int) -> dict[str, str]:
    return _run_step("update_archive", run_dir, step)


@_step_task("train")
def train(run_dir: str, step: int) -> dict[str, str]:
    return _run_step("train", run_dir, step)


@task(name="initialise", retries=1, retry_delay_seconds=10, retry_condition_fn=_retry_infrastructure_only)
def initialise(run_dir: str) -> dict[str, Any]:
    """The run's seeds and initial adapter, each written once (idempotent; runs on every resume)."""
    with _gpu_slots(Run.open(Path(run_dir)), "initialise"):
        return steps.initialise(Path(run_dir))
