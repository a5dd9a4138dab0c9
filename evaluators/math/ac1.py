"""First autocorrelation inequality (docs/method.md §5, App. B.2): a non-negative step function f on
[-1/4, 1/4] certifies the upper bound C1 <= max(f * f) / (integral f)^2; lower is better.

With f given by n equal pieces the bound is 2 n max(f * f) / (sum f)^2 (`*` the full discrete
convolution), and the reward is 1 / bound.
"""

from __future__ import annotations

import math

import numpy as np

from evaluators.math.autoconvolution import autoconvolution
from evaluators.math.autocorrelation import CONTRACT_TEMPLATE, SEQUENCE_RULES, AutocorrelationProblem
from evaluators.sandbox.base import SandboxLimits

BEST_KNOWN_BOUND = 1.50287  # TTT-Discover's 30,000-piece construction (method paper, Table 2)
ROUND_UP = 1e-14  # relative: covers the few roundings after the convolution (sum, square, divide)


def ac1_bound(f: np.ndarray, method: str = "auto") -> float:
    """A certified upper bound on 2 n max(f * f) / (sum f)^2 (docs/method.md §5, App. B.2)."""
    c, error = autoconvolution(f, method)
    total = math.fsum(f)  # correctly rounded sum
    # max of the exact f * f is at most max(c) + error; then round the quotient up.
    return 2 * len(f) * (float(c.max()) + error) / (total * total) * (1 + ROUND_UP)


class FirstAutocorrelationProblem(AutocorrelationProblem):
    """Minimise the AC1 bound 2 n max(f * f) / (sum f)^2 with a sequence written by a program."""

    name = "ac1"
    starter = "ac1_lp.py"  # linear-programming steps, as the released AC1 seed program takes
    target = 1.0 / BEST_KNOWN_BOUND  # docs/method.md §5a: the record to beat, in reward units (1 / bound)

    def certify(self, f: np.ndarray) -> tuple[float, dict[str, float]]:
        bound = ac1_bound(f)
        return 1.0 / bound, {"bound": bound, "pieces": len(f)}  # docs/method.md §5: reward = 1 / bound

    def describe(self, limits: SandboxLimits) -> str:
        return f"""\
First autocorrelation inequality.

For non-negative f supported on [-1/4, 1/4], let C1 be the largest constant with
    max_{{|t| <= 1/2}} (f * f)(t) >= C1 (integral of f)^2
for every such f. Any non-negative step function f certifies the upper bound
    C1 <= max(f * f) / (integral of f)^2,
and we want the smallest such upper bound.

{SEQUENCE_RULES}
The verifier computes, with the full discrete convolution f * f = numpy.convolve(f, f),
    bound = 2 * n * max(f * f) / (sum f)^2
(rigorously: it adds a bound on the floating-point error of its convolution, about 1e-12 of
the maximum). Lower bounds are better; the reward is 1 / bound. The best known bound is
{BEST_KNOWN_BOUND} (a 30,000-piece step function); before that 1.50314 (ThetaEvolve), 1.50317
(AlphaEvolve V2), 1.5053 (AlphaEvolve) and 1.50973 (Matolcsi and Vinuesa 2010).

{CONTRACT_TEMPLATE.format(max_output_bytes=limits.max_output_bytes)}
Limits: {limits.timeout_s:g} s wall clock, {limits.memory_mb} MB of memory, {limits.cpus} CPU threads;
a program that runs past them is killed and gets reward 0. Printed output is cut to its tail.
"""
