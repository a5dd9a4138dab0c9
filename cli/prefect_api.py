"""Prefect's API for a command that runs flows: the server in PREFECT_API_URL, or Prefect's
temporary (ephemeral) server started here, before the flow, with a generous start-up timeout and a
progress line while it starts.

On a busy 2-core machine the temporary server can take over a minute to start (a fresh SQLite
database is migrated first); Prefect's own default wait is 20 s, after which a run fails with
"Timed out while attempting to connect to ephemeral Prefect API server". A run must never fail
for that, so the wait here is DEFAULT_STARTUP_TIMEOUT_S unless the user set Prefect's setting
PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS themselves.

Prefect stops its temporary server at the interpreter's exit (atexit), which a killed command
(SIGKILL, the OOM killer, a job scheduler's timeout) never reaches: the server, its SQLite database
and its port would outlive it. A small watcher process started beside it ends it then.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"  # Prefect's own setting
DEFAULT_STARTUP_TIMEOUT_S = 600
PROGRESS_EVERY_S = 15.0

log = logging.getLogger("discover")

# Run as `python -c WATCH <our pid> <server pid>`: waits (on pidfds: no pid reuse) until this command or
# the server ends, then ends the server (SIGTERM, as Prefect's own stop does). Ctrl-C reaches the whole
# foreground process group: the watcher ignores it and goes on watching.
WATCH = """
import os, select, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
server = os.pidfd_open(int(sys.argv[2]))
try:
    us = os.pidfd_open(int(sys.argv[1]))
except ProcessLookupError:
    us = None
if us is not None:
    select.select([us, server], [], [])
try:
    signal.pidfd_send_signal(server, signal.SIGTERM)
except ProcessLookupError:
    pass
"""


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
    if server.server_process is not None:
        stop_with_this_process(server.server_process.pid)
    log.info("%s ready at %s in %.0f s", what, server.api_url, seconds)
    return server.api_url


def stop_with_this_process(pid: int) -> subprocess.Popen | None:
    """Ends process `pid` (SIGTERM) when this process ends, however it ends (see WATCH); None where the
    kernel has no pidfds (Linux before 5.3, other systems): there only Prefect's exit handler stops it."""
    if not hasattr(os, "pidfd_open"):
        return None
    return subprocess.Popen(
        [sys.executable, "-c", WATCH, str(os.getpid()), str(pid)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True
    )
