"""MIGRATE's mixed groups (docs/method.md §6): slot counts, the best past completions, and a real two-step toy
run whose second step fills each group with on-policy, greedy and neighbourhood completions, and
resumes its on-policy slots after an interruption."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from discover import steps
from discover.archive import Archive, State
from discover.config import ConfigError, parse_config
from discover.mixed import NEIGHBOURHOOD_INSTRUCTION, best_past_rollouts, neighbourhood_prompt, slot_counts
from discover.records import Rollout
from discover.run import load_archive, read_rollouts
from storage.rollout_parts import RolloutParts
from storage.tables import write_records
from tests.conftest import tiny_toy_config
from tests.test_resume_generate import assert_same_rollouts


def test_slot_counts_use_past_completions_only_when_there_are_some() -> None:
    assert slot_counts(8, 2, 3, past=5) == (3, 2, 3)  # alpha = 8 - 2 - 3
    assert slot_counts(8, 2, 3, past=1) == (4, 1, 3)  # one past completion: one greedy slot
    assert slot_counts(8, 2, 3, past=0) == (8, 0, 0)  # step 0: all on-policy


def test_mixed_slots_must_leave_an_on_policy_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least one on-policy slot"):
        parse_config(tiny_toy_config(tmp_path, mixed={"greedy": 2, "neighbourhood": 2}))


def _rollout(group: int, index: int, answer: str) -> Rollout:
    return Rollout(
        prompt_ids=[1],
        completion_ids=[2, 3],
        sampler_logprobs=[-1.0, -1.0],
        loss_mask=[1, 1],
        text=answer,
        answer=answer,
        group=group,
        index=index,
        parent_id="seed-0",
    )


def test_best_past_rollouts_are_those_of_the_best_non_seed_states(tmp_path: Path) -> None:
    # archive: seed (reward 0.9, never chosen), s0000-g01-r002 (0.5), s0001-g00-r001 (0.7), s0001-g00-r000 (0.7, later)
    for step, rows in {0: [_rollout(1, 2, "A")], 1: [_rollout(0, 0, "B"), _rollout(0, 1, "C")]}.items():
        write_records(tmp_path / f"{step}.parquet", rows, Rollout)
    archive = Archive(
        [
            State(id="seed-0", parent_id=None, step=-1, reward=0.9, code="", is_seed=True),
            State(id="s0000-g01-r002", parent_id="seed-0", step=0, reward=0.5, code=""),
            State(id="s0001-g00-r001", parent_id="s0000-g01-r002", step=1, reward=0.7, code=""),
            State(id="s0001-g00-r000", parent_id="s0000-g01-r002", step=1, reward=0.7, code=""),
        ]
    )
    best = best_past_rollouts(archive, lambda s: tmp_path / f"{s}.parquet", 2)
    assert [r.answer for r in best] == ["C", "B"]  # 0.7 (inserted first), 0.7
    assert [r.answer for r in best_past_rollouts(archive, lambda s: tmp_path / f"{s}.parquet", 5)] == ["C", "B", "A"]
    assert neighbourhood_prompt("ctx", ["12", "34"]) == f"ctx\n\n{NEIGHBOURHOOD_INSTRUCTION}\n\nAnswer 1:\n12\n\nAnswer 2:\n34\n"


def test_a_mixed_step_fills_each_group_with_three_kinds_of_completion(tmp_path: Path) -> None:
    config = parse_config(tiny_toy_config(tmp_path / "run", rollouts_per_group=4, mixed={"greedy": 1, "neighbourhood": 1}))
    run = steps.create_run(config)
    steps.initialise(run)
    layout = run.layout
    steps.select_parents(run, 0)
    steps.generate(run, 0)
    # Step 0's answers replaced by known digit strings, each a valid child (what the random tiny model
    # writes depends on the machine's arithmetic), so step 1 certainly has past completions to mix in.
    rollouts = read_rollouts(layout.rollouts(0))
    answers = [str(1000 + 111 * i) for i in range(len(rollouts))]
    write_records(layout.rollouts(0), [dataclasses.replace(r, answer=a) for r, a in zip(rollouts, answers)], Rollout)
    for task in (steps.evaluate, steps.update_archive, steps.train):
        task(run, 0)
    steps.select_parents(run, 1)
    steps.generate(run, 1)
    archive = load_archive(layout.archive(1))
    assert any(not s.is_seed for s in archive.states.values())
    best = best_past_rollouts(archive, layout.rollouts, 1)[0]
    assert best.answer in answers
    rollouts = read_rollouts(layout.rollouts(1))
    assert [(r.group, r.index) for r in rollouts] == [(g, i) for g in range(2) for i in range(4)]
    for g in range(2):
        own = [r for r in rollouts if r.group == g]
        prompt = own[0].prompt_ids
        assert all(r.prompt_ids == prompt for r in own)  # every slot trains as an answer to the group's prompt
        assert own[2].completion_ids == best.completion_ids and own[2].answer == best.answer  # the greedy slot
        assert all(len(r.sampler_logprobs) == len(r.completion_ids) for r in own)
        assert all(lp < 0 for r in own[2:] for lp, m in zip(r.sampler_logprobs, r.loss_mask) if m)  # re-scored

    # A generate of step 1 killed after three on-policy rollouts were stored: run again, it reuses
    # those three, makes the five others (the greedy and neighbourhood slots again, re-scored as
    # one batch) and writes the file an uninterrupted generate wrote.
    whole = list(rollouts)
    parts = RolloutParts(layout.generated(1), Rollout)
    digest = steps._generate_digest(run, 1)
    for r in rollouts:
        if (r.group, r.index) in {(0, 0), (0, 1), (1, 1)}:
            parts.put(r.group, r.index, r, digest)
    parts.put(0, 2, rollouts[2], digest)  # a greedy slot stored by an older version: made again, not reused
    layout.rollouts(1).unlink()
    steps.generate(run, 1)
    assert json.loads(layout.generate_stats(1).read_text())["rollouts_reused"] == 3
    assert_same_rollouts(read_rollouts(layout.rollouts(1)), whole)  # log-probs up to another batch's rounding
