"""Per-candidate evaluation (discover/evaluation.py): one result per distinct candidate, stored as
it returns, never evaluated twice; the step's table the same as scoring every rollout directly."""

from __future__ import annotations

import dataclasses
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from discover import steps
from discover.config import parse_config
from discover.evaluation import NO_CANDIDATE, StepEvaluation, candidate_key, evaluator_source, run_job, thread_pool
from discover.records import Rollout
from discover.run import Run, load_archive, read_evaluations, read_rollouts
from evaluators.base import ParentView
from evaluators.registry import get_problem
from tests.conftest import tiny_toy_config


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory, tiny_model_cache: Path) -> Path:
    """A toy run initialised and taken through step 0's generation."""
    config = parse_config(tiny_toy_config(tmp_path_factory.mktemp("evaluation") / "run", steps=1))
    run = steps.create_run(config)
    steps.initialise(run)
    steps.select_parents(run, 0)
    steps.generate(run, 0)
    return run.root


@pytest.fixture
def run(generated: Path, tmp_path: Path) -> Run:
    shutil.copytree(generated, tmp_path / "run")
    return Run.open(tmp_path / "run")


class Counting:
    """A thread-pool engine that counts what it is given."""

    def __init__(self, submit) -> None:
        self.submit, self.jobs = submit, []

    def __call__(self, job):
        self.jobs.append(job)
        return self.submit(job)


def _with_answers(rollouts: list[Rollout], answers: list[str]) -> list[Rollout]:
    return [dataclasses.replace(r, answer=a) for r, a in zip(rollouts, answers)]


def test_the_table_matches_scoring_every_rollout_directly(run: Run) -> None:
    rollouts = read_rollouts(run.layout.rollouts(0))
    steps.evaluate(run, 0)
    evaluations = read_evaluations(run.layout.evaluations(0))
    problem, archive = run.problem(), load_archive(run.layout.archive(0))
    assert [(e.group, e.index) for e in evaluations] == [(r.group, r.index) for r in rollouts]
    for r, e in zip(rollouts, evaluations):
        candidate = problem.parse(r.answer)
        if candidate is None:
            assert (e.valid, e.reward, e.reason, e.code) == (False, 0.0, NO_CANDIDATE, "")
            continue
        parent = archive[r.parent_id]
        direct = problem.evaluate(candidate, ParentView(parent.code, parent.construction), None)
        assert (e.reward, e.valid, e.reason, e.construction, e.metrics, e.code) == (
            direct.reward,
            direct.valid,
            direct.reason,
            direct.construction,
            direct.metrics,
            candidate,
        )


def test_a_program_seen_twice_in_a_step_is_evaluated_once_and_a_stored_one_never_again(run: Run) -> None:
    rollouts = read_rollouts(run.layout.rollouts(0))  # 2 groups of 4, both from seed-0 at step 0
    answers = ["1234", "1234 again", "55", "no digits", "1234", "55", "7", "7"]
    rollouts = _with_answers(rollouts, answers)
    with thread_pool(2) as submit:
        counting = Counting(submit)
        first = StepEvaluation(run, 0, counting).collect(rollouts)
    assert sorted(j.candidate for j in counting.jobs) == ["1234", "55", "7"]  # "1234 again" parses to 1234
    assert len(StepEvaluation(run, 0, counting).store.keys()) == 3
    assert first[0].reward == first[1].reward == first[4].reward and first[3].reason == NO_CANDIDATE

    with thread_pool(2) as submit:  # a resumed step: everything is stored, nothing runs
        again = Counting(submit)
        second = StepEvaluation(run, 0, again).collect(rollouts)
    assert again.jobs == [] and second == first


def test_a_step_resumes_with_only_the_unfinished_candidates(run: Run) -> None:
    rollouts = _with_answers(read_rollouts(run.layout.rollouts(0)), [str(1000 + i) for i in range(8)])
    with thread_pool(2) as submit:
        partial = StepEvaluation(run, 0, submit)
        for r in rollouts[:3]:  # three candidates come back, then the step dies
            partial.add(r)
        while partial._pending:
            partial._drain(timeout=5)
    with thread_pool(2) as submit:
        counting = Counting(submit)
        StepEvaluation(run, 0, counting).collect(rollouts)
    assert sorted(j.candidate for j in counting.jobs) == [str(1000 + i) for i in range(3, 8)]


def test_a_failed_evaluation_is_named_and_the_others_are_kept(run: Run) -> None:
    rollouts = _with_answers(read_rollouts(run.layout.rollouts(0)), [str(2000 + i) for i in range(8)])

    def flaky(job):
        if job.candidate == "2005":
            raise OSError("the Docker engine went away")
        return run_job(job)

    with ThreadPoolExecutor(2) as pool:
        session = StepEvaluation(run, 0, lambda job: pool.submit(flaky, job))
        with pytest.raises(RuntimeError, match=r"1 candidates of step 0 could not be evaluated.*s0000-g01-r001.*Docker engine"):
            session.collect(rollouts)
    assert len(session.store.keys()) == 7


def test_the_evaluator_digest_covers_the_data_files_of_the_domain_folder(tmp_path: Path) -> None:
    """A test case or published construction changed between a kill and a resume changes the
    evaluator's digest, so no stored verdict of the old files is reused; compiled caches do not."""
    from discover.evaluation import domain_digest

    folder = tmp_path / "domain"
    (folder / "data" / "cases").mkdir(parents=True)
    (folder / "problem.py").write_text("X = 1\n")
    (folder / "data" / "cases" / "0000.txt").write_text("3\n1 2 3\n")
    before = domain_digest(folder)
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "problem.cpython-311.pyc").write_bytes(b"\0\1")
    assert domain_digest.__wrapped__(folder) == before
    (folder / "data" / "cases" / "0000.txt").write_text("3\n1 2 4\n")
    assert domain_digest.__wrapped__(folder) != before


def test_the_key_holds_run_step_content_parent_and_evaluator() -> None:
    toy, erdos = get_problem("toy"), get_problem("erdos")
    parent = ParentView("", "12")
    base = candidate_key("run", 0, "34", parent, evaluator_source(toy))
    assert base == candidate_key("run", 0, "34", ParentView("", "12"), evaluator_source(toy))
    assert (
        len(
            {
                base,
                candidate_key("other", 0, "34", parent, evaluator_source(toy)),
                candidate_key("run", 1, "34", parent, evaluator_source(toy)),
                candidate_key("run", 0, "35", parent, evaluator_source(toy)),
                candidate_key("run", 0, "34", ParentView("", "13"), evaluator_source(toy)),
                candidate_key("run", 0, "34", parent, evaluator_source(erdos)),
            }
        )
        == 6
    )
