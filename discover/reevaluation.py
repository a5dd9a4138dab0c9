"""Re-score a run's best candidates, e.g. on other hardware, and write the table beside the run.

Plain Python, no Prefect (flows/reevaluate_flow.py is the thin flow around it). A program
candidate runs again through its problem's evaluator in the sandbox, from the same parent
construction it was first given; a data candidate (a problem without a sandbox) has its
construction verified again. The table goes to RUN_DIR/reevaluations/<timestamp>-<pool>.parquet
with a Markdown view beside it.

For a problem that needs a GPU (a kernel) the table is named by the GPU type as well,
<timestamp>-<GPU type>-<pool>.parquet, with the GPU each candidate ran on and one column per
metric the evaluator reports (for TriMul the runtime of each benchmark shape and their geometric
mean, in µs), so nights and GPU types (H100 against A100, say) compare side by side. On a machine
without a GPU every row says so, and nothing is run.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from discover.evaluation import judge_candidate
from discover.records import Reevaluation, State
from discover.run import Run, load_archive, read_evaluations
from evaluators.base import EvalResult, ParentView
from evaluators.markdown import markdown_table
from evaluators.sandbox import sandbox_for
from evaluators.sandbox.gpus import local_gpus
from storage.atomic import atomic_write_text
from storage.tables import write_records

GPU_TYPE_ENV = "DISCOVER_GPU_TYPE"  # a GPU pool's declared type (prefect.yaml job variables)
NO_GPU = "no GPU: this machine has no CUDA GPU (nvidia-smi lists none), so nothing was re-timed; run the re-evaluation on a GPU pool"


def gpu_type() -> str:
    """The GPU type of this machine: the pool's declaration, else the first GPU's model, else "no-GPU"."""
    declared = os.environ.get(GPU_TYPE_ENV)
    if declared:
        return declared
    gpus = local_gpus()
    return gpus[0].name if gpus else "no-GPU"


def top_states(run: Run, k: int) -> list[State]:
    """The k best non-seed states of the newest archive, best first."""
    archive = load_archive(run.newest_archive())
    states = sorted((s for s in archive.states.values() if not s.is_seed), key=lambda s: s.reward, reverse=True)
    return states[:k]


def _parent_view(run: Run, state: State) -> ParentView | None:
    """The parent the candidate was first evaluated from: it was in the archive entering its step."""
    if state.parent_id is None:
        return None
    archive = load_archive(run.layout.archive(state.step))
    parent = archive.states.get(state.parent_id)
    return None if parent is None else ParentView(parent.code, parent.construction)


def _candidate(run: Run, state: State) -> str:
    """The parsed candidate the state came from (its program, or the answer of a data problem)."""
    if state.code:
        return state.code
    for e in read_evaluations(run.layout.evaluations(state.step)):  # data problems keep no program
        if e.child_id == state.id:
            return e.code
    raise KeyError(f"state {state.id} has no candidate in step {state.step}'s evaluations")


def reevaluate_states(
    run: Run,
    k: int,
    pool: str,
    slot: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> list[Reevaluation]:
    """Re-score the k best states; `slot()` is held around each evaluation (a GPU slot, say)."""
    problem = run.problem()
    host = socket.gethostname()
    no_gpu = problem.needs_gpu and not local_gpus()
    sandbox = (
        None
        if no_gpu
        else sandbox_for(
            problem, run.config.sandbox.backend, run.config.sandbox.concurrency, run.config.sandbox.allow_unbounded_process_tree
        )
    )
    rows = []
    for state in top_states(run, k):
        t0 = time.time()
        if no_gpu:  # a clear verdict, not a crash and not an hour of CPU checks
            result = EvalResult.invalid(NO_GPU)
        else:
            with slot():
                if problem.needs_sandbox:  # run the program again, from the same parent
                    result = judge_candidate(problem, _candidate(run, state), _parent_view(run, state), sandbox, state.id)
                else:  # a data problem: certify the construction again
                    result = problem.verify(state.construction)
        ran_on = ""  # a problem that needs no GPU
        if problem.needs_gpu:
            ran_on = "none" if no_gpu else str(result.construction.get("gpu", "")) if isinstance(result.construction, dict) else ""
        numbers = {name: float(v) for name, v in result.metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        rows.append(
            Reevaluation(
                **{**result.verdict_fields(), "metrics": numbers, "seconds": time.time() - t0},
                state_id=state.id,
                step=state.step,
                archived_reward=float(state.reward),
                pool=pool,
                host=host,
                gpu=ran_on,
            )
        )
    return rows


# the columns of the Markdown view, before one column per metric
_SHOWN = ("state_id", "step", "archived_reward", "reward", "valid", "reason", "seconds", "pool", "host", "gpu")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")


def write_reevaluation(run_dir: Path, rows: list[Reevaluation], pool: str, when: float | None = None, gpu: str | None = None) -> Path:
    """Write RUN_DIR/reevaluations/<UTC timestamp>[-<GPU type>]-<pool>.parquet and its .md view.

    `gpu` (the GPU type, for problems that need one) goes into the name; each metric the rows carry
    (a kernel's runtime per benchmark shape) is a column of its own (storage/tables.py, "expand").
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if when is None else when))
    name = "-".join(part for part in (stamp, _safe(gpu) if gpu else "", _safe(pool) or "local") if part)
    out = Path(run_dir) / "reevaluations" / f"{name}.parquet"
    write_records(out, rows, Reevaluation)
    where = f"pool `{pool}`" + (f", GPU {gpu}" if gpu else "")
    header = f"# Re-evaluation of {len(rows)} best states on {where} ({stamp})\n\n"
    if gpu == "no-GPU" or any(r.gpu == "none" for r in rows):
        header += f"**{NO_GPU}.**\n\n"
    metrics = sorted({k for r in rows for k in r.metrics})
    atomic_write_text(out.with_suffix(".md"), header + markdown_table(table_rows(rows), [*_SHOWN, *metrics]))
    return out


def table_rows(rows: list[Reevaluation]) -> list[dict[str, Any]]:
    """The rows as a table shows them (the Markdown view, Prefect's artifact): the fixed columns,
    then one per metric."""
    return [{**{c: getattr(r, c) for c in _SHOWN}, **r.metrics} for r in rows]


def reevaluate_run(
    run: Run, k: int, pool: str, slot: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
) -> tuple[list[Reevaluation], Path]:
    """Re-score the k best states and write the table, named by GPU type for a problem that needs one."""
    rows = reevaluate_states(run, k, pool, slot)
    gpu = gpu_type() if run.problem().needs_gpu else None
    return rows, write_reevaluation(run.root, rows, pool, gpu=gpu)
