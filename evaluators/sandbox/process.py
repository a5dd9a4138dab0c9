"""The process backend: each candidate runs in a sandbox that bubblewrap builds on this machine.

Per run: a private host directory (0700, ours; deleted afterwards) holding the captured stdout and
stderr and the file its return value is written to, none of it in the candidate's view. The
candidate runs `harness.py` in a bubblewrap sandbox (evaluators/sandbox/bwrap.py) whose file system
is the minimal view of its problem (evaluators/sandbox/view.py: the interpreter, the packages its
problem allows, a fresh tmpfs as its working directory at /sandbox/work, the job's files read-only
at /sandbox, fresh /tmp, /var/tmp and /dev/shm); in new mount, PID, network, IPC and UTS namespaces;
as its own unprivileged uid when we are root (`reaping.acquire_run_uid`); under a seccomp allow-list
(evaluators/sandbox/syscalls.py, profile "python" or "gpu"); and inside a cgroup made for the run
(evaluators/sandbox/cgroups.py: memory without swap, tasks and a CPU quota for the whole tree,
joined before bubblewrap starts), with a wall-clock timeout after which the whole tree is killed.

Nothing the candidate can write decides how the host reads the run: the job's files are read-only
copies, its return value goes to a descriptor the host opened (`OUTPUT_FD`), and whether the
sandbox was set up is known only from the launcher's report on a socket the candidate never holds
(evaluators/sandbox/supervisor.py). A sandbox that cannot be set up raises InfrastructureError
naming what failed; a missing bubblewrap refuses the backend when it is made (IsolationUnavailable,
one line naming the fix). Running without isolation is asked for by name: `isolation="none"`
(sandbox.isolation: none), for trusted code only; every verdict's logs then say so.

Where no cgroup can be made (no cgroup filesystem we may write: a normal user without a delegated
cgroup v2, see `DISCOVER_CGROUP_PARENT`), the backend refuses to start (UnboundedProcessTree) unless
`allow_unbounded_process_tree` is set; then it warns once and bounds each process alone (rlimits).
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from evaluators.sandbox import bwrap, syscalls, view
from evaluators.sandbox.base import (
    DATA_ENV,
    BackendRefused,
    InfrastructureError,
    SandboxLimits,
    SandboxResult,
    starved,
    tmpfs_mb,
)
from evaluators.sandbox.cgroups import PARENT_ENV, Layout, RunCgroup, available, cpu_quota_missing
from evaluators.sandbox.native import STARVED_WALL_FACTOR
from evaluators.sandbox.reaping import acquire_run_uid, candidate_sys_path, kill_group, release_run_uid, remove_tree, wait_unstarved
from evaluators.sandbox.run_outputs import failure_reason, read_logs, read_output
from evaluators.sandbox.supervisor import Channel, Listener, SetupFailed

HARNESS = Path(__file__).with_name("harness.py")
LAUNCHER = Path(__file__).with_name("confine.py")
ALLOW_ENV = "DISCOVER_ALLOW_UNBOUNDED_PROCESS_TREE"  # "1": the config switch, for processes that read no config
ISOLATIONS = ("standard", "gvisor", "none")  # sandbox.isolation (docs/sandbox.md)
SETUP_TIMEOUT_S = 120.0  # for the sandbox to be set up, before the candidate's own clock starts
STATUS_FD, OUTPUT_FD = 3, 4  # the launcher's channel and the return value, inside the sandbox
UNISOLATED_NOTE = (
    "[sandbox] this candidate ran WITHOUT isolation (sandbox.isolation: none): no namespaces, no seccomp, the host's whole file system"
)
# Joins the run's cgroup (every hierarchy: the arguments before "--"), then becomes the sandbox
JOIN_CGROUP = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
log = logging.getLogger(__name__)
_warned = threading.Event()
_warned_cpu = threading.Event()
_warned_none = threading.Event()
_problems: dict[str, str] = {}
_problems_lock = threading.Lock()


class UnboundedProcessTree(BackendRefused):
    """The process backend cannot bound a candidate's process tree here and was not allowed to run
    without that bound (sandbox.allow_unbounded_process_tree)."""


class IsolationUnavailable(BackendRefused):
    """The process backend cannot isolate candidates here (no bubblewrap, no runsc, a kernel that
    refuses); the message names what failed and the fix."""


def isolation_problem(isolation: str) -> str:
    """Why `isolation` cannot run candidates here ("" when it can), found once per process."""
    if isolation not in ISOLATIONS:
        return f"unknown sandbox isolation {isolation!r}; choose one of {', '.join(ISOLATIONS)}"
    if isolation == "none":
        return ""
    if isolation == "gvisor":
        return "gVisor runs candidates in Docker containers here (runsc as Docker's runtime): use sandbox.backend: docker"
    with _problems_lock:
        if isolation not in _problems:
            _problems[isolation] = bwrap.problem()
        return _problems[isolation]


def isolation_message(isolation: str, why: str) -> str:
    return (
        f"the process sandbox cannot isolate candidates here: {why}; "
        "or use sandbox.backend: docker, or (trusted programs only) sandbox.isolation: none"
    )


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
        "give it cgroups (as a normal user: run under `systemd-run --user --scope -p Delegate=yes` and set "
        f'{PARENT_ENV} to that scope\'s cgroup v2 directory; docs/sandbox.md, "A normal user"), '
        "use sandbox.backend: docker, or accept a tree bounded per process only: sandbox.allow_unbounded_process_tree: true "
        f"in a run's configuration, {ALLOW_ENV}=1 in the environment of commands that read none (discover evaluate)"
    )


def allow_from_env() -> bool:
    return os.environ.get(ALLOW_ENV, "") == "1"


def rlimits(limits: SandboxLimits) -> dict[str, list[int]]:
    """The resource limits of a Python run (set by the launcher before any candidate code runs)."""
    mb = 1024 * 1024
    # CPU seconds add up over threads, so allow timeout x cpus; this mainly stops a process that
    # spins beyond its tree's cgroup quota.
    cpu = math.ceil(limits.timeout_s * max(1, limits.cpus)) + 5
    out = {
        "RLIMIT_CPU": [cpu, cpu + 1],
        "RLIMIT_FSIZE": [int(limits.max_file_mb) * mb] * 2,
        "RLIMIT_CORE": [0, 0],
        "RLIMIT_MSGQUEUE": [0, 0],  # no POSIX message queues
        "RLIMIT_NPROC": [int(limits.max_processes)] * 2,
    }
    if limits.limit_address_space:  # off for CUDA programs (SandboxLimits.limit_address_space)
        out["RLIMIT_AS"] = [int(limits.memory_mb) * mb] * 2
    return out


class ProcessSandbox:
    """Runs untrusted Python in a bubblewrap sandbox on this machine (module docstring).

    `image`: the problem's evaluator image (view.PACKAGES: what its candidates may import).
    `isolation`: "standard" (bubblewrap and seccomp) or "none" (trusted code only: rlimits and the
    cgroup, nothing else); "gvisor" is the docker backend's (DockerSandbox). It refuses, when made, to
    run where the isolation asked for cannot be set up (IsolationUnavailable) or no cgroup can be
    made (UnboundedProcessTree, unless `allow_unbounded_process_tree`, default: the environment
    variable DISCOVER_ALLOW_UNBOUNDED_PROCESS_TREE is "1").
    """

    name = "process"

    def __init__(self, allow_unbounded_process_tree: bool | None = None, isolation: str = "standard", image: str = "python-math"):
        if image not in view.PACKAGES:
            raise ValueError(f"unknown image {image!r} for the process sandbox; known: {', '.join(view.PACKAGES)}")
        self.seccomp_mode = "notify"  # "learn": every call let through and written down (learn_profiles.py)
        # learn mode only ({profile: {call: count}}: every call made); a run's refused calls go into its
        # own verdict and nothing of them is kept here
        self.calls_seen: dict[str, dict[str, int]] = {}
        self.image = image  # whose packages a Python run may import (view.PACKAGES) and its seccomp profile
        if allow_unbounded_process_tree is None:
            allow_unbounded_process_tree = allow_from_env()
        self.allow_unbounded_process_tree = bool(allow_unbounded_process_tree)
        self.isolation = isolation
        why = isolation_problem(isolation)
        if why:
            raise IsolationUnavailable(isolation_message(isolation, why))
        self.layout = check_tree_bound(self.allow_unbounded_process_tree)
        # "" when every run (and every case of a compiled program) gets a CPU quota, else why not
        self.cpu_quota_missing = cpu_quota_missing(self.layout) if self.layout is not None else "there is no cgroup"
        if self.layout is not None and self.cpu_quota_missing and not _warned_cpu.is_set():
            _warned_cpu.set()
            log.warning(
                "process sandbox: %s: a candidate spinning on every core can slow evaluations running beside it",
                self.cpu_quota_missing,
            )
        if isolation == "none" and not _warned_none.is_set():
            _warned_none.set()
            log.warning("process sandbox: candidates run WITHOUT isolation (sandbox.isolation: none): trusted programs only")

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
        workdir = Path(tempfile.mkdtemp(prefix="discover-sandbox-"))
        uid = acquire_run_uid() if self.isolation != "none" else None
        try:
            result = self._run_in(workdir, uid, program, entry, argument, limits, data_dir, device)
        finally:
            remove_tree(str(workdir))
            if uid is not None:
                release_run_uid(uid)
        return SandboxResult(
            ok=result.ok,
            output=result.output,
            reason=result.reason,
            logs=result.logs,
            duration_s=time.monotonic() - start,
            denied=result.denied,
        )

    def run_native(self, source: str, cases, limits, on_case=None):
        """Compile a C++ program once and run it on each case (evaluators/sandbox/native.py)."""
        from evaluators.sandbox.native import LocalSession, run_program

        learn = self.seccomp_mode == "learn"
        return run_program(
            lambda slot: LocalSession(slot, limits, self.layout, self.isolation, self.calls_seen, learn), source, cases, limits, on_case
        )

    # -- one run -------------------------------------------------------------------------------

    @property
    def profile(self) -> str:
        """The seccomp profile of this image's Python runs (evaluators/sandbox/syscalls.py)."""
        return "gpu" if self.image == "gpu" else "python"

    def _confine(self, limits: SandboxLimits, uid: int | None, cwd: str) -> dict[str, Any]:
        """The launcher's spec (confine.py): uid, resource limits, seccomp filter."""
        spec: dict[str, Any] = {"uid": uid, "gid": uid, "rlimits": rlimits(limits), "chdir": cwd}
        if self.isolation == "none":
            spec["require_seccomp"] = False
            return spec
        mode = self.seccomp_mode
        return {**spec, "seccomp": _b64(syscalls.bpf(self.profile, mode)), "listener": True}

    def _run_in(
        self,
        workdir: Path,
        uid: int | None,
        program: str,
        entry: str,
        argument: Any,
        limits: SandboxLimits,
        data_dir: Path | None,
        device: str | None,
    ) -> SandboxResult:
        files = {"candidate.py": program, "input.json": json.dumps(argument, allow_nan=True)}
        data = str(Path(data_dir).resolve()) if data_dir is not None else None
        the_view = None
        if self.isolation == "none":  # no view: the files on the host, the host's import path
            work = workdir / "work"
            work.mkdir(mode=0o700)
            box, cwd, sys_path, data_path = workdir / "box", str(work), candidate_sys_path(), data
        else:
            the_view, sites = view.python_view(
                self.image,
                tmpfs_mb(limits),
                uid or os.getuid(),
                uid or os.getgid(),
                data,
                view.nvidia_devices(device) if self.image == "gpu" and device != "cpu" else (),
            )
            box, cwd, sys_path, data_path = Path(view.BOX), view.WORK, [*view.stdlib_path(), *sites], view.DATA
        files["job.json"] = json.dumps({"entry": entry, "sys_path": sys_path, "confine": self._confine(limits, uid, cwd)})
        if the_view is None:
            box.mkdir(mode=0o755)
            for name, text in {**files, "harness.py": HARNESS.read_text(), "confine.py": LAUNCHER.read_text()}.items():
                (box / name).write_text(text, encoding="utf-8")
        else:
            for name, text in files.items():
                the_view.file(f"{view.BOX}/{name}", text)
            the_view.bind(str(HARNESS), f"{view.BOX}/harness.py")
            the_view.bind(str(LAUNCHER), f"{view.BOX}/confine.py")
        env = _clean_env(cwd, limits, data_path, device, "/tmp" if the_view is not None else cwd)
        channel = Channel()
        group = None
        fds: list[int] = []
        try:
            with (
                open(workdir / "stdout.txt", "w+b") as out,
                open(workdir / "stderr.txt", "w+b") as err,
                open(workdir / "output.json", "wb") as value,
            ):
                inner = [os.path.realpath(sys.executable), "-S", "-s", "-B", "-P", str(box / "harness.py"), str(box / "job.json")]
                inner += [str(channel.child_fd), str(value.fileno())]
                if self.isolation == "standard":
                    prefix, fds = bwrap.command(the_view, "/")
                    argv = prefix + inner
                else:
                    argv = inner
                if self.layout is not None:
                    group = RunCgroup(self.layout, limits.memory_mb, limits.max_processes + bwrap.TASKS, cpus=max(1, limits.cpus))
                    argv = ["/bin/sh", "-c", JOIN_CGROUP, "sh", *group.procs_files, "--", *argv]
                try:
                    proc = subprocess.Popen(
                        argv,
                        cwd=cwd if the_view is None else "/",
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                        start_new_session=True,  # own session and process group: pgid == pid
                        close_fds=True,
                        pass_fds=[*fds, channel.child_fd, value.fileno()],
                    )
                except OSError as e:
                    raise InfrastructureError(f"could not start the sandbox: {e}") from None
                for fd in fds:
                    os.close(fd)
                fds = []
                result = self._supervise(proc, channel, out, err, workdir / "output.json", limits, group)
        finally:
            channel.close()
            for fd in fds:
                os.close(fd)
            if group is not None:
                group.remove()
        if self.isolation == "none":
            result = SandboxResult(ok=result.ok, output=result.output, reason=result.reason, logs=UNISOLATED_NOTE + "\n" + result.logs)
        return result

    def _supervise(
        self, proc: subprocess.Popen, channel: Channel, out, err, output_path: Path, limits: SandboxLimits, group: RunCgroup | None
    ) -> SandboxResult:
        """Wait for the launcher's report, answer the candidate's denied calls while it runs, then
        kill what is left and read what it returned."""
        cap = int(limits.max_output_bytes)
        stop = threading.Event()
        server = None
        listener = None
        try:
            try:
                _, fd = channel.wait_ready(SETUP_TIMEOUT_S)
            except SetupFailed as failed:
                kill_group(proc.pid)
                if group is not None:
                    group.kill()
                proc.wait()
                _, last = read_logs(out, err, cap)
                raise InfrastructureError(
                    f"the process sandbox could not set up the candidate's sandbox: {failed}" + (f" ({last})" if last else "")
                ) from None
            if fd is not None:

                def stop_the_run() -> None:  # too many refused calls: the run ends here
                    kill_group(proc.pid)
                    if group is not None:
                        group.kill()

                listener = Listener(fd, learn=self.seccomp_mode == "learn", on_flood=stop_the_run)
                server = threading.Thread(target=listener.serve, args=(stop,), daemon=True, name="seccomp-listener")
                server.start()
            started = time.monotonic()
            # entitled to its CPUs (the cgroup's quota), or to those this process may use when fewer
            cpus = min(max(1.0, float(limits.cpus)), float(len(os.sched_getaffinity(0))))
            counted = group.cpu_s if group is not None else None  # a fresh group: all it used is this run's
            exited, starved_s = wait_unstarved(proc.pid, limits.timeout_s, STARVED_WALL_FACTOR * limits.timeout_s, cpus, counted)
            timed_out = not exited
            ran_s = time.monotonic() - started
            # the whole group while the (unreaped) leader still pins its pgid, then the cgroup
            kill_group(proc.pid)
            if group is not None:
                group.kill()
            returncode = proc.wait()
        finally:
            stop.set()
            if server is not None:
                server.join()
            if listener is not None:
                listener.close()
        counts = listener.counts() if listener is not None else {}
        flooded = listener is not None and listener.flooded
        if self.seccomp_mode == "learn":  # deriving profiles: every call made is written down; nothing else is kept
            seen = self.calls_seen.setdefault(self.profile, {})
            for key, n in counts.items():
                seen[syscalls.name(*key)] = seen.get(syscalls.name(*key), 0) + n
            counts = {}
        denied = syscalls.describe(counts, self.profile, flooded)
        logs, last_err_line = read_logs(out, err, cap)
        if denied:
            logs = f"[sandbox] {denied}\n" + logs
        if flooded:
            return SandboxResult(ok=False, reason=denied, logs=logs, denied=denied)
        if timed_out and starved_s:  # the host's load, not the program: no verdict for it
            raise starved(starved_s, ran_s, limits.timeout_s)
        if timed_out:
            return SandboxResult(ok=False, reason=_with(f"timeout after {limits.timeout_s:g} s", denied), logs=logs, denied=denied)
        if group is not None and group.oom_kills():  # whoever was killed, the tree went over
            reason = f"memory limit ({limits.memory_mb} MB) exceeded by the process tree: the out-of-memory killer fired"
            return SandboxResult(ok=False, logs=logs, reason=_with(reason, denied), denied=denied)
        if returncode == 0:
            output, reason = read_output(output_path, cap)
            return SandboxResult(ok=not reason, output=output, reason=_with(reason, denied) if reason else "", logs=logs, denied=denied)
        if returncode > 128 and self.isolation != "none":  # bubblewrap exits with 128 + the signal that killed the candidate
            returncode = 128 - returncode
        return SandboxResult(ok=False, reason=_with(failure_reason(returncode, last_err_line, limits), denied), logs=logs, denied=denied)


def _with(reason: str, denied: str) -> str:
    return f"{reason}; {denied}" if denied else reason


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


def _thread_env(limits: SandboxLimits) -> dict[str, str]:
    """Thread-count variables of numeric libraries, set to `limits.cpus`."""
    n = str(max(1, int(limits.cpus)))
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
    return {name: n for name in names}


def _clean_env(home: str, limits: SandboxLimits, data_path: str | None, device: str | None, tmpdir: str) -> dict[str, str]:
    """Nothing inherited from the parent environment (no API keys, no tokens). `data_path` is where
    the run finds its data directory (DISCOVER_DATA); a `device` shows the run that GPU alone
    ("cpu": none) through CUDA_VISIBLE_DEVICES."""
    data = {DATA_ENV: data_path} if data_path is not None else {}
    if device is not None:
        data["CUDA_VISIBLE_DEVICES"] = "" if device == "cpu" else str(device)
    return {
        **data,
        "PATH": view.SYSTEM_PATH,
        "HOME": home,
        "TMPDIR": tmpdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        **_thread_env(limits),
    }
