"""Parent selection ("reuse") from the archive: PUCT and two baselines (docs/method.md §3, Appendix A.2).

All rules return exactly `count` state ids and are deterministic given the archive (and, for
epsilon-greedy, the rng state).
"""

from __future__ import annotations

import math

import numpy as np

from discover.archive import Archive

REUSE_RULES = ("puct", "epsilon-greedy", "none", "chains")

_SCALE_FLOOR = 1e-6


def _check(archive: Archive, count: int) -> None:
    if len(archive) == 0:
        raise ValueError("cannot select parents from an empty archive")
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")


def _fill(taken: list[str], count: int) -> list[str]:
    """Pad `taken` to `count` entries by cycling through it in the order taken."""
    return [taken[i % len(taken)] for i in range(count)]


def puct_scores(archive: Archive, c: float = 1.0) -> dict[str, float]:
    """score(s) = Q(s) + c * scale * P(s) * sqrt(1 + T) / (1 + n(s)), in insertion order."""
    states = list(archive.states.values())
    if not states:
        return {}
    size = len(states)
    # docs/method.md §3: rank 0 = best reward, ties by insertion order
    by_rank = sorted(range(size), key=lambda i: (-states[i].reward, i))
    rank = {states[i].id: r for r, i in enumerate(by_rank)}
    norm = size * (size + 1) / 2  # sum over ranks of (|H| - rank)
    pool = [s.reward for s in states if not s.is_seed] or [s.reward for s in states]
    # docs/method.md §3: scale = R_max - R_min over non-seeds (all states if none), at least 1e-6
    scale = max(max(pool) - min(pool), _SCALE_FLOOR)
    root_t = math.sqrt(1 + archive.total_expansions)
    scores: dict[str, float] = {}
    for s in states:
        q = s.best_child_reward if s.best_child_reward is not None else s.reward  # docs/method.md §3: Q = m if expanded else R
        p = (size - rank[s.id]) / norm  # docs/method.md §3: linear rank prior P ∝ |H| - rank
        scores[s.id] = q + c * scale * p * root_t / (1 + s.visits)  # docs/method.md §3: PUCT score
    return scores


def select_puct(archive: Archive, count: int, c: float = 1.0) -> list[str]:
    """Pick `count` parents by PUCT score with lineage blocking (docs/method.md §3).

    States are visited by score descending (ties: reward descending, then insertion order). Taking
    a state blocks its whole lineage (ancestors and descendants in the archive) for this batch.
    Fill rule (the paper is silent): if fewer than `count` states could be taken, the remaining slots
    cycle through the taken states in the order taken, so the result always has `count` entries
    and repeats occur only in that case.
    """
    _check(archive, count)
    scores = puct_scores(archive, c)
    ids = list(archive.states)
    order = sorted(range(len(ids)), key=lambda i: (-scores[ids[i]], -archive[ids[i]].reward, i))
    taken: list[str] = []
    blocked: set[str] = set()
    for i in order:
        if len(taken) == count:
            break
        sid = ids[i]
        if sid in blocked:
            continue
        taken.append(sid)
        blocked.add(sid)
        blocked.update(archive.ancestors(sid))  # docs/method.md §3: block ancestors ...
        blocked.update(archive.descendants(sid))  # ... and descendants for the rest of the batch
    return _fill(taken, count)


def select_epsilon_greedy(archive: Archive, count: int, rng: np.random.Generator, epsilon: float = 0.1) -> list[str]:
    """Per slot: the best state with probability 1 - epsilon, else uniform over the archive.

    Each slot draws one rng.random(), plus one rng.integers() when it explores.
    """
    _check(archive, count)
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must lie in [0, 1], got {epsilon}")
    ids = list(archive.states)
    best = archive.best().id
    out = []
    for _ in range(count):
        if rng.random() < epsilon:  # docs/method.md §3: explore with probability epsilon
            out.append(ids[int(rng.integers(len(ids)))])
        else:
            out.append(best)
    return out


def select_none(archive: Archive, count: int) -> list[str]:
    """No reuse: always the seed state(s), cycling through the seeds in insertion order."""
    _check(archive, count)
    seeds = [s.id for s in archive.states.values() if s.is_seed]
    if not seeds:
        raise ValueError("reuse rule 'none' needs at least one seed state in the archive")
    return _fill(seeds, count)


def select_chains(archive: Archive, count: int) -> list[str]:
    """SimpleTES (docs/method.md §6): C = count parallel chains, chain i refining the best state of seed i's tree.

    Chain i owns seed i (seeds in insertion order, cycled when there are fewer seeds than slots)
    and every state whose lineage starts at it; its parent is the best of them (ties: earliest
    inserted), so a step's K candidates either improve the chain or leave it where it was.
    """
    _check(archive, count)
    seeds = [s.id for s in archive.states.values() if s.is_seed]
    if not seeds:
        raise ValueError("reuse rule 'chains' needs at least one seed state in the archive")
    best: dict[str, str] = {sid: sid for sid in seeds}
    for s in archive.states.values():  # insertion order: strict '>' keeps the earliest on ties
        root = s.lineage[0] if s.lineage else s.id
        if root in best and s.reward > archive[best[root]].reward:
            best[root] = s.id
    return _fill([best[sid] for sid in seeds], count)


def select_parents(
    archive: Archive,
    rule: str,
    count: int,
    rng: np.random.Generator,
    c: float = 1.0,
    epsilon: float = 0.1,
) -> list[str]:
    """Dispatch to the selection rule named `rule` (one of REUSE_RULES)."""
    if rule not in REUSE_RULES:
        raise ValueError(f"unknown reuse rule {rule!r}; allowed: {', '.join(REUSE_RULES)}")
    _check(archive, count)
    if rule == "puct":
        return select_puct(archive, count, c)
    if rule == "epsilon-greedy":
        return select_epsilon_greedy(archive, count, rng, epsilon)
    if rule == "chains":
        return select_chains(archive, count)
    return select_none(archive, count)
