"""The Prefect server as a run sees it: an API that may be away for a few minutes (a restart for an
upgrade, a crash, its database failing over), which a run meant to last days rides through.

Two parts, both Prefect's own means:

- **Retries of a connected client.** Prefect's client retries a call that fails to connect, with
  exponential backoff (2, 4, 8, ... s, jittered), once it has reached the server before; how many
  times is `PREFECT_CLIENT_MAX_RETRIES` (Prefect's default 5: about a minute). A run's flow runs use
  CLIENT_RETRIES (9: about 17 minutes in all, `retry_budget_s`): the CLI sets it for the runs it
  starts (cli/app.py `_run_settings`), the discovery pools in their job variables (prefect.yaml).
- **A new client waits for the server.** Prefect's client does not retry a first connection (a
  wrong URL fails at once); the run's own calls (creating a step's subflow, the task-boundary check,
  the superseded runs) open one client each, so `server_client()` waits for the server's health
  with the same backoff for up to OUTAGE_S before it gives up, saying what it waits for.

A run survives an outage of OUTAGE_S (10 minutes); a longer one fails the flow run, which `discover
resume` (or the restart automation, once the server is back) resumes from its last finished task.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

OUTAGE_S = 600.0  # the API outage a run rides through
CLIENT_RETRIES = 9  # PREFECT_CLIENT_MAX_RETRIES of a run's flow runs: backoff 2 + 4 + ... + 512 s >= OUTAGE_S
WAIT_LOG_S = 30.0  # how often a wait for the server says so


def retry_budget_s(retries: int = CLIENT_RETRIES) -> float:
    """Seconds Prefect's client waits in all over `retries` retries (its backoff 2**n, before jitter)."""
    return float(sum(2**n for n in range(1, retries + 1)))


def run_settings() -> dict[Any, Any]:
    """Prefect settings for a run's flow runs (applied with `temporary_settings`): client retries."""
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES

    return {PREFECT_CLIENT_MAX_RETRIES: CLIENT_RETRIES}


def wait_for_server(client: Any, outage_s: float = OUTAGE_S, what: str = "") -> None:
    """Return once the API of `client` (a sync Prefect client) answers its health check; wait with
    backoff up to `outage_s` seconds, logging every WAIT_LOG_S, then raise ConnectionError."""
    start = time.monotonic()
    delay, said = 1.0, start
    while True:
        problem = client.api_healthcheck()
        if problem is None:
            if time.monotonic() - start > 1.0:
                log.warning("the Prefect server answers again after %.0f s; the run goes on", time.monotonic() - start)
            return
        waited = time.monotonic() - start
        if waited >= outage_s:
            raise ConnectionError(
                f"the Prefect server at {client.api_url} did not answer for {waited:.0f} s ({type(problem).__name__}: {problem})"
                + (f" while {what}" if what else "")
                + "; once it is back, `discover resume RUN_DIR` (or the restart automation) resumes the run from its last finished task"
            )
        if time.monotonic() - said >= WAIT_LOG_S or said == start:
            said = time.monotonic()
            log.warning(
                "the Prefect server at %s does not answer (%s)%s; waiting up to %.0f s more",
                client.api_url,
                type(problem).__name__,
                f" while {what}" if what else "",
                outage_s - waited,
            )
        time.sleep(min(delay, max(0.0, outage_s - waited)))
        delay = min(delay * 2, WAIT_LOG_S)


@contextmanager
def server_client(what: str = "", outage_s: float = OUTAGE_S) -> Iterator[Any]:
    """A sync Prefect client whose server answered (`wait_for_server`); once it has, Prefect's own
    retries (PREFECT_CLIENT_MAX_RETRIES) carry its calls through an outage."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        wait_for_server(client, outage_s, what)
        yield client
