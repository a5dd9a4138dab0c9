"""Second autocorrelation inequality (docs/method.md §5, App. B.2): a non-negative step function f
certifies the lower bound C2 >= ||f * f||_2^2 / (||f * f||_1 ||f * f||_inf); higher is better.

With c = f * f (m = 2n - 1 entries) read as a piecewise-linear function through m + 2 equally
spaced points of [-1/2, 1/2] with zero ends, the norms are those of that function. The reward is
the bound itself.
"""

from __future__ import annotations

import math

import numpy as np

from evaluators.math.autoconvolution import autoconvolution
from evaluators.math.autocorrelation import CONTRACT_TEMPLATE, SEQUENCE_RULES, AutocorrelationProblem
from evaluators.sandbox.base import SandboxLimits

BEST_KNOWN_BOUND = 0.9610  # AlphaEvolve V2's 50,000-piece construction (method paper, §4.1.2)
ROUND_DOWN = 1e-14  # relative: covers the roundings after the convolution (terms, sums, quotient)


def ac2_bound(f: np.ndarray, method: str = "auto") -> float:
    """A certified lower bound on L2^2 / (L1 Linf) of c = f * f (docs/method.md §5, App. B.2)."""
    c, error = autoconvolution(f, method)
    m = len(c)
    step = 1.0 / (m + 1)  # m + 2 equally spaced points of [-1/2, 1/2]: m + 1 intervals
    # The exact c lies in [low, c + error]; L2^2 grows with every c_k (all are >= 0), so `low`
    # gives a lower bound on it, and max(c) + error an upper bound on Linf.
    low = np.concatenate(([0.0], np.maximum(c - error, 0.0), [0.0]))
    y1, y2 = low[:-1], low[1:]
    # docs/method.md §5: L2^2 = sum over intervals of h/3 (y1^2 + y1 y2 + y2^2) (exact for a linear piece)
    l2_squared = step / 3.0 * math.fsum(y1 * y1 + y1 * y2 + y2 * y2)
    # docs/method.md §5: L1 = sum |c| / (m + 1); sum_k (f * f)_k = (sum f)^2 exactly, so no FFT error enters
    l1 = math.fsum(f) ** 2 / (m + 1)
    linf = float(c.max()) + error  # docs/method.md §5: Linf = max |c|
    return l2_squared / (l1 * linf) * (1 - ROUND_DOWN)


class SecondAutocorrelationProblem(AutocorrelationProblem):
    """Maximise the AC2 bound ||f * f||_2^2 / (||f * f||_1 ||f * f||_inf) with a program."""

    name = "ac2"
    starter = "ac2_local.py"  # a plain local search (ours: no released AC2 starter is known to us)
    target = BEST_KNOWN_BOUND  # docs/method.md §5a: the record to beat, in reward units (the bound)

    def certify(self, f: np.ndarray) -> tuple[float, dict[str, float]]:
        bound = ac2_bound(f)
        return bound, {"bound": bound, "pieces": len(f)}  # docs/method.md §5: reward = bound

    def describe(self, limits: SandboxLimits) -> str:
        return f"""\
Second autocorrelation inequality.

For non-negative f, let C2 = sup_f ||f * f||_2^2 / (||f * f||_1 ||f * f||_inf). Any non-negative
step function f certifies the lower bound C2 >= ||f * f||_2^2 / (||f * f||_1 ||f * f||_inf),
and we want the largest such lower bound.

{SEQUENCE_RULES}
The verifier computes c = numpy.convolve(f, f) (m = 2n - 1 values) and reads it as the
piecewise-linear function through m + 2 equally spaced points of [-1/2, 1/2] whose two end
values are 0, with h = 1 / (m + 1) the spacing:
    L2^2 = sum over the m + 1 intervals of h/3 * (y1^2 + y1*y2 + y2^2)
    L1   = sum(|c|) / (m + 1)
    Linf = max(|c|)
    bound = L2^2 / (L1 * Linf)
(rigorously: it moves c by a bound on the floating-point error of its convolution, about 1e-12
of the maximum, in the direction that lowers the bound). Higher is better; the reward is the
bound. The best known bound is {BEST_KNOWN_BOUND} (AlphaEvolve V2, a 50,000-piece step function);
before that 0.9015 (Boyer and Li 2025), 0.8962 (AlphaEvolve) and 0.8892 (Matolcsi and Vinuesa).

{CONTRACT_TEMPLATE.format(max_output_bytes=limits.max_output_bytes)}
Limits: {limits.timeout_s:g} s wall clock, {limits.memory_mb} MB of memory, {limits.cpus} CPU threads;
a program that runs past them is killed and gets reward 0. Printed output is cut to its tail.
Sequences of tens of thousands of pieces are fine.
"""
