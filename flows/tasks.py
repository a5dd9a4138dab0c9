"""Prefect tasks: one per step task that discover/run.py declares (`STEP_TASKS`), each running the
function discover/steps.py binds to it and recording it in the run's manifest, plus `initialise`.

Each takes the opened run (`Run`, opened once by the flow that calls it) and the step, and returns
the small reference its function returns. The manifest is the one record of what finished: the step
flow does not call a task it records (flows/step_flow.py), and Prefect caches nothing of these tasks
(`NO_CACHE`, results not persisted), so there is no second record to disagree with it. Retries are
for infrastructure only: a candidate's own failure is a reward of 0 inside `evaluate`, never an
exception.

With overlap, `generate` hands each rollout to the step's evaluation (flows/evaluation.py) as it
is finished; `evaluate` waits for the last candidate and writes the step's table.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from discover import steps
from discover.run import EVALUATE, GENERATE, STEP_TASKS, Ref, Run, StepTask
from flows.evaluation import GPU_LIMIT_ENV, current_evaluation, retry_infrastructure_only
from storage.manifest import record_initial, record_task

log = logging.getLogger("discover")


def _seed_gpu_slots(run: Run) -> AbstractContextManager[Any]:
    """Initialise scores program seeds in this process, `sandbox.concurrency` at once: it holds that
    many slots of the pool's GPU limit when the problem needs a GPU (a candidate of a step holds one,
    flows/evaluation.py); else nothing."""
    limit = os.environ.get(GPU_LIMIT_ENV)
    if not limit or not run.problem().needs_gpu:
        return nullcontext()
    from prefect.concurrency.sync import concurrency

    return concurrency(limit, occupy=run.config.sandbox.concurrency, strict=True)


def _generate_options(run: Run, step: int, overlap: bool = False) -> dict[str, Any]:
    """With `overlap`, each rollout starts evaluating as soon as it is generated (`step_evaluation`)."""
    evaluation = current_evaluation(run, step) if overlap else None
    return {"on_rollout": evaluation.add if evaluation is not None else None}


def _evaluate_options(run: Run, step: int) -> dict[str, Any]:
    """The step's evaluation, where overlapped candidates may already be running."""
    return {"evaluation": current_evaluation(run, step)}


# What a task's function gets beyond (run, step), from the options the step flow passes.
_OPTIONS: dict[str, Callable[..., dict[str, Any]]] = {GENERATE.name: _generate_options, EVALUATE.name: _evaluate_options}


def _prefect_task(spec: StepTask) -> Task[..., Ref]:
    def run_step_task(run: Run, step: int, **options: Any) -> Ref:
        started = time.time()
        extra = _OPTIONS[spec.name](run, step, **options) if spec.name in _OPTIONS else {}
        try:
            run.check_inputs(spec, step)  # a damaged input is said in one line, not as its parser's error retried
            ref = steps.step_function(spec)(run, step, **extra)
        except Exception as err:
            # the cause in the run's logs (flows/logs.py) at ERROR, and on the retry state (flows/retry_cause.py)
            log.error("step %d %s failed: %s: %s", step, spec.name, type(err).__name__, err)
            raise
        record_task(run.layout.manifest, step, spec.name, ref, started, time.time())
        return ref

    run_step_task.__qualname__ = run_step_task.__name__ = f"step_task_{spec.name}"  # Prefect's task key: one per task
    run_step_task.__doc__ = f"Step task {spec.name}: run its function and record it in the manifest."
    return task(
        name=spec.name,
        cache_policy=NO_CACHE,
        persist_result=False,
        retries=2,
        retry_delay_seconds=[10, 60],
        retry_condition_fn=retry_infrastructure_only,
    )(run_step_task)


# The Prefect task of each step task, by its name.
STEP_TASK_RUNS: dict[str, Task[..., Ref]] = {spec.name: _prefect_task(spec) for spec in STEP_TASKS}


@task(name="initialise", retries=1, retry_delay_seconds=10, retry_condition_fn=retry_infrastructure_only)
def initialise(run: Run) -> dict[str, Ref]:
    """The run's seeds and initial adapter, each written once (idempotent; runs on every resume)."""
    with _seed_gpu_slots(run):
        refs = steps.initialise(run)
    record_initial(run.layout.manifest, refs)
    return refs
