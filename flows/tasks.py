"""Prefect tasks: each calls one function of discover/steps.py and passes references.

Cache keys come from flows/cache.py (the task's source, its step function's source, the run id,
the step and the hashes of exactly the files the task reads). Retries are for infrastructure only:
a candidate's own failure is a reward of 0 inside `evaluate`, never an exception.

`evaluate_candidate` is the one task that leaves the flow's process: one per distinct candidate,
submitted to the flow's task runner (flows/engines.py) with the engine's resource request; its
result is stored by discover/evaluation.py, not by Prefect.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, ContextManager

from prefect import task
from prefect.cache_policies import NO_CACHE

from discover import steps
from discover.evaluation import CandidateJob, StepEvaluation, run_job
from discover.run import Run, RunDirError
from flows.cache import step_cache_policy
from flows.engines import resource_request
from storage.manifest import record_task

# The global concurrency limit of the GPUs of this worker's pool (set in the pool's job variables,
# see prefect.yaml); a candidate that needs a GPU holds one slot while it runs, so the evaluations
# run on a pool's machines never use more GPUs than the pool has.
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


def _gpu_slot(job: CandidateJob) -> ContextManager[Any]:
    """One slot of this worker's pool's GPU limit for a candidate that needs a GPU; else nothing."""
    limit = os.environ.get(GPU_LIMIT_ENV)
    if not limit or not job.resources.gpus:
        return nullcontext()
    from prefect.concurrency.sync import concurrency

    return concurrency(limit, occupy=job.resources.gpus, strict=True)


def _run_step(name: str, run_dir: str, step: int, **kwargs: Any) -> dict[str, str]:
    """Call `discover.steps.<name>` and record it in the run's manifest."""
    run = Run.open(Path(run_dir))
    started = time.time()
    ref = getattr(steps, name)(Path(run_dir), step, **kwargs)
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
def generate(run_dir: str, step: int, evaluation: StepEvaluation | None = None) -> dict[str, str]:
    """With `evaluation`, each rollout is handed to it (and starts evaluating) as soon as it is finished."""
    return _run_step("generate", run_dir, step, on_rollout=evaluation.add if evaluation is not None else None)


@_step_task("evaluate")
def evaluate(run_dir: str, step: int, evaluation: StepEvaluation | None = None) -> dict[str, str]:
    return _run_step("evaluate", run_dir, step, evaluation=evaluation)


@task(
    name="evaluate-candidate",
    task_run_name="evaluate-{job.child_id}",
    cache_policy=NO_CACHE,  # discover/evaluation.py stores each result under the candidate's own key
    persist_result=False,
    retry_delay_seconds=5,
    retry_condition_fn=_retry_infrastructure_only,
)
def evaluate_candidate(job: CandidateJob) -> dict[str, Any]:
    """Score one candidate on whichever worker the engine chose (discover.evaluation.run_job)."""
    with _gpu_slot(job):
        return run_job(job)


def step_evaluation(run_dir: str, step: int) -> StepEvaluation:
    """The step's evaluation, submitting each candidate to the running flow's task runner."""
    run = Run.open(Path(run_dir))
    runner, candidate_task = run.config.evaluation.runner, evaluate_candidate.with_options(retries=run.config.evaluation.retries)

    def submit(job: CandidateJob) -> Any:
        with resource_request(runner, job.resources):
            return candidate_task.submit(job)

    return StepEvaluation(run.root, step, submit)


@_step_task("update_archive")
def update_archive(run_dir: str, step: int) -> dict[str, str]:
    return _run_step("update_archive", run_dir, step)


@_step_task("train")
def train(run_dir: str, step: int) -> dict[str, str]:
    return _run_step("train", run_dir, step)


@task(name="initialise", retries=1, retry_delay_seconds=10, retry_condition_fn=_retry_infrastructure_only)
def initialise(run_dir: str) -> dict[str, Any]:
    """The run's seeds and initial adapter, each written once (idempotent; runs on every resume)."""
    return steps.initialise(Path(run_dir))
