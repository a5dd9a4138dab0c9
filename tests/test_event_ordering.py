"""flows/event_ordering.py without a server: which events a restarted server's automations take as
already processed (tests/test_restart_automation.py runs it inside a real server)."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

from flows import event_ordering


def _uuid7(moment: dt.datetime) -> uuid.UUID:
    """A time-ordered id as Prefect makes them: 48 bits of milliseconds, version 7, random rest."""
    ms = int(moment.timestamp() * 1000)
    rest = uuid.uuid4().int & ((1 << 80) - 1)
    value = (ms << 80) | rest
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    return uuid.UUID(int=value)


def test_an_event_made_before_the_server_started_counts_as_processed_and_a_newer_one_does_not() -> None:
    before = _uuid7(event_ordering.STARTED - dt.timedelta(minutes=1))
    after = _uuid7(event_ordering.STARTED + dt.timedelta(seconds=5))
    assert before.version == 7 and event_ordering.made_before(before, event_ordering.STARTED)
    assert not event_ordering.made_before(after, event_ordering.STARTED)
    assert not event_ordering.made_before(uuid.uuid4(), event_ordering.STARTED)  # not time-ordered: Prefect's rule

    ordering = event_ordering.CausalOrdering(scope="test-event-ordering")
    assert asyncio.run(ordering.event_has_been_seen(before))
    assert not asyncio.run(ordering.event_has_been_seen(after))


def test_an_event_made_after_the_server_started_but_before_the_ordering_was_imported_is_not_taken_as_processed() -> None:
    """The triggers service imports the ordering only after it has loaded the automations; a state
    change made in between (a crash reported just after a restart of the server) must still be
    evaluated, so "started" is the process's start, not the import of the module."""
    import subprocess
    import sys

    probe = (
        "import time, uuid\n"
        "from prefect._internal.uuid7 import uuid7\n"
        "made = uuid7(); time.sleep(0.5)\n"
        "from flows import event_ordering\n"
        "print(event_ordering.made_before(made, event_ordering.STARTED))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=event_ordering.__file__.rsplit("/flows/", 1)[0]
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", done.stdout
