"""Pulling a candidate out of the model's final answer (SPEC §4)."""

from __future__ import annotations

import re

# An opening fence with an optional language tag, the body, and a closing fence on its own line.
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)


def last_fenced_block(answer: str, languages: tuple[str, ...] = ()) -> str | None:
    """The last fenced code block of `answer` (SPEC §4), or None when there is none.

    With `languages`, blocks tagged with another language are skipped (untagged blocks count).
    An unclosed final fence counts as a block running to the end of the answer, since the model
    may have hit its token limit mid-block.
    """
    blocks = [
        body
        for tag, body in _FENCE.findall(answer)
        if not languages or not tag or tag.lower() in languages
    ]
    if not blocks:
        return None
    body = blocks[-1].strip("\n")
    return body if body.strip() else None
