"""Circle packing (docs/method.md §5, method paper §4.1.3): n disjoint circles inside the unit square;
the reward is the sum of their radii.

The checks are exact: floats are binary rationals, so every comparison is made on
`fractions.Fraction`s and no rounding can let an overlap or an escape through. With the default
tolerance 0 a packing is valid when every circle lies in [0, 1]^2 and no two interiors meet
(touching is allowed). A tolerance t > 0 relaxes each constraint by t, as OpenEvolve does with
t = 1e-6 (ThetaEvolve App. A.1); every verdict states the tolerance in `metrics["tolerance"]`.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any

import numpy as np

from evaluators.base import EvalResult
from evaluators.math.problem import MathProblem
from evaluators.math.seeds_file import nesting_depth
from evaluators.sandbox.base import SandboxLimits

# Best known sums of radii as the method paper's Table 3 reports them (2.635983 for n = 26 is under
# a 1e-6 tolerance; the released packing gives 2.6359774 with none).
BEST_KNOWN = {26: 2.635983, 32: 2.939572}
SEED_MARGIN = 1e-9  # relative shrink of seed radii, so float rounding never makes them touch


def check_circles(construction: Any, n: int) -> tuple[list[tuple[float, float, float]] | None, str]:
    """([(x, y, r)] * n, "") when the shape and the numbers are right, else (None, reason)."""
    if isinstance(construction, dict):
        if "circles_xyr" not in construction:
            return None, 'the object has no "circles_xyr" key'
        construction = construction["circles_xyr"]
    if not isinstance(construction, (list, tuple)):
        return None, f"expected a list of [x, y, r], got {type(construction).__name__}"
    if len(construction) != n:
        return None, f"{len(construction)} circles; exactly {n} are required"
    circles = []
    for i, item in enumerate(construction):
        if not isinstance(item, (list, tuple)) or len(item) != 3:
            return None, f"circle {i} is not a list [x, y, r] of three numbers"
        for name, v in zip("xyr", item):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, np.floating, np.integer)):
                return None, f"circle {i}: {name} is a {type(v).__name__}, not a number"
            try:
                fv = float(v)
            except OverflowError:
                return None, f"circle {i}: {name} is too large for a float"
            if not math.isfinite(fv):
                return None, f"circle {i}: {name} is {fv} (not finite)"
        x, y, r = (float(v) for v in item)
        if not r > 0.0:
            return None, f"circle {i} has radius {r:g}; radii must be positive"
        circles.append((x, y, r))
    return circles, ""


def first_violation(circles: list[tuple[float, float, float]], tolerance: float) -> str:
    """ "" when the circles lie in the unit square and are pairwise disjoint up to `tolerance`,
    else the first violation found. Exact rational arithmetic throughout."""
    t = Fraction(tolerance)
    exact = [tuple(Fraction(v) for v in c) for c in circles]
    for i, (x, y, r) in enumerate(exact):
        # inside the unit square: r <= x <= 1 - r and r <= y <= 1 - r, each relaxed by t
        if x - r < -t or x + r > 1 + t or y - r < -t or y + r > 1 + t:
            return f"circle {i} (x={float(x):.17g}, y={float(y):.17g}, r={float(r):.17g}) leaves the unit square"
    for i in range(len(exact)):
        xi, yi, ri = exact[i]
        for j in range(i + 1, len(exact)):
            xj, yj, rj = exact[j]
            reach = ri + rj - t
            # disjoint: distance of centres >= r_i + r_j - t, compared squared (both sides >= 0)
            if reach > 0 and (xi - xj) ** 2 + (yi - yj) ** 2 < reach * reach:
                gap = math.hypot(float(xi - xj), float(yi - yj)) - float(ri + rj)
                return f"circles {i} and {j} overlap (centre distance minus radii sum = {gap:.3g})"
    return ""


class CirclePackingProblem(MathProblem):
    """Maximise the sum of radii of n disjoint circles in the unit square, written by a program."""

    def __init__(self, n: int, tolerance: float = 0.0, **options: Any):
        if not (isinstance(n, int) and n >= 1):
            raise ValueError(f"n must be a positive integer, got {n!r}")
        if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
            raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
        self.n, self.tolerance = n, float(tolerance)
        self.name = f"circles-{n}"
        self.target = BEST_KNOWN.get(n)  # docs/method.md §5a: the record to beat (sum of radii); None for other n
        super().__init__(**options)

    def verify(self, construction: Any) -> EvalResult:
        circles, reason = check_circles(construction, self.n)
        if circles is None:
            return EvalResult.invalid(reason)
        violation = first_violation(circles, self.tolerance)
        if violation:
            return EvalResult.invalid(f"{violation} (tolerance {self.tolerance:g})")
        total = math.fsum(r for _, _, r in circles)  # docs/method.md §5: reward = sum of radii
        return EvalResult(
            reward=total,
            valid=True,
            construction=[list(c) for c in circles],
            metrics={"bound": total, "circles": self.n, "tolerance": self.tolerance},
        )

    def summary_metrics(self, result: EvalResult) -> dict[str, float]:
        """The sum of radii (the certified bound, as `bound`) and the tolerance it was checked with."""
        if "bound" not in result.metrics:
            return {}
        return {"bound": float(result.metrics["bound"]), "tolerance": float(result.metrics["tolerance"])}

    def random_construction(self, rng: np.random.Generator) -> list[list[float]]:
        # Ours (docs/method.md §5 gives none): n centres uniform in [0.1, 0.9]^2, each radius the largest
        # that keeps the circle inside the square and within half the distance to the nearest
        # other centre, shrunk by SEED_MARGIN. Valid by construction; sum of radii about 1-1.5.
        centres = rng.uniform(0.1, 0.9, size=(self.n, 2))
        wall = np.minimum(centres, 1.0 - centres).min(axis=1)
        dist = np.linalg.norm(centres[:, None, :] - centres[None, :, :], axis=2)
        np.fill_diagonal(dist, np.inf)
        radii = np.minimum(wall, dist.min(axis=1) / 2.0) * (1.0 - SEED_MARGIN)
        return [[float(x), float(y), float(r)] for (x, y), r in zip(centres, radii)]

    def is_one_construction(self, data: Any) -> bool:
        return isinstance(data, dict) or nesting_depth(data) == 2

    def describe_construction(self, verdict: EvalResult) -> str:
        rows = "\n".join(f"[{x:.6f}, {y:.6f}, {r:.6f}]" for x, y, r in verdict.construction)
        return (
            f"{self.n} circles [x, y, r], sum of radii {verdict.reward:.10f} "
            f"(rounded here; construct(parent) receives the exact values)\n{rows}"
        )

    def plot(self, construction: Any, path: str) -> EvalResult:
        from evaluators.math.plots import plot_circles

        result = self.verify(construction)
        if result.valid:
            plot_circles(result.construction, result.reward, self.tolerance, path)
        return result

    def describe(self, limits: SandboxLimits) -> str:
        t = "0 (exact)" if self.tolerance == 0 else f"{self.tolerance:g}"
        return f"""\
Circle packing: n = {self.n} circles in the unit square.

Place {self.n} circles with centres (x_i, y_i) and radii r_i > 0 in the square [0, 1] x [0, 1],
pairwise non-overlapping, maximising the sum of the radii. Valid means: r_i <= x_i <= 1 - r_i,
r_i <= y_i <= 1 - r_i, and sqrt((x_i - x_j)^2 + (y_i - y_j)^2) >= r_i + r_j for every pair
(touching is allowed). The verifier checks this in exact arithmetic on the returned floats,
with tolerance {t}, so shrink the radii by a hair after a numerical optimisation.
The reward is the sum of the radii; anything invalid (wrong count, NaN, inf, radius <= 0,
overlap, escape, crash, timeout) gets 0. Best known sums: about {BEST_KNOWN[26]} (n = 26)
and {BEST_KNOWN[32]} (n = 32).

Your answer must contain one fenced ```python code block defining
    def construct(parent):
        ...
parent is the current packing, a list of {self.n} [x, y, r] lists (or None). construct returns
{self.n} [x, y, r] lists (or a numpy array of shape ({self.n}, 3)). Only the last ```python block
of your answer is used. numpy and scipy are available; there is no network.
Limits: {limits.timeout_s:g} s wall clock, {limits.memory_mb} MB of memory, {limits.cpus} CPU threads;
a program that runs past them is killed and gets reward 0. Printed output is cut to its tail.
"""


def circles_26(**options: Any) -> CirclePackingProblem:
    """The `circles-26` problem."""
    return CirclePackingProblem(n=26, **options)


def circles_32(**options: Any) -> CirclePackingProblem:
    """The `circles-32` problem."""
    return CirclePackingProblem(n=32, **options)
