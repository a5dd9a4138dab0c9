"""A run directory's one writer: the lease RUN_DIR/writer.lock (docs/runs.md, "One writer").

The lease is an exclusive `flock` on that file, held by an open descriptor for as long as the
process works on the run. The operating system releases it when the process ends, however it ends
(SIGKILL, the OOM killer, a machine that reboots), so a crash never leaves a stale lease and resume
after a crash needs no command; no heartbeat, clock or timeout decides who the writer is. On NFSv4
Linux turns `flock` into a lock of the server's lock manager, which the server releases when the
client's lease lapses (about 90 s); on a file system without working locks (some FUSE mounts) the
lock cannot be taken and the run refuses to start rather than run without it.

While it holds the lease the writer keeps its identity in the file (host, pid, flow run, since when),
so a second process names the holder when it refuses. The descriptor is not inherited by programs
the writer starts (close-on-exec). A child forked without exec (multiprocessing's `fork`) shares
it and keeps the lease while it lives, which the message says when the named pid is gone.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LEASE_FILE = "writer.lock"
WRITERS_LOG = "writers.jsonl"  # one line per process that asked for the lease, and what it got
POLL_S = 1.0


class RunBusy(RuntimeError):
    """The run directory has a live writer; `holder` is what it wrote of itself."""

    def __init__(self, message: str, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.holder = holder


@dataclass
class Lease:
    """A held lease; `release()` (or leaving the `with` block) gives it up."""

    path: Path
    holder: dict[str, Any]
    _fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # nobody holds it now
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def this_process(**extra: Any) -> dict[str, Any]:
    """The identity a writer records: host, pid, start time and whatever the caller adds (flow run)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time(), **extra}


def read_holder(root: Path) -> dict[str, Any]:
    """What the current holder wrote of itself ({} when nobody holds it or it is still writing)."""
    try:
        text = (Path(root) / LEASE_FILE).read_text()
        return json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}


def describe(holder: dict[str, Any]) -> str:
    """The holder in words: 'pid 123 on host-a (flow run brave-cat 0f3c..., since 10:02:11 UTC)'."""
    if not holder:
        return "another process (it has not written its name yet)"
    where = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
    details = []
    if holder.get("flow_run_name") or holder.get("flow_run_id"):
        details.append(f"flow run {holder.get('flow_run_name', '')} {holder.get('flow_run_id', '')}".replace("  ", " ").strip())
    if holder.get("command"):
        details.append(str(holder["command"]))
    if holder.get("since"):
        details.append("since " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(holder["since"]))))
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int) and not _alive(holder["pid"]):
        details.append("that pid has exited; a child process it forked still holds the lock")
    return where + (f" ({', '.join(details)})" if details else "")


def acquire(root: Path, holder: dict[str, Any], wait_s: float = 0.0, on_wait: Callable[[dict[str, Any]], None] | None = None) -> Lease:
    """Take the lease of run directory `root` for `holder` (`this_process(...)`), waiting up to
    `wait_s` seconds for a live holder to let go (`on_wait(holder)` once, when it starts waiting);
    RunBusy naming the holder when it does not."""
    path = Path(root) / LEASE_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline, told = time.monotonic() + wait_s, False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as err:
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise RunBusy(
                        f"cannot lock {path} ({err.strerror}): the file system of {root} does not support locks, "
                        "and a run is never worked on without its lease; put the run directory on a local disk or NFSv4",
                        {},
                    ) from None
            current = read_holder(root)
            if time.monotonic() >= deadline:
                raise RunBusy(
                    f"{root} is being worked on by {describe(current)}; a run directory has one writer at a time. "
                    f"Wait for it to finish or stop it (cancel its flow run, or kill that process), then resume",
                    current,
                )
            if on_wait is not None and not told:
                on_wait(current)
                told = True
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder, sort_keys=True) + "\n").encode(), 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    return Lease(path, holder, fd)


def record_writer(root: Path, holder: dict[str, Any], outcome: str) -> None:
    """Append who asked for the run's lease and what came of it ("writer", "refused", "duplicate")
    to RUN_DIR/writers.jsonl: the run's history of writers, one line each (appends of one short line
    with O_APPEND do not interleave)."""
    line = json.dumps({**holder, "outcome": outcome, "at": time.time()}, sort_keys=True) + "\n"
    fd = os.open(Path(root) / WRITERS_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_writers(root: Path) -> list[dict[str, Any]]:
    path = Path(root) / WRITERS_LOG
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
