"""The per-step summary behind `discover status`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from discover.config import RunConfig, load_config
from storage.layout import RunLayout
from storage.manifest import TASKS, read_manifest
from storage.tables import read_archive, read_rows


def _fmt(x: float | None, digits: int = 4) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def step_summaries(run_dir: Path) -> tuple[list[list[str]], RunConfig]:
    """One row of strings per step that has started: rewards, validity, beta, seconds per task."""
    layout = RunLayout(Path(run_dir))
    if not layout.config.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.yaml)")
    config = load_config(layout.config)
    manifest = read_manifest(layout.manifest)["tasks"]
    rows = []
    for step in range(config.steps):
        entries = {t: manifest.get(f"{step}/{t}") for t in TASKS}
        if not any(entries.values()):
            break
        best = mean = valid = None
        if layout.evaluations(step).is_file():
            ev = read_rows(layout.evaluations(step))
            rewards = np.array([e["reward"] for e in ev])
            mean, valid = float(rewards.mean()), float(np.mean([e["valid"] for e in ev]))
        if layout.archive(step + 1).is_file():
            records, _ = read_archive(layout.archive(step + 1))
            best = max(r["reward"] for r in records)
        beta = "–"
        if layout.train_stats(step).is_file():
            t = json.loads(layout.train_stats(step).read_text())
            if t.get("beta_mean") is not None:
                beta = f"{t['beta_mean']:.3g} ({t['beta_min']:.3g}–{t['beta_max']:.3g})"
        times = [f"{e['finished'] - e['started']:.1f}s" if e else "–" for e in entries.values()]
        rows.append([str(step), _fmt(best), _fmt(mean), "–" if valid is None else f"{valid:.0%}", beta, *times])
    return rows, config
