"""The released code's choices (docs/method.md §5a) and the other papers' options (docs/method.md §6), each against a
hand-worked example: one seed per group, the context, the lazy penalty."""

from __future__ import annotations

from pathlib import Path

from discover.config import parse_config
from discover.prompts import build_context
from discover.records import Evaluation
from discover.run import Run
from discover.steps import _seed_states, lazy_rewards
from tests.conftest import tiny_toy_config


def _evaluation(group, index, construction, valid=True, reward=0.5):
    return Evaluation(
        group=group,
        index=index,
        child_id=f"c{group}{index}",
        parent_id="p",
        reward=reward,
        valid=valid,
        reason="" if valid else "bad",
        code="",
        construction=construction,
    )


def test_one_seed_state_per_group_by_default(tmp_path: Path) -> None:
    # docs/method.md §5a: G = 3 groups -> 3 seeds; seed_states: 1 keeps the old single shared seed.
    run = Run.create(parse_config(tiny_toy_config(tmp_path / "a", groups=3)))
    seeds = _seed_states(run)
    assert [s.id for s in seeds] == ["seed-0", "seed-1", "seed-2"]
    assert all(s.is_seed and s.key for s in seeds)
    one = Run.create(parse_config(tiny_toy_config(tmp_path / "b", groups=3, reuse={"seed_states": 1})))
    assert [s.id for s in _seed_states(one)] == ["seed-0"]


def test_context_shows_before_after_target_and_the_last_500_characters() -> None:
    observation = "x" * 600 + "END"
    text = build_context("Problem.", "Current string: 12", 0.25, observation, previous_reward=0.125, target=1.0)
    lines = text.splitlines()
    assert lines[:3] == ["Problem.", "", "Current string: 12"]
    assert "Score of the current state: 0.125000 -> 0.250000 (its parent -> it)" in lines
    assert "Target score: 1.000000 (higher is better)" in lines
    assert lines[-1] == "x" * 497 + "END"  # exactly the last 500 characters
    seed = build_context("Problem.", "No code yet.", 0.0)  # a seed: no parent, no target, no output
    assert seed == "Problem.\n\nNo code yet.\n\nScore of the current state: 0.000000\n"


def test_lazy_penalty_replaces_the_reward_of_children_already_in_the_archive() -> None:
    # ThetaEvolve: children (0,0) and (1,1) equal states of the archive ("12", "34") train with the
    # penalty; (0,1) is new and keeps its reward; (1,0) is invalid and keeps its 0.
    evaluations = [
        _evaluation(0, 0, "12", reward=0.4),
        _evaluation(0, 1, "99", reward=0.6),
        _evaluation(1, 0, None, valid=False, reward=0.0),
        _evaluation(1, 1, "34", reward=0.9),
    ]
    rewards = {(e.group, e.index): e.reward for e in evaluations}
    out, changed = lazy_rewards(rewards, evaluations, {"key:12", "key:34"}, lambda code, c: f"key:{c}", -0.1)
    assert out == {(0, 0): -0.1, (0, 1): 0.6, (1, 0): 0.0, (1, 1): -0.1}
    assert changed == 2 and rewards[(0, 0)] == 0.4  # the input is left untouched
