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

import json
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from evaluators.sandbox.base import DATA_ENV, SandboxLimits, SandboxResult
from evaluators.sandbox.reaping import (
    MARKER_VAR,
    acquire_run_uid,
    kill_group,
    kill_marked,
    kill_uid,
    nproc_limit,
    release_run_uid,
    remove_tree,
    wait_unreaped,
)
from evaluators.sandbox.run_outputs import failure_reason, read_logs, read_output

HARNESS = Path(__file__).with_name("harness.py")


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
            remove_tree(workdir)
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
            "nproc": nproc_limit(limits.max_processes),
            "address_space": bool(limits.limit_address_space),
        }
        uid = acquire_run_uid()
        try:
            if uid is not None:
                job["uid"] = job["gid"] = uid
                for path in (workdir, *workdir.iterdir()):
                    os.chown(path, uid, uid)
            (workdir / "job.json").write_text(json.dumps(job), encoding="utf-8")
            return self._spawn(workdir, limits, uid, data_dir, device)
        finally:
            if uid is not None:
                kill_uid(uid)
                release_run_uid(uid)

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
            timed_out = not wait_unreaped(proc.pid, limits.timeout_s)
            # Kill the whole group while the (unreaped) leader still pins its pgid, which also
            # removes background children left behind after a normal exit.
            kill_group(proc.pid)
            if uid is not None:
                kill_uid(uid)  # everything the run started, wherever it went
            else:
                kill_marked(token)
            returncode = proc.wait()
            logs, last_err_line = read_logs(out, err, cap)

        if timed_out:
            return SandboxResult(ok=False, reason=f"timeout after {limits.timeout_s:g} s", logs=logs)
        if returncode == 0:
            output, reason = read_output(workdir / "output.json", cap)
            return SandboxResult(ok=not reason, output=output, reason=reason, logs=logs)
        return SandboxResult(ok=False, reason=failure_reason(returncode, last_err_line, limits), logs=logs)


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
