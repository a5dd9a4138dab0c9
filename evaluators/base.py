"""What every problem provides, and the small result object an evaluation returns.

An evaluator is a pure function from a candidate to an `EvalResult`: it knows nothing of the
archive, the model or Prefect (DESIGN.md, "evaluators/").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class EvalResult:
    """The verdict on one candidate (SPEC §1: anything invalid has reward 0)."""

    reward: float
    valid: bool
    reason: str = ""  # empty when valid; otherwise why the candidate was rejected
    construction: Any = None  # plain JSON-able data: the child state's construction, if any
    metrics: dict[str, float] = field(default_factory=dict)  # e.g. {"bound": 0.3809}
    logs: str = ""  # tail of the candidate's stdout/stderr

    @staticmethod
    def invalid(reason: str, logs: str = "") -> "EvalResult":
        return EvalResult(reward=0.0, valid=False, reason=reason, logs=logs)


@dataclass(frozen=True)
class SeedState:
    """An initial state: the code that produced it (may be empty) and its construction."""

    code: str
    construction: Any = None


@dataclass(frozen=True)
class ParentView:
    """What an evaluator may know of the parent state: its code and construction, nothing else."""

    code: str
    construction: Any = None


class Problem(Protocol):
    """One problem (SPEC §5): description, seeds, parse, evaluate, verify."""

    name: str
    description: str  # the text `d` given to the model
    needs_sandbox: bool  # True when candidates are programs that must run in the sandbox

    def seeds(self, rng: np.random.Generator, count: int) -> list[SeedState]:
        """Initial states, drawn from `rng` so that a run's seed fixes them."""
        ...

    def parse(self, answer: str) -> str | None:
        """The candidate inside the model's final answer, or None if there is none."""
        ...

    def evaluate(self, candidate: str, parent: ParentView | None, sandbox: Any) -> EvalResult:
        """Turn a parsed candidate into a child state and score it (runs code only in `sandbox`)."""
        ...

    def verify(self, construction: Any) -> EvalResult:
        """Score a construction given as plain data (used by `discover verify`)."""
        ...

    def render_state(self, code: str, construction: Any) -> str:
        """How a state is shown to the model inside a context."""
        ...
