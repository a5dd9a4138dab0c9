"""The in-memory archive H of states and its update rules (docs/method.md §3, paper Appendix A.2).

Everything here is deterministic: states live in an insertion-ordered dict, every sort has an
explicit tie-break (reward, then insertion order or id), and no set is ever iterated for output.
`to_records` / `from_records` round-trip exactly, so a killed-and-resumed run rebuilds the same
archive (insertion order, m, n and T included).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable
from typing import Protocol

from discover.records import Evaluation, State


class ArchiveRules(Protocol):
    """How children enter the archive (docs/method.md §3 and §5a): the `reuse` section of the run's
    configuration (discover/config.py `ReuseConfig`, which documents each default) is passed as it is."""

    @property
    def children_per_parent(self) -> int: ...  # top children of a parent kept (Appendix A.2)
    @property
    def archive_size(self) -> int: ...  # archive cap by reward, seeds always kept (Appendix A.2)
    @property
    def children_scope(self) -> str: ...  # one of CHILDREN_SCOPES
    @property
    def invalid_children(self) -> str: ...  # one of INVALID_CHILDREN
    @property
    def deduplicate(self) -> bool: ...  # a valid child equal (same key) to a state already in the archive is not inserted


# "archive": a parent keeps its best children over the whole archive (released code); "step": per step
CHILDREN_SCOPES = ("archive", "step")
# "ignore": invalid children leave m(p) alone (released code); "zero": they count as reward 0
INVALID_CHILDREN = ("ignore", "zero")
KeyOf = Callable[[Evaluation], str]  # the problem's archive_key of a child


class Archive:
    """Insertion-ordered states plus the total expansion count T."""

    def __init__(self, states: Iterable[State] = (), total_expansions: int = 0):
        self.states: dict[str, State] = {}
        for s in states:
            if s.id in self.states:
                raise ValueError(f"duplicate state id {s.id!r}")
            self.states[s.id] = s
        self.total_expansions: int = int(total_expansions)  # T

    @classmethod
    def from_seeds(cls, seeds: list[State]) -> Archive:
        """An archive of the seed states only (marked is_seed, lineage ()), T = 0."""
        return cls([dataclasses.replace(s, is_seed=True, lineage=()) for s in seeds])

    def __len__(self) -> int:
        return len(self.states)

    def __contains__(self, id: object) -> bool:
        return id in self.states

    def __getitem__(self, id: str) -> State:
        return self.states[id]

    def __repr__(self) -> str:
        return f"Archive({len(self)} states, T={self.total_expansions})"

    def best(self) -> State:
        """Highest reward; ties go to the earliest inserted state."""
        if not self.states:
            raise ValueError("the archive is empty")
        best: State | None = None
        for s in self.states.values():  # strict '>' keeps the earliest on ties
            if best is None or s.reward > best.reward:
                best = s
        assert best is not None
        return best

    def best_non_seeds(self, count: int) -> list[State]:
        """The `count` best states that are not seeds: reward descending, ties by insertion order."""
        order = {sid: i for i, sid in enumerate(self.states)}
        ranked = sorted((s for s in self.states.values() if not s.is_seed), key=lambda s: (-s.reward, order[s.id]))
        return ranked[: max(count, 0)]

    def ancestors(self, id: str) -> list[str]:
        """Ancestor ids of `id` still present in the archive, root first."""
        return [a for a in self.states[id].lineage if a in self.states]

    def descendants(self, id: str) -> set[str]:
        """Ids in the archive whose lineage contains `id` (works across evicted intermediates)."""
        return {s.id for s in self.states.values() if id in s.lineage}

    def record_expansions(self, parent_ids: list[str], children: list[Evaluation], invalid_children: str = "ignore") -> None:
        """Apply the m, n, T updates, one expansion per entry of `parent_ids`, in order.

        Children are grouped by parent_id. With invalid_children "ignore" (the released code, docs/method.md
        §5a) an invalid child leaves m(p) alone, so a parent whose children were all invalid keeps
        Q = R(p); with "zero" it counts as reward 0. A parent listed twice is expanded twice (n and
        T grow twice; m is a max, so it is the same either way). Every parent must be in the
        archive (KeyError otherwise).
        """
        if invalid_children not in INVALID_CHILDREN:
            raise ValueError(f"invalid_children must be one of {INVALID_CHILDREN}, got {invalid_children!r}")
        best_by_parent: dict[str, float] = {}
        for ch in children:
            if not ch.valid and invalid_children == "ignore":
                continue  # docs/method.md §5a: invalid children do not change m(p)
            r = ch.reward  # docs/method.md §3 (option "zero"): invalid children count as 0, their reward
            prev = best_by_parent.get(ch.parent_id)
            best_by_parent[ch.parent_id] = r if prev is None else max(prev, r)
        for pid in parent_ids:
            parent = self.states[pid]
            if pid in best_by_parent:
                m = best_by_parent[pid]
                # docs/method.md §3: m(p) = max(m(p), max R(C)), direct parent only
                parent.best_child_reward = m if parent.best_child_reward is None else max(parent.best_child_reward, m)
            for a in [*self.ancestors(pid), pid]:
                self.states[a].visits += 1  # docs/method.md §3: n(a) += 1 for p and its ancestors in H
            self.total_expansions += 1  # docs/method.md §3: T += 1

    def insert_children(
        self, children: list[Evaluation], step: int, key_of: KeyOf, per_parent: int = 2, deduplicate: bool = False
    ) -> list[str]:
        """Insert the top `per_parent` valid children of each parent; return their ids.

        Order: parents in order of first appearance in `children`, then reward descending, ties by
        child id (docs/method.md §3). lineage = parent's lineage + (parent_id,). If the parent is no longer
        in the archive (evicted meanwhile), its lineage is unknown and the child gets
        lineage (parent_id,) alone. `key_of` gives each valid child's key (the problem's
        archive_key); with `deduplicate`, a child whose key equals the key of a state already in the
        archive (or of a child inserted before it) is skipped before the top `per_parent` are taken
        (docs/method.md §5a); an empty key matches nothing.
        """
        groups: dict[str, list[Evaluation]] = {}
        keys: dict[str, str] = {}
        for ch in children:
            if ch.valid:
                groups.setdefault(ch.parent_id, []).append(ch)
                keys[ch.child_id] = key_of(ch)
        seen = {s.key for s in self.states.values() if s.key} if deduplicate else set()
        inserted: list[str] = []
        for pid, group in groups.items():
            group.sort(key=lambda c: (-c.reward, c.child_id))  # docs/method.md §3: top-2 by reward, ties by id
            if deduplicate:
                distinct = []
                for ch in group:
                    if keys[ch.child_id] and keys[ch.child_id] in seen:
                        continue  # docs/method.md §5a: a duplicate of a state in the archive is not inserted
                    seen.add(keys[ch.child_id])
                    distinct.append(ch)
                group = distinct
            parent = self.states.get(pid)
            lineage = (*parent.lineage, pid) if parent is not None else (pid,)
            for ch in group[:per_parent]:
                if ch.child_id in self.states:
                    raise ValueError(f"duplicate state id {ch.child_id!r}")
                parent_reward = parent.reward if parent is not None else None
                self.states[ch.child_id] = State.child(ch, step, lineage, keys[ch.child_id], parent_reward)
                inserted.append(ch.child_id)
        return inserted

    def trim_children(self, parent_ids: Iterable[str], per_parent: int = 2) -> list[str]:
        """Keep at most `per_parent` children of each given parent in the whole archive; return evicted ids.

        docs/method.md §5a (released code): a parent keeps its best children across all steps, ranked by
        reward descending, ties by earlier insertion. Grandchildren stay (lineage is by id).
        """
        order = {sid: i for i, sid in enumerate(self.states)}
        evicted: list[str] = []
        for pid in dict.fromkeys(parent_ids):
            kids = [s.id for s in self.states.values() if s.parent_id == pid and not s.is_seed]
            kids.sort(key=lambda sid: (-self.states[sid].reward, order[sid]))  # docs/method.md §5a: top-2 per parent over H
            evicted.extend(kids[per_parent:])
        evicted.sort(key=order.__getitem__)
        for sid in evicted:
            del self.states[sid]
        return evicted

    def enforce_cap(self, max_size: int = 1000) -> list[str]:
        """Keep every seed plus the best (max_size - #seeds) non-seeds; return evicted ids.

        Non-seeds are ranked by reward descending, ties by earlier insertion (docs/method.md §3). Seeds are
        never evicted, even when they alone exceed max_size. Survivors keep insertion order;
        evicted ids are returned in insertion order.
        """
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        order = list(self.states)
        non_seeds = [i for i, sid in enumerate(order) if not self.states[sid].is_seed]
        n_seeds = len(order) - len(non_seeds)
        room = max(0, max_size - n_seeds)
        ranked = sorted(non_seeds, key=lambda i: (-self.states[order[i]].reward, i))
        dropped = set(ranked[room:])
        evicted = [order[i] for i in sorted(dropped)]
        for sid in evicted:
            del self.states[sid]
        return evicted

    def to_records(self) -> list[dict]:
        """One plain dict per state, in insertion order (lineage as a list)."""
        out = []
        for s in self.states.values():
            rec = dataclasses.asdict(s)
            rec["lineage"] = list(s.lineage)
            out.append(rec)
        return out

    @classmethod
    def from_records(cls, records: list[dict], total_expansions: int) -> Archive:
        """Inverse of `to_records`."""
        states = []
        for rec in records:
            rec = dict(rec)
            rec["lineage"] = tuple(rec.get("lineage", ()))
            states.append(State(**rec))
        return cls(states, total_expansions)


def update_archive(
    archive: Archive,
    step: int,
    parent_ids: list[str],
    children: list[Evaluation],
    key_of: KeyOf,
    rules: ArchiveRules,
) -> Archive:
    """A new archive after `step`: record_expansions, insert_children, trim_children (scope
    "archive"), enforce_cap.

    The input archive is left untouched (the result is a deep copy).
    """
    if rules.children_scope not in CHILDREN_SCOPES:
        raise ValueError(f"children_scope must be one of {CHILDREN_SCOPES}, got {rules.children_scope!r}")
    new = copy.deepcopy(archive)
    new.record_expansions(parent_ids, children, rules.invalid_children)
    new.insert_children(children, step, key_of, per_parent=rules.children_per_parent, deduplicate=rules.deduplicate)
    if rules.children_scope == "archive":
        new.trim_children([ch.parent_id for ch in children if ch.valid], rules.children_per_parent)
    new.enforce_cap(rules.archive_size)
    return new
