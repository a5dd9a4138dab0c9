"""AHC058 "Apple Incremental Game": the judge of one output, written from the statement, and the problem.

Input: `N L T K` (10 4 500 1), the production capacities A_j (sorted, 1..100), then L rows of the
initial costs C_ij (1..1.25e12). Start: B = 1 and P = 0 for every machine j^i, K apples.
Each turn: optionally strengthen one machine j^i, paying C_ij * (P_ij + 1) apples (never going
below 0), then level 0 produces A_j * B_0j * P_0j apples for every j, and for i = 1, 2, ... in
this order B_(i-1)j += B_ij * P_ij.
Output: exactly T action lines, `i j` (strengthen machine j^i: level i, ID j) or `-1` (do
nothing); lines whose first non-blank character is `#` are comments, blank lines are skipped.
Wrong answer: fewer than T actions, a line among the first T actions that is neither form, a level
or ID that does not exist, a strengthening that the apples do not cover.

Where the statement is silent, the official tester is the rule: it reads the output line by line
and scores the first T actions; what follows the T-th action line is ignored, whatever it is (the
statement makes only fewer than T actions a wrong answer). Within a line, tokens are split on
Unicode whitespace and parsed as `parse::<i64>()` ("+1", "00", "-0" are numbers; one outside the
64-bit range is a wrong answer, "number out of range", judging.py); a line with a third token is a
wrong answer. Blank lines are skipped like comments (not verified against the tester; the
statement says nothing of them). Bounds: at most judging.MAX_OUTPUT_BYTES of output is read, and
the work is T lines: blank and comment lines are skipped by a regular expression, a line's tokens
are split at most three times.
Case score: round(1e5 * log2 S), S the apples after T turns.

Apples, B and costs are Python integers (S exceeds 64 bits on some inputs); the score's rounding
is certified with decimal arithmetic (see `log_score`).
"""

from __future__ import annotations

import decimal
import re
from dataclasses import dataclass

from evaluators.algorithms.contest import AtCoderProblem
from evaluators.algorithms.judging import (
    RUST_WHITESPACE,
    decode_output,
    integer,
    output_too_large,
    shorten,
    tokens_of,
    why_not_integer,
)
from evaluators.base import Judgement

SCORE_FACTOR = 100_000


@dataclass(frozen=True)
class Input:
    n: int  # machine IDs
    levels: int  # machine levels
    turns: int  # T
    apples: int  # K
    a: tuple[int, ...]  # production capacity of machine j^0
    c: tuple[tuple[int, ...], ...]  # c[i][j]: initial cost of machine j^i


def parse_input(text: str) -> Input:
    """Read an input file; ValueError naming the problem when it is not an AHC058 input."""
    try:
        values = [int(t) for t in text.split()]
    except ValueError:
        raise ValueError("not an AHC058 input: it holds a token that is not an integer") from None
    if len(values) < 4:
        raise ValueError("not an AHC058 input: the first line must be `N L T K`")
    n, levels, turns, k = values[:4]
    if n < 1 or levels < 1 or turns < 0 or k < 0 or len(values) != 4 + n + levels * n:
        raise ValueError(f"not an AHC058 input: N L T K = {n} {levels} {turns} {k} needs {4 + n + levels * n} integers, got {len(values)}")
    a = tuple(values[4 : 4 + n])
    c = tuple(tuple(values[4 + n + i * n : 4 + n + (i + 1) * n]) for i in range(levels))
    return Input(n=n, levels=levels, turns=turns, apples=k, a=a, c=c)


# A line that is an action: not blank and not a comment (its first non-blank character is not `#`).
# Found by the regular expression (in C), so blank lines and comments cost no Python step each.
_BLANK = re.escape(RUST_WHITESPACE.replace("\n", ""))
_ACTION_LINE = re.compile(f"^[{_BLANK}]*([^{_BLANK}#\n][^\n]*)$", re.MULTILINE)


def read_actions(text: str, inp: Input) -> tuple[list[tuple[int, int] | None], str]:
    """The T actions ((level, id), or None for "do nothing"), or ([], the first reading error).

    Only the first T action lines are read: what follows the T-th is ignored, as the official tester
    ignores it (the statement makes only fewer than T actions a wrong answer). The work is bounded
    by T lines, whatever the output's length."""
    actions: list[tuple[int, int] | None] = []
    number, counted = 1, 0  # the line number of position `counted`
    for match in _ACTION_LINE.finditer(text):
        if len(actions) == inp.turns:
            break
        number += text.count("\n", counted, match.start())
        counted = match.start()
        body = match.group(1).strip(RUST_WHITESPACE)
        where = f"line {number}"
        tokens = tokens_of(body, most=2)  # a third token is already one too many
        if len(tokens) > 2:
            return [], f"{where}: expected `i j` (strengthen machine j^i) or `-1` (do nothing), got {shorten(body, 40)}"
        values = [integer(t) for t in tokens]
        if None in values:
            bad = tokens[values.index(None)]
            return [], f"{where}: {shorten(bad)} is {why_not_integer(bad)} (expected `i j` or `-1`)"
        if values == [-1]:
            actions.append(None)
            continue
        if len(values) != 2:
            return [], f"{where}: expected `i j` (strengthen machine j^i) or `-1` (do nothing), got {shorten(body, 40)}"
        i, j = values
        if not 0 <= i < inp.levels:
            return [], f"{where}: level {i} does not exist (levels are 0..{inp.levels - 1})"
        if not 0 <= j < inp.n:
            return [], f"{where}: ID {j} does not exist (IDs are 0..{inp.n - 1})"
        actions.append((i, j))
    if len(actions) < inp.turns:
        return [], f"only {len(actions)} actions; the output must hold exactly T = {inp.turns} actions"
    return actions, ""


def simulate(inp: Input, actions: list[tuple[int, int] | None]) -> tuple[int, str]:
    """The apples after the plan (exact), or (0, why the plan breaks the rules at some turn)."""
    apples = inp.apples
    b = [[1] * inp.n for _ in range(inp.levels)]
    p = [[0] * inp.n for _ in range(inp.levels)]
    for turn, action in enumerate(actions):
        if action is not None:
            i, j = action
            cost = inp.c[i][j] * (p[i][j] + 1)
            if cost > apples:
                return 0, (
                    f"turn {turn}: strengthening machine {j}^{i} (level {i}, ID {j}) to power {p[i][j] + 1} costs "
                    f"{cost} apples, but only {apples} are held"
                )
            apples -= cost
            p[i][j] += 1
        apples += sum(a * bj * pj for a, bj, pj in zip(inp.a, b[0], p[0]))  # level 0 produces apples
        for i in range(1, inp.levels):  # then levels 1, 2, ... in order add machines one level down
            below, here, power = b[i - 1], b[i], p[i]
            for j in range(inp.n):
                below[j] += here[j] * power[j]
    return apples, ""


def log_score(apples: int) -> int:
    """round(1e5 * log2 S), exactly: decimal logarithms with enough digits to certify the rounding.

    1e5 * log2 S is an integer when S is a power of two and irrational otherwise, so it is never
    a half-integer; 60 significant digits (raised if ever needed) place it on the right side of
    every half-integer for any S the game can reach. S = 0 cannot happen when K >= 1 (the first
    purchase must cost 1 apple, a level-0 machine, which then produces every turn); it scores 0.
    """
    if apples <= 0:
        return 0
    digits = 60
    while True:
        ctx = decimal.Context(prec=digits)
        value = ctx.multiply(ctx.divide(ctx.ln(decimal.Decimal(apples)), ctx.ln(decimal.Decimal(2))), SCORE_FACTOR)
        nearest_half = value.to_integral_value(rounding=decimal.ROUND_FLOOR) + decimal.Decimal("0.5")
        margin = abs(value - nearest_half)
        if margin > decimal.Decimal(10) ** (-(digits - 20)):
            return int((value + decimal.Decimal("0.5")).to_integral_value(rounding=decimal.ROUND_FLOOR))
        digits *= 2


def judge_output(inp: Input, output: bytes | str) -> Judgement:
    """The contest's verdict on one output: WA with the first broken rule, or the case score."""
    too_large = output_too_large(output)
    if too_large:
        return Judgement.wrong(too_large)
    text = decode_output(output)
    if text is None:
        return Judgement.wrong("the output is not UTF-8 text")
    actions, err = read_actions(text, inp)
    if err:
        return Judgement.wrong(err)
    apples, err = simulate(inp, actions)
    if err:
        return Judgement.wrong(err)
    strengthened = sum(a is not None for a in actions)
    return Judgement(valid=True, score=log_score(apples), details={"apples": str(apples), "strengthened": strengthened})


def judge(input_text: str, output: bytes | str) -> Judgement:
    return judge_output(parse_input(input_text), output)


class AppleGameProblem(AtCoderProblem):
    """AHC058 Apple Incremental Game: reward = mean case score / 3,000,000 (the released code's scale)."""

    name = contest = "ahc058"
    scale = 3_000_000.0
    # docs/method.md §5a: the prompt's target. The contest's 1st place (a human) scored 847,674,723 over its 150
    # official cases: that mean per case, in reward units.
    target = 847_674_723 / 150 / 3_000_000.0
    builtin_program = None  # from scratch, as in the paper

    def parse_input(self, text: str) -> Input:
        return parse_input(text)

    def judge_output(self, parsed_input: Input, output: bytes | str) -> Judgement:
        return judge_output(parsed_input, output)
