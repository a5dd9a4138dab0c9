"""A Ray cluster of several nodes on this machine's loopback, for the tests (tests/conftest.py `ray_cluster`).

A head and worker nodes started with `ray start`, each its own node (its own raylet, object store
and workers) as on separate machines, all on 127.0.0.2: Ray rewrites 127.0.0.1 and `localhost` to
the machine's routable address when a node joins (services.resolve_ip_for_localhost), while the
rest of 127/8 is loopback all the same and kept as it is. No dashboard; every port is chosen free,
so the cluster never meets another one on the machine. Each `ray start` runs in a session of its
own, and the cluster is torn down by killing those process groups (never `ray stop`, which stops
every Ray process of the user on the machine).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HOST = "127.0.0.2"
OBJECT_STORE_BYTES = 80 * 1024 * 1024
STARTS = 3  # tries to start one node


def free_port(host: str = HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LoopbackRayCluster:
    """`ray start --head` and `workers` worker nodes on 127.0.0.2, `cpus` CPUs each."""

    def __init__(self, temp_dir: Path, workers: int = 2, cpus: int = 1, env: dict[str, str] | None = None):
        self.temp_dir, self.workers, self.cpus = temp_dir, workers, cpus
        # workers at niceness 0 (Ray's default 15 starves them beside other tests: docs/operations.md)
        self.env = {**os.environ, "RAY_worker_niceness": "0", **(env or {})}
        self.env.pop("RAY_ADDRESS", None)
        self.groups: list[int] = []
        self.address = ""

    def _ray_start(self, *args: str, env: dict[str, str] | None = None) -> int:
        # each node its own range of worker ports, above the ephemeral ports (32768-60999) that free_port hands out
        base = 61000 + (os.getpid() % 9) * 400 + 100 * len(self.groups)
        cmd = [
            str(Path(sys.executable).with_name("ray")),
            "start",
            f"--node-ip-address={HOST}",
            f"--num-cpus={self.cpus}",
            "--num-gpus=0",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
            # no log monitor: every driver connects with log_to_driver=False, so the node's workers'
            # logs would be published to no one, by a Python process that polls them all the time
            "--include-log-monitor=False",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--min-worker-port={base}",
            f"--max-worker-port={base + 99}",
            *args,
        ]
        for attempt in range(1, STARTS + 1):
            proc = subprocess.Popen(
                cmd, env={**self.env, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
            )
            self.groups.append(proc.pid)  # its daemons stay in this session's process group
            try:
                out, _ = proc.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            if proc.returncode == 0:
                return proc.pid
            # Ray gives a node's raylet 30 s (hard-coded) to register: a busy machine misses it; start that node again
            self._kill([proc.pid])
            if attempt == STARTS or "timed out during startup" not in out:
                raise RuntimeError(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{out[-3000:]}")

    def start(self) -> LoopbackRayCluster:
        port = free_port()
        self._ray_start(
            "--head",
            f"--port={port}",
            "--include-dashboard=false",
            f"--dashboard-port={free_port()}",
            f"--ray-client-server-port={free_port()}",
            f"--temp-dir={self.temp_dir}",
        )
        self.address = f"{HOST}:{port}"
        for i in range(self.workers):
            self._ray_start(f"--address={self.address}", f'--resources={{"worker{i}": 1}}')
        self.wait_for_nodes(1 + self.workers)
        return self

    def wait_for_nodes(self, n: int, timeout: float = 120) -> None:
        """Until `ray status` lists `n` live nodes (a subprocess: this process stays unconnected)."""
        code = (
            "import ray, sys; ray.init(address=sys.argv[1], _node_ip_address=sys.argv[2], log_to_driver=False);"
            "print(sum(1 for n in ray.nodes() if n['Alive']))"
        )
        deadline, seen = time.time() + timeout, ""
        while time.time() < deadline:
            done = subprocess.run([sys.executable, "-c", code, self.address, HOST], env=self.env, capture_output=True, text=True)
            seen = done.stdout.strip() or done.stderr[-500:]
            if done.returncode == 0 and seen.isdigit() and int(seen) >= n:
                return
            time.sleep(2)
        raise RuntimeError(f"the loopback Ray cluster at {self.address} did not reach {n} nodes in {timeout:.0f} s: {seen}")

    def add_node(self, resources: dict[str, float], env: dict[str, str] | None = None) -> int:
        """One more worker node with these custom resources (and, for its processes, these environment
        variables); returns its id for `kill_node`."""
        return self._ray_start(f"--address={self.address}", f"--resources={json.dumps(resources)}", env=env)

    def kill_node(self, node: int) -> None:
        """SIGKILL every process of a node (its raylet, object store and workers), as a machine lost."""
        self._kill([node])

    def stop(self) -> None:
        """Kill the nodes' processes: those of the `ray start` sessions and their descendants (the workers
        a raylet starts put themselves in process groups of their own), by process id."""
        self._kill(self.groups)
        self.groups.clear()

    def _kill(self, groups: list[int]) -> None:
        import psutil

        members = [p for p in psutil.process_iter() if _pgid(p.pid) in groups]
        doomed = {p.pid: p for p in members}
        for p in members:
            try:
                doomed.update({c.pid: c for c in p.children(recursive=True)})
            except psutil.NoSuchProcess:
                pass
        for p in doomed.values():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(list(doomed.values()), timeout=10)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
