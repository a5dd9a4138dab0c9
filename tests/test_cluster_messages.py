"""What a user is told when the cluster cannot do what the run asks:

- a candidate the evaluation engine cannot start is reported (what it asks, what the cluster has)
  and bounded in time, never a silent wait (discover/evaluation.py `StepEvaluation.collect`,
  flows/engines.py `unplaceable`);
- a cluster head that stops answering is reported with the command that resumes the run
  (flows/engines.py `watch_head`), before Ray ends the process in its own words."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from pathlib import Path

import pytest

from discover import evaluation
from discover.evaluation import Resources, StepEvaluation
from flows.engines import unplaceable
from tests.conftest import tiny_toy_config


@pytest.mark.parametrize("no_node_fits", [False, True], ids=["not-free-now", "no-node-has-it"])
def test_an_evaluation_no_worker_can_start_says_why_and_fails_after_the_bound(
    tmp_path: Path, tiny_model_cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, no_node_fits: bool
) -> None:
    """Held by other work (not free now), the task fails after the bound and Prefect retries it; when
    no live node has what a candidate asks at all, it fails once (Unplaceable, not retried: each retry
    would wait the bound again for the same answer), naming the resume command."""
    from discover import steps
    from discover.config import parse_config
    from discover.run import read_rollouts
    from flows.evaluation import retry_infrastructure_only

    run = steps.create_run(parse_config(tiny_toy_config(tmp_path / "run", steps=1, problem_options={"lenient": True})))
    steps.initialise(run)
    steps.select_parents(run, 0)
    steps.generate(run, 0)
    monkeypatch.setattr(evaluation, "UNPLACED_AFTER_S", 0.0)
    monkeypatch.setattr(evaluation, "PLACEMENT_TIMEOUT_S", 6.0)
    never: list[Future] = []

    def submit(job):  # an engine that queues every candidate and starts none
        never.append(Future())
        return never[-1]

    why = "the Ray cluster cannot start one: a candidate asks {'CPU': '2'}, the cluster has {'CPU': '1'} free"
    answer = evaluation.NoNodeFits(why) if no_node_fits else why
    step = StepEvaluation(run, 0, submit, lambda: answer)
    rollouts = read_rollouts(run.reads("evaluate", 0)["rollouts"])
    with caplog.at_level(logging.WARNING, logger="discover"), pytest.raises(RuntimeError) as raised:
        step.collect(rollouts)
    assert never, "the toy's rollouts hold candidates"
    assert f"{len(never)} candidates could not be started for" in str(raised.value) and why in str(raised.value)
    if no_node_fits:
        assert type(raised.value) is evaluation.Unplaceable and "Not retried: no live node has that much" in str(raised.value)
        assert f"`discover resume {run.root}` evaluates only the others" in str(raised.value)
    else:
        assert type(raised.value) is RuntimeError and "a retry of the step evaluates only the others" in str(raised.value)

    class Failed:  # the task run's final state, as Prefect hands it to the retry condition
        def result(self) -> None:
            raise raised.value

    assert retry_infrastructure_only(None, None, Failed()) is not no_node_fits
    warned = [r.getMessage() for r in caplog.records if "no candidate came back" in r.getMessage()]
    assert len(warned) == 1 and why in warned[0] and "evaluate fails after 6 s of this" in warned[0]


def test_local_threads_can_always_start_a_candidate() -> None:
    assert unplaceable("local", Resources(cpus=64, memory_mb=1, gpus=0))() is None


@pytest.mark.slow
def test_the_ray_check_names_what_a_candidate_asks_and_what_the_cluster_has() -> None:
    import ray

    from tests.test_sharded_training import local_ray

    with local_ray(2):
        assert unplaceable("ray", Resources(cpus=1, memory_mb=16, gpus=0))() is None
        why = unplaceable("ray", Resources(cpus=3, memory_mb=16, gpus=0))()
        head = ray.get_runtime_context().gcs_address

        @ray.remote(num_cpus=2)
        class Holder:
            def ready(self) -> bool:
                return True

        holder = Holder.remote()
        ray.get(holder.ready.remote(), timeout=300)
        busy = unplaceable("ray", Resources(cpus=1, memory_mb=16, gpus=0))()  # a node has it, but not free now
    assert isinstance(why, evaluation.NoNodeFits) and busy is not None and not isinstance(busy, evaluation.NoNodeFits)
    assert "the cluster has {'CPU': '0', " in busy, busy
    assert why is not None and "a candidate asks {'CPU': '3', 'memory': '0.0 GiB'}" in why
    assert "free, its 1 live nodes [{'CPU': '2'" in why and f"ray start --address {head} " in why  # the real head, not HEAD:6379


def test_a_lost_ranks_cause_is_rays_first_meaningful_line_whole() -> None:
    from discover.policy.trainer_group import _first_line

    long = "The actor died unexpectedly before finishing this task. " + "class_name: TrainerRank " * 40
    cause = RuntimeError(f'Traceback (most recent call last):\n  File "x.py", line 1, in f\n    g()\n{long}\n\tactor_id: 1a2b\n')
    assert _first_line(cause) == long.strip()  # whole, not cut at 500 characters, and not the last line
    assert _first_line(RuntimeError("")) == "RuntimeError"


def test_a_head_that_stops_answering_is_reported_with_the_resume_command(caplog: pytest.LogCaptureFixture) -> None:
    import socket
    import time

    from flows.engines import HEAD_MISSES, watch_head

    head = socket.socket()
    head.bind(("127.0.0.1", 0))
    head.listen()
    address = f"127.0.0.1:{head.getsockname()[1]}"
    with caplog.at_level(logging.ERROR, logger="discover"), watch_head(address, "discover resume runs/x", every=0.05):
        time.sleep(0.5)
        assert not caplog.records  # answering: nothing said
        head.close()  # the head is lost
        deadline = time.time() + 30
        while not caplog.records and time.time() < deadline:
            time.sleep(0.05)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said  # once, however long it stays lost
    assert f"the Ray cluster's head at {address} does not answer" in said[0] and said[0].endswith("resume with: discover resume runs/x")
    assert HEAD_MISSES >= 2  # one refused connection is not a lost head
