"""Erdős minimum overlap (docs/method.md §5, App. B.3): a step function h on [0, 2] certifies an upper bound.

State: n values of h (n pieces of width 2/n). Valid when 0 <= h <= 1 and, after rescaling to
sum h = n/2 (integral 1), still h <= 1. Bound = max_k (correlate(h, 1 - h, full))_k * 2/n;
lower is better, the reward is 1 / bound.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evaluators.base import EvalResult
from evaluators.math.problem import SequenceProblem
from evaluators.math.sequence import check_sequence
from evaluators.sandbox.base import SandboxLimits

MAX_PIECES = 1000  # App. B.3: "We filter out sequences with more than 1000 values"
RESCALE_SLACK = 1e-12  # a rescaled value may exceed 1 by this much (float rounding), no more
BEST_KNOWN_BOUND = 0.380876  # TTT-Discover's 600-piece construction (method paper, Table 2)


def erdos_bound(h: np.ndarray) -> float:
    """max_k (h ⋆ (1 - h))_k * 2/n for h already rescaled to sum n/2 (docs/method.md §5)."""
    n = len(h)
    return float(np.max(np.correlate(h, 1.0 - h, mode="full")) * 2.0 / n)


def overlap_function(h: np.ndarray) -> np.ndarray:
    """(h ⋆ (1 - h))_k * 2/n for every shift k, the curve whose maximum is the bound (for plots)."""
    return np.correlate(h, 1.0 - h, mode="full") * 2.0 / len(h)


def rescale(values: np.ndarray) -> np.ndarray:
    """h scaled so that sum h = n/2, i.e. its integral over [0, 2] is 1 (docs/method.md §5)."""
    return values * ((len(values) / 2.0) / values.sum())


class ErdosProblem(SequenceProblem):
    """Minimise the Erdős minimum-overlap bound with a step function written by a program."""

    name = "erdos"
    target = 1.0 / BEST_KNOWN_BOUND  # docs/method.md §5a: the record to beat, in reward units (1 / bound)

    def verify(self, construction: Any) -> EvalResult:
        values, reason = check_sequence(construction, high=1.0, max_pieces=MAX_PIECES)
        if values is None:
            return EvalResult.invalid(reason)
        n = len(values)
        h = rescale(values)
        if not np.isfinite(h).all():
            return EvalResult.invalid("values cannot be rescaled to sum n/2 (overflow)")
        top = float(h.max())
        if top > 1.0 + RESCALE_SLACK:
            return EvalResult.invalid(
                f"after rescaling to sum n/2 = {n / 2:g} the largest value is {top:.9g} > 1 "
                f"(the values sum to {values.sum():.9g}; they must sum to at least n/2 to stay in [0, 1])"
            )
        bound = erdos_bound(h)
        return EvalResult(
            reward=1.0 / bound,  # docs/method.md §5: reward = 1 / bound
            valid=True,
            construction=values.tolist(),
            metrics={"bound": bound, "pieces": n},
        )

    def random_construction(self, rng: np.random.Generator) -> list[float]:
        # docs/method.md §5, App. B.3: 40-100 values near 0.5 with noise.
        n = int(rng.integers(40, 101))
        return np.clip(0.5 + rng.normal(0.0, 0.1, n), 0.0, 1.0).tolist()

    def plot(self, construction: Any, path: str) -> EvalResult:
        from evaluators.math.plots import plot_erdos

        result = self.verify(construction)
        if result.valid:
            h = rescale(np.asarray(result.construction))
            plot_erdos(h, overlap_function(h), result.metrics["bound"], path)
        return result

    def describe(self, limits: SandboxLimits) -> str:
        return f"""\
Erdős minimum overlap problem.

Partition {{1, ..., 2n}} into two sets A and B of n elements each, let M_k be the number of
pairs a in A, b in B with a - b = k, and M(n) = min over partitions of max_k M_k. We want the
smallest upper bound on c = lim M(n)/n. Any step function h on [0, 2] with 0 <= h <= 1 and
integral of h equal to 1 (the density of A) certifies such a bound.

Represent h by n equal pieces: a list of n values h_0..h_{{n-1}}, each in [0, 1], at most
{MAX_PIECES} pieces. The verifier rescales h so that sum(h) = n/2 (the integral becomes 1) and
rejects h if any rescaled value exceeds 1 (tolerance {RESCALE_SLACK:g}). It then computes
    bound = max_k (numpy.correlate(h, 1 - h, mode="full"))_k * 2 / n.
Lower bounds are better; the reward is 1 / bound. Anything invalid (wrong type, NaN, inf,
values outside [0, 1], too many pieces, a crash, a timeout) gets reward 0.
The best known bound is {BEST_KNOWN_BOUND} (a 600-piece asymmetric step function);
before that 0.380924 (AlphaEvolve) and 0.380927 (Haugland 2016).

Your answer must contain one fenced ```python code block defining
    def construct(parent):
        ...
parent is the current state's step-function values as a list of floats (or None when there is
none); construct must return a list of at most {MAX_PIECES} floats in [0, 1]. Only the last
```python block of your answer is used. numpy and scipy are available; there is no network.
Limits: {limits.timeout_s:g} s wall clock, {limits.memory_mb} MB of memory, {limits.cpus} CPU threads;
a program that runs past them is killed and gets reward 0. Printed output is cut to its tail.
"""
