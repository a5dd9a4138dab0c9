"""Markdown tables: the one renderer the run report, re-evaluation tables and problems' report
sections share (evaluators sit below discover/, so it lives here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows of dicts as a Markdown table (the columns of the first row unless given)."""
    if not rows:
        return "_(no rows)_\n"
    columns = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(c)).replace("|", "\\|") for c in columns) + " |")
    return "\n".join(lines) + "\n"
