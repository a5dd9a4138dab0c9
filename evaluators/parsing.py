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
_C_START = re.compile(r"//|/\*")
_SPACE = re.compile(r"\s+")


def _strip_c_comments(code: str) -> str:
    """`code` without `// ...` and `/* ... */` comments, in time linear in its length (a regular
    expression's lazy block-comment match rescans to the end from every unclosed `/*`: quadratic). An unclosed
    `/*` stays as it is, and so does every later one, which no `*/` can close either."""
    out, at, closable = [], 0, True
    while (start := _C_START.search(code, at)) is not None:
        j = start.start()
        out.append(code[at:j])
        if start.group() == "//":
            end = code.find("\n", j)
            at = len(code) if end < 0 else end
            continue
        end = code.find("*/", j + 2) if closable else -1
        if end < 0:
            closable = False
            out.append("/*")
            at = j + 2
        else:
            at = end + 2
    out.append(code[at:])
    return "".join(out)


def normalize_code(code: str, language: str = "python") -> str:
    """`code` without comments and whitespace (docs/method.md §5a: duplicates are equal "up to comments and
    whitespace"), in linear time. Comment markers inside string literals are stripped too: two programs
    that differ only there are rare enough to count as the same."""
    stripped = _strip_c_comments(code) if language in ("c", "cpp", "c++") else _PY_COMMENT.sub("", code)
    return _SPACE.sub("", stripped)
