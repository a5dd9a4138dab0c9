"""Problem ids and where each problem lives. A new problem adds one line here."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from evaluators.base import Problem

# id -> "module:factory"; the factory takes the run's `problem_options` as keyword arguments.
_PROBLEMS: dict[str, str] = {
    "toy": "evaluators.toy.digits:DigitsProblem",
    "erdos": "evaluators.math.erdos:ErdosProblem",
    "ac1": "evaluators.math.ac1:FirstAutocorrelationProblem",
    "ac2": "evaluators.math.ac2:SecondAutocorrelationProblem",
    "circles-26": "evaluators.math.circles:circles_26",
    "circles-32": "evaluators.math.circles:circles_32",
    "ahc039": "evaluators.algorithms.ahc039:PurseSeineProblem",
    "ahc058": "evaluators.algorithms.ahc058:AppleGameProblem",
    "trimul": "evaluators.kernels.trimul.problem:TriMulProblem",
    "denoising": "evaluators.bio.denoising.problem:DenoisingProblem",
}


def problem_names() -> list[str]:
    return sorted(_PROBLEMS)


def get_problem(name: str, **options: Any) -> Problem:
    """The problem with id `name`, built with its options; a clear error for unknown ids."""
    if name not in _PROBLEMS:
        raise KeyError(f"unknown problem {name!r}; known problems: {', '.join(problem_names())}")
    module_name, factory = _PROBLEMS[name].split(":")
    cls = getattr(import_module(module_name), factory)
    try:
        return cls(**options)
    except TypeError as err:
        raise ValueError(f"bad problem_options for {name!r}: {err}") from None
