"""The AHC058 judge on hand-made plans (issue 8, Must show 1 and 2): the statement's example output,
every rule broken once with its reason, comments, plans that run out of apples at a given turn,
a final apple count beyond 64 bits, and the exact rounding of the score."""

from __future__ import annotations

import decimal
import math

import pytest

from evaluators.algorithms.ahc058 import Input, judge, log_score, parse_input, simulate
from evaluators.algorithms.cases import public_inputs
from evaluators.algorithms.judging import MAX_OUTPUT_BYTES

# N L T K, A, then L rows of C: a small game whose apples are easy to follow by hand.
SMALL = "2 2 3 1\n1 2\n1 5\n10 20\n"


def plan(*actions: str) -> str:
    return "\n".join(actions) + "\n"


def reference_apples(inp: Input, actions) -> int:
    """The statement's procedure written out again, turn by turn (an independent re-reading)."""
    apples, count, power = inp.apples, {}, {}
    for action in actions:
        if action is not None:
            i, j = action
            cost = inp.c[i][j] * (power.get((i, j), 0) + 1)
            assert apples >= cost
            apples -= cost
            power[(i, j)] = power.get((i, j), 0) + 1
        for j in range(inp.n):
            apples += inp.a[j] * count.get((0, j), 1) * power.get((0, j), 0)
        for i in range(1, inp.levels):
            for j in range(inp.n):
                count[(i - 1, j)] = count.get((i - 1, j), 1) + count.get((i, j), 1) * power.get((i, j), 0)
    return apples


def test_the_statements_example_output_is_a_wrong_answer() -> None:
    """The statement's example output is empty: fewer than T actions."""
    verdict = judge(public_inputs("ahc058")[0], "\n")
    assert not verdict.valid and verdict.reason == "only 0 actions; the output must hold exactly T = 500 actions"


def test_a_game_followed_by_hand() -> None:
    # turn 0: pay 1 for machine 0^0 (apples 0), it makes 1*1*1 -> 1; turns 1, 2: +1 each -> 3
    verdict = judge(SMALL, plan("0 0", "-1", "-1"))
    assert verdict.valid and verdict.details["apples"] == "3"
    assert verdict.score == round(1e5 * math.log2(3)) == 158496
    # doing nothing keeps K = 1 apple: log2(1) = 0
    assert judge(SMALL, plan("-1", "-1", "-1")).score == 0
    # machine 0^0 twice: turn 0 -> 1 apple; turn 1 pays 2 -> but holds 1: not allowed
    broke = judge(SMALL, plan("0 0", "0 0", "-1"))
    assert not broke.valid
    assert broke.reason == "turn 1: strengthening machine 0^0 (level 0, ID 0) to power 2 costs 2 apples, but only 1 are held"


def test_level_one_machines_add_machines_one_level_down() -> None:
    inp = parse_input("1 2 4 10\n3\n1 2\n")
    # turn 0: 0^0 (cost 1) -> 9, +3 -> 12; turn 1: 0^1 (cost 2) -> 10, level 0 makes 3*1*1 -> 13,
    # then B[0][0] += 1*1 = 2; turn 2: 13 + 3*2*1 = 19, B[0][0] = 3; turn 3: 19 + 9 = 28, B = 4
    apples, err = simulate(inp, [(0, 0), (1, 0), None, None])
    assert err == "" and apples == 28 == reference_apples(inp, [(0, 0), (1, 0), None, None])


@pytest.mark.parametrize(
    "output, reason",
    [
        (plan("-1", "-1"), "only 2 actions; the output must hold exactly T = 3 actions"),
        (plan("-1", "2 0", "-1"), "line 2: level 2 does not exist (levels are 0..1)"),
        (plan("-1", "-1 0", "-1"), "line 2: level -1 does not exist"),
        (plan("0 2", "-1", "-1"), "line 1: ID 2 does not exist (IDs are 0..1)"),
        (plan("0", "-1", "-1"), "line 1: expected `i j` (strengthen machine j^i) or `-1` (do nothing), got '0'"),
        (plan("0 0 0", "-1", "-1"), "line 1: expected `i j`"),
        (plan("0 x", "-1", "-1"), "line 1: 'x' is not an integer"),
        (plan("-1", "1 0", "-1"), "turn 1: strengthening machine 0^1 (level 1, ID 0) to power 1 costs 10 apples, but only 1 are held"),
        (b"0 0\n-1\n-1\xff\n", "not UTF-8"),
    ],
    ids=["fewer", "level", "negative-level", "id", "one-number", "three-numbers", "word", "no-apples", "not-utf8"],
)
def test_every_rule_broken_once_names_the_rule(output: str | bytes, reason: str) -> None:
    verdict = judge(SMALL, output)
    assert not verdict.valid and verdict.score == 0
    assert reason in verdict.reason, verdict.reason


def test_comments_and_blank_lines_are_not_actions() -> None:
    output = "# plan by hand\n0 0\n\n   # indented comment\n-1\n#-1\n-1\n# done\n"
    verdict = judge(SMALL, output)
    assert verdict.valid and verdict.details["apples"] == "3"
    assert judge(SMALL, "+0 00\n-01\n-1\n").valid  # a sign and leading zeros, as Rust parses integers


def test_running_out_of_apples_at_a_given_turn() -> None:
    """A real case: a plan that is fine for 40 turns and then buys what it cannot pay for."""
    text = public_inputs("ahc058")[7]
    inp = parse_input(text)
    actions = ["0 0"] + ["-1"] * 39 + ["3 9"] + ["-1"] * (inp.turns - 41)
    verdict = judge(text, plan(*actions))
    assert not verdict.valid and verdict.reason.startswith("turn 40: strengthening machine 9^3 (level 3, ID 9)")
    assert verdict.reason.endswith(f"costs {inp.c[3][9]} apples, but only 40 are held")


def test_an_apple_count_beyond_64_bits_is_exact() -> None:
    """A hand-made game (cheap machines, T = 1000) where S exceeds 2^64: the count and its score are
    exact."""
    n, levels, turns = 10, 4, 1000
    text = (
        f"{n} {levels} {turns} 1\n"
        + " ".join(["1"] + ["100"] * (n - 1))
        + "\n"
        + "\n".join(" ".join(["1"] * n) for _ in range(levels))
        + "\n"
    )
    inp = parse_input(text)
    # machine 0^0 first (the only apple must start production), then the levels of ID 1 in turn
    actions = [(0, 0)] + [(t % levels, 1) for t in range(1, turns)]
    apples, err = simulate(inp, actions)
    assert err == "" and apples.bit_length() > 64 and apples == reference_apples(inp, actions)
    output = plan(*(f"{i} {j}" for i, j in actions))
    verdict = judge(text, output)
    assert verdict.valid and int(verdict.details["apples"]) == apples
    assert verdict.score == log_score(apples) == math.floor(1e5 * math.log2(apples) + 0.5)


def test_spending_the_only_apple_on_a_higher_level_leaves_none() -> None:
    """Only a hand-made input allows it (generated costs above level 0 are at least 500): S = 0,
    whose log is undefined, scores 0."""
    verdict = judge("1 2 2 1\n5\n1\n1\n", plan("1 0", "-1"))
    assert verdict.valid and verdict.details["apples"] == "0" and verdict.score == 0


def test_log_score_rounds_exactly() -> None:
    assert log_score(1) == 0
    assert [log_score(2**k) for k in (1, 10, 64, 200)] == [100_000, 1_000_000, 6_400_000, 20_000_000]
    assert log_score(2**64 + 1) == 6_400_000
    for s in (3, 10**17 + 3, 2**70 - 1, 3**90, 123456789012345678901234567890):
        exact = 1e5 * math.log2(s)
        assert log_score(s) == math.floor(exact + 0.5)  # float is good enough away from .5
    # the integers on either side of the point where the score steps from n to n + 1, which is
    # 2^((2n + 1) / 200000), computed with 60 digits: 1e5 log2 S is within 2e-12 of n + 0.5 there
    n = 5_651_164
    with decimal.localcontext(decimal.Context(prec=60)):
        step = decimal.Decimal(2) ** (decimal.Decimal(2 * n + 1) / 200_000)
    below = int(step)
    assert log_score(below) == n and log_score(below + 1) == n + 1


def test_bad_inputs_are_refused_with_the_problem_named() -> None:
    with pytest.raises(ValueError, match="not an AHC058 input"):
        judge("5000\n1 2\n3 4\n", "-1\n")


# -- issue 21: as the official tester judges, in bounded time and memory --------------------------------


def test_what_follows_the_t_th_action_is_ignored_as_the_official_tester_ignores_it() -> None:
    """The statement makes fewer than T actions a wrong answer, not more: the official tester
    scores the first T and ignores the rest, whatever it is."""
    honest = judge(SMALL, plan("0 0", "-1", "-1"))
    for trailing in ("-1", "0 0\n0 0\n0 0", "garbage that is not an action", "9" * 5000, "5 5"):
        verdict = judge(SMALL, plan("0 0", "-1", "-1", trailing))
        assert verdict.valid and verdict.score == honest.score == 158496, verdict.reason


def test_a_5000_digit_number_gets_a_verdict() -> None:
    for line in ("7" * 5000, "0 " + "7" * 5000, "-" + "7" * 5000):
        verdict = judge(SMALL, plan(line, "-1", "-1"))
        assert not verdict.valid and "number out of range" in verdict.reason, verdict.reason
    assert judge(SMALL, plan("0" * 5000 + " 0", "-1", "-1")).valid  # leading zeros: the number 0


def test_huge_outputs_are_judged_within_the_first_t_actions() -> None:
    """Megabytes of comments or of one line are read in C, not one Python step per line or token."""
    blank_and_comments = "\n" * 4_000_000 + "# " + "x" * 8_000_000 + "\n"
    verdict = judge(SMALL, blank_and_comments + plan("0 0", "-1", "-1"))
    assert verdict.valid and verdict.score == 158496
    one_long_line = "0 " * 10_000_000
    verdict = judge(SMALL, one_long_line)
    assert not verdict.valid and verdict.reason.startswith("line 1: expected `i j`")
    too_large = judge(SMALL, b"-1\n" * (MAX_OUTPUT_BYTES // 3 + 1))
    assert not too_large.valid and too_large.reason.startswith("output too large")
