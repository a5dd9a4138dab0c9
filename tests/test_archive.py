"""Archive update rules (SPEC §3): m/n/T, top-2 insertion, the size cap, records round trip."""

from __future__ import annotations

import json

import pytest

from discover.archive import Archive, Child, State, update_archive


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


def _child(id, parent, reward, valid=True, step=1):
    return Child(id=id, parent_id=parent, step=step, reward=reward, valid=valid, code=f"# {id}")


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
        _child("b2", "b", 2.0, valid=False),  # invalid: counts as 0, must not set m(b) = 2.0
        _child("b3", "b", 0.7),
        _child("c1", "c", 0.3),
        _child("c2", "c", 5.0, valid=False),
    ]
    ar.record_expansions(["b", "b", "c"], children)
    # m: direct parent only. m(b) = max(0.95, 0, 0.7) = 0.95; m(c) = max(0.3, 0) = 0.3
    assert ar["b"].best_child_reward == 0.95
    assert ar["c"].best_child_reward == 0.3
    assert ar["a"].best_child_reward is None and ar["s"].best_child_reward is None
    # n: b expanded twice -> n(b)=2, its ancestors a, s +2; c once -> n(c)=1, s +1 => n(s)=3
    assert {k: s.visits for k, s in ar.states.items()} == {"s": 3, "a": 2, "b": 2, "c": 1}
    # T: three entries in parent_ids -> three expansions
    assert ar.total_expansions == 3


def test_record_expansions_m_is_running_max_and_invalid_counts_as_zero():
    ar = _chain()
    ar.record_expansions(["c"], [_child("c1", "c", 9.0, valid=False)])
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
    inserted = ar.insert_children(children)
    assert inserted == ["b1", "b0", "c1"]
    assert list(ar.states) == ["s", "a", "b", "c", "b1", "b0", "c1"]
    assert ar["b1"].lineage == ("s", "a", "b") and ar["b1"].parent_id == "b"
    assert ar["c1"].lineage == ("s", "c")
    assert ar["b1"].best_child_reward is None and ar["b1"].visits == 0 and not ar["b1"].is_seed
    assert ar.descendants("a") == {"b", "b1", "b0"}


def test_insert_child_of_evicted_parent_uses_parent_id_as_lineage():
    ar = _chain()
    assert ar.insert_children([_child("g", "gone", 0.5)]) == ["g"]
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
    new = update_archive(ar, ["b", "c"], children, max_size=5)
    assert ar.to_records() == before and ar.total_expansions == 0
    # after insertion: s, a(0.6), b(0.9), c(0.4), b1(0.95), b3(0.7), c1(0.05) -> 6 non-seeds;
    # cap 5 keeps s + best 4 non-seeds: b1 0.95, b 0.9, b3 0.7, a 0.6 -> c and c1 evicted
    assert list(new.states) == ["s", "a", "b", "b1", "b3"]
    assert new["b"].best_child_reward == 0.95
    assert new["b"].visits == 1 and new["a"].visits == 1 and new["s"].visits == 2
    assert new.total_expansions == 2


def test_records_round_trip_exactly():
    ar = _chain()
    ar = update_archive(ar, ["b", "b", "a"], [_child("b1", "b", 0.95), _child("a1", "a", 0.1)])
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
