"""The process backend: each candidate runs in a fresh Python process under rlimits.

Per run: a new temp directory (deleted afterwards) holding candidate.py, input.json and job.json;
`harness.py` loads the candidate, calls `entry(argument)` and writes the value to output.json.
The process gets its own process group, a clean environment, rlimits (set by the harness before
any candidate code runs) and a wall-clock timeout after which the whole group is SIGKILLed.

When we run as root (CI, containers), each run gets its own unprivileged uid/gid, picked at random
from a range no account uses: the harness drops to it before the candidate runs. Then
RLIMIT_NPROC binds (the uid has no other tasks), root-only files are unreadable, the candidate
cannot signal our processes, and after the run every process of that uid is killed, wherever
it went (no marker needed).

What this backend does NOT isolate (use the docker backend for untrusted models):
- the filesystem: as a normal user the candidate can read and write whatever we can; as root
  (dropped uid) it can still read world-readable files and write world-writable places (/tmp);
- the network: sockets are not blocked;
- as a normal user: processes that leave the process group (setsid) are found only by an
  environment marker (`/proc/*/environ`), which a process that re-execs itself with a cleaned
  environment evades (RLIMIT_CPU still kills them), and RLIMIT_NPROC counts all of our tasks;
- memory: RLIMIT_AS limits address space per process, not the real memory of the process tree;
- CPU count: `limits.cpus` only sets the thread variables of numeric libraries;
- disk: RLIMIT_FSIZE caps each file, not the number of files;
- the kernel: no namespaces, no seccomp.
"""

from __future__ import annotations

import errno
import json
import math
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from evaluators.sandbox.base import DATA_ENV, SandboxLimits, SandboxResult

HARNESS = Path(__file__).with_name("harness.py")
MARKER_VAR = "DISCOVER_SANDBOX_RUN"  # env marker used to find processes that left the group
_EXIT_NO_ENTRY, _EXIT_BAD_VALUE = 3, 4  # harness.py's exit codes whose stderr line is the reason
# Run uids used when we are root: far above any account (and below the 32-bit overflow ids).
RUN_UID_BASE, RUN_UID_SPAN = 1_500_000_000, 1 << 24
_uids_in_use: set[int] = set()
_uids_lock = threading.Lock()


class ProcessSandbox:
    """Runs untrusted Python in a subprocess with rlimits and a process-group kill on timeout."""

    name = "process"

    def run(
        self, program: str, entry: str, argument: Any, limits: SandboxLimits, data_dir: Path | None = None,
        device: str | None = None,
    ) -> SandboxResult:
        start = time.monotonic()
        if data_dir is not None and not Path(data_dir).is_dir():
            raise FileNotFoundError(f"the sandbox's data directory {data_dir} does not exist")
        workdir = tempfile.mkdtemp(prefix="discover-sandbox-")
        try:
            result = self._run_in(Path(workdir), program, entry, argument, limits, data_dir, device)
        finally:
            _remove_tree(workdir)
        return SandboxResult(
            ok=result.ok,
            output=result.output,
            reason=result.reason,
            logs=result.logs,
            duration_s=time.monotonic() - start,
        )

    def run_native(self, source: str, cases, limits, on_case=None):
        """Compile a C++ program once and run it on each case (evaluators/sandbox/native.py)."""
        from evaluators.sandbox.native import LocalSession, run_program

        return run_program(lambda slot: LocalSession(slot, limits), source, cases, limits, on_case)

    def _run_in(
        self, workdir: Path, program: str, entry: str, argument: Any, limits: SandboxLimits, data_dir: Path | None,
        device: str | None = None,
    ) -> SandboxResult:
        (workdir / "candidate.py").write_text(program, encoding="utf-8")
        (workdir / "input.json").write_text(json.dumps(argument, allow_nan=True), encoding="utf-8")
        job = {
            "entry": entry,
            "memory_mb": int(limits.memory_mb),
            # CPU seconds add up over threads, so allow timeout x cpus; this mainly stops
            # processes that escaped the group from spinning forever.
            "cpu_s": math.ceil(limits.timeout_s * max(1, limits.cpus)) + 5,
            "fsize_mb": int(limits.max_file_mb),
            "nproc": _nproc_limit(limits.max_processes),
            "address_space": bool(limits.limit_address_space),
        }
        uid = _acquire_run_uid()
        try:
            if uid is not None:
                job["uid"] = job["gid"] = uid
                for path in (workdir, *workdir.iterdir()):
                    os.chown(path, uid, uid)
            (workdir / "job.json").write_text(json.dumps(job), encoding="utf-8")
            return self._spawn(workdir, limits, uid, data_dir, device)
        finally:
            if uid is not None:
                _kill_uid(uid)
                _release_run_uid(uid)

    def _spawn(
        self, workdir: Path, limits: SandboxLimits, uid: int | None, data_dir: Path | None, device: str | None = None
    ) -> SandboxResult:
        token = secrets.token_hex(16)
        cap = int(limits.max_output_bytes)

        with open(workdir / "stdout.txt", "w+b") as out, open(workdir / "stderr.txt", "w+b") as err:
            # Not `-I`: it implies -E, which would drop PYTHONHASHSEED. -s -B -P plus a clean
            # environment give the same isolation; site-packages stay importable (numpy, scipy).
            cmd = [sys.executable, "-s", "-B", "-P", str(HARNESS), "job.json"]
            try:
                proc = subprocess.Popen(
                    cmd,
                    cwd=workdir,
                    env=_clean_env(workdir, limits, token, data_dir, device),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # own session and process group: pgid == pid
                    close_fds=True,
                )
            except OSError as e:
                return SandboxResult(ok=False, reason=f"could not start the sandbox: {e}")
            timed_out = not _wait_unreaped(proc.pid, limits.timeout_s)
            # Kill the whole group while the (unreaped) leader still pins its pgid, which also
            # removes background children left behind after a normal exit.
            _kill_group(proc.pid)
            if uid is not None:
                _kill_uid(uid)  # everything the run started, wherever it went
            else:
                _kill_marked(token)
            returncode = proc.wait()
            logs, last_err_line = _read_logs(out, err, cap)

        if timed_out:
            return SandboxResult(ok=False, reason=f"timeout after {limits.timeout_s:g} s", logs=logs)
        if returncode == 0:
            output, reason = _read_output(workdir / "output.json", cap)
            return SandboxResult(ok=not reason, output=output, reason=reason, logs=logs)
        return SandboxResult(ok=False, reason=_failure_reason(returncode, last_err_line, limits), logs=logs)


def _thread_env(limits: SandboxLimits) -> dict[str, str]:
    """Thread-count variables of numeric libraries, set to `limits.cpus`."""
    n = str(max(1, int(limits.cpus)))
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
    return {name: n for name in names}


def _clean_env(
    workdir: Path, limits: SandboxLimits, token: str, data_dir: Path | None = None, device: str | None = None
) -> dict[str, str]:
    """Nothing inherited from the parent environment (no API keys, no tokens).

    The process backend cannot mount: a data directory is shown by its absolute path and must be
    readable by the run's uid (the problem keeps it world-readable and keeps nothing secret in it).
    A `device` shows the run that GPU alone ("cpu": none) through CUDA_VISIBLE_DEVICES.
    """
    data = {DATA_ENV: str(Path(data_dir).resolve())} if data_dir is not None else {}
    if device is not None:
        data["CUDA_VISIBLE_DEVICES"] = "" if device == "cpu" else str(device)
    return {
        **data,
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        MARKER_VAR: token,
        **_thread_env(limits),
    }


def _acquire_run_uid() -> int | None:
    """A fresh unprivileged uid for one run when we are root, else None (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    with _uids_lock:
        while True:
            uid = RUN_UID_BASE + secrets.randbelow(RUN_UID_SPAN)
            if uid not in _uids_in_use and not _uid_pids(uid):
                _uids_in_use.add(uid)
                return uid


def _release_run_uid(uid: int) -> None:
    with _uids_lock:
        _uids_in_use.discard(uid)


def _uid_pids(uid: int) -> list[int]:
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


def _kill_uid(uid: int, rounds: int = 50) -> None:
    """SIGKILL every process of `uid` until none is left (a fork bomb is capped by RLIMIT_NPROC)."""
    for _ in range(rounds):
        pids = _uid_pids(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)


def _nproc_limit(max_processes: int) -> int:
    """RLIMIT_NPROC for the candidate.

    The kernel counts all tasks (processes and threads) of the real user against this limit and
    does not enforce it for root; for other users, add the tasks they already run so a busy
    parent (Prefect, torch threads) does not leave the candidate unable to start threads.
    """
    uid = os.getuid()
    if uid == 0:
        return int(max_processes)
    return int(max_processes) + _user_task_count(uid)


def _user_task_count(uid: int) -> int:
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


def _wait_unreaped(pid: int, timeout_s: float) -> bool:
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


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:  # a member changed its uid; nothing more we can do
        pass


def _kill_marked(token: str, rounds: int = 3) -> None:
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


def _tail(f: BinaryIO, cap: int) -> tuple[bytes, bool]:
    """The last `cap` bytes of an open file, and whether anything was cut."""
    size = os.fstat(f.fileno()).st_size
    f.seek(max(0, size - cap))
    return f.read(cap), size > cap


def _read_logs(out: BinaryIO, err: BinaryIO, cap: int) -> tuple[str, str]:
    """stdout then stderr, together at most `cap` characters (stderr keeps at least half)."""
    out_b, out_cut = _tail(out, cap)
    err_b, err_cut = _tail(err, cap)
    return _compose_logs(out_b, out_cut, err_b, err_cut, cap)


def _compose_logs(out_b: bytes, out_cut: bool, err_b: bytes, err_cut: bool, cap: int) -> tuple[str, str]:
    """Logs from the tails of stdout and stderr (shared with the docker backend)."""
    keep_err = min(len(err_b), max(cap // 2, cap - len(out_b)))
    err_b = err_b[len(err_b) - keep_err :]
    keep_out = min(len(out_b), cap - keep_err)
    out_cut = out_cut or keep_out < len(out_b)
    out_b = out_b[len(out_b) - keep_out :]
    out_s = out_b.decode("utf-8", errors="replace")
    err_s = err_b.decode("utf-8", errors="replace")
    logs = out_s + ("\n" if out_s and err_s and not out_s.endswith("\n") else "") + err_s
    if out_cut or err_cut:
        logs = "[output truncated]\n" + logs
    logs = logs[-cap:] if cap > 0 else ""
    lines = [line.strip() for line in err_s.splitlines() if line.strip()]
    return logs, (lines[-1][:500] if lines else "")


def _read_output(path: Path, cap: int) -> tuple[Any, str]:
    """(value, "") or (None, reason). Refuses links, pipes and files over `cap` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, "program exited without returning a value (no output.json)"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None, "output.json is a symbolic link"
        return None, f"could not read the return value: {e}"
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "output.json is not a regular file"
        if st.st_size > cap:
            return None, f"return value too large: {st.st_size} bytes > max_output_bytes={cap}"
        data = f.read(cap + 1)
    return _parse_output(data, cap)


def _parse_output(data: bytes, cap: int) -> tuple[Any, str]:
    """(value, "") or (None, reason) from output.json's bytes (shared with the docker backend)."""
    if len(data) > cap:
        return None, f"return value too large: over max_output_bytes={cap}"
    try:
        return json.loads(data.decode("utf-8")), ""  # NaN/Infinity decode to floats
    except (ValueError, RecursionError) as e:
        return None, f"return value is not valid JSON: {str(e)[:200]}"


def _failure_reason(returncode: int, last_err_line: str, limits: SandboxLimits) -> str:
    if returncode < 0:
        sig = -returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        if sig == signal.SIGXCPU:
            return f"killed by signal {name}: CPU time limit exceeded"
        if sig == signal.SIGXFSZ:
            return f"killed by signal {name}: file size limit ({limits.max_file_mb} MB) exceeded"
        if sig in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS):
            return f"killed by signal {name} (possibly the memory limit of {limits.memory_mb} MB)"
        return f"killed by signal {name}"
    if returncode in (_EXIT_NO_ENTRY, _EXIT_BAD_VALUE) and last_err_line:
        return last_err_line
    reason = f"exit code {returncode}" + (f": {last_err_line}" if last_err_line else "")
    if "MemoryError" in last_err_line:
        return f"memory limit ({limits.memory_mb} MB) exceeded: {reason}"
    return reason


def _remove_tree(path: str) -> None:
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
