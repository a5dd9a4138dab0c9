"""Per-step figures of a run for `discover status`: read from each step's metrics record
(discover/metrics.py), nothing else; the report and the flow's artifacts read the same records."""

from __future__ import annotations

from typing import Any

from discover.metrics import run_metrics
from discover.run import TASKS, Run


def step_rows(run: Run) -> list[dict[str, Any]]:
    """One row per started step: {"step": n} and the step's metrics record (None where not yet
    known). A step without a kept record (unfinished, or a run of an older version) gets one
    computed now."""
    return [{"step": step, **record} for step, record in run_metrics(run)]


def _fmt(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def step_summaries(run: Run) -> list[list[str]]:
    """`step_rows` as the strings of the `discover status` table: step, best, mean, valid, beta
    (min–max), seconds per task."""
    out = []
    for r in step_rows(run):
        beta, lo, hi = (r.get(f"train/beta_{k}") for k in ("mean", "min", "max"))
        beta_text = "–" if beta is None else f"{beta:.3g}" + ("" if lo is None or hi is None else f" ({lo:.3g}–{hi:.3g})")
        times = [_fmt(r.get(f"time/{t}"), ".1f") + ("s" if r.get(f"time/{t}") is not None else "") for t in TASKS]
        out.append(
            [
                str(r["step"]),
                _fmt(r.get("reward/best"), ".4f"),
                _fmt(r.get("reward/mean"), ".4f"),
                _fmt(r.get("reward/valid_fraction"), ".0%"),
                beta_text,
                *times,
            ]
        )
    return out
