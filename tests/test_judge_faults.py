"""Whatever a candidate writes gets a verdict (issue 21, A): an exception raised while a problem
judges a candidate is that candidate's verdict (invalid, reward 0, an evaluator fault), stored like
any result; a failure of the infrastructure is still raised, for the engine to retry."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from discover import steps
from discover.config import parse_config
from discover.evaluation import EVALUATOR_FAULT, CandidateJob, Resources, run_job
from discover.records import Rollout
from discover.run import Run, read_evaluations, read_rollouts
from evaluators.sandbox.base import InfrastructureError, infrastructure_failure
from evaluators.sandbox.native import SessionError
from evaluators.toy.digits import DigitsProblem
from storage.tables import write_records
from tests.conftest import tiny_toy_config

BIG = "Exceeds the limit (4300 digits) for integer string conversion"


def _job(tmp_path: Path, candidate: str) -> CandidateJob:
    config = parse_config(tiny_toy_config(tmp_path / "run", steps=1))
    return CandidateJob(
        key="k",
        step=0,
        child_id="s0000-g00-r000",
        candidate=candidate,
        parent_code="",
        parent_construction="",
        config_json=config.model_dump_json(),
        resources=Resources(cpus=1, memory_mb=512, gpus=0),
    )


def _raising(err: BaseException):
    honest = DigitsProblem.evaluate

    def evaluate(self, candidate, parent, sandbox=None):
        if candidate.startswith("9"):
            raise err
        return honest(self, candidate, parent, sandbox)

    return evaluate


@pytest.mark.parametrize(
    "err",
    [ValueError(BIG), MemoryError(), RecursionError("maximum recursion depth exceeded"), IndexError("list index out of range")],
    ids=lambda e: type(e).__name__,
)
def test_run_job_turns_an_exception_of_the_judge_into_a_verdict(tmp_path: Path, monkeypatch, caplog, err) -> None:
    monkeypatch.setattr(DigitsProblem, "evaluate", _raising(err))
    with caplog.at_level(logging.ERROR, logger="discover"):
        result = run_job(_job(tmp_path, "9876"))
    assert (result.valid, result.reward) == (False, 0.0)
    assert result.reason.startswith(f"{EVALUATOR_FAULT}: judging this candidate raised {type(err).__name__}")
    assert str(err) in result.reason
    assert any("s0000-g00-r000" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    honest = run_job(_job(tmp_path, "1234"))  # the others are judged as ever
    assert honest.valid and honest.reason == ""


@pytest.mark.parametrize(
    "err",
    [
        InfrastructureError("no sandbox backend"),
        SessionError("the runner exited: no message (the container may have been killed)"),
        OSError(11, "Resource temporarily unavailable"),
        ConnectionError("the Docker engine went away"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_run_job_raises_a_failure_of_the_infrastructure(tmp_path: Path, monkeypatch, err) -> None:
    monkeypatch.setattr(DigitsProblem, "evaluate", _raising(err))
    with pytest.raises(type(err)):
        run_job(_job(tmp_path, "9876"))


def test_docker_sdk_errors_are_the_infrastructure(tmp_path: Path, monkeypatch) -> None:
    docker = pytest.importorskip("docker")
    for err in (docker.errors.APIError("500 Server Error: container not found"), docker.errors.NotFound("gone")):
        assert infrastructure_failure(err)
        monkeypatch.setattr(DigitsProblem, "evaluate", _raising(err))
        with pytest.raises(docker.errors.DockerException):
            run_job(_job(tmp_path, "9876"))
    assert not infrastructure_failure(ValueError(BIG)) and not infrastructure_failure(MemoryError())


def test_a_run_step_with_a_candidate_that_breaks_the_judge_finishes_and_stores_it(
    tmp_path: Path, tiny_model_cache: Path, monkeypatch
) -> None:
    """End to end, the step's five tasks as the run's flow calls them (discover/steps.py, no
    Prefect): the tiny model's rollouts, their answers replaced by known ones (what the random model
    writes depends on the machine's arithmetic), half of them starting with an odd digit, on which
    the judge raises; the step finishes, those are scored 0 with the fault in evaluations.parquet,
    the others get their honest verdicts, and re-evaluating the step (a resume) judges none of them
    again."""
    honest = DigitsProblem.evaluate
    judged: list[str] = []

    def evaluate(self, candidate, parent, sandbox=None):
        judged.append(candidate)
        if candidate[:1] in "13579":
            int("7" * 5000)  # what an AtCoder judge did with a 5000-digit number
        return honest(self, candidate, parent, sandbox)

    monkeypatch.setattr(DigitsProblem, "evaluate", evaluate)
    config = parse_config(tiny_toy_config(tmp_path / "run", steps=1))
    run = steps.create_run(config)
    steps.initialise(run)
    steps.select_parents(run, 0)
    steps.generate(run, 0)
    # Known answers: first digits 0, 1, 2, ... (odd and even alternate), then the target's next three
    # digits, so every answer is a valid candidate with a reward above 0 whatever the judge's fault.
    rest = "".join(map(str, run.problem()._target[1:4]))
    rollouts = read_rollouts(run.layout.rollouts(0))
    answers = [f"{i % 10}{rest}" for i in range(len(rollouts))]
    write_records(run.layout.rollouts(0), [dataclasses.replace(r, answer=a) for r, a in zip(rollouts, answers)], Rollout)
    steps.evaluate(run, 0)
    steps.update_archive(run, 0)
    steps.train(run, 0)

    evaluations = read_evaluations(run.layout.evaluations(0))
    assert [e.code for e in evaluations] == answers
    broken = [e for e in evaluations if e.code[:1] in "13579"]
    fine = [e for e in evaluations if e.code[:1] not in "13579"]
    assert len(broken) == len(fine) == len(answers) // 2
    for e in broken:
        assert (e.valid, e.reward) == (False, 0.0)
        assert e.reason.startswith(f"{EVALUATOR_FAULT}: judging this candidate raised ValueError: Exceeds the limit")
    for e in fine:  # judged as ever: valid, and the reward the problem gives
        assert e.valid and e.reward > 0 and e.reward == pytest.approx(honest(run.problem(), e.code, None).reward), e
        assert e.reason == ""
    assert Run.open(run.root).layout.archive(1).is_file()

    judged.clear()  # a resumed step: the stored verdicts are read back, nothing is judged again
    run.layout.evaluations(0).unlink()
    steps.evaluate(run, 0)
    assert judged == []
    again = read_evaluations(run.layout.evaluations(0))
    assert [dataclasses.astuple(e) for e in again] == [dataclasses.astuple(e) for e in evaluations]
