"""One training step as a Prefect flow: select → generate → evaluate → archive → train (SPEC §1)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows import tasks
from storage.layout import RunLayout


def result_storage(run_dir: str) -> Path:
    """Task results (small references) live beside the run, so a resumed run finds its cache.

    Prefect takes a `Path` as local-file-system storage; the JSON serializer keeps them readable.
    """
    return RunLayout(Path(run_dir)).prefect_results.resolve()


@flow(name="discovery-step", flow_run_name="step-{step}")
def discovery_step(run_dir: str, step: int) -> dict[str, dict[str, str]]:
    """Run the five tasks of `step`; a task whose inputs are unchanged comes from the cache."""
    storage = result_storage(run_dir)

    def run(t):  # a task, with this run's result storage
        return t.with_options(result_storage=storage, result_serializer="json")(run_dir, step)

    parents = run(tasks.select_parents)
    rollouts = run(tasks.generate)
    evaluations = run(tasks.evaluate)
    archive = run(tasks.update_archive)
    checkpoint = run(tasks.train)
    return {"parents": parents, "rollouts": rollouts, "evaluations": evaluations, "archive": archive, "checkpoint": checkpoint}
