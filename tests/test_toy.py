"""The toy problem: a continuous reward that grows with depth (reuse) and accuracy (training)."""

from __future__ import annotations

import numpy as np

from evaluators.base import ParentView
from evaluators.toy.digits import DigitsProblem


def test_reward_is_the_graded_match_with_the_hidden_target() -> None:
    p = DigitsProblem(length=4, chunk=2, target_seed=0)
    target = "".join(map(str, p._target))
    assert p.verify(target).reward == 1.0
    off_by_one = str((int(target[0]) + 1) % 10) if target[0] != "9" else "8"
    # one position off by one: 0.5 of one of four positions
    assert p.verify(off_by_one).reward == 0.5 / 4
    assert p.verify(target[:2]).reward == 0.5  # missing positions score 0


def test_an_action_appends_at_most_chunk_digits_to_its_parent() -> None:
    p = DigitsProblem(length=6, chunk=2, target_seed=0)
    assert p.parse("x1y2z3") == "12"
    assert p.parse("no digits") is None
    child = p.evaluate("12", ParentView(code="", construction="0000"), None)
    assert child.valid and child.construction == "000012"
    # digits past the length are dropped; a complete string has no valid children
    assert p.evaluate("12", ParentView(code="", construction="00000"), None).construction == "000001"
    assert not p.evaluate("12", ParentView(code="", construction="000000"), None).valid


def test_the_lenient_toy_takes_any_answer_as_digits() -> None:
    p = DigitsProblem(length=6, chunk=3, lenient=True)
    # "a" is code point 97 -> 7, "b" 98 -> 8; blanks are skipped; digits stay themselves
    assert p.parse(" a 1\nb2") == "718"
    assert p.parse("x") == "0"  # 120 -> 0
    assert p.parse(" \n\t") is None  # nothing but blanks: no candidate
    assert DigitsProblem(length=6, chunk=3).parse("ab") is None  # the strict default


def test_invalid_states_are_rejected_with_a_reason() -> None:
    p = DigitsProblem(length=4, chunk=2)
    for bad in ["", "12a", "12345", 12, None, ["1"]]:
        r = p.verify(bad)
        assert not r.valid and r.reward == 0.0 and r.reason


def test_reuse_matters_a_single_action_from_the_seed_is_capped() -> None:
    p = DigitsProblem(length=32, chunk=8)
    rng = np.random.default_rng(0)
    best = max(p.evaluate("".join(map(str, rng.integers(0, 10, 8))), ParentView("", ""), None).reward for _ in range(2000))
    assert best <= 8 / 32
