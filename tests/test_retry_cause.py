"""A retried task's retry state carries the cause of the failure it retries (flows/retry_cause.py)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect.client.orchestration import get_client

from flows import retry_cause
from flows.evaluation import retry_infrastructure_only


def test_the_retry_state_of_a_task_names_the_failure_it_retries_and_a_refused_retry_notes_nothing(tmp_path: Path, prefect_api: str) -> None:
    attempts = tmp_path / "attempts"

    @task(retries=1, retry_delay_seconds=1, retry_condition_fn=retry_infrastructure_only)
    def flaky() -> int:
        with open(attempts, "a") as f:
            f.write("x")
        if attempts.read_text() == "x":
            raise ConnectionError("the node of rank 1 was lost: its raylet died")
        return 7

    @task(retries=1, retry_delay_seconds=1, retry_condition_fn=retry_infrastructure_only)
    def misconfigured() -> int:
        raise ValueError("trainer_world_size must be at least 1")

    @flow
    def both() -> tuple[str, str]:
        ok = flaky.submit()
        bad = misconfigured.submit()
        assert ok.result() == 7
        bad.wait()
        return str(ok.task_run_id), str(bad.task_run_id)

    ok_id, bad_id = both()
    import asyncio

    async def states(task_run_id: str) -> list:
        async with get_client() as client:
            return await client.read_task_run_states(task_run_id)

    retried = asyncio.run(states(ok_id))
    waits = [s for s in retried if s.name == "AwaitingRetry"]
    assert len(waits) == 1, [(s.name, s.message) for s in retried]
    assert waits[0].message == retry_cause.PREFIX + "ConnectionError: the node of rank 1 was lost: its raylet died"
    refused = asyncio.run(states(bad_id))
    assert [s.name for s in refused if s.name == "AwaitingRetry"] == []  # not retried: a bad configuration
    assert refused[-1].type.value == "FAILED"


def test_a_long_cause_is_cut_and_a_noted_cause_serves_one_retry_only() -> None:
    import prefect.task_engine as engine
    from prefect.states import AwaitingRetry

    retry_cause.install()
    retry_cause.note(RuntimeError("x" * 5000))
    first = engine.AwaitingRetry()
    assert (
        first.message.startswith(retry_cause.PREFIX + "RuntimeError: xxx")
        and len(first.message) <= len(retry_cause.PREFIX) + retry_cause.MAX_CHARS
    )
    assert engine.AwaitingRetry().message is None  # no stale cause on a later retry
    assert engine.AwaitingRetry(message="Prefect's own").message == "Prefect's own"
    assert AwaitingRetry().message is None  # built anywhere else: as Prefect makes it
