"""Parent selection (docs/method.md §3): PUCT scores, lineage blocking, fill rule and the baselines."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from discover.archive import Archive, State
from discover.reuse import (
    REUSE_RULES,
    puct_scores,
    select_chains,
    select_epsilon_greedy,
    select_none,
    select_parents,
    select_puct,
)


def _state(id, reward, parent=None, lineage=(), seed=False, m=None, n=0):
    return State(
        id=id,
        parent_id=parent,
        step=-1 if seed else 0,
        reward=reward,
        code="",
        lineage=tuple(lineage),
        is_seed=seed,
        best_child_reward=m,
        visits=n,
    )


def _chain(m_a=0.9) -> Archive:
    """seed s -> a -> b, plus c a child of s (sibling of a); T = 3."""
    return Archive(
        [
            _state("s", 0.1, seed=True, m=0.6, n=3),
            _state("a", 0.6, "s", ("s",), m=m_a, n=2),
            _state("b", 0.9, "a", ("s", "a")),
            _state("c", 0.4, "s", ("s",)),
        ],
        total_expansions=3,
    )


def test_puct_scores_hand_worked():
    # ranks by reward: b 0, a 1, c 2, s 3 -> P = 4/10, 3/10, 2/10, 1/10
    # scale over non-seeds only: 0.9 - 0.4 = 0.5 (including the seed would give 0.8)
    # sqrt(1 + T) = sqrt(4) = 2
    # s: Q = m = 0.6; 0.6 + 0.5 * 0.1 * 2 / (1 + 3) = 0.6 + 0.025 = 0.625
    # a: Q = m = 0.9; 0.9 + 0.5 * 0.3 * 2 / (1 + 2) = 0.9 + 0.1   = 1.0
    # b: Q = R = 0.9; 0.9 + 0.5 * 0.4 * 2 / 1       = 0.9 + 0.4   = 1.3
    # c: Q = R = 0.4; 0.4 + 0.5 * 0.2 * 2 / 1       = 0.4 + 0.2   = 0.6
    scores = puct_scores(_chain())
    assert list(scores) == ["s", "a", "b", "c"]
    assert scores == pytest.approx({"s": 0.625, "a": 1.0, "b": 1.3, "c": 0.6}, abs=1e-12)
    # c = 2 doubles each bonus: s 0.65, a 1.1, b 1.7, c 0.8
    assert puct_scores(_chain(), c=2.0) == pytest.approx({"s": 0.65, "a": 1.1, "b": 1.7, "c": 0.8}, abs=1e-12)
    # c = 0: pure Q
    assert puct_scores(_chain(), c=0.0) == pytest.approx({"s": 0.6, "a": 0.9, "b": 0.9, "c": 0.4}, abs=1e-12)


def test_puct_scale_floor_when_non_seeds_tie():
    ar = Archive([_state("s", 0.0, seed=True), _state("x", 0.5, "s", ("s",)), _state("y", 0.5, "s", ("s",))])
    # non-seed scale = 0.5 - 0.5 = 0 -> floored to 1e-6 (all-states scale would be 0.5)
    # ranks: x 0 (earlier than y), y 1, s 2 -> P = 3/6, 2/6, 1/6; T = 0, n = 0 -> factor 1
    # x: 0.5 + 1e-6 * 1/2 = 0.5000005; y: 0.5 + 1e-6 / 3; s: 0 + 1e-6 / 6
    scores = puct_scores(ar)
    assert scores["x"] == pytest.approx(0.5 + 0.5e-6, abs=1e-15)
    assert scores["y"] == pytest.approx(0.5 + 1e-6 / 3, abs=1e-15)
    assert scores["s"] == pytest.approx(1e-6 / 6, abs=1e-15)


def test_puct_scale_over_all_states_when_only_seeds():
    ar = Archive([_state("s0", 0.2, seed=True), _state("s1", 0.6, seed=True)])
    # no non-seeds -> scale = 0.6 - 0.2 = 0.4; P(s1) = 2/3, P(s0) = 1/3; T = 0
    # s1: 0.6 + 0.4 * 2/3 = 0.8666...; s0: 0.2 + 0.4 / 3 = 0.3333...
    assert puct_scores(ar) == pytest.approx({"s0": 0.2 + 0.4 / 3, "s1": 0.6 + 0.8 / 3}, abs=1e-12)


def test_select_puct_blocks_lineage_and_cycles():
    # scores (above): b 1.3, a 1.0, s 0.625, c 0.6
    # take b -> blocks a and s (ancestors); c is unrelated to b -> taken; 2 taken, then cycle
    assert select_puct(_chain(), 1) == ["b"]
    assert select_puct(_chain(), 2) == ["b", "c"]
    assert select_puct(_chain(), 5) == ["b", "c", "b", "c", "b"]


def test_select_puct_taking_a_blocks_seed_and_b_but_not_sibling():
    # m(a) = 1.0, c = 0 -> scores = Q: a 1.0, b 0.9, s 0.6, c 0.4
    # take a -> blocks s (ancestor) and b (descendant); c (sibling of a) stays available
    ar = _chain(m_a=1.0)
    assert select_puct(ar, 3, c=0.0) == ["a", "c", "a"]


def test_select_puct_score_ties_by_reward_then_insertion():
    # c = 0, m(a) = 0.9: a and b both score 0.9; b has the higher reward -> b first, blocks a, s
    assert select_puct(_chain(), 2, c=0.0) == ["b", "c"]
    # fully tied unrelated seeds: insertion order
    ar = Archive([_state("s0", 0.3, seed=True), _state("s1", 0.3, seed=True)])
    assert select_puct(ar, 3, c=0.0) == ["s0", "s1", "s0"]


def test_select_puct_single_seed_fills_every_slot():
    ar = Archive([_state("s", 0.0, seed=True)])
    assert select_puct(ar, 8) == ["s"] * 8


def test_epsilon_zero_always_best():
    rng = np.random.default_rng(0)
    assert select_epsilon_greedy(_chain(), 50, rng, epsilon=0.0) == ["b"] * 50


def test_epsilon_one_roughly_uniform_and_deterministic():
    counts = Counter(select_epsilon_greedy(_chain(), 4000, np.random.default_rng(123), epsilon=1.0))
    assert set(counts) == {"s", "a", "b", "c"}
    assert all(850 <= v <= 1150 for v in counts.values()), counts  # expected 1000 each
    a = select_epsilon_greedy(_chain(), 20, np.random.default_rng(7), epsilon=0.3)
    b = select_epsilon_greedy(_chain(), 20, np.random.default_rng(7), epsilon=0.3)
    assert a == b


def test_none_always_returns_seeds_cycling():
    ar = Archive([_state("s0", 0.0, seed=True), _state("x", 5.0, "s0", ("s0",)), _state("s1", 0.1, seed=True)])
    assert select_none(ar, 5) == ["s0", "s1", "s0", "s1", "s0"]
    assert select_none(_chain(), 3) == ["s", "s", "s"]


def test_chains_follow_the_best_state_of_each_seeds_tree():
    # Two chains: seed s0 -> x (0.5) -> y (0.3); seed s1 -> z (0.2), w (0.2, a tie: z is earlier).
    # Chain 0 refines x (its best, not the newest y), chain 1 refines z; a third slot cycles.
    ar = Archive(
        [
            _state("s0", 0.1, seed=True),
            _state("s1", 0.15, seed=True),
            _state("x", 0.5, "s0", ("s0",)),
            _state("z", 0.2, "s1", ("s1",)),
            _state("y", 0.3, "x", ("s0", "x")),
            _state("w", 0.2, "s1", ("s1",)),
        ]
    )
    assert select_chains(ar, 3) == ["x", "z", "x"]
    # a chain whose children all scored below its seed stays at the seed
    flat = Archive([_state("s0", 0.4, seed=True), _state("x", 0.1, "s0", ("s0",))])
    assert select_chains(flat, 1) == ["s0"]


def test_select_parents_dispatch_and_errors():
    rng = np.random.default_rng(0)
    assert REUSE_RULES == ("puct", "epsilon-greedy", "none", "chains")
    assert select_parents(_chain(), "chains", 2, rng) == ["b", "b"]
    assert select_parents(_chain(), "puct", 2, rng) == ["b", "c"]
    assert select_parents(_chain(), "epsilon-greedy", 3, rng, epsilon=0.0) == ["b", "b", "b"]
    assert select_parents(_chain(), "none", 2, rng) == ["s", "s"]
    with pytest.raises(ValueError) as err:
        select_parents(_chain(), "greedy", 2, rng)
    for rule in REUSE_RULES:
        assert rule in str(err.value)
    with pytest.raises(ValueError):
        select_parents(Archive(), "puct", 2, rng)
    with pytest.raises(ValueError):
        select_parents(_chain(), "puct", 0, rng)
