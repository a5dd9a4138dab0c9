"""The toy problem: grow a hidden digit string, a few digits per action.

State: a string of at most `length` digits (default 96). Action: the model's answer; its first
`chunk` digits (default 4) are appended to the parent's string (the answer's other characters are
ignored; digits past `length` are dropped, and a complete string has no valid children). Reward:
the mean over all `length` positions of a graded match with a hidden target (1 for the right digit,
0.5 for one off, 0 otherwise; a missing position scores 0), so it is continuous in [0, 1]. The
target repeats a hidden random motif of `period` digits (default 4).

Why both parts of TTT-Discover matter here:
- reuse: one action adds at most `chunk` digits, so a rollout from the empty seed scores at most
  chunk/length (0.042 by default); a high reward needs a deep lineage of states, each expanded
  from a good parent, which only reuse builds;
- training: the motif is hidden, so an untrained policy guesses (0.2 a position on average, when
  it writes digits at all: only about one answer in seven of the random tiny model holds one); a policy
  that learns to answer in digits, and which digits, writes better chunks at every later step.
`benchmarks/toy_learning.py` measures both against PUCT without training and best-of-N.

Option `lenient` (default off): every non-blank answer is a candidate, a character that is not a
digit standing for the digit of its code point modulo 10. With the random tiny model nearly every
rollout then reaches evaluation, which is what the tests of distributed evaluation and
`benchmarks/pipeline.py` measure; the learning benchmarks keep the strict rule.
"""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np

from evaluators.base import BaseProblem, EvalResult, ParentView, SeedState

_DIGIT = re.compile(r"[0-9]")


class DigitsProblem(BaseProblem):
    name = "toy"
    needs_sandbox = False
    target = 1.0  # every digit right

    def __init__(
        self,
        length: int = 96,
        chunk: int = 4,
        period: int | None = 4,
        target_seed: int = 20260121,
        eval_delay_s: float = 0.0,
        lenient: bool = False,
    ):
        if length < 1 or chunk < 1 or (period is not None and period < 1):
            raise ValueError("length, chunk and period must be at least 1")
        if eval_delay_s < 0:
            raise ValueError("eval_delay_s must be at least 0")
        # Seconds each evaluation waits before scoring: stands in for a real evaluator's run time
        # in benchmarks/pipeline.py and the tests of distributed evaluation. Default 0.
        self.eval_delay_s = float(eval_delay_s)
        self.lenient = bool(lenient)
        self.length = length
        self.chunk = chunk
        # The target repeats a random motif of `period` digits (None: no repetition). With the
        # period equal to the chunk, one motif is right at every depth, so what training learns
        # carries over to every later state; a longer period asks the policy to track position.
        motif = np.random.default_rng(target_seed).integers(0, 10, size=period or length)
        self._target = np.resize(motif, length)
        self.description = (
            f"Guess a hidden string of {length} digits. Your answer's first {chunk} digits are "
            f"appended to the current string. Score: mean match per position."
        )

    def seeds(self, rng: np.random.Generator, count: int) -> list[SeedState]:
        return [SeedState(code="", construction="") for _ in range(count)]

    def parse(self, answer: str) -> str | None:
        if self.lenient:
            chars = [c for c in answer if not c.isspace()][: self.chunk]
            return "".join(c if c in "0123456789" else str(ord(c) % 10) for c in chars) or None
        digits = _DIGIT.findall(answer)[: self.chunk]
        return "".join(digits) if digits else None

    def evaluate(self, candidate: str, parent: ParentView | None, sandbox: Any = None) -> EvalResult:
        if self.eval_delay_s:
            time.sleep(self.eval_delay_s)
        prefix = parent.construction if parent is not None else ""
        if not isinstance(prefix, str):
            return EvalResult.invalid("parent construction is not a digit string")
        if len(prefix) >= self.length:
            return EvalResult.invalid(f"the string is already complete ({self.length} digits)")
        return self.verify((prefix + candidate[: self.chunk])[: self.length])

    def verify(self, construction: Any) -> EvalResult:
        if isinstance(construction, dict):
            construction = construction.get("values")
        if not isinstance(construction, str) or not construction:
            return EvalResult.invalid("expected a non-empty string of digits")
        if not construction.isascii() or not construction.isdigit():
            return EvalResult.invalid("the string holds characters other than the digits 0-9")
        if len(construction) > self.length:
            return EvalResult.invalid(f"more than {self.length} digits")
        digits = np.frombuffer(construction.encode(), dtype=np.uint8) - ord("0")
        distance = np.abs(digits.astype(int) - self._target[: len(digits)])
        per_position = np.clip(1.0 - 0.5 * distance, 0.0, 1.0)
        reward = float(per_position.sum() / self.length)
        return EvalResult(
            reward=reward,
            valid=True,
            construction=construction,
            metrics={"digits": float(len(digits)), "exact": float((distance == 0).sum())},
        )

    def summary_metrics(self, result: EvalResult) -> dict[str, float]:
        """How many digits the answer has and how many of them are exactly right."""
        return {k: float(result.metrics[k]) for k in ("digits", "exact") if k in result.metrics}

    def render_state(self, code: str, construction: Any) -> str:
        return f"Current string: {construction}"
