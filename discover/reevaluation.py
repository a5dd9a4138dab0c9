"""Re-score a run's best candidates, e.g. on other hardware, and write the table beside the run.

Plain Python, no Prefect (flows/reevaluate_flow.py is the thin flow around it). A program
candidate runs again through its problem's evaluator in the sandbox, from the same parent
construction it was first given; a data candidate (a problem without a sandbox) has its
construction verified again. The table goes to RUN_DIR/reevaluations/<timestamp>-<pool>.parquet
with a Markdown view beside it.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from pathlib import Path
from typing import Any, Callable, ContextManager

import pyarrow as pa

from discover.report import markdown_table
from discover.archive import State
from discover.run import Run, load_archive, read_evaluations
from evaluators.base import ParentView
from evaluators.sandbox import sandbox_for
from storage.atomic import atomic_write_text
from storage.tables import write_rows

REEVALUATION_SCHEMA = pa.schema(
    [
        ("state_id", pa.string()),
        ("step", pa.int32()),
        ("archived_reward", pa.float64()),
        ("reward", pa.float64()),
        ("valid", pa.bool_()),
        ("reason", pa.string()),
        ("seconds", pa.float64()),
        ("pool", pa.string()),
        ("host", pa.string()),
    ]
)


def top_states(run_dir: Path, k: int) -> list[State]:
    """The k best non-seed states of the newest archive, best first."""
    archive = load_archive(Run.open(run_dir).newest_archive())
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
    run_dir: Path,
    k: int,
    pool: str,
    slot: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
) -> list[dict[str, Any]]:
    """Re-score the k best states; `slot()` is held around each evaluation (a GPU slot, say)."""
    run = Run.open(run_dir)
    problem = run.problem()
    sandbox = sandbox_for(problem, run.config.sandbox.backend, run.config.sandbox.concurrency)
    host = socket.gethostname()
    rows = []
    for state in top_states(run_dir, k):
        t0 = time.time()
        with slot():
            if problem.needs_sandbox:  # run the program again, from the same parent
                result = problem.evaluate(_candidate(run, state), _parent_view(run, state), sandbox)
            else:  # a data problem: certify the construction again
                result = problem.verify(state.construction)
        rows.append(
            {
                "state_id": state.id,
                "step": state.step,
                "archived_reward": float(state.reward),
                "reward": float(result.reward) if result.valid else 0.0,
                "valid": bool(result.valid),
                "reason": result.reason,
                "seconds": time.time() - t0,
                "pool": pool,
                "host": host,
            }
        )
    return rows


def write_reevaluation(run_dir: Path, rows: list[dict[str, Any]], pool: str, when: float | None = None) -> Path:
    """Write RUN_DIR/reevaluations/<UTC timestamp>-<pool>.parquet and its .md view; return the Parquet path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if when is None else when))
    safe_pool = re.sub(r"[^A-Za-z0-9_.-]+", "-", pool) or "local"
    out = Path(run_dir) / "reevaluations" / f"{stamp}-{safe_pool}.parquet"
    write_rows(out, rows, REEVALUATION_SCHEMA)
    header = f"# Re-evaluation of {len(rows)} best states on pool `{pool}` ({stamp})\n\n"
    atomic_write_text(out.with_suffix(".md"), header + markdown_table(rows, REEVALUATION_SCHEMA.names))
    return out
