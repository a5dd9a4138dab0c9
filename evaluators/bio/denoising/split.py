"""Molecular cross-validation (Batson et al. 2019) as OpenProblems v1 splits a dataset (docs/method.md §5d).

Each count is split by `train = Binomial(X, 0.9)` drawn from `numpy.random.RandomState(seed)`
(the generator and call OpenProblems' split_data uses, so the same counts and seed give the same
split), `test = X - train`; genes whose train total is 0 are dropped from both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TRAIN_FRACTION = 0.9  # docs/method.md §5d: train = Binomial(X, 0.9)
DEFAULT_SEED = 42  # the released code's split seed (run_denoising_eval(..., seed=42))


@dataclass(frozen=True)
class Split:
    """The two halves of one dataset's molecules (float64, cells x genes, same shape)."""

    train: np.ndarray
    test: np.ndarray
    seed: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.train.shape

    @property
    def train_total(self) -> float:
        return float(self.train.sum())


def split_molecules(X: np.ndarray, seed: int = DEFAULT_SEED) -> Split:
    """docs/method.md §5d: train ~ Binomial(X, 0.9) seeded, test = X - train, genes with no train count dropped."""
    counts = np.asarray(X)
    if counts.ndim != 2 or not np.issubdtype(counts.dtype, np.integer) or counts.min(initial=0) < 0:
        raise ValueError("split_molecules needs a 2-D array of non-negative integer counts")
    counts = counts.astype(np.int64)
    train = np.random.RandomState(seed).binomial(counts, TRAIN_FRACTION)
    test = counts - train
    kept = train.sum(axis=0) > 0
    return Split(
        train=np.ascontiguousarray(train[:, kept], dtype=np.float64),
        test=np.ascontiguousarray(test[:, kept], dtype=np.float64),
        seed=seed,
    )
