"""The process backend: each candidate runs in a fresh Python process under rlimits and a cgroup.

Per run: a new temp directory (0700; the run's uid's when we are root; deleted afterwards) holding
candidate.py, input.json and job.json; `harness.py` loads the candidate, calls `entry(argument)`
and writes the value to output.json. The process gets its own process group, a clean environment,
rlimits (set by the harness before any candidate code runs), umask 077, no POSIX message queues
(RLIMIT_MSGQUEUE 0), an import path without the project's own source (`python -S` and the job's
`sys_path`: an editable install's .pth file never runs) and a wall-clock timeout after which the
whole tree is SIGKILLed.

The whole process tree is bounded by a cgroup made for the run (evaluators/sandbox/cgroups.py):
memory (no swap) = `memory_mb` for the tree together, tasks = `max_processes`, CPU quota =
`cpus`. The harness joins it before it drops privileges, so every process the candidate starts
is born inside; an out-of-memory kill anywhere in it fails the run ("memory limit ... exceeded
by the process tree"), and afterwards the group is killed as a whole and removed. Where no
cgroup can be made (no cgroup filesystem we may write: a normal user without a delegated
cgroup v2, see `DISCOVER_CGROUP_PARENT`), the backend refuses to start (UnboundedProcessTree,
one line naming the fix) unless `allow_unbounded_process_tree` (the configuration's
sandbox.allow_unbounded_process_tree) is set; then it warns once and bounds each process alone.

When we run as root (CI, containers), each run gets its own unprivileged uid/gid, picked at random
from a range no account uses: the harness drops to it before the candidate runs. Then
RLIMIT_NPROC binds (the uid has no other tasks), root-only files are unreadable, the candidate
cannot signal our processes, and after the run every process of that uid is killed, wherever
it went (no marker needed), and what the uid left is removed: its files in /tmp, /var/tmp,
/run/lock and /dev/shm, its System V IPC objects and POSIX message queues (reaping.remove_owned),
and its user and user-session keyrings are cleared (a uid that still owns keys is never handed out
again: reaping.acquire_run_uid). The harness also joins a new anonymous session keyring as the uid,
so a candidate's @s is its own. Evaluations running at once are told apart this way: another run's
directory is another uid's and 0700, and each run's cgroup has a CPU quota (`cpu_quota_missing`
says when the machine allows none; docs/sandbox.md, "Evaluations running at the same time").

Every candidate is isolated by the operating system first (evaluators/sandbox/isolation.py; the
harness calls it): as root, new mount, network, IPC, UTS and PID namespaces with a read-only host,
a fresh tmpfs on /tmp, /var/tmp, /dev/shm and /run/lock, the run's directory bound at its path and
a passwd entry for its uid; Landlock (execve of the interpreter, the toolchain and its own files
only) and a seccomp deny-list (built by libseccomp) for everyone. What the kernel lacks is found
once (`isolation()`, a probe in a fresh process) and said once (`isolation_missing`).

What this backend does NOT isolate (use the docker backend for untrusted models):
- reading: the candidate can read every world-readable file (this repository and its evaluators
  included, though it cannot import them) and, as a normal user, everything we can read;
- the kernel: it is shared (seccomp is a deny-list), and so are timing side channels;
- as a normal user (no namespaces): the network, world-writable places such as /tmp (nothing it
  wrote outside its run directory is removed afterwards), other processes (those that leave the
  process group are found by the cgroup, or without one only by an environment marker); RLIMIT_NPROC
  counts all of our tasks; System V IPC objects are not removed;
- without a cgroup (only when allowed): memory is bounded per process (RLIMIT_AS), not for the tree;
- disk: RLIMIT_FSIZE caps each file, the tmpfs sizes the scratch filesystems, not the run directory.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from evaluators.sandbox.base import DATA_ENV, BackendRefused, SandboxLimits, SandboxResult, tmpfs_mb
from evaluators.sandbox.cgroups import Layout, RunCgroup, available, cpu_quota_missing
from evaluators.sandbox.isolation import EXTRA_TASKS
from evaluators.sandbox.reaping import (
    MARKER_VAR,
    acquire_run_uid,
    candidate_sys_path,
    keyctl_number,
    kill_group,
    kill_marked,
    kill_uid,
    nproc_limit,
    release_run_uid,
    remove_owned,
    remove_tree,
    wait_unreaped,
)
from evaluators.sandbox.run_outputs import failure_reason, read_logs, read_output

HARNESS = Path(__file__).with_name("harness.py")
ALLOW_ENV = "DISCOVER_ALLOW_UNBOUNDED_PROCESS_TREE"  # "1": the config switch, for processes that read no config
EXIT_NO_CGROUP = 5  # harness.py: it could not join the run's cgroup (the candidate never ran)
EXIT_NO_ISOLATION = 6  # harness.py: it could not isolate the candidate (ISOLATION_FAILED says why)
ISOLATION_FAILED = "isolation-failed"
log = logging.getLogger(__name__)
_warned = threading.Event()
_warned_cpu = threading.Event()
_warned_isolation = threading.Event()
_isolation_lock = threading.Lock()
_isolation: tuple[dict[str, Any], dict[str, str]] | None = None


def isolation() -> tuple[dict[str, Any], dict[str, str]]:
    """(what every run's isolation spec shares, {mechanism: why it is missing here}), found once per
    process: namespaces (root only), Landlock and seccomp are each tried on a child that exits at
    once (isolation.probe, in a fresh process). The shared part: "namespaces" (bool), "seccomp" (the
    filter's BPF, base64, or None), "landlock" (bool), "python_tools" (isolation.python_tools)."""
    global _isolation
    with _isolation_lock:
        if _isolation is None:
            _isolation = _find_isolation()
        return _isolation


def _find_isolation() -> tuple[dict[str, Any], dict[str, str]]:
    from evaluators.sandbox import isolation as iso

    missing: dict[str, str] = {}
    try:
        bpf: str | None = base64.b64encode(iso.seccomp_filter()).decode()
    except (ImportError, OSError, RuntimeError, ValueError) as err:  # no libseccomp.so.2 for pyseccomp to load
        bpf, missing["seccomp"] = None, f"the seccomp filter cannot be built ({err}): install libseccomp2 (libseccomp.so.2)"
    root = os.geteuid() == 0
    if not root:
        missing["namespaces"] = "not root: namespaces and mounts need CAP_SYS_ADMIN"
    trial = {
        "namespaces": root,
        "tmpfs_mb": 16,
        "binds": [],
        "user": {"uid": 65534, "gid": 65534, "home": "/"},
        "exec": iso.python_tools(),
        "seccomp": bpf,
    }
    try:
        out = subprocess.run(
            [sys.executable, "-I", "-S", iso.__file__, json.dumps(trial)], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        found = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as err:
        found = {name: f"the probe failed: {err}" for name in ("namespaces", "landlock", "seccomp")}
    for name, why in found.items():
        missing.setdefault(name, why)  # the reasons found above stay
    shared = {
        "namespaces": "namespaces" not in missing,
        "seccomp": bpf if "seccomp" not in missing else None,
        "landlock": "landlock" not in missing,
        "python_tools": trial["exec"],  # what a Python run may execute besides its own files
    }
    return shared, missing


class UnboundedProcessTree(BackendRefused):
    """The process backend cannot bound a candidate's process tree here and was not allowed to run
    without that bound (sandbox.allow_unbounded_process_tree)."""


def tree_bound() -> tuple[Layout | None, str]:
    """(layout, "") when the process backend can bound a whole process tree here, else (None, why)."""
    return available()


def check_tree_bound(allow_unbounded: bool) -> Layout | None:
    """The cgroup layout runs are bounded with; None when there is none and that was allowed (a
    warning, once per process); UnboundedProcessTree when there is none and it was not."""
    layout, why = tree_bound()
    if layout is not None:
        return layout
    if not allow_unbounded:
        raise UnboundedProcessTree(unbounded_message(why))
    if not _warned.is_set():
        _warned.set()
        log.warning(
            "process sandbox: %s, so a candidate's process tree is bounded only per process (rlimits), "
            "not in total (sandbox.allow_unbounded_process_tree is set)",
            why,
        )
    return None


def unbounded_message(why: str) -> str:
    return (
        f"the process sandbox cannot bound a candidate's process tree here ({why}); "
        "use sandbox.backend: docker or set sandbox.allow_unbounded_process_tree: true"
    )


def allow_from_env() -> bool:
    return os.environ.get(ALLOW_ENV, "") == "1"


class ProcessSandbox:
    """Runs untrusted Python in a subprocess with rlimits, a cgroup around its whole process tree
    where the machine allows one, and a kill of everything it started at the end.

    `allow_unbounded_process_tree` (default: the environment variable DISCOVER_ALLOW_UNBOUNDED_PROCESS_TREE
    is "1") lets it run where no cgroup can be made, with rlimits alone; otherwise it refuses
    (`UnboundedProcessTree`) when it is made.
    """

    name = "process"

    def __init__(self, allow_unbounded_process_tree: bool | None = None):
        if allow_unbounded_process_tree is None:
            allow_unbounded_process_tree = allow_from_env()
        self.allow_unbounded_process_tree = bool(allow_unbounded_process_tree)
        self.layout = check_tree_bound(self.allow_unbounded_process_tree)
        # "" when every run (and every case of a compiled program) gets a CPU quota, else why not
        self.cpu_quota_missing = cpu_quota_missing(self.layout) if self.layout is not None else "there is no cgroup"
        if self.layout is not None and self.cpu_quota_missing and not _warned_cpu.is_set():
            _warned_cpu.set()
            log.warning(
                "process sandbox: %s: a candidate spinning on every core can slow evaluations running beside it",
                self.cpu_quota_missing,
            )
        # {mechanism: why not} for namespaces, landlock and seccomp: what runs here go without
        self.isolation, self.isolation_missing = isolation()
        if self.isolation_missing and not _warned_isolation.is_set():
            _warned_isolation.set()
            log.warning(
                "process sandbox: candidates run without %s (docs/sandbox.md, Process, says what that leaves open)",
                "; ".join(f"{name}: {why}" for name, why in sorted(self.isolation_missing.items())),
            )

    def run(
        self,
        program: str,
        entry: str,
        argument: Any,
        limits: SandboxLimits,
        data_dir: Path | None = None,
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

        isolation = self.isolation if (self.isolation["namespaces"] or self.isolation["landlock"] or self.isolation["seccomp"]) else None
        return run_program(lambda slot: LocalSession(slot, limits, self.layout, isolation), source, cases, limits, on_case)

    def _run_in(
        self,
        workdir: Path,
        program: str,
        entry: str,
        argument: Any,
        limits: SandboxLimits,
        data_dir: Path | None,
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
            # the interpreter's import path without the project's own source (python -S: no .pth)
            "sys_path": candidate_sys_path(),
        }
        uid = acquire_run_uid()
        group = None
        try:
            if self.layout is not None:
                # the candidate's tasks, and the waiter and init of its PID namespace (isolation.py)
                tasks = limits.max_processes + (EXTRA_TASKS if self.isolation["namespaces"] else 0)
                group = RunCgroup(self.layout, limits.memory_mb, tasks, cpus=max(1, limits.cpus))
                job["cgroup_procs"] = group.procs_files  # the harness joins it before dropping to `uid`
            if uid is not None:
                job["uid"] = job["gid"] = uid
                job["keyctl"] = keyctl_number()  # a session keyring of its own (harness.py)
                for path in (workdir, *workdir.iterdir()):
                    os.chown(path, uid, uid)
            job["isolation"] = self._isolation_spec(workdir, limits, uid, data_dir)
            (workdir / "job.json").write_text(json.dumps(job), encoding="utf-8")
            return self._spawn(workdir, limits, uid, data_dir, device, group)
        finally:
            if group is not None:
                group.remove()
            if uid is not None:
                kill_uid(uid)
                remove_owned(uid)  # its files in /tmp, /var/tmp, /run/lock, /dev/shm; its IPC objects
                release_run_uid(uid)

    def _isolation_spec(self, workdir: Path, limits: SandboxLimits, uid: int | None, data_dir: Path | None) -> dict[str, Any] | None:
        """What harness.py's isolation does for this run (evaluators/sandbox/isolation.py)."""
        from evaluators.sandbox import isolation as iso

        shared = self.isolation
        if not (shared["namespaces"] or shared["landlock"] or shared["seccomp"]):
            return None
        binds = [[str(workdir), True]] + ([[str(Path(data_dir).resolve()), False]] if data_dir is not None else [])
        if shared["namespaces"]:  # the interpreter and its import path, should they live under /tmp
            interpreter = [os.path.dirname(os.path.realpath(sys.executable)), sys.prefix, sys.base_prefix]
            binds += [[path, False] for path in iso.hidden_by_scratch([*candidate_sys_path(), *interpreter])]
        private = [str(workdir), *iso.SCRATCH] if shared["namespaces"] else [str(workdir)]
        return {
            "namespaces": shared["namespaces"],
            "tmpfs_mb": tmpfs_mb(limits),
            "binds": binds,
            "user": {"uid": uid, "gid": uid, "home": str(workdir)} if uid is not None else None,
            "exec": shared["python_tools"] + private if shared["landlock"] else None,
            "seccomp": shared["seccomp"],
        }

    def _spawn(
        self,
        workdir: Path,
        limits: SandboxLimits,
        uid: int | None,
        data_dir: Path | None,
        device: str | None = None,
        group: RunCgroup | None = None,
    ) -> SandboxResult:
        token = secrets.token_hex(16)
        cap = int(limits.max_output_bytes)

        with open(workdir / "stdout.txt", "w+b") as out, open(workdir / "stderr.txt", "w+b") as err:
            # Not `-I`: it implies -E, which would drop PYTHONHASHSEED. -S: no site module, so no
            # .pth file (an editable install's) puts the project on the path; the harness sets
            # sys.path from the job (site-packages kept: numpy, scipy). -s -B -P plus a clean
            # environment do the rest.
            cmd = [sys.executable, "-S", "-s", "-B", "-P", str(HARNESS), "job.json"]
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
            if group is not None:
                group.kill()  # the whole tree, wherever its processes went
            if uid is not None:
                kill_uid(uid)  # everything the run started, wherever it went
            else:
                kill_marked(token)
            returncode = proc.wait()
            logs, last_err_line = read_logs(out, err, cap)

        if timed_out:
            return SandboxResult(ok=False, reason=f"timeout after {limits.timeout_s:g} s", logs=logs)
        if group is not None and group.oom_kills():  # whoever was killed, the tree went over
            return SandboxResult(
                ok=False,
                logs=logs,
                reason=f"memory limit ({limits.memory_mb} MB) exceeded by the process tree: the out-of-memory killer fired",
            )
        if returncode == EXIT_NO_ISOLATION:
            why = _isolation_failure(workdir)
            if why is not None:  # written by root before any candidate code ran: ours to fix
                raise RuntimeError(f"the process sandbox could not isolate the candidate: {why}")
        if returncode == EXIT_NO_CGROUP and group is not None and not group.cpu_s():
            # nothing ever ran in the group (a candidate that exits with 5 itself did): ours to fix
            raise RuntimeError(f"the process sandbox could not move the candidate into its cgroup: {last_err_line}")
        if returncode == 0:
            output, reason = read_output(workdir / "output.json", cap)
            return SandboxResult(ok=not reason, output=output, reason=reason, logs=logs)
        return SandboxResult(ok=False, reason=failure_reason(returncode, last_err_line, limits), logs=logs)


def _isolation_failure(workdir: Path) -> str | None:
    """Why harness.py could not isolate the run, when root wrote it (a candidate, another uid, cannot
    forge a root-owned file); None otherwise (then an exit status 6 is the candidate's own)."""
    path = workdir / ISOLATION_FAILED
    try:
        if os.geteuid() != 0 or path.lstat().st_uid != 0:
            return None
        return path.read_text(encoding="utf-8", errors="replace")[:500]
    except OSError:
        return None


def _thread_env(limits: SandboxLimits) -> dict[str, str]:
    """Thread-count variables of numeric libraries, set to `limits.cpus`."""
    n = str(max(1, int(limits.cpus)))
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
    return {name: n for name in names}


def _clean_env(workdir: Path, limits: SandboxLimits, token: str, data_dir: Path | None = None, device: str | None = None) -> dict[str, str]:
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
