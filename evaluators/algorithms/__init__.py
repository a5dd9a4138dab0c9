"""Algorithm engineering (docs/method.md §5b): AtCoder Heuristic Contests 039 and 058, C++ programs judged on
the contests' public cases. `JUDGES` is what `discover judge` uses."""

from __future__ import annotations

from collections.abc import Callable

from evaluators.algorithms import ahc039, ahc058
from evaluators.algorithms.judging import Judgement

JUDGES: dict[str, Callable[[str, bytes | str], Judgement]] = {"ahc039": ahc039.judge, "ahc058": ahc058.judge}


def get_judge(problem: str) -> Callable[[str, bytes | str], Judgement]:
    """judge(input_text, output) of a contest problem; KeyError naming the problems that have one."""
    if problem not in JUDGES:
        raise KeyError(f"problem {problem!r} has no output judge; judges exist for {', '.join(sorted(JUDGES))}")
    return JUDGES[problem]
