"""The report of a run and the re-evaluation table, on a run directory written by hand (no model)."""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from discover.archive import Archive, State
from discover.config import dump_config, parse_config
from discover.records import Evaluation, Rollout
from discover.reevaluation import GpuCheck, reevaluate_states, write_reevaluation
from discover.report import step_rows, write_report
from discover.run import TASKS, Run, read_evaluations, read_rollouts, save_archive
from evaluators.markdown import escape_unprintable
from evaluators.toy.digits import DigitsProblem
from storage.atomic import atomic_write_json, atomic_write_text
from storage.layout import RunLayout
from storage.manifest import record_task
from storage.tables import write_records


def _state(id: str, parent: str | None, step: int, construction: str, lineage: tuple[str, ...]) -> State:
    reward = DigitsProblem().verify(construction).reward if construction else 0.0
    return State(
        id=id,
        parent_id=parent,
        step=step,
        reward=reward,
        is_seed=parent is None,
        lineage=lineage,
        code=construction[-4:],
        construction=construction,
    )


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A toy run of two steps: seed, then one child per step, each written as the run would."""
    root = tmp_path / "run"
    layout = RunLayout(root)
    config = parse_config({"problem": "toy", "run_dir": str(root), "steps": 2, "groups": 1, "rollouts_per_group": 2})
    atomic_write_text(layout.config, dump_config(config))
    atomic_write_json(layout.run_info, {"run_id": "0123456789abcdef", "created": 0.0})
    seed = _state("seed-0", None, -1, "", ())
    a = _state("s0000-g00-r000", "seed-0", 0, "1234", ("seed-0",))
    b = _state("s0001-g00-r001", a.id, 1, "12345678", ("seed-0", a.id))
    archives = [[seed], [seed, a], [seed, a, b]]
    for i, records in enumerate(archives):
        save_archive(layout.archive(i), Archive(records, total_expansions=2 * i))
    for step, child in ((0, a), (1, b)):
        evals = [
            Evaluation(
                group=0,
                index=0,
                child_id=f"s{step:04d}-g00-r000",
                parent_id=child.parent_id,
                reward=0.0,
                valid=False,
                reason="no candidate found in the answer",
                code="",
            ),
            Evaluation(
                group=0,
                index=1,
                child_id=child.id,
                parent_id=child.parent_id,
                reward=child.reward,
                valid=True,
                reason="",
                code=child.code,
                construction=child.construction,
            ),
        ]
        write_records(layout.evaluations(step), evals, Evaluation)
        rollout = dict(
            group=0,
            parent_id=child.parent_id,
            prompt_ids=[1],
            completion_ids=[1, 2, 3],
            sampler_logprobs=[0.0] * 3,
            loss_mask=[1] * 3,
            text="",
            answer="",
            forced=False,
            finish_reason="eos",
        )
        write_records(layout.rollouts(step), [Rollout(**rollout, index=0), Rollout(**rollout, index=1)], Rollout)
        atomic_write_json(layout.train_stats(step), {"beta_mean": 2.5, "beta_min": 2.0, "beta_max": 3.0})
        for t in TASKS:
            record_task(layout.manifest, step, t, {"path": "x", "sha256": "y"}, 10.0, 10.5)
    return root


def test_step_rows_are_the_steps_metrics_records(run_dir: Path) -> None:
    rows = step_rows(Run.open(run_dir))
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[1]["reward/best"] == pytest.approx(max(_state("b", "a", 1, "12345678", ()).reward, rows[0]["reward/best"]))
    assert rows[0]["reward/valid_fraction"] == 0.5 and rows[0]["tokens/completion"] == 6 and rows[0]["train/beta_mean"] == 2.5
    assert rows[0]["archive/size"] == 2 and rows[1]["archive/size"] == 3
    assert all(rows[0][f"time/{t}"] == 0.5 for t in TASKS)


def test_report_is_markdown_whose_pictures_exist(run_dir: Path) -> None:
    from cli.app import app

    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    report = Path(result.output.strip())
    assert report == run_dir / "report" / "report.md"
    text = report.read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images == ["rewards.png"]
    assert (report.parent / "rewards.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| step | reward/best | reward/mean | reward/max | reward/valid_fraction | archive/size | tokens/completion |" in text
    assert "train/beta_mean" in text and "time/train" in text and "s0001-g00-r001" in text


def test_report_renders_the_problems_sections(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The problem's `report_sections` get the newest archive's states, best first, and each
    section becomes a heading, its paragraph and its table."""
    from evaluators.base import ReportSection

    seen = []

    def sections(self, states):
        seen.append(list(states))
        rows = [{"state": s.id, "reward": s.reward} for s in states]
        return [ReportSection("Digits of the best states", "One row per state.", rows, ("reward", "state")), ReportSection("Empty")]

    monkeypatch.setattr(DigitsProblem, "report_sections", sections)
    text = write_report(Run.open(run_dir)).read_text()
    rewards = [s.reward for s in seen[0]]
    assert len(seen[0]) == 3 and seen[0][0].id == "s0001-g00-r001" and rewards == sorted(rewards, reverse=True)
    assert isinstance(seen[0][0], State)
    assert "## Digits of the best states\n\nOne row per state.\n\n| reward | state |" in text
    assert "## Empty\n" in text


def test_escape_unprintable_shows_control_characters_and_keeps_text() -> None:
    raw = "a\x1b[31mb\x00c\r\n\td\u202eevil\u2028e\u200bf\ud800g\U000e0001 é → 数 \u00a0 🙂"
    escaped = escape_unprintable(raw)
    assert escaped == "a\\x1b[31mb\\x00c\\x0d\n\td\\u202eevil\\u2028e\\u200bf\\ud800g\\U000e0001 é → 数 \u00a0 🙂"
    escaped.encode("utf-8")  # a lone surrogate no longer makes it unwritable


def test_report_quotes_model_text_with_control_characters_escaped(run_dir: Path) -> None:
    """The tiny random model writes control characters: the report stays UTF-8 text and shows them as escapes."""
    layout = RunLayout(run_dir)
    answers = ["best \x1b[2J\x00 answer\nline two\twith a tab \u202e drawkcab", "worst \x07\x08 \u2028 \x7f answer"]
    rollouts = [dataclasses.replace(r, text=text) for r, text in zip(read_rollouts(layout.rollouts(1)), answers[::-1], strict=True)]
    write_records(layout.rollouts(1), rollouts, Rollout)
    evaluations = read_evaluations(layout.evaluations(1))
    evaluations[0] = dataclasses.replace(evaluations[0], reason="candidate printed \x1b[0m\x0c")
    write_records(layout.evaluations(1), evaluations, Evaluation)

    data = write_report(Run.open(run_dir)).read_bytes()
    text = data.decode("utf-8")  # strict: valid UTF-8
    unprintable = [ch for ch in text if ch not in "\n\t" and (unicodedata.category(ch).startswith("C") or ch in "\u2028\u2029")]
    assert not unprintable, f"unescaped characters in the report: {unprintable}"
    assert "best \\x1b[2J\\x00 answer\nline two\twith a tab \\u202e drawkcab" in text
    assert "worst \\x07\\x08 \\u2028 \\x7f answer" in text
    assert "invalid: candidate printed \\x1b[0m\\x0c" in text


def test_report_of_a_folder_that_is_no_run_fails_clearly(tmp_path: Path) -> None:
    from cli.app import app

    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "not a run directory" in result.output


def test_reevaluation_rescores_the_best_states_and_writes_the_table(run_dir: Path) -> None:
    held = []

    class Slot:
        def __enter__(self):
            held.append(1)

        def __exit__(self, *exc):
            return False

    rows = reevaluate_states(Run.open(run_dir), 5, "gpu-test", Slot)
    assert [r.state_id for r in rows] == ["s0001-g00-r001", "s0000-g00-r000"]  # seeds are not re-scored
    assert all(r.valid and r.reward == pytest.approx(r.archived_reward) for r in rows)
    assert len(held) == 2  # one slot held per candidate
    out = write_reevaluation(run_dir, rows, GpuCheck.here("gpu-test", needs_gpu=False), when=0.0)
    assert out == run_dir / "reevaluations" / "19700101T000000Z-gpu-test.parquet"
    assert pq.read_table(out).num_rows == 2 and "gpu-test" in out.with_suffix(".md").read_text()
    assert "Re-evaluations" in write_report(Run.open(run_dir)).read_text()
