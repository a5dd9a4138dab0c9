"""Archive update rules (docs/method.md §3, §5a): m/n/T, top-2 insertion, the size cap, records round trip;
invalid children and Q, top-2 per parent over the whole archive, duplicates."""

from __future__ import annotations

import json

import pytest

from discover.archive import Archive, update_archive
from discover.config import ReuseConfig
from discover.records import Evaluation, State


def _state(id, reward, parent=None, lineage=(), seed=False, m=None, n=0, step=0):
    return State(
        id=id,
        parent_id=parent,
        step=-1 if seed else step,
        reward=reward,
        code=f"# {id}",
        lineage=tuple(lineage),
        is_seed=seed,
        best_child_reward=m,
        visits=n,
    )


def _child(id, parent, reward, valid=True, step=1, key=""):
    """A step's evaluation of a child; the test's archive key travels in its code ("key:K")."""
    return Evaluation(
        child_id=id,
        parent_id=parent,
        group=0,
        index=0,
        reward=reward,
        valid=valid,
        code=f"key:{key}" if key else f"# {id}",
        reason="" if valid else "invalid",
    )


def _key(child: Evaluation) -> str:
    return child.code.removeprefix("key:") if child.code.startswith("key:") else ""


def _insert(ar, children, step=1, **kwargs):
    return ar.insert_children(children, step, _key, **kwargs)


def _update(ar, parents, children, rules=None, step=1):
    return update_archive(ar, step, parents, children, _key, rules or ReuseConfig())


def _chain() -> Archive:
    """seed s -> a -> b, plus c a child of s (sibling of a)."""
    return Archive(
        [
            _state("s", 0.1, seed=True),
            _state("a", 0.6, "s", ("s",)),
            _state("b", 0.9, "a", ("s", "a")),
            _state("c", 0.4, "s", ("s",)),
        ]
    )


def test_basic_accessors():
    ar = _chain()
    assert len(ar) == 4 and "b" in ar and "zz" not in ar
    assert ar["a"].reward == 0.6
    assert ar.best().id == "b"
    assert ar.ancestors("b") == ["s", "a"]
    assert ar.ancestors("s") == []
    assert ar.descendants("a") == {"b"}
    assert ar.descendants("s") == {"a", "b", "c"}
    assert ar.descendants("c") == set()


def test_best_ties_go_to_earliest_inserted():
    ar = Archive([_state("x", 0.5), _state("y", 0.7), _state("z", 0.7)])
    assert ar.best().id == "y"
    with pytest.raises(ValueError):
        Archive().best()


def test_duplicate_ids_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        Archive([_state("x", 0.1), _state("x", 0.2)])


def test_from_seeds_marks_seeds():
    ar = Archive.from_seeds([_state("s0", 0.0), _state("s1", 0.2)])
    assert [s.is_seed for s in ar.states.values()] == [True, True]
    assert ar.total_expansions == 0 and list(ar.states) == ["s0", "s1"]


def test_record_expansions_m_n_t_with_ancestors_and_double_selection():
    ar = _chain()
    children = [
        _child("b1", "b", 0.95),
        _child("b2", "b", 2.0, valid=False),  # invalid: ignored, must not set m(b) = 2.0
        _child("b3", "b", 0.7),
        _child("c1", "c", 0.3),
        _child("c2", "c", 5.0, valid=False),
    ]
    ar.record_expansions(["b", "b", "c"], children)
    # m: direct parent only. m(b) = max(0.95, 0.7) = 0.95; m(c) = 0.3
    assert ar["b"].best_child_reward == 0.95
    assert ar["c"].best_child_reward == 0.3
    assert ar["a"].best_child_reward is None and ar["s"].best_child_reward is None
    # n: b expanded twice -> n(b)=2, its ancestors a, s +2; c once -> n(c)=1, s +1 => n(s)=3
    assert {k: s.visits for k, s in ar.states.items()} == {"s": 3, "a": 2, "b": 2, "c": 1}
    # T: three entries in parent_ids -> three expansions
    assert ar.total_expansions == 3


def test_all_invalid_expansion_keeps_q_at_the_parents_reward():
    # docs/method.md §5a (released code): c (R = 0.4) expanded with two invalid children keeps m(c) unset,
    # so Q(c) = R(c) = 0.4; it still counts as a visit (n(c) = 1, n(s) = 1, T = 1).
    ar = _chain()
    ar.record_expansions(["c"], [_child("c1", "c", 9.0, valid=False), _child("c2", "c", 0.0, valid=False)])
    assert ar["c"].best_child_reward is None
    assert ar["c"].visits == 1 and ar["s"].visits == 1 and ar.total_expansions == 1
    from discover.reuse import puct_scores

    # |H| = 4, ranks b, a, c, s -> P(c) = (4 - 2) / 10; scale = 0.9 - 0.4 (non-seeds); T = 1
    expected = 0.4 + 1.0 * 0.5 * 0.2 * 2**0.5 / (1 + 1)
    assert puct_scores(ar)["c"] == pytest.approx(expected)
    # the "zero" option: invalid children count as reward 0, so Q(c) drops to 0
    zero = _chain()
    zero.record_expansions(["c"], [_child("c1", "c", 9.0, valid=False)], invalid_children="zero")
    assert zero["c"].best_child_reward == 0.0
    assert puct_scores(zero)["c"] == pytest.approx(0.0 + 1.0 * 0.5 * 0.2 * 2**0.5 / 2)


def test_record_expansions_m_is_running_max_and_invalid_counts_as_zero():
    ar = _chain()
    ar.record_expansions(["c"], [_child("c1", "c", 9.0, valid=False)], invalid_children="zero")
    assert ar["c"].best_child_reward == 0.0  # only invalid children: max(None, 0) = 0
    ar.record_expansions(["c"], [_child("c2", "c", 0.8)])
    assert ar["c"].best_child_reward == 0.8  # max(0, 0.8)
    ar.record_expansions(["c"], [_child("c3", "c", 0.5)])
    assert ar["c"].best_child_reward == 0.8  # max(0.8, 0.5)
    assert ar["c"].visits == 3 and ar["s"].visits == 3 and ar.total_expansions == 3


def test_record_expansions_unknown_parent_raises():
    with pytest.raises(KeyError):
        _chain().record_expansions(["nope"], [])


def test_insert_top_two_valid_children_per_parent():
    ar = _chain()
    children = [
        _child("b1", "b", 0.95),
        _child("b2", "b", 2.0, valid=False),  # invalid: never inserted even though highest
        _child("b3", "b", 0.7),
        _child("b0", "b", 0.7),  # ties b3 at 0.7; "b0" < "b3" so b0 wins the 2nd slot
        _child("c1", "c", 0.3),
        _child("c2", "c", 5.0, valid=False),
    ]
    inserted = _insert(ar, children)
    assert inserted == ["b1", "b0", "c1"]
    assert list(ar.states) == ["s", "a", "b", "c", "b1", "b0", "c1"]
    assert ar["b1"].lineage == ("s", "a", "b") and ar["b1"].parent_id == "b"
    assert ar["c1"].lineage == ("s", "c")
    assert ar["b1"].best_child_reward is None and ar["b1"].visits == 0 and not ar["b1"].is_seed
    assert ar.descendants("a") == {"b", "b1", "b0"}


def test_insert_child_of_evicted_parent_uses_parent_id_as_lineage():
    ar = _chain()
    assert _insert(ar, [_child("g", "gone", 0.5)]) == ["g"]
    assert ar["g"].lineage == ("gone",)


def test_cap_keeps_lowest_reward_seed_with_exact_survivors():
    ar = Archive(
        [
            _state("s", -1.0, seed=True),  # lowest reward, but a seed: always kept
            _state("x1", 0.5, "s", ("s",)),
            _state("x2", 0.9, "s", ("s",)),
            _state("x3", 0.5, "s", ("s",)),  # ties x1 but inserted later -> evicted first
            _state("x4", 0.2, "s", ("s",)),
        ]
    )
    # max_size 3 = 1 seed + best 2 non-seeds: x2 (0.9), x1 (0.5, earlier than x3)
    assert ar.enforce_cap(3) == ["x3", "x4"]
    assert list(ar.states) == ["s", "x1", "x2"]


def test_cap_never_evicts_seeds_even_above_max_size():
    ar = Archive([_state("s0", 0.0, seed=True), _state("s1", 0.0, seed=True), _state("x", 1.0)])
    assert ar.enforce_cap(1) == ["x"]
    assert list(ar.states) == ["s0", "s1"]
    assert ar.enforce_cap(1) == []


def test_update_archive_returns_new_archive_and_leaves_input_untouched():
    ar = _chain()
    before = ar.to_records()
    children = [
        _child("b1", "b", 0.95),
        _child("b3", "b", 0.7),
        _child("b4", "b", 0.2),  # 3rd best of b: not inserted
        _child("c1", "c", 0.05),
    ]
    new = _update(ar, ["b", "c"], children, ReuseConfig(archive_size=5))
    assert ar.to_records() == before and ar.total_expansions == 0
    # after insertion: s, a(0.6), b(0.9), c(0.4), b1(0.95), b3(0.7), c1(0.05) -> 6 non-seeds;
    # cap 5 keeps s + best 4 non-seeds: b1 0.95, b 0.9, b3 0.7, a 0.6 -> c and c1 evicted
    assert list(new.states) == ["s", "a", "b", "b1", "b3"]
    assert new["b"].best_child_reward == 0.95
    assert new["b"].visits == 1 and new["a"].visits == 1 and new["s"].visits == 2
    assert new.total_expansions == 2


def test_records_round_trip_exactly():
    ar = _chain()
    ar = _update(ar, ["b", "b", "a"], [_child("b1", "b", 0.95), _child("a1", "a", 0.1)])
    ar["b1"].construction = {"points": [[0.0, 1.5], [2.0, 3.0]], "name": "x"}
    ar["b1"].observation = "score=0.95"
    records = ar.to_records()
    assert all(isinstance(r["lineage"], list) for r in records)
    # survives JSON (plain data only)
    back = Archive.from_records(json.loads(json.dumps(records)), ar.total_expansions)
    assert list(back.states) == list(ar.states)
    assert back.total_expansions == ar.total_expansions == 3
    assert back.to_records() == records
    assert back.states == ar.states  # dataclass equality: m, n, lineage tuples, seeds
    assert back["b1"].lineage == ("s", "a", "b")


def test_top_two_children_per_parent_hold_across_the_whole_archive():
    # b already has two children (b1 0.95, b2 0.5). Step 2 expands b again: b3 0.7 and b4 0.6.
    # Scope "archive" (released code): b keeps its best two over H, b1 0.95 and b3 0.7; b2 and b4
    # go. Scope "step": each step inserts its own top two, so b ends with four children.
    ar = _chain()
    ar = _update(ar, ["b"], [_child("b1", "b", 0.95), _child("b2", "b", 0.5)])
    step2 = [_child("b3", "b", 0.7, step=2), _child("b4", "b", 0.6, step=2)]
    kept = _update(ar, ["b"], step2)
    assert [s.id for s in kept.states.values() if s.parent_id == "b"] == ["b1", "b3"]
    per_step = _update(ar, ["b"], step2, ReuseConfig(children_scope="step"))
    assert [s.id for s in per_step.states.values() if s.parent_id == "b"] == ["b1", "b2", "b3", "b4"]


def test_trim_children_keeps_grandchildren_of_an_evicted_child():
    ar = _chain()
    _insert(ar, [_child("c1", "c", 0.2), _child("c2", "c", 0.1)])
    _insert(ar, [_child("x", "c2", 0.9)])  # c2's child
    _insert(ar, [_child("c3", "c", 0.3)])  # c now has three children: c3 0.3, c1 0.2, c2 0.1
    assert ar.trim_children(["c"]) == ["c2"]
    assert "x" in ar and ar["x"].lineage == ("s", "c", "c2")
    assert ar.descendants("c") == {"c1", "c3", "x"}


def test_duplicates_of_archive_states_are_not_inserted():
    # a's key is "A". Children of b: b1 equal to a (key "A"), b2 and b3 equal to each other
    # (key "B"), b4 new (key "C"). Dedup keeps b2 (the better of the two "B"s) and b4; the top
    # two of b are then b2 and b4 although b1 had the highest reward.
    ar = _chain()
    ar.states["a"].key = "A"
    children = [
        _child("b1", "b", 0.99, key="A"),
        _child("b2", "b", 0.8, key="B"),
        _child("b3", "b", 0.7, key="B"),
        _child("b4", "b", 0.6, key="C"),
    ]
    new = _update(ar, ["b"], children)
    assert [s.id for s in new.states.values() if s.parent_id == "b"] == ["b2", "b4"]
    assert new["b2"].key == "B"
    assert new["b"].best_child_reward == 0.99  # m counts every valid child, duplicates included
    off = _update(ar, ["b"], children, ReuseConfig(deduplicate=False))
    assert [s.id for s in off.states.values() if s.parent_id == "b"] == ["b1", "b2"]
    # an empty key (unknown) never matches
    blank = _update(ar, ["b"], [_child("e1", "b", 0.5), _child("e2", "b", 0.4)])
    assert [s.id for s in blank.states.values() if s.parent_id == "b"] == ["e1", "e2"]
