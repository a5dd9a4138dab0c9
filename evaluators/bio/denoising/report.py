"""The run report's denoising section: the best program's MSE, Poisson and score against the
baselines of the same split (no denoising, perfect, the MAGIC seed, ALRA) and the published figures.

The best program's and the seed's figures are those the sandbox gave them during the run (kept
in their states); ALRA is our own code and runs here, in this process, on the train half.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from evaluators.base import ArchivedState, ReportSection
from evaluators.bio.denoising.metrics import COUNT_POISSON_MIN, DROPOUT_AUC_MIN, LIKELIHOOD_SHARE, Baselines, judge
from evaluators.bio.denoising.sources import run_program
from evaluators.bio.denoising.split import Split

__all__ = ["COLUMNS", "PUBLISHED", "TITLE", "baseline_rows", "report_sections", "row", "run_program"]

TITLE = "Denoising: the best program against the baselines"
COLUMNS = (
    "method",
    "MSE",
    "Poisson",
    "normalised MSE",
    "normalised Poisson",
    "score",
    "normalised count-scale Poisson",
    "dropout AUC",
    "reward",
)
PUBLISHED = "MAGIC (A, R) 0.64, ALRA (S, RN) 0.50, TTT-Discover 0.71"  # Table 7, PBMC 1k scores


def row(method: str, metrics: dict[str, float], reward: float | None) -> dict[str, Any]:
    return {
        "method": method,
        "MSE": metrics["mse"],
        "Poisson": metrics["poisson"],
        "normalised MSE": metrics["mse_normalized"],
        "normalised Poisson": metrics["poisson_normalized"],
        "score": metrics["score"],
        "normalised count-scale Poisson": metrics.get("count_poisson_normalized"),  # absent in states scored before the rule
        "dropout AUC": metrics.get("dropout_auc"),
        "reward": reward,
    }


def baseline_rows(split: Split, baselines: Baselines) -> list[dict[str, Any]]:
    """No denoising, ALRA, and perfect on this split (no denoising is rejected: reward 0; ALRA too, by the
    likelihood rule, docs/method.md §5d)."""
    rows = []
    for method, denoised in (("no denoising (D = train)", split.train), ("ALRA (programs/alra.py)", run_program("alra", split))):
        verdict = judge(split, baselines, denoised)
        rows.append(row(method, verdict.metrics, verdict.reward))
    perfect = judge(split, baselines, split.test)
    rows.append(row("perfect (D = held-out counts)", perfect.metrics, None))
    return rows


def report_sections(prepared: Any, states: Sequence[ArchivedState]) -> list[ReportSection]:
    """The best state and the seed against the baselines of the run's split; `prepared` is the
    problem's dataset ready to score on (problem.py `Prepared`: split, baselines, source)."""
    scored = [s for s in states if isinstance(s.construction, dict) and "mse" in s.construction]
    rows = []
    if scored:
        best = scored[0]
        rows.append(row(f"best state {best.id} (step {best.step})", best.construction, best.reward))
    for seed in (s for s in scored if s.is_seed):
        if not rows or seed is not scored[0]:
            rows.append(row(f"MAGIC seed {seed.id}", seed.construction, seed.reward))
    rows += baseline_rows(prepared.split, prepared.baselines)
    cells, genes = prepared.split.shape
    text = (
        f"Dataset {prepared.source}: {cells} cells x {genes} genes after filtering, split seed "
        f"{prepared.split.seed}{' keyed with the counts' if prepared.split.keyed else ''} (train "
        f"{prepared.split.train_total:.0f} molecules, held out {float(np.sum(prepared.split.test)):.0f}). "
        "Reward: 1 / MSE when the normalised Poisson is in [0.97, 1] (the published gate) and the "
        f"normalised count-scale Poisson is at least {COUNT_POISSON_MIN} and {LIKELIHOOD_SHARE} x the MAGIC seed's "
        f"({prepared.baselines.count_poisson_magic:.4f} on this split) and the dropout AUC at least {DROPOUT_AUC_MIN} "
        "(ours, docs/method.md §5d), else 0; the MSE is taken no lower than the output's flattened to the MAGIC seed's "
        f"sharpness (calibration power {prepared.baselines.calibration_power_magic:.4f} on this split; the calibration rule). "
        "MSE and Poisson: lower is better; normalised values and score: higher. "
        f"Published scores on PBMC 1k (method paper, Table 7): {PUBLISHED}; another dataset and size, "
        "so compare the ordering, not the digits."
    )
    return [ReportSection(title=TITLE, text=text, rows=rows, columns=COLUMNS)]
