"""Per-step figures of a run, for `discover status`, the report and the flow's artifacts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from discover.config import RunConfig, load_config
from storage.layout import RunLayout
from discover.run import TASKS
from storage.manifest import read_manifest


def step_rows(run_dir: Path) -> list[dict[str, Any]]:
    """One row per started step: best (archive after the step), mean reward and valid fraction of
    its rollouts, beta (mean, min, max over groups), completion tokens and seconds per task; None
    where not yet known."""
    layout = RunLayout(Path(run_dir))
    if not layout.config.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.yaml)")
    config = load_config(layout.config)
    tasks = read_manifest(layout.manifest)["tasks"]
    rows = []
    for step in range(config.steps):
        entries = {t: tasks.get(f"{step}/{t}") for t in TASKS}
        if not any(entries.values()):
            break
        row: dict[str, Any] = {"step": step, "best": None, "mean": None, "valid": None, "beta": None,
                               "beta_min": None, "beta_max": None, "tokens": None}
        if layout.evaluations(step).is_file():
            ev = pq.read_table(layout.evaluations(step), columns=["reward", "valid"])
            row["mean"] = float(np.mean(ev.column("reward").to_numpy()))
            row["valid"] = float(np.mean(ev.column("valid").to_numpy(zero_copy_only=False)))
        if layout.archive(step + 1).is_file():
            row["best"] = float(pq.read_table(layout.archive(step + 1), columns=["reward"]).column("reward").to_numpy().max())
        if layout.rollouts(step).is_file():
            ids = pq.read_table(layout.rollouts(step), columns=["completion_ids"]).column("completion_ids")
            row["tokens"] = int(sum(len(x) for x in ids.to_pylist()))
        if layout.train_stats(step).is_file():
            stats = json.loads(layout.train_stats(step).read_text())
            row["beta"], row["beta_min"], row["beta_max"] = stats.get("beta_mean"), stats.get("beta_min"), stats.get("beta_max")
        for t, e in entries.items():
            row[f"{t}_s"] = None if e is None else round(e["finished"] - e["started"], 2)
        rows.append(row)
    return rows


def _fmt(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def step_summaries(run_dir: Path) -> tuple[list[list[str]], RunConfig]:
    """`step_rows` as the strings of the `discover status` table."""
    rows = step_rows(run_dir)
    out = []
    for r in rows:
        beta = "–" if r["beta"] is None else f"{r['beta']:.3g} ({r['beta_min']:.3g}–{r['beta_max']:.3g})"
        times = [_fmt(r[f"{t}_s"], ".1f") + ("s" if r[f"{t}_s"] is not None else "") for t in TASKS]
        out.append([str(r["step"]), _fmt(r["best"], ".4f"), _fmt(r["mean"], ".4f"), _fmt(r["valid"], ".0%"), beta, *times])
    return out, load_config(RunLayout(Path(run_dir)).config)
