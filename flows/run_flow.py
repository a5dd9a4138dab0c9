"""A whole discovery run as a Prefect flow: initialise, then each unfinished step in order."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prefect import flow

from discover import steps
from discover.run import TASKS, Run
from flows import artifacts, tasks
from flows.engines import evaluation_engine
from flows.step_flow import discovery_step
from storage.manifest import finished_steps

log = logging.getLogger("discover")


def _config_yaml(run_dir: str | None, config_yaml: str | None, config_path: str | None, config: dict[str, Any] | None) -> tuple[str, str | None]:
    """The run directory and the configuration as YAML, from whichever form was given (or none: resume)."""
    import yaml

    from discover.config import dump_config, load_config, parse_config

    given = [x for x in (config_yaml, config_path, config) if x is not None]
    if len(given) > 1:
        raise ValueError("give the configuration once: config_yaml, config_path or config")
    overrides = {"run_dir": run_dir} if run_dir else None
    if config_path is not None:
        cfg = load_config(config_path, overrides)
    elif config is not None:
        cfg = parse_config({**config, **(overrides or {})}, source="the `config` parameter")
    elif config_yaml is not None:
        return run_dir or str(parse_config(yaml.safe_load(config_yaml)).run_dir), config_yaml
    else:
        if not run_dir:
            raise ValueError("give run_dir to resume a run, or a configuration to start one")
        return run_dir, None
    return str(cfg.run_dir), dump_config(cfg)


@flow(name="discovery-run")
def discovery_run(
    run_dir: str | None = None,
    config_yaml: str | None = None,
    config_path: str | None = None,
    config: dict[str, Any] | None = None,
) -> dict:
    """Start a run from a configuration in `run_dir`, or resume the run already there.

    The configuration comes as YAML text (`config_yaml`, what the CLI passes), a path readable by
    the worker (`config_path`) or a mapping (`config`); `run_dir` overrides its run_dir. With none
    of them the run in `run_dir` resumes at the first step whose tasks have not all finished; inside
    it, the tasks that finished come from Prefect's cache.
    """
    run_dir, config_yaml = _config_yaml(run_dir, config_yaml, config_path, config)
    if config_yaml is not None:
        steps.create_run(_parse(config_yaml, run_dir))
    tasks.initialise(run_dir)  # also on resume: a run killed while initialising finishes it first
    run = Run.open(run_dir)
    config_ = run.config
    start = finished_steps(run.layout.manifest, TASKS)
    if start:
        log.info("resuming %s at step %d of %d", run_dir, start, config_.steps)
    if start < config_.steps:
        with evaluation_engine(config_) as task_runner:  # a local cluster lives as long as the run
            for step in range(start, config_.steps):
                log.info("step %d/%d", step + 1, config_.steps)
                discovery_step.with_options(task_runner=task_runner())(run_dir, step)
                _quietly(artifacts.publish_step, run_dir, step)
    report = _quietly(artifacts.publish_report, run_dir)
    best = steps.best_state(Path(run_dir))
    log.info("best state %s: reward %.6f", best.id, best.reward)
    return {"run_dir": run_dir, "best_state": best.id, "best_reward": best.reward, "report": str(report) if report else None}


def _parse(config_yaml: str, run_dir: str):
    import yaml

    from discover.config import parse_config

    data = yaml.safe_load(config_yaml)
    data["run_dir"] = run_dir
    return parse_config(data)


def _quietly(fn, *args):
    """Artifacts and reports are for people: a failure to draw one is logged, never fatal to the run."""
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001
        log.warning("%s failed: %s", fn.__name__, err)
        return None
