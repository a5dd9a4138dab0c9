"""Validation shared by the step-function problems (Erdős, AC1, AC2): untrusted data to an array.

A construction is a list of numbers or an object whose "values" holds one. Every check of docs/method.md §5
on the values themselves lives here, so the three verifiers reject hostile input the same way.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np


def sequence_values(construction: Any) -> Any:
    """The list inside `{"values": [...]}`, or the construction itself."""
    if isinstance(construction, dict):
        return construction.get("values")
    return construction


def check_sequence(construction: Any, *, high: float, max_pieces: int, min_sum: float = 0.0) -> tuple[np.ndarray | None, str]:
    """(values as float64, "") for 1..max_pieces real numbers in [0, high] summing to at least
    `min_sum`; otherwise (None, the reason)."""
    if isinstance(construction, dict) and "values" not in construction:
        return None, 'the object has no "values" key'
    values = sequence_values(construction)
    if not isinstance(values, (list, tuple)):
        return None, f"expected a list of numbers, got {type(values).__name__}"
    n = len(values)
    if n == 0:
        return None, "the list of values is empty"
    if n > max_pieces:
        return None, f"{n} pieces; at most {max_pieces} are allowed"
    for i, v in enumerate(values):
        # bool is a subclass of int and numpy scalars are not numbers.Real in every version
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, np.floating, np.integer)):
            return None, f"value {i} is a {type(v).__name__}, not a number"
    try:
        f = np.array([float(v) for v in values], dtype=np.float64)
    except (OverflowError, ValueError) as err:  # e.g. an int too large for a float
        return None, f"a value cannot be read as a float ({err})"
    for bad, what in ((np.isnan(f), "NaN"), (np.isinf(f), "infinite")):
        if bad.any():
            return None, f"value {int(np.argmax(bad))} is {what}"
    if (f < 0).any():
        i = int(np.argmax(f < 0))
        return None, f"value {i} is negative ({f[i]:g}); values must lie in [0, {high:g}]"
    if (f > high).any():
        i = int(np.argmax(f > high))
        return None, f"value {i} is above {high:g} ({f[i]:g}); values must lie in [0, {high:g}]"
    total = math.fsum(f)
    if total <= 0.0 or total < min_sum:
        need = f"at least {min_sum:g}" if min_sum > 0 else "more than 0"
        return None, f"the values sum to {total:.3g}; the sum must be {need} (a near-zero sum is degenerate)"
    return f, ""


def summarize_sequence(f: np.ndarray, list_up_to: int) -> str:
    """How a sequence is shown to the model: its size and range, and every value if it is short."""
    head = f"{len(f)} pieces, min {f.min():.6g}, max {f.max():.6g}"
    if len(f) <= list_up_to:
        return head + "\nValues: [" + ", ".join(f"{v:.6g}" for v in f) + "]"
    return head + "\n(The values are too many to list here; construct(parent) receives all of them.)"
