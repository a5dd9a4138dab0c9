"""The docker backend for compiled programs: each slot of an evaluation is one container of the
problem's image (cpp20) running the trusted runner (native_runner.py) as the container's root.

A slot's container has one CPU (nano_cpus), the case's memory limit plus HEADROOM_MB (runner, the
binary, the current case's input and output on the tmpfs) with no swap, no network, a read-only
root, a tmpfs /tmp and /dev/shm owned by root with mode 0755 (the program can write no file
anywhere, so nothing carries over from one case to the next), a private IPC namespace, a
process-count limit, docker-init as PID 1, no-new-privileges and only the capabilities the
runner needs to drop to the program's uid and clean up after it (CHOWN, DAC_OVERRIDE, FOWNER,
SETUID, SETGID, KILL). The keeper (`cat`) holds the container open; it and the runner (an `exec`)
run as the container's root, because Docker gives an exec'd root those capabilities only when the
container's user is root; the program runs as a random uid of the container (never root, never
another container's), so it cannot signal the keeper or the runner, nor read the runner's files,
its other inputs or its report. Docker copies the image's /tmp mode (1777) onto the tmpfs, so the
runner sets it back to 0755 before anything runs. Cases running at the same time are in different containers
(different PID, IPC and network namespaces), so they cannot reach each other.

Containers are pooled between evaluations like DockerSandbox's (same labels and owner, so
`reap_orphans` and the keeper's exit on our death apply): a container goes back to the pool only
when its runner reported a clean end (every process of the uid killed, its IPC objects removed).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from evaluators.sandbox.docker_engine import GVISOR_THREADS, LABEL, OWNER_LABEL, START_TIMEOUT_S, locked_down_host_config, recv_frame
from evaluators.sandbox.native import RUNNER, NativeLimits, ReplyReader, SessionError, message

RUNNER_TEXT = RUNNER.read_text(encoding="utf-8")
HEADROOM_MB = 512  # container memory above the case's limit
TMPFS_MB = 512  # /tmp: the binary, one input, one output (at most the output cap), the compiler's files
PROGRAM_UIDS = (2_000_000_000, 1 << 24)  # the program's uid: base and span of the random choice
CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"]
MAX_SESSIONS = 200  # evaluations a container serves before it is replaced


@dataclass
class _Slot:
    id: str
    key: tuple
    attach: Any  # the keeper's attach socket: closing it ends the container
    uid: int
    sessions: int = 0


class NativePool:
    """The containers of compiled-program slots for one DockerSandbox (its client, image, owner)."""

    def __init__(self, box: Any):
        self.box = box
        self.api = box._api
        self.lock = threading.Lock()
        self.idle: list[_Slot] = []
        self.closed = False

    def session(self, slot: int, limits: NativeLimits) -> DockerSession:
        key = (int(limits.memory_mb), int(limits.max_processes))
        with self.lock:
            found = next((c for c in self.idle if c.key == key), None)
            if found is not None:
                self.idle.remove(found)
        if found is not None:
            try:
                return DockerSession(self, found, limits)
            except SessionError:
                pass  # a pooled container that died meanwhile: start a fresh one
        try:
            container = self._create(key)
        except Exception as err:  # docker.errors.DockerException and socket errors
            raise SessionError(f"could not start a sandbox container: {err}") from None
        return DockerSession(self, container, limits)

    def release(self, c: _Slot, healthy: bool) -> None:
        c.sessions += 1
        if healthy and c.sessions < MAX_SESSIONS:
            with self.lock:
                if not self.closed:
                    self.idle.append(c)
                    return
        self.destroy(c)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            idle, self.idle = self.idle, []
        for c in idle:
            self.destroy(c)

    def destroy(self, c: _Slot) -> None:
        try:
            c.attach.close()
        except Exception:
            pass
        try:
            self.api.remove_container(c.id, force=True)
        except Exception:
            pass  # already gone (auto_remove)

    def _create(self, key: tuple) -> _Slot:
        memory_mb, max_processes = key
        host_config = locked_down_host_config(
            self.api,
            memory_mb + HEADROOM_MB,
            self.box.kinds,
            self.box.gvisor,
            nano_cpus=int(1e9),  # one CPU: the slot runs one case at a time
            pids_limit=max_processes + 32 + (GVISOR_THREADS if self.box.gvisor else 0),  # + keeper, init, runner and its helpers
            tmpfs={
                "/tmp": f"rw,nosuid,nodev,exec,mode=0755,size={TMPFS_MB}m",
                "/dev/shm": "rw,nosuid,nodev,noexec,mode=0755,size=1m",
            },
            cap_add=CAPABILITIES,
        )
        cid = self.api.create_container(
            self.box.image,
            ["cat"],  # the keeper: exits when our attach socket closes (we died or closed)
            detach=False,
            stdin_open=True,
            user="0:0",  # an exec'd root keeps the capabilities above only if the container's user is root
            working_dir="/tmp",
            network_disabled=True,
            environment={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
            labels={LABEL: "1", OWNER_LABEL: self.box._owner, "discover.sandbox.image": self.box.image, "discover.sandbox.kind": "native"},
            host_config=host_config,
        )["Id"]
        try:
            attach = self.api.attach_socket(cid, params={"stdin": 1, "stream": 1})
            self.api.start(cid)
        except Exception:
            try:
                self.api.remove_container(cid, force=True)
            except Exception:
                pass
            raise
        return _Slot(id=cid, key=key, attach=attach, uid=PROGRAM_UIDS[0] + secrets.randbelow(PROGRAM_UIDS[1]))


class DockerSession:
    """One runner exec'd as root in a slot container; speaks the runner's protocol over the socket."""

    def __init__(self, pool: NativePool, container: _Slot, limits: NativeLimits):
        self.pool, self.container = pool, container
        self.token = secrets.token_hex(16)
        self.common = {
            "token": self.token,
            "marker": secrets.token_hex(16),
            "uid": container.uid,
            "gid": container.uid,
            "cpu": None,  # the container has one CPU
            "workdir": f"/tmp/judge-{self.token}",
            "nproc": int(limits.max_processes),
            "cgroup": True,
            "scratch": [],  # the program can write nowhere
            "private_dirs": ["/tmp"],  # root's, mode 0755
        }
        self.errors = bytearray()
        self.ended = self.clean = False
        api = pool.api
        try:
            exec_id = api.exec_create(
                container.id,
                ["python3", "-I", "-S", "-c", RUNNER_TEXT],
                stdin=True,
                stdout=True,
                stderr=True,
                user="0:0",
                workdir="/tmp",
            )["Id"]
            self.sock = api.exec_start(exec_id, socket=True)
        except Exception as err:
            pool.release(container, healthy=False)
            raise SessionError(f"could not start the runner in its container: {err}") from None
        self.raw = getattr(self.sock, "_sock", self.sock)
        self.reader = ReplyReader(self.token, self._recv, self._death)

    def _recv(self, timeout: float) -> bytes:
        """The next chunk of the runner's stdout (stderr frames are kept for error messages)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                frame = recv_frame(self.raw, deadline)
            except OSError as err:
                if isinstance(err, TimeoutError):
                    raise
                return b""
            if frame is None:
                return b""
            stream, body = frame
            if stream == 1:
                return body
            self.errors.extend(body)
            del self.errors[:-2000]

    def _death(self) -> str:
        lines = bytes(self.errors).decode("utf-8", "replace").strip().splitlines()
        return lines[-1][:500] if lines else "no message (the container may have been killed)"

    def _send(self, payload: dict[str, Any]) -> None:
        try:
            self.raw.settimeout(START_TIMEOUT_S)
            self.raw.sendall(message(payload))
        except OSError as err:
            raise SessionError(f"the runner is gone ({err}): {self._death()}") from None

    def start(self, setup: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._send({**setup, **self.common})
        return self.reader.read(timeout)

    def case(self, index: int, text: str, timeout: float) -> dict[str, Any]:
        self._send({"kind": "case", "index": index, "input": text})
        return self.reader.read(timeout)

    def end(self, timeout: float) -> dict[str, Any]:
        self._send({"kind": "end"})
        report = self.reader.read(timeout)
        self.ended, self.clean = True, bool(report.get("clean"))
        return report

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        if not self.ended:  # a runner that failed or hung: the container goes
            try:
                self.pool.api.kill(self.container.id)
            except Exception:
                pass
        self.pool.release(self.container, healthy=self.ended and self.clean)
