"""Markdown tables, and model or candidate text made safe to quote: the one renderer the run
report, re-evaluation tables and problems' report sections share (evaluators sit below discover/,
so it lives here)."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Any

# Control (Cc), format (Cf: bidi controls, zero-width characters), surrogate (Cs), private-use (Co)
# and unassigned (Cn) characters and the line/paragraph separators U+2028/U+2029 (Zl, Zp).
UNPRINTABLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_KEPT = frozenset("\n\t")  # the layout a quoted text keeps


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape_unprintable(text: str) -> str:
    """`text` (a model's answer, a candidate's output) with every unprintable character but newline
    and tab written as a visible escape (`\\x1b`, `\\u202e`, `\\U000e0001`): the result is printable
    UTF-8 (a lone surrogate too becomes its escape), so a report quoting it stays a text file and shows
    what the text held."""
    return "".join(_escape(ch) if ch not in _KEPT and unicodedata.category(ch) in UNPRINTABLE_CATEGORIES else ch for ch in text)


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return escape_unprintable(str(value))


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows of dicts as a Markdown table (the columns of the first row unless given)."""
    if not rows:
        return "_(no rows)_\n"
    columns = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(c)).replace("|", "\\|") for c in columns) + " |")
    return "\n".join(lines) + "\n"
