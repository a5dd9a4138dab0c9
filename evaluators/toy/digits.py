"""The toy problem: grow a hidden digit string, a few digits per action.

State: a string of at most `length` digits. Action: the model's answer; its first `chunk` digits are
appended to the parent's string (the answer's other characters are ignored; digits past `length`
are dropped, and a complete string has no valid children). Reward: the mean over
all `length` positions of a graded match with a hidden target (1 for the right digit, 0.5 for one
off, 0 otherwise; a missing position scores 0), so the reward is continuous in [0, 1].

Why both parts of TTT-Discover matter here:
- reuse: one action adds at most `chunk` digits, so a rollout from the empty seed scores at most
  chunk/length; a high reward needs a lineage of states, each expanded from a good parent;
- training: the target is hidden and fixed, and each digit position sits at a fixed token position
  of the prompt (the context's other parts have constant length), so a policy that learns
  "digit i of the target" writes better chunks at every later step; an untrained policy guesses.
The tiny embedded model learns it in minutes on CPU; `benchmarks/toy_learning.py` measures both.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from evaluators.base import EvalResult, ParentView, SeedState

_DIGIT = re.compile(r"[0-9]")


class DigitsProblem:
    name = "toy"
    needs_sandbox = False

    def __init__(self, length: int = 32, chunk: int = 8, target_seed: int = 20260121):
        if length < 1 or chunk < 1:
            raise ValueError("length and chunk must be at least 1")
        self.length = length
        self.chunk = chunk
        self._target = np.random.default_rng(target_seed).integers(0, 10, size=length)
        self.description = (
            f"Guess a hidden string of {length} digits. Your answer's first {chunk} digits are "
            f"appended to the current string. Score: mean match per position."
        )

    def seeds(self, rng: np.random.Generator, count: int) -> list[SeedState]:
        return [SeedState(code="", construction="") for _ in range(count)]

    def parse(self, answer: str) -> str | None:
        digits = _DIGIT.findall(answer)[: self.chunk]
        return "".join(digits) if digits else None

    def evaluate(self, candidate: str, parent: ParentView | None, sandbox: Any = None) -> EvalResult:
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

    def render_state(self, code: str, construction: Any) -> str:
        return f"Current string: {construction}"
