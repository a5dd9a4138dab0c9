"""Molecular cross-validation (Batson et al. 2019) as OpenProblems v1 splits a dataset (docs/method.md §5d).

Each count is split by `train = Binomial(X, 0.9)` drawn from `numpy.random.RandomState(...)`
(the generator and call OpenProblems' split_data uses), `test = X - train`; genes whose train
total is 0 are dropped from both.

The generator's seed is keyed (`keyed_seed`, docs/method.md §5d "The split's seed"): the
SHA-256 of the configured seed together with the full counts, never the configured seed itself.
`RandomState(seed).binomial` draws exactly one uniform per entry, so whoever knows the generator's
seed can invert the split from the train counts alone; the keyed seed cannot be computed without
the held-out counts, so a candidate cannot recover it. `keyed=False` gives OpenProblems' own
split (`RandomState(seed)`), for comparison with its released code only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

TRAIN_FRACTION = 0.9  # docs/method.md §5d: train = Binomial(X, 0.9)
DEFAULT_SEED = 42  # the released code's split seed (run_denoising_eval(..., seed=42)), keyed below
KEY_DOMAIN = b"discover/denoising/split/v1\0"  # docs/method.md §5d: what the split's SHA-256 key starts with


@dataclass(frozen=True)
class Split:
    """The two halves of one dataset's molecules (float64, cells x genes, same shape)."""

    train: np.ndarray
    test: np.ndarray
    seed: int  # the configured seed; the generator's own seed is keyed with the counts (never stored)
    keyed: bool = True

    @property
    def shape(self) -> tuple[int, int]:
        return self.train.shape

    @property
    def train_total(self) -> float:
        return float(self.train.sum())


def keyed_seed(counts: np.ndarray, seed: int) -> np.ndarray:
    """docs/method.md §5d: the generator's seed, the eight 32-bit words of SHA-256(domain, seed, shape, counts)."""
    counts = np.ascontiguousarray(counts, dtype="<i8")
    digest = hashlib.sha256()
    digest.update(KEY_DOMAIN)
    digest.update(int(seed).to_bytes(16, "little", signed=True))
    digest.update(np.asarray(counts.shape, dtype="<i8").tobytes())
    digest.update(counts.tobytes())
    return np.frombuffer(digest.digest(), dtype="<u4").astype(np.uint32)


def split_molecules(X: np.ndarray, seed: int = DEFAULT_SEED, keyed: bool = True) -> Split:
    """docs/method.md §5d: train ~ Binomial(X, 0.9) seeded, test = X - train, genes with no train count dropped."""
    counts = np.asarray(X)
    if counts.ndim != 2 or not np.issubdtype(counts.dtype, np.integer) or counts.min(initial=0) < 0:
        raise ValueError("split_molecules needs a 2-D array of non-negative integer counts")
    counts = counts.astype(np.int64)
    generator_seed = keyed_seed(counts, seed) if keyed else seed
    train = np.random.RandomState(generator_seed).binomial(counts, TRAIN_FRACTION)
    test = counts - train
    kept = train.sum(axis=0) > 0
    return Split(
        train=np.ascontiguousarray(train[:, kept], dtype=np.float64),
        test=np.ascontiguousarray(test[:, kept], dtype=np.float64),
        seed=seed,
        keyed=keyed,
    )
