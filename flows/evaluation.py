"""The step's candidates as Prefect tasks on the flow's task runner (flows/engines.py).

`evaluate_candidate` is the one task that leaves the flow's process: one per distinct candidate,
submitted with the engine's resource request, retried when the infrastructure fails (a lost
worker, a Docker engine that went away), never for the candidate's own failure (a reward of 0).
Its result is stored by discover/evaluation.py under the candidate's own key, not by Prefect.

The step's evaluation lives here, by (run id, step), while the step flow runs: the generate and
evaluate tasks look it up (`current_evaluation`) rather than take it as a parameter, because a
task's parameters, and the globals of the module its function comes from, travel with every task
it submits (Prefect serialises the parent's context for the engine's workers).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from discover.evaluation import CandidateJob, Resources, StepEvaluation, Unplaceable, run_job
from discover.run import Run, RunDirError
from flows import retry_cause
from flows.engines import resource_request, unplaceable
from storage.atomic import DiskFull

# The global concurrency limit of the GPUs of this worker's pool (set in the pool's job variables,
# see prefect.yaml); a candidate that needs a GPU holds one slot while it runs, so the evaluations
# run on a pool's machines never use more GPUs than the pool has.
GPU_LIMIT_ENV = "DISCOVER_GPU_LIMIT"

# Failures of infrastructure are retried; a bad configuration or run directory is not. An exception
# of a problem's judging never gets here: run_job makes it the candidate's verdict (an evaluator
# fault, evaluators/sandbox/base.py `infrastructure_failure` draws the line).
# DiskFull: nothing changes until space is freed; Unplaceable: until a node that can start a candidate joins
_NO_RETRY = (ValueError, KeyError, TypeError, RunDirError, DiskFull, Unplaceable)


def retry_infrastructure_only(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition of the step's tasks: retry a failure of infrastructure, and give its
    retry state the cause (flows/retry_cause.py)."""
    try:
        state.result()
    except _NO_RETRY:
        return False
    except Exception as err:
        retry_cause.note(err)
        return True
    return False


retry_cause.install()


def _gpu_slot(job: CandidateJob) -> AbstractContextManager[Any]:
    """One slot of this worker's pool's GPU limit for a candidate that needs a GPU; else nothing."""
    limit = os.environ.get(GPU_LIMIT_ENV)
    if not limit or not job.resources.gpus:
        return nullcontext()
    from prefect.concurrency.sync import concurrency

    return concurrency(limit, occupy=job.resources.gpus, strict=True)


@task(
    name="evaluate-candidate",
    task_run_name="evaluate-{job.child_id}",
    cache_policy=NO_CACHE,  # discover/evaluation.py stores each result under the candidate's own key
    persist_result=False,
    retry_delay_seconds=5,
    retry_condition_fn=retry_infrastructure_only,
)
def evaluate_candidate(job: CandidateJob) -> dict[str, Any]:
    """Score one candidate on whichever worker the engine chose (discover.evaluation.run_job)."""
    with _gpu_slot(job):
        return run_job(job)


_EVALUATIONS: dict[tuple[str, int], StepEvaluation] = {}


def current_evaluation(run: Run, step: int) -> StepEvaluation | None:
    """The evaluation of `step` under way in this process (None outside `step_evaluation`)."""
    return _EVALUATIONS.get((run.run_id, step))


@contextmanager
def step_evaluation(run: Run, step: int) -> Iterator[StepEvaluation]:
    """The step's evaluation while the block runs, each candidate a task of the flow's task runner."""
    runner = run.config.evaluation.runner
    candidate_task = evaluate_candidate.with_options(retries=run.config.evaluation.retries)

    def submit(job: CandidateJob) -> Any:
        with resource_request(runner, job.resources):
            return candidate_task.submit(job)

    check = unplaceable(runner, Resources.of(run.problem()))
    _EVALUATIONS[(run.run_id, step)] = evaluation = StepEvaluation(run, step, submit, check)
    try:
        yield evaluation
    finally:
        _EVALUATIONS.pop((run.run_id, step), None)
