"""Answers as edits (`sampling.answer_format: edits`, docs/method.md "Answers as edits"): the model
answers with SEARCH/REPLACE blocks against its parent's program instead of a whole program, and
the host turns them into the whole program that is evaluated. Pure text functions, no I/O; the
model's text is never run here.

An answer holds one or more blocks, anywhere in its text (text around them is ignored, and so are
code fences around them):

    <<<<<<< SEARCH
    exact lines of the parent's program
    =======
    the lines that replace them
    >>>>>>> REPLACE

The rules (`apply_edits`), each failure an `EditError` whose message names the block:

* A marker is a line of its own: `<<<<<<< SEARCH`, `=======`, `>>>>>>> REPLACE` (trailing
  whitespace allowed). An answer without a block: "no SEARCH/REPLACE block". A block whose
  `=======` or `>>>>>>> REPLACE` line is missing (e.g. the token limit cut it): not closed.
* SEARCH matches whole lines. An exact match is looked for first; only when there is none, a
  match with trailing whitespace stripped from every line (of SEARCH and of the program) is
  accepted. Leading whitespace (indentation) always has to match.
* A SEARCH part that is empty (or holds only blank lines) is refused; one that matches no place,
  or more than one place ("block k matches n places; include more context"), is refused, naming
  the block by its 1-based index and its first SEARCH line.
* Every block is matched against the original parent program, not against the result of the
  blocks before it; two blocks whose matched lines overlap are refused, naming both. Blocks then
  replace their lines (in any order of their positions: they do not overlap), and the result is
  the whole program.

This runs on the host, outside any sandbox, on text the model wrote: its time is linear in the
sizes of the parent and the answer. The parent is indexed once (each line's places, prefix hashes
of its lines); a block is looked for only where its rarest line occurs, and the places looked at
are capped at `LOCATE_WORK_PER_LINE` per line of parent and SEARCH parts together: blocks made of
lines that occur too often to locate within that cost are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ANSWER_FORMATS = ("program", "edits")  # sampling.answer_format: a whole program (the paper's) or edits to the parent's

SEARCH, DIVIDER, REPLACE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"
EDITS_NOT_APPLIED = "edits not applied"  # how the reason of an answer whose edits failed begins

_MARKER = re.compile(r"^(<<<<<<< SEARCH|=======|>>>>>>> REPLACE)[ \t\r]*$")


class EditError(ValueError):
    """An answer whose edits cannot be applied; the message says which block and why."""


@dataclass(frozen=True)
class Block:
    """One SEARCH/REPLACE block: the lines it looks for and the lines that replace them."""

    search: tuple[str, ...]
    replace: tuple[str, ...]

    def first_line(self) -> str:
        """The first non-blank SEARCH line, shortened, for messages."""
        line = next((s.strip() for s in self.search if s.strip()), "")
        return line if len(line) <= 60 else line[:57] + "..."


def parse_blocks(answer: str) -> list[Block]:
    """The SEARCH/REPLACE blocks of `answer`, in order; EditError for none or an unclosed one."""
    blocks: list[Block] = []
    search: list[str] | None = None
    replace: list[str] | None = None
    for line in answer.split("\n"):
        marker = _MARKER.match(line)
        kind = marker.group(1) if marker else None
        if search is None:  # outside a block: only an opening marker matters
            if kind == SEARCH:
                search = []
        elif replace is None:  # in SEARCH
            if kind == DIVIDER:
                replace = []
            elif kind is not None:
                raise EditError(f"block {len(blocks) + 1} has {kind!r} before its {DIVIDER!r} line")
            else:
                search.append(line)
        elif kind == REPLACE:
            blocks.append(Block(tuple(search), tuple(replace)))
            search = replace = None
        elif kind is not None:
            raise EditError(f"block {len(blocks) + 1} has {kind!r} before its {REPLACE!r} line")
        else:
            replace.append(line)
    if search is not None:
        missing = DIVIDER if replace is None else REPLACE
        raise EditError(f"block {len(blocks) + 1} is not closed (no {missing!r} line; was the answer cut off?)")
    if not blocks:
        raise EditError(f"no SEARCH/REPLACE block (an edit is {SEARCH!r}, lines, {DIVIDER!r}, lines, {REPLACE!r})")
    return blocks


# Locating costs at most this many places looked at per line of the parent and of the answer's SEARCH
# parts together; beyond it (blocks made of lines that occur hundreds of times) the answer is refused.
LOCATE_WORK_PER_LINE = 20
_MOD, _BASE = (1 << 61) - 1, 1_000_003  # the polynomial hash of a run of lines (each line a number)


class _Index:
    """The parent's lines indexed once for all blocks: each distinct line a number, the places where
    each occurs, and prefix hashes of the sequence, so that a block is located in time linear in its
    own length plus the places its rarest line occurs (never by scanning the parent per block)."""

    def __init__(self, lines: list[str]):
        self.number: dict[str, int] = {}
        self.seq: list[int] = []
        self.where: dict[int, list[int]] = {}
        for i, line in enumerate(lines):
            n = self.number.setdefault(line, len(self.number))
            self.seq.append(n)
            self.where.setdefault(n, []).append(i)
        self.prefix = [0]
        for n in self.seq:
            self.prefix.append((self.prefix[-1] * _BASE + n + 1) % _MOD)
        self.power = [1]
        for _ in self.seq:
            self.power.append(self.power[-1] * _BASE % _MOD)

    def places(self, search: tuple[str, ...], work: list[int]) -> list[int]:
        """The line indices where `search` matches as consecutive whole lines; `work` (a one-item
        budget) is charged with the places looked at, EditError when it runs out."""
        numbers: list[int] = []
        for line in search:
            n = self.number.get(line)
            if n is None:  # a line the parent does not have
                return []
            numbers.append(n)
        length = len(numbers)
        offset = min(range(length), key=lambda k: len(self.where[numbers[k]]))  # the rarest line anchors
        anchors = self.where[numbers[offset]]
        work[0] -= len(anchors)
        if work[0] < 0:
            raise EditError(
                "the blocks are made of lines that occur too often in the parent's program to locate them within the "
                "cost allowed; include lines that occur once"
            )
        target = 0
        for n in numbers:
            target = (target * _BASE + n + 1) % _MOD
        found: list[int] = []
        for at in anchors:
            start = at - offset
            if start < 0 or start + length > len(self.seq):
                continue
            if (self.prefix[start + length] - self.prefix[start] * self.power[length]) % _MOD != target:
                continue
            if not found and self.seq[start : start + length] != numbers:
                continue  # a hash collision: the first match is always compared line by line
            found.append(start)
        return found


class _Parent:
    """The parent's lines, with the exact index and, made on first need, the trailing-whitespace one."""

    def __init__(self, lines: list[str], search_lines: int):
        self.lines = lines
        self.exact = _Index(lines)
        self._stripped: _Index | None = None
        self.work = [LOCATE_WORK_PER_LINE * (len(lines) + search_lines)]

    def stripped(self) -> _Index:
        if self._stripped is None:
            self._stripped = _Index([s.rstrip() for s in self.lines])
        return self._stripped


def locate(parent: _Parent, block: Block, k: int) -> tuple[int, int]:
    """The [start, end) line range of the parent's lines that block `k` (1-based) replaces."""
    if not any(s.strip() for s in block.search):
        raise EditError(f"block {k} has an empty SEARCH part; copy the lines to replace from the current program")
    places = parent.exact.places(block.search, parent.work)
    if not places:  # the whitespace-tolerant fallback: trailing whitespace stripped on both sides
        places = parent.stripped().places(tuple(s.rstrip() for s in block.search), parent.work)
    if not places:
        raise EditError(f"block {k} (SEARCH starts {block.first_line()!r}) matches no place of the parent's program")
    if len(places) > 1:
        raise EditError(f"block {k} (SEARCH starts {block.first_line()!r}) matches {len(places)} places; include more context")
    return places[0], places[0] + len(block.search)


def apply_blocks(parent: str, blocks: list[Block]) -> str:
    """`parent` with every block applied, each matched against `parent` itself (see the module's rules),
    in time linear in the sizes of the parent and the blocks (`_Index`; `LOCATE_WORK_PER_LINE`)."""
    lines = parent.split("\n")
    indexed = _Parent(lines, sum(len(b.search) for b in blocks))
    ranges = [(*locate(indexed, b, k), k) for k, b in enumerate(blocks, start=1)]
    ordered = sorted(ranges)
    for (_, end, a), (start, _, b) in zip(ordered, ordered[1:]):
        if start < end:
            first, second = sorted((a, b))
            raise EditError(f"blocks {first} and {second} overlap (their SEARCH parts match the same lines); merge them into one block")
    out: list[str] = []
    at = 0
    for start, end, k in ordered:
        out += lines[at:start]
        out += blocks[k - 1].replace
        at = end
    out += lines[at:]
    return "\n".join(out)


def apply_edits(parent: str, answer: str) -> str:
    """The whole program that `answer`'s SEARCH/REPLACE blocks make of `parent`; EditError if they cannot."""
    return apply_blocks(parent, parse_blocks(answer))


# a count: an integer of 2 or more assigned to a name on its own (`TRIALS = 3000`) or a loop's `range(20)`
_COUNT = re.compile(r"(?:^\s*[A-Za-z_]\w*\s*=\s*|\brange\()([2-9]|[1-9]\d+)(?=\s*(?:\)|#|$))")


def example_block(program: str) -> tuple[str, str] | None:
    """A concrete SEARCH/REPLACE example quoting a real line of `program`: (that line, its replacement).

    The line is the first one that occurs once in the program and sets a count (an integer of 2 or
    more assigned to a name, `TRIALS = 3000`, or a loop's `range(20)`); the replacement doubles it. Without such a line,
    the first line that occurs once (not blank, not a comment) gets a comment added after it; None
    for a program without either. A small model shown only a description of the format copied the
    description's placeholder line into its SEARCH part (benchmarks/results/answer_formats.md).
    """
    lines = program.splitlines()
    unique = [line for line in lines if line.strip() and not line.lstrip().startswith("#") and lines.count(line) == 1]
    for line in unique:
        code = line.split("#", 1)[0].rstrip()
        match = _COUNT.search(code)
        if match:
            return line, line[: match.start(1)] + str(2 * int(match.group(1))) + line[match.end(1) :]
    if unique:
        line = unique[0]
        indent = line[: len(line) - len(line.lstrip())]
        return line, f"{line}\n{indent}# (a line added after it)"
    return None


def edits_instruction(program: str = "") -> str:
    """What the context adds under `answer_format: edits`: the format, the rules, and that it replaces
    the problem's own request for a whole program. With the parent's `program`, the format is shown
    as a concrete block on one of its lines (`example_block`) instead of placeholder lines."""
    example = example_block(program)
    if example is None:
        shape = (
            "one or more SEARCH/REPLACE blocks, each\n"
            f"{SEARCH}\n"
            "lines copied exactly from the current program\n"
            f"{DIVIDER}\n"
            "the lines that replace them\n"
            f"{REPLACE}\n"
        )
    else:
        line, replacement = example
        shape = (
            f"one or more SEARCH/REPLACE blocks. A block is a line {SEARCH}, then lines copied exactly from the current "
            f"program, then a line {DIVIDER}, then the lines that replace them, then a line {REPLACE}. "
            "For example, this block changes one line of the current program:\n"
            f"{SEARCH}\n{line}\n{DIVIDER}\n{replacement}\n{REPLACE}\n"
        )
    return (
        "Answer format: do not write a whole program. Answer with edits to the current program shown above: "
        + shape
        + "Each SEARCH part must be whole lines of the current program, indentation included, and match exactly one "
        "place (add lines around it when it could match several); blocks must not overlap. Text outside the blocks "
        "is ignored. The edited program is your answer and is run and scored as described above."
    )
