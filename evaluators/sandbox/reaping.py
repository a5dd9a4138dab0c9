"""Processes and directories of sandboxed runs: the uid each run gets when we are root, waiting
for and killing a run's process group, and deleting a run directory the candidate made unwritable.

Each run (and each slot of a compiled program) gets its own unprivileged uid when we are root
(`acquire_run_uid`), so that one run's candidate is never another's user, RLIMIT_NPROC counts its
tasks alone, and it cannot signal ours. Inside a bubblewrap sandbox nothing of a run outlives its
PID namespace; `kill_uid` stays for the runs without one (sandbox.isolation: none, Docker's runner).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable

# Run uids used when we are root: far above any account (and below the 32-bit overflow ids).
RUN_UID_BASE, RUN_UID_SPAN = 1_500_000_000, 1 << 24
_uids_in_use: set[int] = set()
_uids_lock = threading.Lock()


def acquire_run_uid() -> int | None:
    """A fresh unprivileged uid for one run when we are root, else None (run as ourselves); never
    one that runs a process."""
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
        sigkill(pids)
        time.sleep(0.005)


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


def wait_unstarved(
    pid: int, timeout_s: float, starved_cap_s: float, cpus: float = 1.0, counted: Callable[[], float | None] | None = None
) -> tuple[bool, float]:
    """Wait until `pid` exits without reaping it, for `timeout_s` of the time its process tree could
    run: at the deadline, the time the tree's tasks waited for a CPU while it got less than its
    `cpus` (`starved_deadline`; `counted()`: the CPU seconds of its cgroup so far) moves it later,
    up to `starved_cap_s` after the start. Returns (exited, s): `s` > 0 when it was stopped while
    still short of CPU (it waited `s` seconds): the host's load, not the program."""
    from evaluators.sandbox.native_runner import starved_deadline

    start = time.monotonic()
    deadline: float | None = start + timeout_s
    while deadline is not None:
        if wait_unreaped(pid, max(0.0, deadline - time.monotonic())):
            return True, 0.0
        deadline, starved_s = starved_deadline(pid, start, timeout_s, starved_cap_s, deadline, cpus, counted)
    return False, starved_s


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:  # a member changed its uid; nothing more we can do
        pass


def remove_tree(path: str) -> None:
    """Delete the run directory even if the candidate made parts of it unwritable (never changing
    anything outside it: the directory it sits in, /tmp, is left as it is)."""
    if not os.path.lexists(path):
        return
    root = os.path.abspath(path)

    def make_writable_and_retry(func, p, _exc):
        if os.path.abspath(p) == root and not os.path.lexists(p):
            return  # gone already; never touch the directory the tree sits in (/tmp)
        try:
            parent = os.path.abspath(os.path.dirname(p))
            if parent == root or parent.startswith(root + os.sep):
                os.chmod(parent, 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable_and_retry)
    if os.path.exists(path):
        shutil.rmtree(path, ignore_errors=True)


def candidate_sys_path() -> list[str]:
    """The import path a candidate's interpreter gets (started with -S, so no .pth file runs): ours,
    less the current directory and every directory that holds this project's source (its root, an
    editable install's entry: a directory with `evaluators/` or `discover/` packages), so that a
    candidate cannot import or patch the evaluators; the standard library and site-packages stay
    (numpy, scipy, torch), even when the virtual environment lives inside the project."""
    project = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    path = []
    for entry in sys.path:
        if not entry:
            continue
        real = os.path.realpath(entry)
        if real == project or any(os.path.isfile(os.path.join(real, pkg, "__init__.py")) for pkg in ("evaluators", "discover", "flows")):
            continue
        if os.path.exists(real):
            path.append(real)
    return path


def sigkill(pids: list[int] | set[int]) -> None:
    """SIGKILL each of `pids`; one already gone (or not ours to signal) is passed over."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
