"""What the mathematics problems share: a program `construct(parent)` run in the sandbox, its
return value verified as plain data in the host process, seeds drawn at random or read from a file.

A subclass gives its id, its description, `verify` (data to EvalResult; never imports candidate
code), `random_construction`, `describe_construction` and `plot`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from evaluators.base import BaseProblem, EvalResult, ParentView, SeedState
from evaluators.math.seeds_file import load_seed_constructions, nesting_depth
from evaluators.math.sequence import summarize_sequence
from evaluators.options import missing_file
from evaluators.parsing import last_fenced_block
from evaluators.sandbox.base import SandboxLimits

ENTRY_POINT = "construct"  # the function every candidate program defines: construct(parent)

# App. B.2 and B.3: "Each algorithm is run with 1 GB with 2 CPUs each and a timeout of up to 1100 s".
PAPER_LIMITS = {"timeout_s": 1100.0, "memory_mb": 1024, "cpus": 2}
STARTERS = Path(__file__).parent / "starters"  # programs a seed state can carry (docs/method.md §5a)


class MathProblem(BaseProblem):
    """Base of the Erdős, autocorrelation and circle-packing problems."""

    image = "python-math"  # the evaluator image its programs run in under Docker (images/python-math)
    can_plot = True
    max_output_bytes = 1_000_000  # cap on the returned JSON (and the captured output) of a program
    starter = ""  # the program every seed state shows the model: a file name under starters/ ("": none)

    def __init__(
        self,
        timeout_s: float = PAPER_LIMITS["timeout_s"],
        memory_mb: int = PAPER_LIMITS["memory_mb"],
        cpus: int = PAPER_LIMITS["cpus"],
        seeds_file: str | None = None,
        starter: str | None = None,
    ):
        self.limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, cpus=cpus, max_output_bytes=self.max_output_bytes)
        # Read only when seeds are drawn (once, when a run starts), so the later tasks of a run
        # never depend on the file; a relative path is taken from the working directory.
        self.seeds_file = seeds_file
        # `starter` option: a file name under starters/ or a path to a program; None: the problem's own
        if starter is not None:
            self.starter = starter

    @property
    def description(self) -> str:
        """The text `d` the model sees; it states the current limits, so it follows `limits`."""
        return self.describe(self.limits)

    # -- what each problem provides -------------------------------------------------------

    def describe(self, limits: SandboxLimits) -> str:
        raise NotImplementedError

    def verify(self, construction: Any) -> EvalResult:
        raise NotImplementedError

    def random_construction(self, rng: np.random.Generator) -> Any:
        raise NotImplementedError

    def is_one_construction(self, data: Any) -> bool:
        """Whether `data` (from a seeds file) is a single construction rather than a list of them."""
        raise NotImplementedError

    def describe_construction(self, verdict: EvalResult) -> str:
        """A valid construction (its verdict from `verify`) as the model sees it inside a context."""
        raise NotImplementedError

    def plot(self, construction: Any, path: str) -> EvalResult:
        """Draw a valid construction to `path` (PNG); returns the verdict, drawing nothing if invalid."""
        raise NotImplementedError

    # -- shared behaviour -----------------------------------------------------------------

    def seeds(self, rng: np.random.Generator, count: int) -> list[SeedState]:
        """The seeds file's constructions (all of them) if one is set, else `count` random ones, each
        with the starter program as its code.

        Raises ValueError naming the file and the reason when the file is missing or holds an
        invalid construction.
        """
        code = self._starter_path().read_text() if self.starter else ""
        if self.seeds_file:
            return [SeedState(code=code, construction=c) for c in self._load_seeds(self.seeds_file)]
        return [SeedState(code=code, construction=self.random_construction(rng)) for _ in range(count)]

    def _starter_path(self) -> Path:
        """The starter program: a file of starters/ by that name, else the path as given."""
        packaged = STARTERS / self.starter
        return packaged if packaged.is_file() else Path(self.starter).expanduser()

    def parse(self, answer: str) -> str | None:
        return last_fenced_block(answer, languages=("python", "py"))

    def evaluate(self, candidate: str, parent: ParentView | None, sandbox: Any) -> EvalResult:
        """Run `construct(parent)` in the sandbox and verify what it returned (docs/method.md §1.3)."""
        argument = parent.construction if parent is not None else None
        run = sandbox.run(candidate, ENTRY_POINT, argument, self.limits)
        if not run.ok:
            return EvalResult.invalid(run.reason, observation=run.logs)
        return dataclasses.replace(self.verify(run.output), observation=run.logs)

    def render_state(self, code: str, construction: Any) -> str:
        parts = []
        if code and code.strip():
            parts.append(f"Code:\n```python\n{code.strip()}\n```")
        result = self.verify(construction)
        if result.valid:
            parts.append("Construction: " + self.describe_construction(result))
        else:
            parts.append(f"Construction: none usable ({result.reason}).")
        return "\n\n".join(parts)

    def preflight(self, sandbox_backend: str) -> list[str]:
        """The seeds file and the starter program, if set, exist (they are read when the run starts)."""
        starter = str(self._starter_path()) if self.starter else None
        return missing_file("seeds_file", self.seeds_file) + missing_file("starter", starter)

    def _load_seeds(self, path: str) -> list[Any]:
        constructions = []
        for i, data in enumerate(load_seed_constructions(path, self.is_one_construction)):
            result = self.verify(data)
            if not result.valid:
                raise ValueError(f"seeds_file {path!r}: construction {i} is invalid for {self.name}: {result.reason}")
            constructions.append(result.construction)  # the plain form, e.g. the list inside {"values": ...}
        return constructions


class SequenceProblem(MathProblem):
    """Base of the problems whose construction is one sequence of values (Erdős, AC1, AC2)."""

    list_in_prompt = 200  # states with at most this many pieces show all values in the context

    def summary_metrics(self, result: EvalResult) -> dict[str, float]:
        """The certified bound (the reward is its inverse or, for AC2, itself)."""
        return {"bound": float(result.metrics["bound"])} if "bound" in result.metrics else {}

    def is_one_construction(self, data: Any) -> bool:
        return isinstance(data, dict) or nesting_depth(data) == 1

    def describe_construction(self, verdict: EvalResult) -> str:
        values = np.asarray(verdict.construction)
        return f"{summarize_sequence(values, self.list_in_prompt)}\nbound {verdict.metrics['bound']:.8f}"
