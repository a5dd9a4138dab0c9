"""The in-memory archive H of states and its update rules (SPEC §3, paper Appendix A.2).

Everything here is deterministic: states live in an insertion-ordered dict, every sort has an
explicit tie-break (reward, then insertion order or id), and no set is ever iterated for output.
`to_records` / `from_records` round-trip exactly, so a killed-and-resumed run rebuilds the same
archive (insertion order, m, n and T included).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable

import pyarrow as pa


@dataclass
class State:
    """One state s in the archive H; also the row of the archive's Parquet table (storage/tables.py)."""

    id: str = dataclasses.field(metadata={"column": "state_id"})
    parent_id: str | None
    step: int = dataclasses.field(metadata={"arrow": pa.int32()})  # training step that created it; -1 for seeds
    reward: float
    code: str
    construction: Any = dataclasses.field(default=None, metadata={"json": True})  # JSON-able plain data
    observation: str = ""  # tail of the program's output, shown to the model
    lineage: tuple[str, ...] = ()  # ancestor ids, root first, parent last; () for seeds
    is_seed: bool = False
    best_child_reward: float | None = None  # m(s); None until s is expanded
    visits: int = 0  # n(s)
    key: str = ""  # the problem's archive_key: equal for duplicate states; "" when unknown
    parent_reward: float | None = None  # R(parent) when s was inserted, shown as "before -> after"; None for seeds


@dataclass
class Child:
    """One evaluated rollout's result, as `update_archive` receives it."""

    id: str
    parent_id: str
    step: int
    reward: float
    valid: bool
    code: str
    construction: Any = None
    observation: str = ""
    key: str = ""  # the problem's archive_key (SPEC §5a, duplicates); "" matches nothing


@dataclass(frozen=True)
class ArchiveRules:
    """How children enter the archive (SPEC §3 and §5a); docs/defaults.md gives each default's source."""

    children_per_parent: int = 2  # top children of a parent kept (Appendix A.2)
    max_size: int = 1000  # archive cap by reward, seeds always kept (Appendix A.2)
    children_scope: str = "archive"  # "archive": a parent keeps its best children over the whole archive; "step": per step
    invalid_children: str = "ignore"  # "ignore": invalid children leave m(p) alone; "zero": they count as reward 0
    deduplicate: bool = True  # a valid child equal (same key) to a state already in the archive is not inserted


CHILDREN_SCOPES = ("archive", "step")
INVALID_CHILDREN = ("ignore", "zero")


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
    def from_seeds(cls, seeds: list[State]) -> "Archive":
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

    def ancestors(self, id: str) -> list[str]:
        """Ancestor ids of `id` still present in the archive, root first."""
        return [a for a in self.states[id].lineage if a in self.states]

    def descendants(self, id: str) -> set[str]:
        """Ids in the archive whose lineage contains `id` (works across evicted intermediates)."""
        return {s.id for s in self.states.values() if id in s.lineage}

    def record_expansions(self, parent_ids: list[str], children: list[Child], invalid_children: str = "ignore") -> None:
        """Apply the m, n, T updates, one expansion per entry of `parent_ids`, in order.

        Children are grouped by parent_id. With invalid_children "ignore" (the released code, SPEC
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
                continue  # SPEC §5a: invalid children do not change m(p)
            r = float(ch.reward) if ch.valid else 0.0  # SPEC §3 (option "zero"): invalid children count as 0
            prev = best_by_parent.get(ch.parent_id)
            best_by_parent[ch.parent_id] = r if prev is None else max(prev, r)
        for pid in parent_ids:
            parent = self.states[pid]
            if pid in best_by_parent:
                m = best_by_parent[pid]
                # SPEC §3: m(p) = max(m(p), max R(C)), direct parent only
                parent.best_child_reward = m if parent.best_child_reward is None else max(parent.best_child_reward, m)
            for a in [*self.ancestors(pid), pid]:
                self.states[a].visits += 1  # SPEC §3: n(a) += 1 for p and its ancestors in H
            self.total_expansions += 1  # SPEC §3: T += 1

    def insert_children(self, children: list[Child], per_parent: int = 2, deduplicate: bool = False) -> list[str]:
        """Insert the top `per_parent` valid children of each parent; return their ids.

        Order: parents in order of first appearance in `children`, then reward descending, ties by
        child id (SPEC §3). lineage = parent's lineage + (parent_id,). If the parent is no longer
        in the archive (evicted meanwhile), its lineage is unknown and the child gets
        lineage (parent_id,) alone. With `deduplicate`, a child whose key equals the key of a state
        already in the archive (or of a child inserted before it) is skipped before the top
        `per_parent` are taken (SPEC §5a); an empty key matches nothing.
        """
        groups: dict[str, list[Child]] = {}
        for ch in children:
            if ch.valid:
                groups.setdefault(ch.parent_id, []).append(ch)
        seen = {s.key for s in self.states.values() if s.key} if deduplicate else set()
        inserted: list[str] = []
        for pid, group in groups.items():
            group.sort(key=lambda c: (-float(c.reward), c.id))  # SPEC §3: top-2 by reward, ties by id
            if deduplicate:
                distinct = []
                for ch in group:
                    if ch.key and ch.key in seen:
                        continue  # SPEC §5a: a duplicate of a state in the archive is not inserted
                    seen.add(ch.key)
                    distinct.append(ch)
                group = distinct
            parent = self.states.get(pid)
            lineage = (*parent.lineage, pid) if parent is not None else (pid,)
            for ch in group[:per_parent]:
                if ch.id in self.states:
                    raise ValueError(f"duplicate state id {ch.id!r}")
                self.states[ch.id] = State(
                    id=ch.id,
                    parent_id=pid,
                    step=ch.step,
                    reward=float(ch.reward),
                    code=ch.code,
                    construction=ch.construction,
                    observation=ch.observation,
                    lineage=lineage,
                    key=ch.key,
                    parent_reward=parent.reward if parent is not None else None,
                )
                inserted.append(ch.id)
        return inserted

    def trim_children(self, parent_ids: Iterable[str], per_parent: int = 2) -> list[str]:
        """Keep at most `per_parent` children of each given parent in the whole archive; return evicted ids.

        SPEC §5a (released code): a parent keeps its best children across all steps, ranked by
        reward descending, ties by earlier insertion. Grandchildren stay (lineage is by id).
        """
        order = {sid: i for i, sid in enumerate(self.states)}
        evicted: list[str] = []
        for pid in dict.fromkeys(parent_ids):
            kids = [s.id for s in self.states.values() if s.parent_id == pid and not s.is_seed]
            kids.sort(key=lambda sid: (-self.states[sid].reward, order[sid]))  # SPEC §5a: top-2 per parent over H
            evicted.extend(kids[per_parent:])
        evicted.sort(key=order.__getitem__)
        for sid in evicted:
            del self.states[sid]
        return evicted

    def enforce_cap(self, max_size: int = 1000) -> list[str]:
        """Keep every seed plus the best (max_size - #seeds) non-seeds; return evicted ids.

        Non-seeds are ranked by reward descending, ties by earlier insertion (SPEC §3). Seeds are
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
    def from_records(cls, records: list[dict], total_expansions: int) -> "Archive":
        """Inverse of `to_records`."""
        states = []
        for rec in records:
            rec = dict(rec)
            rec["lineage"] = tuple(rec.get("lineage", ()))
            states.append(State(**rec))
        return cls(states, total_expansions)


def update_archive(
    archive: Archive,
    parent_ids: list[str],
    children: list[Child],
    rules: ArchiveRules = ArchiveRules(),
) -> Archive:
    """A new archive after one step: record_expansions, insert_children, trim_children (scope
    "archive"), enforce_cap.

    The input archive is left untouched (the result is a deep copy).
    """
    if rules.children_scope not in CHILDREN_SCOPES:
        raise ValueError(f"children_scope must be one of {CHILDREN_SCOPES}, got {rules.children_scope!r}")
    new = copy.deepcopy(archive)
    new.record_expansions(parent_ids, children, rules.invalid_children)
    new.insert_children(children, per_parent=rules.children_per_parent, deduplicate=rules.deduplicate)
    if rules.children_scope == "archive":
        new.trim_children([ch.parent_id for ch in children if ch.valid], rules.children_per_parent)
    new.enforce_cap(rules.max_size)
    return new
