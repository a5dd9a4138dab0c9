"""A whole discovery run as a Prefect flow: initialise, then each unfinished step in order."""

from __future__ import annotations

import logging
from pathlib import Path

from prefect import flow

from discover import steps
from flows import tasks
from flows.step_flow import discovery_step
from storage.manifest import finished_steps

log = logging.getLogger("discover")


@flow(name="discovery-run")
def discovery_run(run_dir: str, config_yaml: str | None = None) -> dict:
    """Start a run from `config_yaml` in `run_dir`, or resume the run already there.

    Resuming starts at the first step whose tasks have not all finished; inside it, the tasks that
    finished come from Prefect's cache.
    """
    if config_yaml is not None:
        tasks.init_run(config_yaml, run_dir)
    config, layout = steps.open_run(Path(run_dir))
    start = finished_steps(layout.manifest)
    if start:
        log.info("resuming %s at step %d of %d", run_dir, start, config.steps)
    for step in range(start, config.steps):
        log.info("step %d/%d", step + 1, config.steps)
        discovery_step(run_dir, step)
    best = steps.best_state(Path(run_dir))
    log.info("best state %s: reward %.6f", best.id, best.reward)
    return {"run_dir": run_dir, "best_state": best.id, "best_reward": best.reward}
