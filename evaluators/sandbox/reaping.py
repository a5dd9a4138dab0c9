"""Finding and killing what a sandboxed run left behind, for the process and native backends.

When we run as root each run gets its own unprivileged uid (`acquire_run_uid`), so every process
of that uid can be killed after the run wherever it went (`kill_uid`); as a normal user, the run's
process group (`kill_group`) and an environment marker (`kill_marked`) find them. `remove_tree`
deletes a run directory the candidate made unwritable.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import threading
import time

MARKER_VAR = "DISCOVER_SANDBOX_RUN"  # env marker used to find processes that left the group
# Run uids used when we are root: far above any account (and below the 32-bit overflow ids).
RUN_UID_BASE, RUN_UID_SPAN = 1_500_000_000, 1 << 24
_uids_in_use: set[int] = set()
_uids_lock = threading.Lock()


def acquire_run_uid() -> int | None:
    """A fresh unprivileged uid for one run when we are root, else None (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    with _uids_lock:
        while True:
            uid = RUN_UID_BASE + secrets.randbelow(RUN_UID_SPAN)
            if uid not in _uids_in_use and not uid_pids(uid):
                _uids_in_use.add(uid)
                return uid


def release_run_uid(uid: int) -> None:
    with _uids_lock:
        _uids_in_use.discard(uid)


def uid_pids(uid: int) -> list[int]:
    """Processes (not zombies) whose real or effective uid is `uid`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as f:
                state = ""
                for line in f:
                    if line.startswith("State:"):
                        state = line.split()[1]
                    elif line.startswith("Uid:"):
                        real, effective = line.split()[1:3]
                        if state != "Z" and uid in (int(real), int(effective)):
                            found.append(int(entry.name))
                        break
        except (OSError, ValueError, IndexError):
            continue
    return found


def kill_uid(uid: int, rounds: int = 50) -> None:
    """SIGKILL every process of `uid` until none is left (a fork bomb is capped by RLIMIT_NPROC)."""
    for _ in range(rounds):
        pids = uid_pids(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)


def nproc_limit(max_processes: int) -> int:
    """RLIMIT_NPROC for the candidate.

    The kernel counts all tasks (processes and threads) of the real user against this limit and
    does not enforce it for root; for other users, add the tasks they already run so a busy
    parent (Prefect, torch threads) does not leave the candidate unable to start threads.
    """
    uid = os.getuid()
    if uid == 0:
        return int(max_processes)
    return int(max_processes) + user_task_count(uid)


def user_task_count(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("Threads:"):
                        count += int(line.split()[1])
                        break
        except (OSError, ValueError):
            continue
    return count


def wait_unreaped(pid: int, timeout_s: float) -> bool:
    """Wait until `pid` exits without reaping it; False when `timeout_s` passed first."""
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        if info is not None and info.si_pid == pid:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.02)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:  # a member changed its uid; nothing more we can do
        pass


def kill_marked(token: str, rounds: int = 3) -> None:
    """SIGKILL processes that left the group but still carry this run's environment marker."""
    marker = f"{MARKER_VAR}={token}".encode()
    me = os.getpid()
    for _ in range(rounds):
        found = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    environ = f.read()
            except OSError:
                continue
            if marker in environ.split(b"\0"):
                found = True
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                except OSError:
                    pass
        if not found:
            return
        time.sleep(0.01)


def remove_tree(path: str) -> None:
    """Delete the run directory even if the candidate made parts of it unwritable."""

    def make_writable_and_retry(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable_and_retry)
    if os.path.exists(path):
        shutil.rmtree(path, ignore_errors=True)
