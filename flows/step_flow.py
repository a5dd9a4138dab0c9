"""One training step as a Prefect flow: select → generate → evaluate → archive → train (docs/method.md §1).

The step's candidates are tasks of this flow's task runner (flows/engines.py; the run flow sets
it): with `evaluation.overlap` each starts as soon as its rollout is generated, so generation and
evaluation overlap; `evaluate` then waits for the last of them and writes the step's table.
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect import flow

from discover.run import Run
from flows import tasks
from flows.evaluation import step_evaluation
from storage.layout import RunLayout

RESULT_STORAGE_ENV = "DISCOVER_RESULT_STORAGE"


def result_storage(run_dir: str) -> Path | str:
    """Where task results (small references) live, so a resumed run finds its cache.

    Default RUN_DIR/prefect-results, beside the run. DISCOVER_RESULT_STORAGE overrides it for runs
    retried on other workers or containers: an absolute path (a shared mount; one folder per run id
    below it) or a Prefect block slug such as `s3-bucket/discover-results`. Prefect takes a `Path`
    as local-file-system storage; the JSON serializer keeps the results readable.
    """
    layout = RunLayout(Path(run_dir))
    shared = os.environ.get(RESULT_STORAGE_ENV, "").strip()
    if not shared:
        return layout.prefect_results.resolve()
    if shared.startswith("/"):
        return Path(shared) / Run.open(run_dir).run_id
    return shared  # a block document slug, "<block-type>/<block-name>"


@flow(name="discovery-step", flow_run_name="step-{step}")
def discovery_step(run_dir: str, step: int) -> dict[str, dict[str, str]]:
    """Run the five tasks of `step`; a task whose inputs are unchanged comes from the cache."""
    storage = result_storage(run_dir)

    def run(t, **kwargs):  # a task, with this run's result storage
        return t.with_options(result_storage=storage, result_serializer="json")(run_dir, step, **kwargs)

    parents = run(tasks.select_parents)
    with step_evaluation(run_dir, step):
        rollouts = run(tasks.generate, overlap=Run.open(run_dir).config.evaluation.overlap)
        evaluations = run(tasks.evaluate)
    archive = run(tasks.update_archive)
    checkpoint = run(tasks.train)
    return {"parents": parents, "rollouts": rollouts, "evaluations": evaluations, "archive": archive, "checkpoint": checkpoint}
