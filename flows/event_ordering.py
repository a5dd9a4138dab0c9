"""The order in which a Prefect server's automations take events, kept across a restart of the server.

Runs inside the Prefect server, named by its setting `PREFECT_SERVER_EVENTS_CAUSAL_ORDERING=
flows.event_ordering` (flows/recovery.py `SERVER_ORDERING`; docs/operations.md, "Start a server"). Prefect's own (`...ordering.memory`,
the default) holds back an event that says it follows another until that other one has been
processed, for up to 15 minutes (`PRECEDING_EVENT_LOOKBACK`), and remembers what it processed only
in memory. A flow run's state-change event follows the run's previous one when they are less than
5 minutes apart. So after a restart of the server, the first state change of every run that changed
state in the 5 minutes before it follows an event the new process never saw, and it and every later
state change of that run wait 15 minutes before any automation sees them. By then the windows they
open have long closed and are swept away unevaluated: a run that crashed shortly after a server
restart was never restarted (`benchmarks/soak.py` found it; `tests/test_restart_automation.py`
replays it).

This is Prefect's in-memory ordering with one change: an event made before this server process
started counts as processed. The earlier process processed it, or it was lost with that process (a
server killed before it stored its last events); either way it will never come, and waiting for it
only delays what follows it. Event ids are time-ordered (UUIDv7, as Prefect makes them), so "made
before" is read from the id; a flow run's state-change events are made by the server itself.
Anything made since keeps Prefect's ordering as it is.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from pathlib import Path
from uuid import UUID

from prefect.server.events.ordering import memory
from prefect.server.events.schemas.events import Event

log = logging.getLogger("prefect.server.events.ordering")


def process_started() -> dt.datetime:
    """When this process started, to 10 ms (Linux: its start in clock ticks since boot, against the
    boot clock), rounded down; where that cannot be read, now. Not the time this module is imported:
    the triggers service imports it after it has loaded the automations, and on a busy server the
    first state changes are made before that; counted as processed, they were dropped unevaluated (a
    crash reported seconds after a restart of the server was never restarted)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of proc(5): starttime
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - started_s
    except (OSError, ValueError, IndexError, AttributeError):
        return dt.datetime.now(dt.UTC)
    return dt.datetime.fromtimestamp(time.time() - max(age_s, 0.0) - 0.01, dt.UTC)


# When this server process started: an event made before it was made by an earlier process.
STARTED = process_started()


class CausalOrdering(memory.CausalOrdering):
    """Prefect's in-memory causal ordering; an event made before this process started counts as seen."""

    _instances: dict[str, memory.CausalOrdering] = {}  # one per scope, apart from Prefect's own class's
    _locks: dict = {}

    async def event_has_been_seen(self, event: UUID | Event) -> bool:
        if await super().event_has_been_seen(event):
            return True
        event_id = event.id if isinstance(event, Event) else event
        if not made_before(event_id, STARTED):
            return False  # an event of this process's time: Prefect's ordering as it is
        log.info("event %s was made before this server process started: taken as processed", event_id)
        return True


def made_before(event_id: UUID, moment: dt.datetime) -> bool:
    """Whether a time-ordered event id (UUIDv7: its first 48 bits are milliseconds since the epoch)
    was made before `moment`; False for an id of any other kind (Prefect's ordering then holds)."""
    return event_id.version == 7 and event_id.int >> 80 < moment.timestamp() * 1000
