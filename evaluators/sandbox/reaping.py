"""Finding and killing what a sandboxed run left behind, for the process and native backends.

When we run as root each run gets its own unprivileged uid (`acquire_run_uid`), so every process
of that uid can be killed after the run wherever it went (`kill_uid`); as a normal user, the run's
process group (`kill_group`) and an environment marker (`kill_marked`) find them. `remove_tree`
deletes a run directory the candidate made unwritable.
"""

from __future__ import annotations

import logging
import os
import platform
import secrets
import shutil
import signal
import sys
import threading
import time

MARKER_VAR = "DISCOVER_SANDBOX_RUN"  # env marker used to find processes that left the group
# Run uids used when we are root: far above any account (and below the 32-bit overflow ids).
RUN_UID_BASE, RUN_UID_SPAN = 1_500_000_000, 1 << 24
_uids_in_use: set[int] = set()
_uids_lock = threading.Lock()
log = logging.getLogger(__name__)


def acquire_run_uid() -> int | None:
    """A fresh unprivileged uid for one run when we are root, else None (run as ourselves).

    Never one that runs a process or owns a kernel key (/proc/key-users): a user keyring outlives
    the uid's processes, and one a candidate locked against clearing (`clear_keyrings`) would
    otherwise be handed, with its keys, to a later candidate."""
    if os.geteuid() != 0:
        return None
    with _uids_lock:
        while True:
            uid = RUN_UID_BASE + secrets.randbelow(RUN_UID_SPAN)
            if uid not in _uids_in_use and not uid_pids(uid) and uid not in uids_with_keys():
                _uids_in_use.add(uid)
                return uid


def release_run_uid(uid: int) -> None:
    """After every process of `uid` is dead: clear its keyrings (they outlive it), free the uid."""
    # A run that never used keys owns one: the session keyring the harness or runner joined, freed
    # shortly after its last process (its uid is not handed out until then); more than one means
    # keyrings that outlive the run.
    if uids_with_keys().get(uid, 0) > 1:
        why = clear_keyrings(uid)
        if why:  # the uid keeps its keys and is never handed out again (acquire_run_uid)
            log.debug("uid %d retired: %s", uid, why)
    with _uids_lock:
        _uids_in_use.discard(uid)


# keyctl(2)'s system call number by machine (platform.machine()); None elsewhere: no keyrings used
KEYCTL_SYSCALL = {
    "x86_64": 250,
    "amd64": 250,
    "i386": 288,
    "i686": 288,
    "aarch64": 219,
    "arm64": 219,
    "riscv64": 219,
    "loongarch64": 219,
    "armv7l": 311,
    "armv6l": 311,
    "ppc64le": 271,
    "ppc64": 271,
    "s390x": 280,
}
KEY_USERS = "/proc/key-users"  # one line per uid that owns kernel keys (root sees every uid)


def keyctl_number() -> int | None:
    """keyctl's system call number here, or None (an architecture not in KEYCTL_SYSCALL)."""
    return KEYCTL_SYSCALL.get(platform.machine())


def uids_with_keys() -> dict[int, int]:
    """The uids that own kernel keys or keyrings now, each with how many (empty where the kernel
    has no keys). /proc/key-users: "<uid>: <usage> <nkeys>/<nikeys> <quota> ..."."""
    found = {}
    try:
        with open(KEY_USERS, encoding="ascii") as f:
            for line in f:
                head, _, rest = line.partition(":")
                fields = rest.split()
                if head.strip().isdigit() and len(fields) > 1:
                    found[int(head)] = int(fields[1].split("/")[0])
    except (OSError, ValueError):
        pass
    return found


# Run as root in a fresh interpreter (no fork of our threaded process): become the uid, join an
# anonymous session keyring of its own (ours is never touched), and, for each of its user and
# user-session keyrings (looking them up creates them: this runs only for a uid that owns keys),
# give the uid back write access (a candidate may have taken it away; it can also lock us out
# entirely, which acquire_run_uid's rule covers) and clear it.
_CLEAR_KEYRINGS = """
import ctypes, os, sys
uid, nr = int(sys.argv[1]), int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
def keyctl(*args):
    return libc.syscall(L(nr), *[a if a is None else L(a) for a in args])
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
if keyctl(1, None) < 0:  # KEYCTL_JOIN_SESSION_KEYRING, anonymous
    sys.exit("cannot join a session keyring: " + os.strerror(ctypes.get_errno()))
failed = []
for name, spec in (("user", -4), ("user session", -5)):  # KEY_SPEC_USER_KEYRING, _USER_SESSION_
    keyctl(5, spec, 0x3F3F0000)  # KEYCTL_SETPERM: possessor and user all
    if keyctl(7, spec) < 0:  # KEYCTL_CLEAR
        failed.append(name + " keyring: " + os.strerror(ctypes.get_errno()))
sys.exit("; ".join(failed) if failed else 0)
"""


def clear_keyrings(uid: int) -> str:
    """Root, after every process of `uid` is dead: clear the keyrings that outlive them (user and
    user-session), so that the keys' contents are gone; "" or why not. (The uid still owns the empty
    keyrings, so acquire_run_uid does not hand it out again.)"""
    nr = keyctl_number()
    if nr is None or os.geteuid() != 0:
        return f"keyrings not cleared: no keyctl number for {platform.machine()}" if nr is None else "not root"
    import subprocess

    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _CLEAR_KEYRINGS, str(uid), str(nr)],
            capture_output=True,
            timeout=30,
            check=False,
            env={"PATH": "/usr/bin:/bin"},
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"could not clear the keyrings of uid {uid}: {err}"
    if done.returncode != 0:
        return f"could not clear the keyrings of uid {uid}: {done.stderr.decode(errors='replace').strip()[-300:]}"
    return ""


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


# World-writable places a run's uid can leave files in (each checked only where it exists).
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/run/lock", "/var/lock", "/dev/shm", "/dev/mqueue")
SYSV_IPC = {"shm": "-m", "msg": "-q", "sem": "-s"}  # /proc/sysvipc/<kind> -> ipcrm's option


def owned_ipc(uid: int) -> list[tuple[str, int]]:
    """System V IPC objects (kind, id) that `uid` owns or created."""
    found = []
    for kind in SYSV_IPC:
        try:
            with open(f"/proc/sysvipc/{kind}", encoding="ascii") as f:
                header = f.readline().split()
                ident = header.index("shmid" if kind == "shm" else "msqid" if kind == "msg" else "semid")
                columns = [header.index("uid"), header.index("cuid")]
                for line in f:
                    fields = line.split()
                    if fields and any(int(fields[c]) == uid for c in columns):
                        found.append((kind, int(fields[ident])))
        except (OSError, ValueError, IndexError):
            continue
    return found


def remove_owned(uid: int, scratch: tuple[str, ...] = SCRATCH_DIRS) -> list[str]:
    """Root, after every process of `uid` is dead: delete what `uid` left in the world-writable
    directories (top-level entries it owns, whole), its System V IPC objects and its POSIX message
    queues (through a private mount of the mqueue filesystem when /dev/mqueue is not mounted).
    Nothing of `uid` runs any more, so no link can be swapped in under us. Returns what was removed."""
    removed = []
    for top in scratch:
        removed += _remove_owned_in(top, uid)
    if not os.path.ismount("/dev/mqueue"):
        removed += _remove_owned_queues(uid)
    for kind, ident in owned_ipc(uid):
        if _ipc_rmid(kind, ident):
            removed.append(f"sysvipc {kind} {ident}")
    return removed


def _remove_owned_in(top: str, uid: int) -> list[str]:
    removed = []
    try:
        entries = list(os.scandir(top))
    except OSError:
        return removed
    for entry in entries:
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            if entry.is_dir(follow_symlinks=False):
                remove_tree(entry.path)
            else:
                os.unlink(entry.path)
            removed.append(entry.path)
        except OSError:
            continue
    return removed


def _remove_owned_queues(uid: int) -> list[str]:
    """POSIX message queues of `uid`, seen through a mount of the mqueue filesystem of our IPC
    namespace in a private directory (root only; nothing is left mounted)."""
    import ctypes
    import tempfile

    if os.geteuid() != 0:
        return []
    libc = ctypes.CDLL(None, use_errno=True)
    point = tempfile.mkdtemp(prefix="discover-mqueue-")
    removed = []
    try:
        if libc.mount(b"mqueue", point.encode(), b"mqueue", 0, None) != 0:
            return removed
        try:
            removed = [p.replace(point, "mqueue:", 1) for p in _remove_owned_in(point, uid)]
        finally:
            libc.umount2(point.encode(), 2)  # MNT_DETACH
    finally:
        try:
            os.rmdir(point)
        except OSError:
            pass
    return removed


def _ipc_rmid(kind: str, ident: int) -> bool:
    import subprocess

    for tool in ("/usr/bin/ipcrm", "/bin/ipcrm"):
        if os.path.exists(tool):
            done = subprocess.run([tool, SYSV_IPC[kind], str(ident)], capture_output=True, check=False)
            return done.returncode == 0
    return False


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
