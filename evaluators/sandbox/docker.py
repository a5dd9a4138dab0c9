"""The docker backend: each candidate runs in a locked-down container of its problem's image.

Same contract as `ProcessSandbox`: `run(program, entry, argument, limits) -> SandboxResult`, with
JSON in and out, and the same `harness.py` inside the container.

Every container (images/<name>, tagged discover/<name>:latest) is created with: no network
(network_mode none), a memory limit equal to its memory+swap limit (no swap), a CPU quota
(nano_cpus), a process-count limit (pids_limit), a read-only root filesystem with a size-limited
tmpfs on /tmp (noexec unless the image compiles code) and a small /dev/shm, a run's data
directory (if any) bind-mounted read-only at /data, all capabilities
dropped, no-new-privileges, docker-init as PID 1 (reaps orphans), and non-root numeric users:
the container's keeper process runs as KEEPER_UID and every candidate as RUN_UID, so the
candidate cannot signal the keeper.

One run = one `exec` of a small runner (`python3 -c RUNNER`, which needs nothing in the image but
python3) that reads the job from its stdin, writes it into a fresh directory on the tmpfs, starts
harness.py under `RLIMIT_*` and a wall-clock timeout, then kills every process of RUN_UID
(`kill(-1)`: background children, setsid escapees), removes what the candidate left (its System V
shared memory, semaphores and message queues, its POSIX message queues, and the files in /tmp,
/dev/shm, /var/tmp, /run/lock and /var/lock), checks that none of it is left and prints one JSON
line: exit status, output.json's bytes, the tails of stdout/stderr (capped) and whether the
container is clean. The host reads at
most a few times `max_output_bytes` and, as a backstop, kills the container when the runner has
not answered `BACKSTOP_S` after the timeout. Nothing is unpickled: the value is JSON text.

Warm pool: up to `concurrency` containers stay started between runs (a run's state lives only
in what the runner removes and in processes of RUN_UID, which it kills: the runner does it before
and after each candidate); a container is replaced after `max_runs` runs, after any run it could
not verify clean (a process that would not die, an IPC object or a file left), and when the
limits change. Containers are always removed: `auto_remove` once stopped; the keeper (`cat` on stdin)
exits when our attach socket closes, i.e. when this process dies, even by SIGKILL; `close()`
and an atexit hook kill the pool; and each container is labelled with its owner
(host, pid, process start time), so `reap_orphans()` (run at start-up) removes those whose
owner is gone.

What it does not isolate: the kernel is shared (Docker's default seccomp profile, no gVisor or
VM). The runner runs as the same uid as the candidate (only that uid can kill all of the
candidate's processes, no process in the container having a capability) and makes itself
non-dumpable before the job (docker_runner.py `not_dumpable`), so the candidate cannot open its
/proc/PID/mem or fds to read or forge its report; it can still signal it, which only ends its own
run with no report (an invalid verdict) or in the host's timeout.
"""

from __future__ import annotations

import atexit
import base64
import inspect
import json
import logging
import secrets
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluators.sandbox import syscalls
from evaluators.sandbox.base import DATA_ENV, InfrastructureError, SandboxLimits, SandboxResult, starved, tmpfs_mb
from evaluators.sandbox.docker_engine import (  # noqa: F401  (re-exported: tests and callers use them here)
    GVISOR_THREADS,
    LABEL,
    OWNER_LABEL,
    REPOSITORY,
    START_TIMEOUT_S,
    _client,
    _owner,
    engine_answers,
    gvisor_missing,
    image_exists,
    image_ref,
    locked_down_host_config,
    reap_orphans,
    recv_frame,
    sandbox_containers,
)
from evaluators.sandbox.native import STARVED_WALL_FACTOR
from evaluators.sandbox.native_runner import CGROUP_CPU, cgroup_cpu_s, starved_deadline, tree_usage
from evaluators.sandbox.process import HARNESS, LAUNCHER, _thread_env, rlimits
from evaluators.sandbox.run_outputs import compose_logs, failure_reason, parse_output

log = logging.getLogger("discover.sandbox")
KEEPER_UID, RUN_UID = 10000, 10001
DATA_MOUNT = "/data"  # where a run's read-only data directory is bind-mounted
SHM_MB = 16
HEADROOM_MB = 128  # container memory on top of the candidate's limit (runner, keeper, page cache)
BACKSTOP_S = 15.0  # the host kills the container this long after the timeout


# see docker_runner.py's docstring; it measures a starved candidate as the native runner does (the same
# functions, their source sent ahead of the runner's: the runner is standard library only, never imported)
RUNNER = "\n\n".join(
    [
        "CGROUP_CPU = %r" % (CGROUP_CPU,),
        inspect.getsource(cgroup_cpu_s),
        inspect.getsource(tree_usage),
        inspect.getsource(starved_deadline),
        Path(__file__).with_name("docker_runner.py").read_text(encoding="utf-8"),
    ]
)


@dataclass
class _Container:
    id: str
    key: tuple
    attach: Any  # the attach socket that keeps the keeper alive; closing it ends the container
    runs: int = 0


class DockerSandbox:
    """Runs untrusted Python in a warm pool of locked-down containers of one image."""

    name = "docker"

    def __init__(
        self,
        image: str = "python-math",
        concurrency: int = 2,
        warm: bool = True,
        max_runs: int = 500,
        exec_tmp: bool | None = None,
        gpu: bool = False,
        client=None,
        gvisor: bool = False,
    ):
        self.image = image_ref(image)
        # the seccomp profile's kinds (syscalls.docker_profile): the image's Python runs, and in the
        # C++ image its compiler and programs beside the Python runner
        self.kinds: tuple[str, ...] = (
            ("gpu",) if gpu or image == "gpu" else ("python", "compiler", "program") if "cpp" in image else ("python",)
        )
        self.concurrency = max(1, int(concurrency))
        self.warm = warm
        self.max_runs = max_runs
        # Compiled programs run from /tmp in the C++ image, and Triton loads the launcher and kernels
        # it compiles from there in a GPU image; elsewhere /tmp is noexec.
        self.exec_tmp = ("cpp" in self.image or gpu) if exec_tmp is None else exec_tmp
        self.gpu = gpu
        self._client = client or _client(timeout=START_TIMEOUT_S)
        self._api = self._client.api
        self._client.images.get(self.image)  # fail now (ImageNotFound) rather than at the first run
        # GPU containers stay on runc: gVisor's GPU support (nvproxy) is newer than the runsc that
        # Debian ships and proxies a subset of the driver's calls only (docs/sandbox.md, "gVisor")
        self.gvisor = bool(gvisor) and not gpu
        if gvisor and gpu:
            log.warning("sandbox.isolation gvisor: %s runs GPU programs, which stay on runc (docs/sandbox.md, gVisor)", self.image)
        if self.gvisor:
            why = gvisor_missing(self._client)
            if why:
                raise ValueError(f"sandbox.isolation 'gvisor' cannot run here: {why}")
        self._engine_cpus = int(self._api.info().get("NCPU") or 1)  # a CPU quota above it is refused
        self._harness = HARNESS.read_text(encoding="utf-8")
        self._launcher = LAUNCHER.read_text(encoding="utf-8")
        self._runner = RUNNER
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._lock = threading.Lock()
        self._idle: list[_Container] = []
        self._owner = _owner()
        self._closed = False
        self._native = None  # the containers of compiled programs (docker_native.py), made on first use
        reap_orphans(self._client)
        _live.add(self)

    # -- the contract ---------------------------------------------------------------------------

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
        if data_dir is not None:
            if not Path(data_dir).is_dir():
                raise FileNotFoundError(f"the sandbox's data directory {data_dir} does not exist")
            data_dir = Path(data_dir).resolve()
        with self._slots:
            result = self._run(program, entry, argument, limits, data_dir, device)
        return SandboxResult(
            ok=result.ok,
            output=result.output,
            reason=result.reason,
            logs=result.logs,
            duration_s=time.monotonic() - start,
        )

    def run_native(self, source: str, cases, limits, on_case=None):
        """Compile a C++ program once and run it on each case in one-CPU containers (docker_native.py)."""
        from evaluators.sandbox.docker_native import NativePool
        from evaluators.sandbox.native import run_program

        with self._lock:
            self._native = self._native or NativePool(self)
        return run_program(lambda slot: self._native.session(slot, limits), source, cases, limits, on_case)

    def close(self) -> None:
        """Kill and remove every container of the pool."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            self._destroy(c)
        if self._native is not None:
            self._native.close()

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- one run --------------------------------------------------------------------------------

    def _run(
        self, program: str, entry: str, argument: Any, limits: SandboxLimits, data_dir: Path | None, device: str | None = None
    ) -> SandboxResult:
        import docker

        token = secrets.token_hex(16)
        cap = int(limits.max_output_bytes)
        # the launcher's limits (confine.py; the tmpfs is sized to hold the largest file: base.tmpfs_mb);
        # pids_limit bounds the container, RLIMIT_NPROC (per uid, engine-wide) only as a second line,
        # generous because every container's candidate shares RUN_UID. The container's seccomp
        # profile is Docker's to apply (locked_down_host_config).
        limited = {**rlimits(limits), "RLIMIT_NPROC": [4096, 4096]}
        if self.gvisor:  # a kernel of the container's own: the uid's tasks are this run's alone
            limited["RLIMIT_NPROC"] = [int(limits.max_processes)] * 2
            limited.pop("RLIMIT_MSGQUEUE")  # gVisor refuses to set it (its message queues are its own anyway)
        # the launcher also installs the Python kind's own filter (EPERM, no listener): under runc it
        # narrows the container's profile, under gVisor, which ignores a container's profile, it is the one
        seccomp = base64.b64encode(syscalls.bpf(self.kinds[0] if self.kinds[0] == "gpu" else "python", "errno")).decode()
        job = {"entry": entry, "confine": {"rlimits": limited, "seccomp": seccomp}}
        payload = {
            "token": token,
            "cap": cap,
            "timeout": float(limits.timeout_s),
            "starved_cap": STARVED_WALL_FACTOR * float(limits.timeout_s),  # the limit moved later for a starved candidate, up to this
            "cpus": min(max(1.0, float(limits.cpus)), float(self._engine_cpus)),  # its CPU quota (nano_cpus): a starved candidate had less
            "env": {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": "/tmp/run-" + token,
                "TMPDIR": "/tmp/run-" + token,
                "LANG": "C.UTF-8",
                "LC_ALL": "C.UTF-8",
                "PYTHONHASHSEED": "0",
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONNOUSERSITE": "1",
                **_thread_env(limits),
                **({DATA_ENV: DATA_MOUNT} if data_dir is not None else {}),
            },
            "files": {
                "harness.py": self._harness,
                "confine.py": self._launcher,
                "candidate.py": program,
                "input.json": json.dumps(argument, allow_nan=True),
                "job.json": json.dumps(job),
            },
        }
        data = json.dumps(payload).encode()
        for attempt in range(2):  # a container that died under us is an infrastructure failure
            try:
                container = self._acquire(limits, data_dir, device)
            except docker.errors.DockerException as e:
                return SandboxResult(ok=False, reason=f"could not start the sandbox container: {e}")
            healthy = False
            try:
                report, problem = self._exec(container, data, token, limits)
                if problem == "broken" and attempt == 0:
                    continue
                if problem == "backstop":
                    return SandboxResult(ok=False, reason=f"timeout after {limits.timeout_s:g} s (killed by the host)")
                if report is None:
                    return SandboxResult(ok=False, reason=problem)
                if report.get("setup_error"):
                    raise InfrastructureError(f"the sandbox runner could not close itself to the candidate: {report['setup_error']}")
                healthy = bool(report.get("clean"))
                if report.get("residue"):
                    log.info("replacing a sandbox container the runner could not clean: %s", ", ".join(map(str, report["residue"])))
                return self._result(report, limits)
            finally:
                self._release(container, healthy)
        return SandboxResult(ok=False, reason="the sandbox container failed twice")

    def _result(self, report: dict, limits: SandboxLimits) -> SandboxResult:
        cap = int(limits.max_output_bytes)
        logs, last_err_line = compose_logs(
            base64.b64decode(report["stdout"]),
            bool(report["stdout_cut"]),
            base64.b64decode(report["stderr"]),
            bool(report["stderr_cut"]),
            cap,
        )
        if report["timed_out"] and report.get("starved_s"):  # the host's load, not the program: no verdict for it
            raise starved(float(report["starved_s"]), float(report["elapsed"]), limits.timeout_s)
        if report["timed_out"]:
            return SandboxResult(ok=False, reason=f"timeout after {limits.timeout_s:g} s", logs=logs)
        rc = int(report["rc"])
        if rc == 0:
            if report["output_error"]:
                return SandboxResult(ok=False, reason=str(report["output_error"])[:500], logs=logs)
            output, reason = parse_output(base64.b64decode(report["output"] or ""), cap)
            return SandboxResult(ok=not reason, output=output, reason=reason, logs=logs)
        reason = failure_reason(rc, last_err_line, limits)
        if rc == -9 and "memory" not in reason:
            reason += f" (possibly the memory limit of {limits.memory_mb} MB)"
        return SandboxResult(ok=False, reason=reason, logs=logs)

    def _exec(self, c: _Container, data: bytes, token: str, limits: SandboxLimits) -> tuple[dict | None, str]:
        """(report, "") or (None, why): why is "broken", "backstop" or a reason for the result."""
        import docker

        try:
            exec_id = self._api.exec_create(
                c.id,
                ["python3", "-I", "-c", self._runner],
                stdin=True,
                stdout=True,
                stderr=True,
                user=f"{RUN_UID}:{RUN_UID}",
                workdir="/tmp",
            )["Id"]
            sock = self._api.exec_start(exec_id, socket=True)
        except docker.errors.DockerException:
            c.runs = self.max_runs  # do not reuse
            return None, "broken"
        raw = getattr(sock, "_sock", sock)
        deadline = time.monotonic() + STARVED_WALL_FACTOR * limits.timeout_s + BACKSTOP_S
        limit = 8 * int(limits.max_output_bytes) + (1 << 20)  # base64 of output + two log tails
        try:
            raw.settimeout(max(1.0, deadline - time.monotonic()))
            raw.sendall(str(len(data)).encode() + b"\n" + data)
            stdout = bytearray()
            stderr = bytearray()
            while (frame := recv_frame(raw, deadline)) is not None:
                stream, body = frame
                (stdout if stream == 1 else stderr).extend(body)
                if len(stdout) + len(stderr) > limit:
                    c.runs = self.max_runs
                    self._kill(c)
                    return None, "the sandbox runner's report exceeded its size limit"
        except TimeoutError:
            c.runs = self.max_runs
            self._kill(c)
            return None, "backstop"
        except OSError:
            c.runs = self.max_runs
            return None, "broken"
        finally:
            try:
                sock.close()
            except OSError:
                pass
        c.runs += 1
        marker = token.encode() + b" "
        for line in reversed(bytes(stdout).splitlines()):
            if line.startswith(marker):
                try:
                    return json.loads(line[len(marker) :]), ""
                except ValueError:
                    break
        c.runs = self.max_runs
        tail = bytes(stderr[-300:]).decode("utf-8", "replace").strip()
        return None, "the sandbox runner did not report" + (f": {tail}" if tail else " (killed, possibly the memory limit)")

    # -- the pool -------------------------------------------------------------------------------

    def _key(self, limits: SandboxLimits, data_dir: Path | None, device: str | None = None) -> tuple:
        gpus = ("all" if device is None else "" if device == "cpu" else str(device)) if self.gpu else ""
        return (int(limits.memory_mb), int(limits.cpus), int(limits.max_processes), str(data_dir or ""), tmpfs_mb(limits), gpus)

    def _acquire(self, limits: SandboxLimits, data_dir: Path | None = None, device: str | None = None) -> _Container:
        key = self._key(limits, data_dir, device)
        stale = []
        found = None
        with self._lock:
            while self._idle:
                c = self._idle.pop()
                if c.key == key and found is None:
                    found = c
                else:
                    stale.append(c)
            self._idle.extend(c for c in stale if c.key == key)
            stale = [c for c in stale if c.key != key]
        for c in stale:
            self._destroy(c)
        return found or self._create(key)

    def _release(self, c: _Container, healthy: bool) -> None:
        if healthy and self.warm and c.runs < self.max_runs:
            with self._lock:
                if not self._closed:
                    self._idle.append(c)
                    return
        self._destroy(c)

    def _create(self, key: tuple) -> _Container:
        import docker

        memory_mb, cpus, max_processes, data_dir, tmpfs_mb, gpus = key
        tmp_opts = "rw,nosuid,nodev,mode=1777,size=%dm" % tmpfs_mb + (",exec" if self.exec_tmp else ",noexec")
        # One GPU per container when a run names its device (two runs are never timed on one GPU);
        # every GPU when it names none; none for "cpu".
        if gpus == "all":
            device_requests = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
        elif gpus:
            device_requests = [docker.types.DeviceRequest(device_ids=[gpus], capabilities=[["gpu"]])]
        else:
            device_requests = None
        host_config = locked_down_host_config(
            self._api,
            memory_mb + tmpfs_mb + HEADROOM_MB,
            self.kinds,
            self.gvisor,
            nano_cpus=int(min(cpus, self._engine_cpus) * 1e9),
            # + keeper, init, runner and its threads; under gVisor its own threads (the candidate's
            # tasks live inside gVisor's kernel, bounded there by RLIMIT_NPROC)
            pids_limit=max_processes + 16 + (GVISOR_THREADS if self.gvisor else 0),
            tmpfs={"/tmp": tmp_opts},
            shm_size=SHM_MB * 1024 * 1024,
            device_requests=device_requests,
            binds={data_dir: {"bind": DATA_MOUNT, "mode": "ro"}} if data_dir else None,
        )
        cid = self._api.create_container(
            self.image,
            ["cat"],  # the keeper: exits when our attach socket closes (we died or closed)
            detach=False,  # with stdin_open: StdinOnce, so stdin closes when we disconnect
            stdin_open=True,
            user=f"{KEEPER_UID}:{KEEPER_UID}",
            working_dir="/tmp",
            network_disabled=True,
            volumes=[DATA_MOUNT] if data_dir else None,
            environment={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
            labels={LABEL: "1", OWNER_LABEL: self._owner, "discover.sandbox.image": self.image},
            host_config=host_config,
        )["Id"]
        try:
            attach = self._api.attach_socket(cid, params={"stdin": 1, "stream": 1})
            self._api.start(cid)
        except Exception:
            try:
                self._api.remove_container(cid, force=True)
            except Exception:
                pass
            raise
        return _Container(id=cid, key=key, attach=attach)

    def _kill(self, c: _Container) -> None:
        try:
            self._api.kill(c.id)
        except Exception:
            pass

    def _destroy(self, c: _Container) -> None:
        try:
            c.attach.close()
        except Exception:
            pass
        try:
            self._api.remove_container(c.id, force=True)
        except Exception:
            pass  # already gone (auto_remove)


_live: weakref.WeakSet[DockerSandbox] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for box in list(_live):
        try:
            box.close()
        except Exception:
            pass
