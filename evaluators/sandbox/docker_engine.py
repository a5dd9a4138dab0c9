"""The Docker engine around the sandbox's containers: references, pings, reaping containers
whose owner died (every container carries LABEL and OWNER_LABEL), the locked-down host
configuration every sandbox container shares, and reading an attached exec's output frames."""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

REPOSITORY = "discover"
LABEL = "discover.sandbox"  # every container this backend starts carries it
OWNER_LABEL = "discover.sandbox.owner"  # "<hostname>:<pid>:<process start time>"
START_TIMEOUT_S = 60.0  # seconds a container may take to start and answer


def image_ref(name: str) -> str:
    """discover/<name>:latest for a bare image name; a full reference is kept as it is."""
    return name if ("/" in name or ":" in name) else f"{REPOSITORY}/{name}:latest"


def _client(timeout: float = 30.0):
    import docker

    return docker.from_env(timeout=timeout)


GVISOR_RUNTIME = "runsc"  # the name gVisor's runtime is registered under (`runsc install`)
GVISOR_THREADS = 512  # the host threads of gVisor's own kernel and file proxy, in a container's pids limit


def gvisor_missing(client=None) -> str:
    """Why Docker cannot run containers under gVisor here ("" when it can): the engine must list
    the runsc runtime (Debian: apt-get install runsc; then `runsc install` and reload dockerd)."""
    try:
        runtimes = (client or _client()).api.info().get("Runtimes") or {}
    except Exception as err:  # docker.errors.DockerException and socket errors
        return f"the Docker engine did not answer: {err}"
    if GVISOR_RUNTIME not in runtimes:
        return (
            f"the Docker engine has no {GVISOR_RUNTIME!r} runtime (it has {', '.join(sorted(runtimes)) or 'none'}): "
            "install gVisor (Debian: apt-get install runsc), run `runsc install` and reload dockerd (kill -HUP its pid)"
        )
    return ""


def engine_answers() -> bool:
    """True when a Docker engine answers a ping."""
    try:
        _client(timeout=5.0).ping()
        return True
    except Exception:
        return False


def image_exists(name: str) -> bool:
    try:
        import docker

        _client(timeout=10.0).images.get(image_ref(name))
        return True
    except (docker.errors.ImageNotFound, docker.errors.DockerException):
        return False
    except Exception:
        return False


def _process_start_time(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split()[19]
    except (OSError, IndexError):
        return "?"


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_process_start_time(os.getpid())}"


def reap_orphans(client=None) -> int:
    """Remove sandbox containers whose owning process (on this host) is gone. Returns how many."""
    client = client or _client()
    host = socket.gethostname()
    removed = 0
    for c in client.containers.list(all=True, filters={"label": LABEL}):
        owner = c.labels.get(OWNER_LABEL, "")
        parts = owner.split(":")
        if len(parts) != 3 or parts[0] != host:
            continue
        pid = int(parts[1]) if parts[1].isdigit() else -1
        if pid > 0 and _process_start_time(pid) == parts[2]:
            continue  # its owner is alive
        try:
            c.remove(force=True)
            removed += 1
        except Exception:
            pass
    return removed


def sandbox_containers(client=None) -> list:
    """Every container of this backend on the engine, whoever owns it; one removed while they are
    read (another sandbox closing its own) is left out, not an error."""
    import docker

    client = client or _client()
    found = []
    for summary in client.api.containers(all=True, filters={"label": LABEL}):
        try:
            found.append(client.containers.get(summary["Id"]))
        except docker.errors.NotFound:
            pass
    return found


def locked_down_host_config(api, memory_mb: int, kinds: tuple[str, ...], gvisor: bool = False, **settings):
    """What every sandbox container has, whatever it runs: docker-init as PID 1, removed once
    stopped, no network, `memory_mb` of memory and no swap on top, a read-only root filesystem, no
    new privileges, no capability (unless `settings` adds some), a private IPC namespace, no core
    dumps, and the seccomp allow-list of the kinds of program it runs (syscalls.docker_profile);
    with `gvisor`, gVisor's runtime (runsc) instead of runc. `settings` adds the rest (CPU quota,
    process limit, tmpfs, devices, mounts)."""
    import docker

    from evaluators.sandbox.syscalls import docker_profile

    mem = f"{memory_mb}m"
    if gvisor:
        settings["runtime"] = GVISOR_RUNTIME
    return api.create_host_config(
        init=True,
        auto_remove=True,
        network_mode="none",
        mem_limit=mem,
        memswap_limit=mem,  # equal: no swap on top of the memory limit
        read_only=True,
        security_opt=["no-new-privileges", "seccomp=" + docker_profile(kinds)],
        cap_drop=["ALL"],
        ipc_mode="private",
        ulimits=[docker.types.Ulimit(name="core", soft=0, hard=0)],
        **settings,
    )


def recv_frame(sock, deadline: float) -> tuple[int, bytes] | None:
    """The next frame of an attached exec's multiplexed output: (1 for stdout or 2 for stderr,
    its bytes), or None when the stream ended. Raises socket.timeout past `deadline`."""
    header = _recv_exact(sock, 8, deadline)
    if header is None:
        return None
    stream, size = struct.unpack(">BxxxL", header)
    body = _recv_exact(sock, size, deadline)
    return None if body is None else (stream, body)


def _recv_exact(sock, n: int, deadline: float) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("sandbox backstop")
        sock.settimeout(remaining)
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf.extend(chunk)
    return bytes(buf)
