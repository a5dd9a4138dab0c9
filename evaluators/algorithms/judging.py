"""What the two contest judges share: the verdict on one output, and reading tokens the way the
contests' official tools (Rust) read them.

The official tools split an output on Unicode whitespace (`str::split_whitespace`) and parse each
token with `str::parse::<i64>()`, which accepts an optional sign and ASCII digits only ("+7" and
"007" are numbers; "7.0", "1_000", "٣" are not). Python's `int()` and `str.split()` accept more,
so they are not used on their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# Unicode White_Space, which is what Rust's char::is_whitespace tests (Python's str.split() also
# splits on \x1c-\x1f, which Rust does not).
RUST_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
_SPLIT = re.compile("[" + re.escape(RUST_WHITESPACE) + "]+")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_ALL_INTEGERS = re.compile(r"(?:[+-]?[0-9]+ )*")  # on " ".join(tokens) + " "


@dataclass(frozen=True)
class Judgement:
    """The verdict on one output for one input: valid with the contest's case score, or why not."""

    valid: bool
    score: int  # the case score of the statement; 0 when not valid
    reason: str = ""  # empty when valid; otherwise the first rule the output breaks
    details: dict[str, Any] = field(default_factory=dict)  # e.g. {"mackerels": 812, "sardines": 15}

    @staticmethod
    def wrong(reason: str) -> "Judgement":
        return Judgement(valid=False, score=0, reason=reason)

    def as_dict(self) -> dict[str, Any]:
        return {"valid": self.valid, "score": self.score, "reason": self.reason, **self.details}


def decode_output(output: bytes | str) -> str | None:
    """The output as text, or None when it is not UTF-8 (the official tools read it as a String)."""
    if isinstance(output, str):
        return output
    try:
        return output.decode("utf-8")
    except UnicodeDecodeError:
        return None


def tokens_of(text: str) -> list[str]:
    """Whitespace-separated tokens, as Rust's `split_whitespace` gives them."""
    return [t for t in _SPLIT.split(text) if t]


def is_integer(token: str) -> bool:
    return _INTEGER.fullmatch(token) is not None


def integer_prefix(tokens: list[str]) -> tuple[list[int], int | None]:
    """The values of the tokens up to the first one that is not an integer, and that one's index
    (None when all are integers). One regular-expression pass decides the common all-good case."""
    if not tokens or _ALL_INTEGERS.fullmatch(" ".join(tokens) + " ") is not None:
        return list(map(int, tokens)), None
    bad = next(i for i, t in enumerate(tokens) if not is_integer(t))
    return list(map(int, tokens[:bad])), bad


def shorten(token: str, limit: int = 30) -> str:
    """A token quoted for a reason, cut when long."""
    return repr(token if len(token) <= limit else token[:limit] + "...")
