"""What every problem provides, and the one result record an evaluation returns.

An evaluator is a pure function from a candidate to an `EvalResult`: it knows nothing of the
archive, the model or Prefect (docs/architecture.md, "Floors"). `EvalResult` is the record that
travels: the candidate store keeps it, a step's evaluations table extends it with the rollout it
came from (discover/records.py `Evaluation`), and a re-evaluation table with the state it re-scored
(discover/reevaluation.py `Reevaluation`); their Parquet schemas derive from the fields below
(storage/tables.py).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from evaluators.parsing import normalize_code
from evaluators.sandbox.base import Sandbox, SandboxLimits

REASON_CHARS = 2000  # a verdict's reason, at most
OBSERVATION_CHARS = 8000  # a verdict's observation (the tail of the candidate's output), at most
DETAIL_CHARS = 300  # one case's reason among a verdict's per-case metrics (150 cases for AtCoder), at most


def clip(text: str, limit: int, keep: str = "head") -> str:
    """`text` cut to at most `limit` characters, saying how many were cut: its start kept (its end with keep="tail")."""
    if len(text) <= limit:
        return text
    note = f"[... {len(text) - limit} characters cut]"
    room = limit - len(note) - 1
    return text[:room] + " " + note if keep == "head" else note + " " + text[len(text) - room :]


@dataclass(frozen=True, kw_only=True)
class EvalResult:
    """The verdict on one candidate; invalid means reward 0, enforced here and nowhere else."""

    reward: float
    valid: bool
    reason: str = ""  # empty when valid; otherwise why the candidate was rejected
    construction: Any = field(default=None, metadata={"json": True})  # plain JSON-able data: the child state's construction, if any
    metrics: dict[str, Any] = field(default_factory=dict, metadata={"json": True})  # JSON data: {"bound": 0.3809}; per-case lists for AHC
    observation: str = field(default="", metadata={"formerly": ("logs",)})  # tail of the candidate's output, shown to the model
    seconds: float = 0.0  # wall time of the evaluation, set by whoever ran it

    def __post_init__(self) -> None:
        # docs/method.md §1: a state that fails any check has reward 0 and never enters the archive
        object.__setattr__(self, "valid", bool(self.valid))
        object.__setattr__(self, "reward", float(self.reward) if self.valid else 0.0)
        # what a candidate can make these say is bounded, whatever it does (the archive, logs and progress lines carry them)
        object.__setattr__(self, "reason", clip(self.reason, REASON_CHARS))
        object.__setattr__(self, "observation", clip(self.observation, OBSERVATION_CHARS, keep="tail"))

    @staticmethod
    def invalid(reason: str, observation: str = "") -> EvalResult:
        return EvalResult(reward=0.0, valid=False, reason=reason, observation=observation)

    def verdict_fields(self) -> dict[str, Any]:
        """The result's fields by name (of a subclass record, such as a step's Evaluation, only these)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(EvalResult)}

    def verdict(self) -> EvalResult:
        """The result alone (a subclass record, such as a step's Evaluation, without its own fields)."""
        return EvalResult(**self.verdict_fields())


@dataclass(frozen=True)
class Judgement:
    """The verdict on one program output for one input, as a contest's judge gives it (`Problem.judge`):
    valid with the case score, or why not."""

    valid: bool
    score: int  # the case score of the statement; 0 when not valid
    reason: str = ""  # empty when valid; otherwise the first rule the output breaks
    details: dict[str, Any] = field(default_factory=dict)  # e.g. {"mackerels": 812, "sardines": 15}

    @staticmethod
    def wrong(reason: str) -> Judgement:
        return Judgement(valid=False, score=0, reason=reason)

    def as_dict(self) -> dict[str, Any]:
        return {"valid": self.valid, "score": self.score, "reason": self.reason, **self.details}


@dataclass(frozen=True)
class ReportSection:
    """What a problem adds to the run report (docs/architecture.md, "Problem hooks"): a title, a
    paragraph, and optionally a table; rendered as Markdown by the report and shown as a table
    artifact in Prefect's UI."""

    title: str
    text: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)
    columns: tuple[str, ...] = ()  # the table's columns in order; () for the first row's keys


class ArchivedState(Protocol):
    """What a problem may read of a state of the archive (discover/records.py `State` has these)."""

    @property
    def id(self) -> str: ...
    @property
    def reward(self) -> float: ...
    @property
    def step(self) -> int: ...
    @property
    def is_seed(self) -> bool: ...
    @property
    def code(self) -> str: ...
    @property
    def construction(self) -> Any: ...


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
    """One problem (docs/method.md §5): everything the run, the CLI and re-evaluation ask of it.

    Subclass `BaseProblem`, which gives the defaults; nothing outside evaluators/ probes a problem
    with getattr, so every attribute below is always there.
    """

    name: str
    description: str  # the text `d` given to the model (states the live limits where they matter)
    needs_sandbox: bool  # True when candidates are programs that must run in the sandbox
    image: str  # the evaluator image (images/<image>) its programs run in under Docker
    needs_gpu: bool  # True when evaluating needs a GPU (the sandbox gets a device request)
    limits: SandboxLimits  # per-candidate limits; `with_limits` changes them
    target: float | None  # the reward the context names as the goal (docs/method.md §5a), None: no target
    can_plot: bool  # whether `plot` draws anything
    has_cases: bool  # whether a candidate runs on numbered test cases (`with_cases`, `case_input`)
    can_judge: bool  # whether `judge` judges one program output for one input
    progress_logger: str  # the logger whose lines tell an evaluation's progress ("": none); `discover evaluate` shows them

    def seeds(self, rng: np.random.Generator, count: int) -> list[SeedState]:
        """Initial states, drawn from `rng` so that a run's seed fixes them."""
        ...

    def parse(self, answer: str) -> str | None:
        """The candidate inside the model's final answer, or None if there is none."""
        ...

    def evaluate(self, candidate: str, parent: ParentView | None, sandbox: Sandbox | None) -> EvalResult:
        """Turn a parsed candidate into a child state and score it (runs code only in `sandbox`)."""
        ...

    def verify(self, construction: Any) -> EvalResult:
        """Score a construction given as plain data (used by `discover verify`)."""
        ...

    def render_state(self, code: str, construction: Any) -> str:
        """How a state is shown to the model inside a context."""
        ...

    def archive_key(self, code: str, construction: Any) -> str:
        """Equal for two states that are the same for the archive (docs/method.md §5a, duplicates)."""
        ...

    def plot(self, construction: Any, path: str) -> EvalResult:
        """Draw a valid construction to `path` (PNG); only when `can_plot`."""
        ...

    def with_limits(self, **overrides: Any) -> Problem:
        """The same problem with some `SandboxLimits` fields replaced (None values are ignored)."""
        ...

    def with_cases(self, cases: str | None, stop_at_first_failure: bool) -> Problem:
        """The same problem evaluating candidates on the selected test cases ("0-9", "0,5,7-9"; None:
        all), stopping at the first failed case or running them all; only when `has_cases`.
        ValueError names a bad selection and the cases there are."""
        ...

    def case_input(self, case: int) -> str:
        """The input of test case `case`; only when `has_cases`. KeyError names the cases there are."""
        ...

    def judge(self, input_text: str, output: bytes) -> Judgement:
        """The verdict on one program output for one input, as the problem's judge gives it (no program
        runs); only when `can_judge`. ValueError when the input is not one of this problem's."""
        ...

    def preflight(self, sandbox_backend: str) -> list[str]:
        """What keeps this problem from running here with `sandbox_backend` ('auto', 'process' or
        'docker'), one sentence each naming the fix; [] when nothing does. Called once before a
        run directory is created (discover/preflight.py), so nothing is written for a run that
        cannot work: files named in the problem's options, compilers, data."""
        ...

    def report_sections(self, states: Sequence[ArchivedState]) -> list[ReportSection]:
        """What the run report adds for this problem, given the newest archive's states, best
        first; [] for nothing."""
        ...

    def summary_metrics(self, result: EvalResult) -> dict[str, float]:
        """The few numbers that summarise one verdict (Erdős: its bound; AtCoder: cases passed),
        by short name: `discover evaluate` prints them and each step's metrics record averages them
        over the step's valid candidates as `problem/<name>`."""
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
    has_cases = False
    can_judge = False
    progress_logger = ""
    code_language = "python"  # the fence of `render_state` and the comment syntax `archive_key` strips: "python", or "c"/"cpp" for C-like

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

    def with_cases(self, cases: str | None, stop_at_first_failure: bool):
        raise NotImplementedError(f"problem {self.name!r} has no test cases")

    def case_input(self, case: int) -> str:
        raise NotImplementedError(f"problem {self.name!r} has no test cases")

    def judge(self, input_text: str, output: bytes) -> Judgement:
        raise NotImplementedError(f"problem {self.name!r} has no output judge")

    def preflight(self, sandbox_backend: str) -> list[str]:
        return []

    def report_sections(self, states: Sequence[ArchivedState]) -> list[ReportSection]:
        return []

    def summary_metrics(self, result: EvalResult) -> dict[str, float]:
        return {}

    def with_limits(self, **overrides: Any):
        changes = {k: v for k, v in overrides.items() if v is not None}
        unknown = set(changes) - {f.name for f in dataclasses.fields(SandboxLimits)}
        if unknown:
            raise ValueError(f"unknown sandbox limits {sorted(unknown)}; known: {[f.name for f in dataclasses.fields(SandboxLimits)]}")
        clone = copy.copy(self)
        clone.limits = dataclasses.replace(self.limits, **changes)
        return clone
