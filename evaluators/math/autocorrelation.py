"""What the two autocorrelation problems share (docs/method.md §5, App. B.2): a non-negative sequence f of
n equal pieces, checked the same way, drawn the same way, shown to the model the same way."""

from __future__ import annotations

from typing import Any

import numpy as np

from evaluators.base import EvalResult
from evaluators.math.problem import SequenceProblem
from evaluators.math.sequence import check_sequence

CLAMP = 1000.0  # App. B.2: values "clamped to [0, 1000]"; we reject values above it instead
MIN_SUM = 0.01  # App. B.2: "sum >= 0.01"; a near-zero sum would inflate an unnormalised metric
MAX_PIECES = 1_000_000  # ours: 20x the largest record (50,000), keeps the host verifier bounded
SEED_REPEATS = (1000, 8000)  # App. B.2: one random value in [0, 1] repeated 1,000-8,000 times

SEQUENCE_RULES = f"""\
Represent f by n equal pieces: a list of n floats f_0..f_{{n-1}}, each in [0, {CLAMP:g}], with
sum(f) >= {MIN_SUM:g}, at most {MAX_PIECES:,} pieces. Anything else (wrong type, NaN, inf,
negative values, values above {CLAMP:g}, an empty list, a crash, a timeout) gets reward 0."""

CONTRACT_TEMPLATE = """\
Your answer must contain one fenced ```python code block defining
    def construct(parent):
        ...
parent is the current state's sequence as a list of floats (or None when there is none);
construct must return the new sequence as a list of floats (a numpy array is converted);
its JSON may take at most {max_output_bytes:,} bytes (about 20 bytes per float).
Only the last ```python block of your answer is used. numpy and scipy are available; there is
no network."""


class AutocorrelationProblem(SequenceProblem):
    """Base of AC1 and AC2: a subclass gives `certify(f) -> (reward, metrics)` and its text."""

    # ~20 bytes of JSON per float: room for ~200,000 pieces, 4x the largest record. (The sandbox
    # applies the same cap to captured output; a run's `sandbox.max_output_bytes` overrides it.)
    max_output_bytes = 4_000_000
    # The released AC1 seed carries a program that improves f along a linear-programming direction,
    # which the paper credits for AC1's record (docs/method.md §5a); AC2's is ours.

    def certify(self, f: np.ndarray) -> tuple[float, dict[str, float]]:
        raise NotImplementedError

    def verify(self, construction: Any) -> EvalResult:
        f, reason = check_sequence(construction, high=CLAMP, max_pieces=MAX_PIECES, min_sum=MIN_SUM)
        if f is None:
            return EvalResult.invalid(reason)
        reward, metrics = self.certify(f)
        return EvalResult(reward=reward, valid=True, construction=f.tolist(), metrics=metrics)

    def random_construction(self, rng: np.random.Generator) -> list[float]:
        # docs/method.md §5, App. B.2: one random value in [0, 1] repeated 1,000-8,000 times. A value below
        # MIN_SUM / 1000 would make the seed invalid; rng.random() gives one with probability ~1e-5.
        value = float(rng.random())
        return [value] * int(rng.integers(SEED_REPEATS[0], SEED_REPEATS[1] + 1))

    def plot(self, construction: Any, path: str) -> EvalResult:
        from evaluators.math.plots import plot_autoconvolution

        result = self.verify(construction)
        if result.valid:
            plot_autoconvolution(np.asarray(result.construction), self.name, result.metrics["bound"], path)
        return result
