"""One training step as a Prefect flow: select → generate → evaluate → archive → train (docs/method.md §1).

The step's candidates are tasks of this flow's task runner (flows/engines.py; the run flow sets
it): with `evaluation.overlap` each starts as soon as its rollout is generated, so generation and
evaluation overlap; `evaluate` then waits for the last of them and writes the step's table.

A task the run's manifest records as finished is not called again: its recorded output is used as
it is (`Run.finished_output`), whatever changed in the code since. The others run, or come from
Prefect's cache (flows/cache.py).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from prefect import flow

from discover.run import Ref, Run
from flows import tasks
from flows.evaluation import step_evaluation
from storage.manifest import record_task, task_entry

RESULT_STORAGE_ENV = "DISCOVER_RESULT_STORAGE"

log = logging.getLogger("discover")


def result_storage(run: Run) -> Path | str:
    """Where task results (small references) live, so a resumed run finds its cache.

    Default RUN_DIR/prefect-results, beside the run. DISCOVER_RESULT_STORAGE overrides it for runs
    retried on other workers or containers: an absolute path (a shared mount; one folder per run id
    below it) or a Prefect block slug such as `s3-bucket/discover-results`. Prefect takes a `Path`
    as local-file-system storage; the JSON serializer keeps the results readable.
    """
    shared = os.environ.get(RESULT_STORAGE_ENV, "").strip()
    if not shared:
        return run.layout.prefect_results.resolve()
    if shared.startswith("/"):
        return Path(shared) / run.run_id
    return shared  # a block document slug, "<block-type>/<block-name>"


@flow(name="discovery-step", flow_run_name="step-{step}")
def discovery_step(run_dir: str, step: int) -> dict[str, Ref]:
    """Run the five tasks of `step`; a task the manifest records as finished is not run again."""
    run = Run.open(run_dir)
    storage = result_storage(run)

    def run_task(t: Any, **kwargs: Any) -> Ref:
        """The task's output: as recorded when it finished before, else from running it (or Prefect's cache)."""
        done = run.finished_output(t.name, step)
        if done is not None:
            log.info("step %d %s: finished before (manifest.json), not run again", step, t.name)
            return done
        ref = t.with_options(result_storage=storage, result_serializer="json")(run, step, **kwargs)
        if task_entry(run.layout.manifest, step, t.name) is None:  # from Prefect's cache: finished, not executed now
            now = time.time()
            record_task(run.layout.manifest, step, t.name, ref, now, now, executed=False)
        return ref

    parents = run_task(tasks.select_parents)
    with step_evaluation(run, step):
        rollouts = run_task(tasks.generate, overlap=run.config.evaluation.overlap)
        evaluations = run_task(tasks.evaluate)
    archive = run_task(tasks.update_archive)
    checkpoint = run_task(tasks.train)
    return {"parents": parents, "rollouts": rollouts, "evaluations": evaluations, "archive": archive, "checkpoint": checkpoint}
