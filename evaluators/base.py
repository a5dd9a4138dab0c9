"""What every problem provides, and the small result object an evaluation returns.

An evaluator is a pure function from a candidate to an `EvalResult`: it knows nothing of the
archive, the model or Prefect (DESIGN.md, "evaluators/").
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from evaluators.parsing import normalize_code
from evaluators.sandbox.base import SandboxLimits


@dataclass(frozen=True)
class EvalResult:
    """The verdict on one candidate (SPEC §1: anything invalid has reward 0)."""

    reward: float
    valid: bool
    reason: str = ""  # empty when valid; otherwise why the candidate was rejected
    construction: Any = None  # plain JSON-able data: the child state's construction, if any
    metrics: dict[str, Any] = field(default_factory=dict)  # JSON data: {"bound": 0.3809}; per-case lists for AHC
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
    """One problem (SPEC §5): everything the run, the CLI and re-evaluation ask of it.

    Subclass `BaseProblem`, which gives the defaults; nothing outside evaluators/ probes a problem
    with getattr, so every attribute below is always there.
    """

    name: str
    description: str  # the text `d` given to the model (states the live limits where they matter)
    needs_sandbox: bool  # True when candidates are programs that must run in the sandbox
    image: str  # the evaluator image (images/<image>) its programs run in under Docker
    needs_gpu: bool  # True when evaluating needs a GPU (the sandbox gets a device request)
    limits: SandboxLimits  # per-candidate limits; `with_limits` changes them
    target: float | None  # the reward the context names as the goal (SPEC §5a), None: no target
    can_plot: bool  # whether `plot` draws anything

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

    def archive_key(self, code: str, construction: Any) -> str:
        """Equal for two states that are the same for the archive (SPEC §5a, duplicates)."""
        ...

    def plot(self, construction: Any, path: str) -> EvalResult:
        """Draw a valid construction to `path` (PNG); only when `can_plot`."""
        ...

    def with_limits(self, **overrides: Any) -> "Problem":
        """The same problem with some `SandboxLimits` fields replaced (None values are ignored)."""
        ...

    def report_section(self, states: list[dict[str, Any]]) -> list[str]:
        """Markdown lines the run report adds for this problem, given the newest archive's states
        (dicts with id, reward, step, is_seed, code, construction), best first; [] for none."""
        ...


class BaseProblem:
    """The defaults of the Problem protocol; a problem overrides what differs."""

    name = ""
    description = ""
    needs_sandbox = True
    image = "python-math"
    needs_gpu = False
    limits = SandboxLimits()
    target: float | None = None
    can_plot = False
    code_language = "python"  # how `archive_key` strips comments from a program ("python" or "c")

    def render_state(self, code: str, construction: Any) -> str:
        return f"Code:\n```{self.code_language}\n{code.strip()}\n```" if code.strip() else "No code yet."

    def archive_key(self, code: str, construction: Any) -> str:
        """A state's key: its construction as canonical JSON if it has one, else its normalised code."""
        if construction is not None:
            payload = "construction:" + json.dumps(construction, sort_keys=True, allow_nan=True)
        else:
            payload = "code:" + normalize_code(code, self.code_language)
        return hashlib.sha256(payload.encode()).hexdigest()

    def plot(self, construction: Any, path: str) -> EvalResult:
        raise NotImplementedError(f"problem {self.name!r} has no plot")

    def report_section(self, states: list[dict[str, Any]]) -> list[str]:
        return []

    def with_limits(self, **overrides: Any):
        changes = {k: v for k, v in overrides.items() if v is not None}
        unknown = set(changes) - {f.name for f in dataclasses.fields(SandboxLimits)}
        if unknown:
            raise ValueError(f"unknown sandbox limits {sorted(unknown)}; known: {[f.name for f in dataclasses.fields(SandboxLimits)]}")
        clone = copy.copy(self)
        clone.limits = dataclasses.replace(self.limits, **changes)
        return clone
