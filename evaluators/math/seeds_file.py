"""Seeds read from a file of constructions, for runs that start from a known record (docs/method.md §5,
"Initial states"; the paper's App. B.2 also loads state-of-the-art constructions when available).

The file is JSON holding one construction or a list of them. A construction is what the
problem's `discover verify` accepts: a list of numbers or {"values": [...]} for the step-function
problems, a list of [x, y, r] or {"circles_xyr": [...]} for circle packing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def load_seed_constructions(path: str | Path, is_one: Callable[[Any], bool]) -> list[Any]:
    """The constructions in `path`; `is_one(data)` says whether `data` is a single construction."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"seeds_file {str(path)!r} does not exist")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"seeds_file {str(path)!r} is not valid JSON: {err}") from None
    if is_one(data):
        return [data]
    if isinstance(data, list) and data and all(is_one(item) for item in data):
        return list(data)
    raise ValueError(f"seeds_file {str(path)!r} holds neither one construction nor a non-empty list of them")


def nesting_depth(data: Any) -> int:
    """How deep the first elements of nested lists go: 0 for a number, 1 for [1, 2], 2 for [[1]]."""
    depth = 0
    while isinstance(data, list) and data:
        data, depth = data[0], depth + 1
    return depth
