"""Re-score a run's best candidates, e.g. on other hardware, and write the table beside the run.

Plain Python, no Prefect (flows/reevaluate_flow.py is the thin flow around it). A program
candidate runs again through its problem's evaluator in the sandbox, from the same parent
construction it was first given; a data candidate (a problem without a sandbox) has its
construction verified again. The table goes to RUN_DIR/reevaluations/<timestamp>-<pool>.parquet
with a Markdown view beside it.

Every table records the GPU it really ran on, as the device reports it (model, total memory,
driver version: evaluators/sandbox/gpus.py), beside the pool's declared type (DISCOVER_GPU_TYPE):
in its header, in the Parquet file's metadata and on every row (`GpuCheck`).

For a problem that needs a GPU (a kernel) the table is named by this machine's GPU as well,
<timestamp>-<GPU model>-<pool>.parquet (`no-GPU` on a machine without one), with one column per
metric the evaluator reports (for TriMul the runtime of each benchmark shape and their geometric
mean, in µs), so nights and GPU types (H100 against A100, say) compare side by side. Nothing is
timed, and every row is invalid with a reason naming what was declared, what was found and the
fix, on a machine without a GPU or whose GPU is not of the declared type (the rule TriMul applies
too: `evaluators.sandbox.gpus.is_declared_type`). For a problem that needs no GPU the `gpu`
column says it was not used.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from discover.evaluation import judge_candidate
from discover.records import Reevaluation, State
from discover.run import Run, load_archive, read_evaluations
from evaluators.base import EvalResult, ParentView
from evaluators.markdown import markdown_table
from evaluators.sandbox import sandbox_for
from evaluators.sandbox.gpus import GPU_TYPE_ENV, Gpu, declared_gpu_type, local_gpus, wrong_gpu_reason
from storage.atomic import atomic_write_text
from storage.tables import write_records

NO_GPU = "no GPU: this machine has no CUDA GPU (nvidia-smi lists none), so nothing was re-timed; run the re-evaluation on a GPU pool"
CPU_ONLY = "not used (the problem runs on CPU)"  # the `gpu` of a row of a problem that needs no GPU
NO_DEVICE = "none"  # the `gpu` of a row of a problem that needs one, on a machine without one


@dataclass(frozen=True)
class GpuCheck:
    """The GPU side of one re-evaluation: the pool's declared type, the GPUs this machine really
    has (as nvidia-smi reports them), and whether the problem may be timed here.

    `refusal` is "" when it may (or when the problem needs no GPU), else the one-sentence reason
    every row gets: no GPU here, or a GPU whose model does not contain the declared type.
    """

    pool: str
    needs_gpu: bool
    declared: str | None
    gpus: tuple[Gpu, ...]

    @classmethod
    def here(cls, pool: str, needs_gpu: bool) -> GpuCheck:
        """This machine's check: DISCOVER_GPU_TYPE and the GPUs this process may use."""
        return cls(pool, needs_gpu, declared_gpu_type(), tuple(local_gpus()))

    @property
    def refusal(self) -> str:
        if not self.needs_gpu:
            return ""
        if not self.gpus:
            if not self.declared:
                return NO_GPU
            return (
                f"not timed: {self.declared} is declared ({GPU_TYPE_ENV} of pool {self.pool}), but this machine has no CUDA GPU "
                f"(nvidia-smi lists none); run the re-evaluation on a machine with a {self.declared}, or correct the pool's {GPU_TYPE_ENV}"
            )
        if self.declared:
            return wrong_gpu_reason(self.declared, self.gpus, f"{GPU_TYPE_ENV} of pool {self.pool}")
        return ""

    def device(self) -> str:
        """What this machine has: "this machine: no GPU", or "device <model>, <memory>, driver <version>"."""
        if not self.gpus:
            return "this machine: no GPU"
        counts = Counter(g.describe() for g in self.gpus)
        return "device " + "; ".join(d if n == 1 else f"{n} x {d}" for d, n in counts.items())

    def line(self) -> str:
        """Both sides in one line, e.g. "declared H100 (pool gpu-h100); this machine: no GPU"."""
        declared = f"declared {self.declared}" if self.declared else f"declared: none ({GPU_TYPE_ENV} unset)"
        return f"{declared} (pool {self.pool}); {self.device()}"

    def verdict(self) -> str:
        """One sentence on what the table's figures are."""
        if not self.needs_gpu:
            return "The problem runs on CPU: no GPU was used, and no figure of this table is a GPU figure."
        if self.refusal:
            return f"{self.refusal}."
        return f"Run on this machine's {' and '.join(sorted({g.name for g in self.gpus}))}: every runtime here is a figure of that GPU."

    def name_part(self) -> str | None:
        """What the table's file name says of the GPU: this machine's model, `no-GPU`; None when
        the problem needs none."""
        if not self.needs_gpu:
            return None
        return self.gpus[0].name if self.gpus else "no-GPU"

    def row_device(self, result: EvalResult | None) -> dict[str, Any]:
        """The GPU fields of one row: the GPU the candidate ran on (the one its result names,
        else this machine's first), or why there is none."""
        fields: dict[str, Any] = {"declared_gpu": self.declared or ""}
        if not self.needs_gpu:
            return {**fields, "gpu": CPU_ONLY}
        if not self.gpus:
            return {**fields, "gpu": NO_DEVICE}
        named = result.construction.get("gpu") if result is not None and isinstance(result.construction, dict) else None
        gpu = next((g for g in self.gpus if g.name == named), self.gpus[0])
        return {**fields, "gpu": gpu.name, "gpu_memory_mib": gpu.memory_mib, "gpu_driver": gpu.driver}


def row_gpu(row: Reevaluation) -> str:
    """A row's GPU as its table shows it, e.g. "declared H100; device NVIDIA H100 80GB HBM3, 81559
    MiB, driver 550.54.15"; for a problem that needs no GPU, why it is unused."""
    if row.gpu in (CPU_ONLY, ""):  # "": a version 1 row, which recorded no GPU
        return row.gpu
    declared = f"declared {row.declared_gpu}" if row.declared_gpu else "declared: none"
    if row.gpu == NO_DEVICE:
        return f"{declared}; this machine: no GPU"
    return f"{declared}; device {Gpu('', row.gpu, memory_mib=row.gpu_memory_mib, driver=row.gpu_driver).describe()}"


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
    check: GpuCheck | None = None,
) -> list[Reevaluation]:
    """Re-score the k best states; `slot()` is held around each evaluation (a GPU slot, say).

    `check` (default: this machine's) refuses a problem that needs a GPU where there is none or
    where it is not of the declared type: every row is then invalid with its reason, and nothing runs.
    """
    problem = run.problem()
    check = check or GpuCheck.here(pool, problem.needs_gpu)
    refusal = check.refusal
    host = socket.gethostname()
    sandbox = (
        None
        if refusal
        else sandbox_for(
            problem,
            run.config.sandbox.backend,
            run.config.sandbox.concurrency,
            run.config.sandbox.allow_unbounded_process_tree,
            run.config.sandbox.isolation,
        )
    )
    rows = []
    for state in top_states(run, k):
        t0 = time.time()
        if refusal:  # a clear verdict, not a crash, not an hour of CPU checks, and no figure from the wrong device
            result = EvalResult.invalid(refusal)
        else:
            with slot():
                if problem.needs_sandbox:  # run the program again, from the same parent
                    result = judge_candidate(problem, _candidate(run, state), _parent_view(run, state), sandbox, state.id)
                else:  # a data problem: certify the construction again
                    result = problem.verify(state.construction)
        numbers = {name: float(v) for name, v in result.metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        rows.append(
            Reevaluation(
                **{**result.verdict_fields(), "metrics": numbers, "seconds": time.time() - t0},
                state_id=state.id,
                step=state.step,
                archived_reward=float(state.reward),
                pool=pool,
                host=host,
                **check.row_device(None if refusal else result),
            )
        )
    return rows


# the columns of the Markdown view, before one column per metric
_SHOWN = ("state_id", "step", "archived_reward", "reward", "valid", "reason", "seconds", "pool", "host", "gpu")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")


def write_reevaluation(run_dir: Path, rows: list[Reevaluation], check: GpuCheck, when: float | None = None) -> Path:
    """Write RUN_DIR/reevaluations/<UTC timestamp>[-<GPU model>]-<pool>.parquet and its .md view.

    The GPU model (or `no-GPU`) is in the name for a problem that needs a GPU; the declared type
    and the device are in the Markdown header and the Parquet file's metadata (`gpu`,
    `gpu_verdict`, `declared_gpu`, `pool`); each metric the rows carry (a kernel's runtime per
    benchmark shape) is a column of its own (storage/tables.py, "expand").
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if when is None else when))
    gpu = check.name_part()
    name = "-".join(part for part in (stamp, _safe(gpu) if gpu else "", _safe(check.pool) or "local") if part)
    out = Path(run_dir) / "reevaluations" / f"{name}.parquet"
    metadata = {"pool": check.pool, "declared_gpu": check.declared or "", "gpu": check.line(), "gpu_verdict": check.verdict()}
    write_records(out, rows, Reevaluation, metadata)
    header = f"# Re-evaluation of {len(rows)} best states on pool `{check.pool}` ({stamp})\n\n"
    header += f"GPU: {check.line()}.\n\n"
    header += f"**{check.verdict()}**\n\n" if check.refusal else f"{check.verdict()}\n\n"
    metrics = sorted({k for r in rows for k in r.metrics})
    atomic_write_text(out.with_suffix(".md"), header + markdown_table(table_rows(rows), [*_SHOWN, *metrics]))
    return out


def table_summary(path: Path) -> str:
    """The GPU line and verdict a table was written with (its Parquet metadata), for a caption."""
    meta = {k.decode(): v.decode() for k, v in (pq.read_schema(path).metadata or {}).items()}
    return f"GPU: {meta.get('gpu', 'not recorded (written before version 2)')}. {meta.get('gpu_verdict', '')}".strip()


def table_rows(rows: list[Reevaluation]) -> list[dict[str, Any]]:
    """The rows as a table shows them (the Markdown view, Prefect's artifact): the fixed columns,
    `gpu` as the declared type beside the device, then one column per metric."""
    return [{**{c: getattr(r, c) for c in _SHOWN}, "gpu": row_gpu(r), **r.metrics} for r in rows]


def reevaluate_run(
    run: Run, k: int, pool: str, slot: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
) -> tuple[list[Reevaluation], Path]:
    """Re-score the k best states and write the table, named by this machine's GPU for a problem that needs one."""
    check = GpuCheck.here(pool, run.problem().needs_gpu)
    rows = reevaluate_states(run, k, pool, slot, check)
    return rows, write_reevaluation(run.root, rows, check)
