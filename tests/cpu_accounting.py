"""Where the suite's time goes: each test's wall time and the CPU time of everything it ran.

A pytest plugin (tests/conftest.py loads it when `DISCOVER_TEST_CPU_LOG` names a file;
benchmarks/suite_cpu.py runs the suite with it and prints the summary). Each pytest(-xdist) process
moves itself into a cgroup of its own (cgroup v1 `cpuacct`, or v2), so that the CPU time of every
process it starts, reaped or not, in a session of its own or not (servers, Ray's processes, sandboxed
candidates), is counted; around each test its cgroup's usage is read. A test's CPU time is then
exact for what its worker started, and its wall time minus that is waiting (for servers, restarts,
sleeps, or a CPU). Long-lived processes a fixture started keep counting against the test that runs
while they work; processes in Docker's cgroups (containers) are counted apart, as the engine's total
over the test, which overlaps with other workers' tests.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

LOG_ENV = "DISCOVER_TEST_CPU_LOG"
V1 = "/sys/fs/cgroup/cpuacct"
V2 = "/sys/fs/cgroup"
DOCKER = ("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage", "/sys/fs/cgroup/system.slice/cpu.stat")


def _own_group() -> tuple[str, str]:
    """A new cgroup holding this process: (directory, the file that tells its CPU time)."""
    name = f"discover-test-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}"
    if os.path.isfile(os.path.join(V1, "cpuacct.usage")):
        group = os.path.join(V1, name)
        os.makedirs(group, exist_ok=True)
        Path(group, "cgroup.procs").write_text(str(os.getpid()))
        return group, os.path.join(group, "cpuacct.usage")
    own = Path("/proc/self/cgroup").read_text().splitlines()[0].split(":", 2)[2]
    parent = os.path.join(V2, own.lstrip("/"), "..")
    group = os.path.realpath(os.path.join(parent, name))
    os.makedirs(group, exist_ok=True)
    Path(group, "cgroup.procs").write_text(str(os.getpid()))
    return group, os.path.join(group, "cpu.stat")


def _cpu_s(path: str | None) -> float:
    """Seconds of CPU in a cgroup's usage file (v1 ns, v2 `usage_usec`); 0 when there is none."""
    if not path:
        return 0.0
    try:
        text = Path(path).read_text()
    except OSError:
        return 0.0
    if path.endswith("cpu.stat"):
        return int(text.split("usage_usec", 1)[1].split()[0]) / 1e6
    return int(text) / 1e9


class CpuLog:
    def __init__(self, log: Path) -> None:
        self.log = log
        self.group, self.usage = _own_group()
        self.docker = next((p for p in DOCKER if os.path.isfile(p)), None)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201
        wall, cpu, docker = time.monotonic(), _cpu_s(self.usage), _cpu_s(self.docker)
        yield
        record = {
            "test": item.nodeid,
            "file": item.nodeid.split("::", 1)[0],
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "wall_s": round(time.monotonic() - wall, 3),
            "cpu_s": round(_cpu_s(self.usage) - cpu, 3),
            "docker_cpu_s": round(_cpu_s(self.docker) - docker, 3),
        }
        with open(self.log, "a", encoding="utf-8") as f:  # one short line per write: whole under O_APPEND
            f.write(json.dumps(record) + "\n")

    def pytest_unconfigure(self) -> None:
        """Back to the parent cgroup; ours removed once nothing it started is left in it."""
        try:
            Path(self.group, "..", "cgroup.procs").write_text(str(os.getpid()))
            os.rmdir(self.group)
        except OSError:
            pass  # a process it started still runs: the empty group stays until the next boot


def register(config: pytest.Config) -> None:
    """Load the plugin when `DISCOVER_TEST_CPU_LOG` is set (it needs root: it makes cgroups)."""
    log = os.environ.get(LOG_ENV)
    if log and not config.pluginmanager.has_plugin("discover-cpu-log"):
        config.pluginmanager.register(CpuLog(Path(log)), "discover-cpu-log")
