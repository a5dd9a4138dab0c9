"""A whole discovery run as a Prefect flow: initialise, then each unfinished step in order."""

from __future__ import annotations

import logging
from pathlib import Path

from prefect import flow

from discover import steps
from discover.config import RunConfig, load_config  # RunConfig at run time: Prefect validates the parameter
from discover.run import Run
from flows import artifacts, tasks
from flows.engines import evaluation_engine
from flows.step_flow import discovery_step

log = logging.getLogger("discover")


def _run_dir(run_dir: str | None, config: RunConfig | None, config_path: str | None) -> str:
    """The run directory to run: created from the configuration given (`steps.create_run`, the one
    place that pre-flights), or `run_dir` as it is when there is none (resume)."""
    if config is not None and config_path is not None:
        raise ValueError("give the configuration once: config or config_path")
    if config_path is not None:
        config = load_config(config_path, {"run_dir": run_dir} if run_dir else None)
    elif config is None:
        if not run_dir:
            raise ValueError("give run_dir to resume a run, or a configuration to start one")
        return run_dir
    elif run_dir:
        config = config.model_copy(update={"run_dir": Path(run_dir)})
    steps.create_run(config)
    return str(config.run_dir)


@flow(name="discovery-run")
def discovery_run(run_dir: str | None = None, config: RunConfig | None = None, config_path: str | None = None) -> dict:
    """Start a run from a configuration in `run_dir`, or resume the run already there.

    The configuration is `config` (a RunConfig; a deployment passes it as a mapping, which Prefect
    validates) or `config_path` (a YAML file readable by the worker); `run_dir` overrides its
    run_dir. With neither, the run in `run_dir` resumes at the first step whose tasks have not all
    finished (`discover run` creates the run directory itself and passes `run_dir` alone); inside
    it, the tasks that finished come from Prefect's cache.
    """
    run = Run.open(_run_dir(run_dir, config, config_path))
    tasks.initialise(run)  # also on resume: a run killed while initialising finishes it first
    start, steps_ = run.finished_steps(), run.config.steps
    if start:
        log.info("resuming %s at step %d of %d", run.root, start, steps_)
    if start < steps_:
        with evaluation_engine(run) as task_runner:  # a local cluster lives as long as the run
            for step in range(start, steps_):
                log.info("step %d/%d", step + 1, steps_)
                discovery_step.with_options(task_runner=task_runner())(str(run.root), step)
                _quietly(artifacts.publish_step, run, step)
    report = _quietly(artifacts.publish_report, run)
    best = steps.best_state(run)
    log.info("best state %s: reward %.6f", best.id, best.reward)
    return {"run_dir": str(run.root), "best_state": best.id, "best_reward": best.reward, "report": str(report) if report else None}


def _quietly(fn, *args):
    """Artifacts and reports are for people: a failure to draw one is logged, never fatal to the run."""
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001
        log.warning("%s failed: %s", fn.__name__, err)
        return None
