"""A whole discovery run as a Prefect flow: initialise, then each unfinished step in order.

The flow run is named after the run directory and tagged with the run (flows/naming.py); the
project's log lines go to its logs (flows/logs.py). Each attempt is recorded, and a restart that
would repeat attempts without progress stops (flows/recovery.py); an earlier flow run of the same
run still marked RUNNING (its worker died) is cancelled as superseded. All of it happens while the
flow run holds the run directory's lease (flows/writer.py): a second process of the run never
writes, and never supersedes a live one.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path

from prefect import flow
from prefect.context import FlowRunContext
from prefect.states import Failed

from discover import steps
from discover.config import ConfigError, RunConfig, load_config  # RunConfig at run time: Prefect validates the parameter
from discover.run import Run, RunDirError
from flows import artifacts, tasks
from flows.engines import evaluation_engine, ray_connection
from flows.logs import forward_project_logs
from flows.naming import discovery_run_name, run_tags
from flows.recovery import end_superseded_runs, guard_restarts
from flows.server_api import server_client
from flows.step_flow import run_step
from flows.workers import resident_workers
from flows.writer import after_last_boundary, writer_lease
from storage.lease import RunBusy

log = logging.getLogger("discover")

NO_PARAMETERS = (
    "discovery-run needs a parameter: config_path (a YAML file the worker can read), config (the configuration as a "
    "mapping) or run_dir (a run directory to resume); e.g. `prefect deployment run discovery-run/process "
    "--param config_path=configs/toy.yaml`"
)


def _run_dir(run_dir: str | None, config: RunConfig | None, config_path: str | None) -> str:
    """The run directory to run: created from the configuration given (`steps.create_run`, the one
    place that pre-flights), or `run_dir` as it is when there is none (resume)."""
    if config is not None and config_path is not None:
        raise ValueError("give the configuration once: config or config_path")
    if config_path is not None:
        config = load_config(config_path, {"run_dir": run_dir} if run_dir else None)
    elif config is None:
        if not run_dir:
            raise ValueError(NO_PARAMETERS)
        return run_dir
    elif run_dir:
        config = config.model_copy(update={"run_dir": Path(run_dir)})
    steps.create_run(config)
    return str(config.run_dir)


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    return discovery_run_name(flow_run.parameters)


@flow(name="discovery-run", flow_run_name=_flow_run_name)
def discovery_run(run_dir: str | None = None, config: RunConfig | None = None, config_path: str | None = None) -> dict:
    """Start a run from a configuration in `run_dir`, or resume the run already there.

    The configuration is `config` (a RunConfig; a deployment passes it as a mapping, which Prefect
    validates) or `config_path` (a YAML file readable by the worker); `run_dir` overrides its
    run_dir. With neither, the run in `run_dir` resumes at the first step whose tasks have not all
    finished (`discover run` creates the run directory itself and passes `run_dir` alone); inside
    it, a task manifest.json records as finished is not run again.
    """
    forward_project_logs()
    with ExitStack() as held:
        try:
            run = Run.open(_run_dir(run_dir, config, config_path))
            # the run's one writer from here on (flows/writer.py), before any other flow run is touched
            held.enter_context(writer_lease(run))
        except (ValueError, ConfigError, RunDirError, RunBusy) as err:  # the run cannot start as asked: said, without a traceback
            log.error("%s", err)
            return Failed(message=str(err), data=err)  # type: ignore[return-value]
        _take_over(run)
        tasks.initialise(run)  # also on resume: a run killed while initialising finishes it first
        start, steps_ = run.finished_steps(), run.config.steps
        if start:
            log.info("resuming %s at step %d of %d", run.root, start, steps_)
        if start < steps_:
            # a local cluster lives as long as the run; Ray, when used, is connected once for the evaluation and the replicas
            with ray_connection(run), evaluation_engine(run) as task_runner, resident_workers(run):
                for step in range(start, steps_):
                    log.info("step %d/%d", step + 1, steps_)
                    run_step(run, step, task_runner())
                    _quietly(artifacts.publish_step, run, step)
        report = _quietly(artifacts.publish_report, run)
        after_last_boundary(run)  # a cancel that came too late to stop anything: the run is COMPLETED
    best = steps.best_state(run)
    log.info("best state %s: reward %.6f", best.id, best.reward)
    return {"run_dir": str(run.root), "best_state": best.id, "best_reward": best.reward, "report": str(report) if report else None}


def _take_over(run: Run) -> None:
    """This flow run is the run's one attempt now: tag it with the run, cancel an earlier flow run
    of the run still marked live, and record the attempt (a restart without progress stops here)."""
    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return

    me, tags = ctx.flow_run, run_tags(run)
    if not set(tags) <= set(me.tags):
        with server_client("tagging the run's flow run") as client:
            client.update_flow_run(me.id, tags=[*me.tags, *(t for t in tags if t not in me.tags)])
    # only this directory's earlier flow runs (we hold its lease: their process is gone), never a copy's
    end_superseded_runs(ctx.flow.name, tags, str(me.id), f"superseded: the run continues in flow run {me.name}")
    guard_restarts(run, str(me.id), me.run_count)


def _quietly(fn, *args):
    """Artifacts and reports are for people: a failure to draw one is logged, never fatal to the run."""
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001
        log.warning("%s failed: %s", fn.__name__, err)
        return None
