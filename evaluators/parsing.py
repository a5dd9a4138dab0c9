"""Pulling a candidate out of the model's final answer (docs/method.md §4)."""

from __future__ import annotations

import re

# An opening fence with an optional language tag, the body, and a closing fence on its own line.
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)


def last_fenced_block(answer: str, languages: tuple[str, ...] = ()) -> str | None:
    """The last fenced code block of `answer` (docs/method.md §4), or None when there is none.

    With `languages`, blocks tagged with another language are skipped (untagged blocks count).
    An unclosed final fence counts as a block running to the end of the answer, since the model
    may have hit its token limit mid-block.
    """
    blocks = [body for tag, body in _FENCE.findall(answer) if not languages or not tag or tag.lower() in languages]
    if not blocks:
        return None
    body = blocks[-1].strip("\n")
    return body if body.strip() else None


_PY_COMMENT = re.compile(r"#[^\n]*")
_C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_SPACE = re.compile(r"\s+")


def normalize_code(code: str, language: str = "python") -> str:
    """`code` without comments and whitespace (docs/method.md §5a: duplicates are equal "up to comments and
    whitespace"). Comment markers inside string literals are stripped too: two programs that differ
    only there are rare enough to count as the same."""
    pattern = _C_COMMENT if language in ("c", "cpp", "c++") else _PY_COMMENT
    return _SPACE.sub("", pattern.sub("", code))
