"""One training step as a Prefect flow: select → generate → evaluate → archive → train (docs/method.md §1).

The step's candidates are tasks of this flow's task runner (flows/engines.py; the run flow sets
it): with `evaluation.overlap` each starts as soon as its rollout is generated, so generation and
evaluation overlap; `evaluate` then waits for the last of them and writes the step's table.

A task the run's manifest records as finished is not called again: its recorded output is used as
it is (`Run.finished_output`), whatever changed in the code since. The others run (the manifest is
the one record of what finished; Prefect caches nothing of them, flows/tasks.py).

`run_step` starts the step as a subflow of the run's flow run, named `<run>-step-<N>` and tagged
with the run and the step (flows/naming.py). It creates the subflow run itself, keyed by the step:
Prefect's own subflow call keys a subflow by how many times the parent called it, so a restarted
run (which starts at its first unfinished step) would take over an earlier step's subflow run
under that step's name. A step's flow runs of earlier attempts that are still not final (their
process died) are put in a final state, with the task runs they left RUNNING.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect import Task, flow
from prefect.context import FlowRunContext

from discover.run import EVALUATE, GENERATE, SELECT_PARENTS, TRAIN, UPDATE_ARCHIVE, Ref, Run, StepTask
from flows import tasks
from flows.evaluation import step_evaluation
from flows.logs import forward_project_logs
from flows.naming import run_tags, step_run_name
from flows.recovery import end_superseded_runs
from flows.server_api import server_client
from flows.writer import at_task_boundary

log = logging.getLogger("discover")


@flow(name="discovery-step", flow_run_name="step-{step}")
def discovery_step(run_dir: str, step: int) -> dict[str, Ref]:
    """Run the five tasks of `step`; a task the manifest records as finished is not run again."""
    forward_project_logs()
    run = Run.open(run_dir)

    def run_task(spec: StepTask, **options: Any) -> Ref:
        """The task's output: as the manifest recorded it when it finished before, else from running it."""
        done = run.finished_output(spec, step)
        if done is not None:
            log.info("step %d %s: finished before (manifest.json), not run again", step, spec.name)
            return done
        at_task_boundary(run, f"{spec.name} of step {step}")  # a cancelled flow run stops here
        return tasks.STEP_TASK_RUNS[spec.name](run, step, **options)

    parents = run_task(SELECT_PARENTS)
    with step_evaluation(run, step):
        rollouts = run_task(GENERATE, overlap=run.config.evaluation.overlap)
        evaluations = run_task(EVALUATE)
    archive = run_task(UPDATE_ARCHIVE)
    checkpoint = run_task(TRAIN)
    return {"parents": parents, "rollouts": rollouts, "evaluations": evaluations, "archive": archive, "checkpoint": checkpoint}


def run_step(run: Run, step: int, task_runner: Any) -> dict[str, Ref]:
    """`discovery_step(run, step)` on `task_runner`, as a subflow of the calling flow run keyed by
    the step (see the module); called outside a flow run, it is a flow run of its own."""
    flow_ = discovery_step.with_options(task_runner=task_runner, flow_run_name=step_run_name(run, step))
    parameters = {"run_dir": str(run.root), "step": step}
    parent = FlowRunContext.get()
    if parent is None or parent.flow_run is None:
        return flow_(**parameters)
    from prefect.flow_engine import run_flow
    from prefect.states import Pending

    tags = [*run_tags(run), f"step:{step}"]  # this directory's step runs only (naming.py: a copy has its own)
    end_superseded_runs(discovery_step.name, tags, None, f"its process died; step {step} started again in flow run {parent.flow_run.name}")
    with server_client(f"starting step {step}'s flow run") as client:
        tracking = client.create_task_run(
            task=_STEP_TASK, flow_run_id=parent.flow_run.id, dynamic_key=f"step-{step}", name=step_run_name(run, step), extra_tags=tags
        )
        flow_run = client.create_flow_run(
            flow_,
            name=step_run_name(run, step),
            parameters=flow_.serialize_parameters(parameters),
            parent_task_run_id=tracking.id,
            tags=tags,
            state=Pending(),
        )
    return run_flow(flow_, flow_run=flow_run, parameters=parameters)  # type: ignore[return-value]


# The task run that stands for a step's subflow in the run's flow run, created with the client's
# public `create_task_run` and the step's own dynamic key (Prefect's subflow calls make one of the
# same shape, keyed by call order).
_STEP_TASK: Task[Any, Any] = Task(name=discovery_step.name, fn=discovery_step.fn)
