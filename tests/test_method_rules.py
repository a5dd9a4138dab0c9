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


def _set_rewards(run: Run, step: int, rewards: list[float]) -> None:
    """Give the step's evaluations these rewards (in rollout order), as if the problem had scored them so."""
    import dataclasses

    from discover.run import read_evaluations
    from storage.tables import write_records

    path = run.layout.evaluations(step)
    evaluations = [dataclasses.replace(e, reward=r, valid=True) for e, r in zip(read_evaluations(path), rewards, strict=True)]
    write_records(path, evaluations, Evaluation)


def test_no_step_is_taken_on_rounding_noise_at_the_base_model(tmp_path: Path, tiny_model_cache: Path) -> None:
    """docs/method.md §2, not in the paper: without a group with signal and with the adapter still the
    identity, the checkpoint is copied as it is; once the adapter has moved, a step without signal
    trains (the KL term), and a step with signal always does."""
    import json

    from discover import steps
    from storage.atomic import content_hash

    run = steps.create_run(parse_config(tiny_toy_config(tmp_path / "run", steps=3)))
    steps.initialise(run)

    def step(s: int, rewards: list[float]) -> dict:
        steps.select_parents(run, s)
        steps.generate(run, s)
        steps.evaluate(run, s)
        _set_rewards(run, s, rewards)
        steps.update_archive(run, s)
        steps.train(run, s)
        return json.loads(run.layout.train_stats(s).read_text())

    flat = [0.5] * 8  # 2 groups of 4 with equal rewards: no signal
    stats = step(0, flat)
    assert stats["optimizer_step"] is False and stats["groups_with_signal"] == 0 and "loss" not in stats
    assert content_hash(run.layout.checkpoint(1)) == content_hash(run.layout.checkpoint(0))

    stats = step(1, [0.0, 0.25, 0.5, 1.0] + [0.5] * 4)  # one group with signal
    assert stats["optimizer_step"] is True and stats["groups_with_signal"] == 1 and stats["grad_norm"] > 0
    assert content_hash(run.layout.checkpoint(2) / "adapter") != content_hash(run.layout.checkpoint(1) / "adapter")

    stats = step(2, flat)  # no signal, but the adapter has moved: the KL term trains
    assert stats["optimizer_step"] is True and stats["groups_with_signal"] == 0 and stats["grad_norm"] > 0
    assert content_hash(run.layout.checkpoint(3) / "adapter") != content_hash(run.layout.checkpoint(2) / "adapter")
