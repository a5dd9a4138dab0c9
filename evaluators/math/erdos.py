"""Erdős minimum overlap (SPEC §5): a step function h on [0, 2] certifies an upper bound.

State: n values of h (n pieces of width 2/n). Valid when 0 <= h <= 1 and, after rescaling to
sum h = n/2 (integral 1), still h <= 1. Bound = max_k (correlate(h, 1 - h, full))_k * 2/n;
lower is better, the reward is 1 / bound.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import numpy as np

from evaluators.base import EvalResult, ParentView, SeedState
from evaluators.parsing import last_fenced_block
from evaluators.sandbox.base import SandboxLimits

MAX_PIECES = 1000
RESCALE_SLACK = 1e-12  # a rescaled value may exceed 1 by this much (float rounding), no more
BEST_KNOWN_BOUND = 0.380876  # TTT-Discover's 600-piece construction (method paper, Table 2)
_LIST_IN_PROMPT = 200  # states with at most this many pieces show all values in the context


def erdos_bound(values: np.ndarray) -> float:
    """max_k (h ⋆ (1 - h))_k * 2/n for h already rescaled to sum n/2 (SPEC §5)."""
    n = len(values)
    return float(np.max(np.correlate(values, 1.0 - values, mode="full")) * 2.0 / n)


class ErdosProblem:
    """Minimise the Erdős minimum-overlap bound with a step function written by a program."""

    name = "erdos"
    needs_sandbox = True

    def __init__(self, timeout_s: float = 1100.0, memory_mb: int = 1024, cpus: int = 2):
        self.limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, cpus=cpus)
        self.description = _describe(self.limits)

    def seeds(self, rng: np.random.Generator, count: int) -> list[SeedState]:
        # SPEC §5: 40-100 values near 0.5 with noise.
        out = []
        for _ in range(count):
            n = int(rng.integers(40, 101))
            values = np.clip(0.5 + rng.normal(0.0, 0.1, n), 0.0, 1.0)
            out.append(SeedState(code="", construction=[float(v) for v in values]))
        return out

    def parse(self, answer: str) -> str | None:
        return last_fenced_block(answer, languages=("python", "py"))

    def evaluate(self, candidate: str, parent: ParentView | None, sandbox: Any) -> EvalResult:
        argument = parent.construction if parent is not None else None
        run = sandbox.run(candidate, "construct", argument, self.limits)
        if not run.ok:
            return EvalResult.invalid(run.reason, logs=run.logs)
        return dataclasses.replace(self.verify(run.output), logs=run.logs)

    def verify(self, construction: Any) -> EvalResult:
        values, reason = _check_values(construction)
        if reason:
            return EvalResult.invalid(reason)
        n = len(values)
        h = np.asarray(values, dtype=np.float64)
        total = float(h.sum())
        if not total > 0.0:
            return EvalResult.invalid("all values are zero; h must integrate to 1")
        h = h * ((n / 2.0) / total)  # rescale so that sum h = n/2, i.e. the integral of h is 1
        if not np.isfinite(h).all():
            return EvalResult.invalid("values cannot be rescaled to sum n/2 (overflow)")
        top = float(h.max())
        if top > 1.0 + RESCALE_SLACK:
            return EvalResult.invalid(
                f"after rescaling to sum n/2 = {n / 2:g} the largest value is {top:.9g} > 1 "
                f"(the values sum to {total:.9g}; they must sum to at least n/2 to stay in [0, 1])"
            )
        bound = erdos_bound(h)
        return EvalResult(
            reward=1.0 / bound,
            valid=True,
            construction=[float(v) for v in values],
            metrics={"bound": bound, "pieces": n},
        )

    def render_state(self, code: str, construction: Any) -> str:
        parts = []
        if code and code.strip():
            parts.append(f"Code:\n```python\n{code.strip()}\n```")
        values, reason = _check_values(construction)
        if reason:
            parts.append(f"Construction: none usable ({reason}).")
            return "\n\n".join(parts)
        result = self.verify(values)
        n = len(values)
        head = f"Construction: {n} pieces, min {min(values):.6f}, max {max(values):.6f}, "
        head += f"bound {result.metrics['bound']:.8f}" if result.valid else f"invalid: {result.reason}"
        if n <= _LIST_IN_PROMPT:
            body = "Values: [" + ", ".join(f"{v:.6f}" for v in values) + "]"
        else:
            body = "(The values are too many to list here; construct(parent) receives all of them.)"
        parts.append(f"{head}\n{body}")
        return "\n\n".join(parts)


def _check_values(construction: Any) -> tuple[list[float], str]:
    """(values, "") for a list of finite numbers in [0, 1], else ([], reason)."""
    if isinstance(construction, dict):
        if "values" not in construction:
            return [], 'the returned object has no "values" key'
        construction = construction["values"]
    if not isinstance(construction, (list, tuple)):
        return [], f"expected a list of numbers, got {type(construction).__name__}"
    n = len(construction)
    if n == 0:
        return [], "the list of values is empty"
    if n > MAX_PIECES:
        return [], f"{n} pieces; at most {MAX_PIECES} are allowed"
    values = []
    for i, v in enumerate(construction):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
            return [], f"value {i} is a {type(v).__name__}, not a number"
        x = float(v)
        if math.isnan(x):
            return [], f"value {i} is NaN"
        if math.isinf(x):
            return [], f"value {i} is infinite"
        if x < 0.0:
            return [], f"value {i} is negative ({x:g}); h must lie in [0, 1]"
        if x > 1.0:
            return [], f"value {i} is above 1 ({x:g}); h must lie in [0, 1]"
        values.append(x)
    return values, ""


def _describe(limits: SandboxLimits) -> str:
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
