"""Prefect's API for a command that runs flows: the server in PREFECT_API_URL, or Prefect's
temporary (ephemeral) server started here, before the flow, with a generous start-up timeout and a
progress line while it starts.

On a busy 2-core machine the temporary server can take over a minute to start (a fresh SQLite
database is migrated first); Prefect's own default wait is 20 s, after which a run fails with
"Timed out while attempting to connect to ephemeral Prefect API server". A run must never fail
for that, so the wait here is DEFAULT_STARTUP_TIMEOUT_S unless the user set Prefect's setting
PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS themselves.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"  # Prefect's own setting
DEFAULT_STARTUP_TIMEOUT_S = 600
PROGRESS_EVERY_S = 15.0

log = logging.getLogger("discover")


def startup_timeout() -> int:
    """The temporary server's start-up timeout: the user's Prefect setting, else ours."""
    value = os.environ.get(TIMEOUT_ENV, "").strip()
    if not value:
        return DEFAULT_STARTUP_TIMEOUT_S
    try:
        return max(1, int(float(value)))
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}={value!r} is not a number of seconds") from None


def with_progress(start: Callable[[], None], what: str, every_s: float = PROGRESS_EVERY_S) -> float:
    """Call `start()`, logging a line every `every_s` seconds until it returns; its duration."""
    done = threading.Event()
    t0 = time.monotonic()

    def tick() -> None:
        while not done.wait(every_s):
            log.info("%s: still starting after %.0f s (a busy machine is slow here)", what, time.monotonic() - t0)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        start()
    finally:
        done.set()
        ticker.join()
    return time.monotonic() - t0


def ensure_prefect_api() -> str:
    """The API flows of this process will use; starts Prefect's temporary server when none is set.

    Must run before the first flow: Prefect then finds the server already running (its
    `SubprocessASGIServer` is one instance per process) and does not start its own with a 20 s limit.
    """
    timeout = startup_timeout()
    os.environ[TIMEOUT_ENV] = str(timeout)  # also for any path of Prefect's that starts it itself
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    if api:
        return api
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    what = "Prefect's temporary API server"
    log.info("starting %s (no PREFECT_API_URL set; waiting up to %d s, %s)", what, timeout, TIMEOUT_ENV)
    seconds = with_progress(lambda: server.start(timeout=timeout), what)
    log.info("%s ready at %s in %.0f s", what, server.api_url, seconds)
    return server.api_url
