"""Prefect tasks: each calls one function of discover/steps.py and passes references.

Each takes the opened run (`Run`, opened once by the flow that calls it) and the step. The step
flow does not call a task the manifest records as finished (flows/step_flow.py); for the others,
cache keys come from flows/cache.py (the task's source, the code its step function runs, the run
id, its redo epoch, the step and the hashes of exactly the files the task reads). Retries are for
infrastructure only: a candidate's own failure is a reward of 0 inside `evaluate`, never an exception.

With overlap, `generate` hands each rollout to the step's evaluation (flows/evaluation.py) as it
is finished; `evaluate` waits for the last candidate and writes the step's table.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from prefect import task

from discover import steps
from discover.run import TASKS, Ref, Run
from flows.cache import step_cache_policy
from flows.evaluation import GPU_LIMIT_ENV, current_evaluation, retry_infrastructure_only
from storage.manifest import record_task

# The task names, defined once in discover/run.py; each is also the name of its step function.
SELECT_PARENTS, GENERATE, EVALUATE, UPDATE_ARCHIVE, TRAIN = TASKS


def _seed_gpu_slots(run: Run) -> AbstractContextManager[Any]:
    """Initialise scores program seeds in this process, `sandbox.concurrency` at once: it holds that
    many slots of the pool's GPU limit when the problem needs a GPU (a candidate of a step holds one,
    flows/evaluation.py); else nothing."""
    limit = os.environ.get(GPU_LIMIT_ENV)
    if not limit or not run.problem().needs_gpu:
        return nullcontext()
    from prefect.concurrency.sync import concurrency

    return concurrency(limit, occupy=run.config.sandbox.concurrency, strict=True)


def _run_step(name: str, run: Run, step: int, **kwargs: Any) -> Ref:
    """Call `discover.steps.<name>` and record it in the run's manifest."""
    started = time.time()
    ref = getattr(steps, name)(run, step, **kwargs)
    record_task(run.layout.manifest, step, name, ref, started, time.time())
    return ref


def _step_task(name: str) -> Callable[[Callable[..., Any]], Any]:
    return task(
        name=name,
        cache_policy=step_cache_policy(name),
        persist_result=True,
        retries=2,
        retry_delay_seconds=[10, 60],
        retry_condition_fn=retry_infrastructure_only,
    )


@_step_task(SELECT_PARENTS)
def select_parents(run: Run, step: int) -> Ref:
    """Choose the step's start states and build their contexts."""
    return _run_step(SELECT_PARENTS, run, step)


@_step_task(GENERATE)
def generate(run: Run, step: int, overlap: bool = False) -> Ref:
    """Sample the rollouts; with `overlap`, each starts evaluating as soon as it is finished (`step_evaluation`)."""
    evaluation = current_evaluation(run, step) if overlap else None
    return _run_step(GENERATE, run, step, on_rollout=evaluation.add if evaluation is not None else None)


@_step_task(EVALUATE)
def evaluate(run: Run, step: int) -> Ref:
    """Score every rollout's candidate in the problem's sandbox."""
    return _run_step(EVALUATE, run, step, evaluation=current_evaluation(run, step))


@_step_task(UPDATE_ARCHIVE)
def update_archive(run: Run, step: int) -> Ref:
    """Add the step's best children to the archive."""
    return _run_step(UPDATE_ARCHIVE, run, step)


@_step_task(TRAIN)
def train(run: Run, step: int) -> Ref:
    """One optimizer step of the LoRA policy."""
    return _run_step(TRAIN, run, step)


@task(name="initialise", retries=1, retry_delay_seconds=10, retry_condition_fn=retry_infrastructure_only)
def initialise(run: Run) -> dict[str, Ref]:
    """The run's seeds and initial adapter, each written once (idempotent; runs on every resume)."""
    with _seed_gpu_slots(run):
        return steps.initialise(run)
