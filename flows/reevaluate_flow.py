"""Re-evaluation as a Prefect flow: re-score a run's top-k candidates on this worker's pool.

Deployed per GPU pool with a cron schedule (prefect.yaml); the table goes beside the run
(RUN_DIR/reevaluations/<timestamp>-<pool>.parquet and .md; a kernel run's table is named by this
machine's GPU model, or no-GPU, and has a runtime column per benchmark shape). The table artifact's
rows show the pool's declared GPU type beside the device, and its description the verdict. The
work is discover/reevaluation.py.
"""

from __future__ import annotations

import contextlib
import logging
from functools import partial

from prefect import flow
from prefect.artifacts import create_table_artifact
from prefect.context import FlowRunContext

from discover.reevaluation import reevaluate_run, table_rows, table_summary
from discover.run import Run
from flows.logs import forward_project_logs
from flows.naming import reevaluation_key, run_name

log = logging.getLogger("discover")


def _pool() -> str:
    ctx = FlowRunContext.get()
    return (ctx.flow_run.work_pool_name if ctx and ctx.flow_run else None) or "local"


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    return f"{run_name(flow_run.parameters['run_dir'])}-reevaluate-top{flow_run.parameters.get('top_k', 5)}"


@flow(name="reevaluate", flow_run_name=_flow_run_name)
def reevaluate(run_dir: str, top_k: int = 5, gpu_limit: str | None = None) -> str:
    """Re-score the top_k states of the run in `run_dir` and write the table beside it.

    `gpu_limit` names the global concurrency limit of this pool's GPUs (prefect.yaml sets it per
    GPU pool): each candidate holds one slot while it runs, so re-evaluations, and the evaluate
    tasks of runs on the same pool, never use more GPUs than the pool has.
    """
    forward_project_logs()
    pool = _pool()
    slot = contextlib.nullcontext
    if gpu_limit:
        from prefect.concurrency.sync import concurrency

        slot = partial(concurrency, gpu_limit, occupy=1, strict=True)
    run = Run.open(run_dir)
    rows, out = reevaluate_run(run, top_k, pool, slot)
    create_table_artifact(table_rows(rows), key=reevaluation_key(run, pool), description=f"{run_dir}: {out.name}. {table_summary(out)}")
    log.info("re-evaluated %d states of %s on %s: %s", len(rows), run_dir, pool, out)
    return str(out)
