"""What the two contest judges share: reading tokens the way the contests' official tools (Rust)
read them, and the bounds on an output (a judge's verdict is `evaluators.base.Judgement`).

The official tools split an output on Unicode whitespace (`str::split_whitespace`) and parse each
token with `str::parse::<i64>()`, which accepts an optional sign and ASCII digits only ("+7",
"-0" and "007" are numbers; "7.0", "1_000", "٣", "+", "" are not), and refuses a number outside
the 64-bit range (a parse error, so a wrong answer). Python's `int()` and `str.split()` accept
more, and `int()` raises on a string of more than 4300 digits, so neither is used on its own: a
token's significant digits are counted before it is converted (`integer`, `read_integers`), and a
number out of the 64-bit range is a wrong answer ("number out of range"), never an exception.

Bounds: a judge never reads more than `MAX_OUTPUT_BYTES` (the sandbox's cap on a case's output:
past it the case is already a wrong answer, "output too large"), and `read_integers` reads up to
that many bytes of tokens with NumPy in a few passes of linear time and memory (about 20 bytes of
memory per byte of output at worst), never one Python object per token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

MAX_OUTPUT_BYTES = 32 * 1024 * 1024  # = contest.OUTPUT_CAP: the sandbox's cap on one case's stdout
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
OUT_OF_RANGE = "number out of range"

# Unicode White_Space, which is what Rust's char::is_whitespace tests (Python's str.split() also
# splits on \x1c-\x1f, which Rust does not).
RUST_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
_SPLIT = re.compile("[" + re.escape(RUST_WHITESPACE) + "]+")
_INTEGER = re.compile(r"[+-]?[0-9]+")


def output_too_large(output: bytes | str) -> str:
    """Why the judge will not read `output` (more than MAX_OUTPUT_BYTES), or ""; checked before any parsing."""
    if isinstance(output, str) and 4 * len(output) <= MAX_OUTPUT_BYTES:
        return ""  # at most 4 bytes a character: small enough without encoding it
    size = len(output) if isinstance(output, bytes) else len(output.encode("utf-8", "surrogatepass"))
    if size > MAX_OUTPUT_BYTES:
        return f"output too large: {size} bytes, more than the {MAX_OUTPUT_BYTES} bytes a case may print"
    return ""


def decode_output(output: bytes | str) -> str | None:
    """The output as text, or None when it is not UTF-8 (the official tools read it as a String)."""
    if isinstance(output, str):
        return output
    try:
        return output.decode("utf-8")
    except UnicodeDecodeError:
        return None


def tokens_of(text: str, most: int = 0) -> list[str]:
    """Whitespace-separated tokens, as Rust's `split_whitespace` gives them; with `most`, at most
    `most` + 1 of them, the last holding the rest of the text (a bound on the work for a long line)."""
    return [t for t in _SPLIT.split(text.strip(RUST_WHITESPACE), maxsplit=most) if t]


def is_integer(token: str) -> bool:
    return _INTEGER.fullmatch(token) is not None


def integer(token: str) -> int | None:
    """The token's value as `parse::<i64>()` reads it, or None when it is not a 64-bit integer (not a
    number at all, or out of range): the digits are counted before `int()` sees them."""
    if _INTEGER.fullmatch(token) is None:
        return None
    digits = token.lstrip("+-").lstrip("0")
    if len(digits) > 19:
        return None
    value = -int(digits or "0") if token.startswith("-") else int(digits or "0")  # int() on at most 19 digits
    return value if I64_MIN <= value <= I64_MAX else None


def why_not_integer(token: str) -> str:
    """Why `integer(token)` is None: "not an integer" or OUT_OF_RANGE."""
    return "not an integer" if _INTEGER.fullmatch(token) is None else OUT_OF_RANGE


@dataclass(frozen=True)
class Integers:
    """The tokens of an output read as integers: the values of those before the first token that is
    not a 64-bit integer, how many tokens there are, and that token (with why) when there is one."""

    values: np.ndarray  # int64
    count: int  # tokens in the output
    bad: int | None = None  # the index of the first token that is not a 64-bit integer
    bad_token: str = ""
    bad_reason: str = ""  # "not an integer" or OUT_OF_RANGE


_RUST_SPACE = {ord(c): " " for c in RUST_WHITESPACE}
_ASCII_SPACE = bytes.maketrans(b"\t\n\x0b\x0c\r", b"     ")
_CLASS = np.zeros(256, dtype=np.uint8)  # 0: other, 1: digit, 2: sign, 3: space
_CLASS[ord("0") : ord("9") + 1] = 1
_CLASS[[ord("+"), ord("-")]] = 2
_CLASS[ord(" ")] = 3
_LONG = 18  # a token of at most this many characters is a 64-bit integer whenever it is an integer


def read_integers(text: str) -> Integers:
    """Every whitespace-separated token of `text` read as `parse::<i64>()` reads it, in linear time
    and memory with NumPy (no Python object per token), up to the first token that is not one."""
    if not text.isascii():
        text = text.translate(_RUST_SPACE)  # Unicode whitespace separates tokens; anything else non-ASCII is in a token
    raw = text.encode("utf-8", "surrogatepass").translate(_ASCII_SPACE)
    a = np.frombuffer(raw, dtype=np.uint8)
    kind = _CLASS[a]
    solid = kind != 3
    first = solid.copy()  # the first character of a token
    first[1:] &= ~solid[:-1]
    count = int(np.count_nonzero(first))

    def span(at: int) -> tuple[int, int]:
        """The token holding character `at`: its index, start and end."""
        begin = raw.rfind(b" ", 0, at) + 1
        stop = raw.find(b" ", at)
        return begin, len(raw) if stop < 0 else stop

    # a character that breaks its token: not a digit or sign; a sign not first, or not followed by a digit
    after = np.empty_like(kind)
    after[:-1], after[-1:] = kind[1:], 3
    broken = (kind == 0) | ((kind == 2) & (~first | (after != 1)))
    del after
    hits = np.flatnonzero(broken[: np.argmax(broken) + 1]) if broken.any() else ()
    bad_at = int(hits[0]) if len(hits) else len(raw)
    reason = "not an integer"
    # tokens longer than _LONG characters may be integers out of the 64-bit range: checked one by one
    run = solid[:bad_at].copy()
    for k in range(1, _LONG + 1):
        run[:-k] &= solid[k:bad_at]
        run[len(run) - k :] = False
    at = 0
    while True:
        found = np.flatnonzero(run[at:][: 1 << 16])
        if not len(found):
            if at + (1 << 16) >= len(run):
                break
            at += 1 << 16
            continue
        begin, stop = span(at + int(found[0]))
        if stop > bad_at:  # the token holds the first character that is not part of an integer: it is not one
            break
        if integer(raw[begin:stop].decode("ascii")) is None:
            bad_at, reason = begin, OUT_OF_RANGE
            break
        at = stop
    del run
    bad = None if bad_at >= len(raw) else int(np.count_nonzero(first[:bad_at])) - (0 if first[bad_at] else 1)
    good = count if bad is None else bad
    begin = span(bad_at)[0] if bad is not None else len(raw)
    values = np.fromstring(raw[:begin], dtype=np.int64, sep=" ") if good else np.zeros(0, dtype=np.int64)
    if len(values) != good:  # cannot happen: every token of the prefix is a checked integer
        raise AssertionError(f"read {len(values)} integers of {good}")
    if bad is None:
        return Integers(values=values, count=count)
    token = raw[slice(*span(bad_at))].decode("utf-8", "replace")
    if reason != OUT_OF_RANGE:
        reason = why_not_integer(token)
    return Integers(values=values, count=count, bad=bad, bad_token=token, bad_reason=reason)


def shorten(token: str, limit: int = 30) -> str:
    """A token quoted for a reason, cut when long."""
    return repr(token if len(token) <= limit else token[:limit] + "...")
