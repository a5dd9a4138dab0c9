"""A busy host does not turn a valid compiled program, nor a Python candidate, into a TLE (issue 43), and
a candidate's own processes queued for its CPUs never pass for a busy host. A case's wall-clock
backstop exists for programs that sleep or block; the time a program spends runnable but waiting
for a CPU (the kernel's schedstat run_delay) is added to it, up to `NativeLimits.starved_wall_s`,
and a program still short of CPU there gets no verdict: the evaluation raises SessionError, an
infrastructure failure (retried by the engine), never a zero reward.

The tests make the host busy themselves: HOGS_PER_CPU spinning processes on every CPU of this
machine, each in a session of its own (so the kernel's autogroup scheduling counts each apart, as
it does the processes of separate jobs), so the program gets a small share of whichever CPU it is
given, whatever else runs. Those hogs take every CPU from whatever else runs beside them, and a load
from elsewhere moves what these tests see: the module is `exclusive` (pyproject.toml), run alone after
the others by `make test`, never beside other tests' workers (the `busy_host` fixture refuses)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from evaluators.sandbox import ProcessSandbox
from evaluators.sandbox import native as native_module
from evaluators.sandbox.base import InfrastructureError, SandboxLimits, infrastructure_failure
from evaluators.sandbox.native import NativeLimits, SessionError

HOGS_PER_CPU = 8
# About 0.5 s of CPU, then an answer: with 8 hogs on its CPU it needs several times its 4 s
# wall-clock backstop (cpu_s 2: 1.5 * 2 + 1), well inside 10 times it.
WORKS_HALF_A_SECOND = r"""
#include <cstdio>
#include <ctime>
int main() {
    volatile unsigned long x = 0;
    clock_t start = clock();
    while (clock() - start < CLOCKS_PER_SEC / 2) x += 1;
    std::printf("done %lu\n", x > 0 ? 1UL : 0UL);
    return 0;
}
"""
SLEEPS = r"""
#include <unistd.h>
int main() { sleep(1000); return 0; }
"""
LIMITS = NativeLimits(cpu_s=2.0, memory_mb=256, parallel=1)

pytestmark = pytest.mark.exclusive


@pytest.fixture
def busy_host():
    """HOGS_PER_CPU spinning processes on each CPU this process may use, ended after the test. Never
    beside other pytest-xdist workers: their tests would be starved too (and time out), and their load
    would be this test's."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        pytest.fail(
            f"this test loads every CPU and must run alone, not beside {workers - 1} other pytest-xdist worker(s): "
            "`pytest -m exclusive` (as `make test` does)"
        )
    hogs = []
    for cpu in sorted(os.sched_getaffinity(0)):
        for _ in range(HOGS_PER_CPU):
            hogs.append(
                subprocess.Popen(
                    [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"],
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # each its own scheduling entity (the kernel's autogroup is per session)
                )
            )
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def test_a_program_starved_of_cpu_is_judged_on_its_own_time(busy_host) -> None:
    run = ProcessSandbox(isolation="standard").run_native(WORKS_HALF_A_SECOND, [(0, "")], LIMITS)
    assert run.compiled, run.compile_log
    (case,) = run.cases
    assert case.status == "OK", (case.status, case.detail, case.wall_s)
    assert case.stdout.startswith(b"done 1")
    assert case.cpu_s < LIMITS.cpu_s


def test_a_program_still_starved_at_the_cap_gets_no_verdict_but_an_infrastructure_failure(busy_host, monkeypatch) -> None:
    monkeypatch.setattr(native_module, "STARVED_WALL_FACTOR", 1.0)  # no room to move the backstop
    with pytest.raises(SessionError, match=r"case 0 could not be judged: the host was too busy \(its program waited") as raised:
        ProcessSandbox(isolation="standard").run_native(WORKS_HALF_A_SECOND, [(0, "")], LIMITS)
    assert infrastructure_failure(raised.value)  # retried by the engine, never a verdict


def test_a_sleeping_program_still_ends_at_its_backstop() -> None:
    run = ProcessSandbox(isolation="standard").run_native(SLEEPS, [(0, "")], LIMITS)
    (case,) = run.cases
    assert case.status == "TLE" and "wall-clock backstop of 4 s" in case.detail, case.detail
    assert case.wall_s < LIMITS.starved_wall_s


# A program whose own processes queue for its one CPU (the quota of its cgroup) had its CPU: it ends
# at its wall-clock backstop, with a fraction of its CPU time used, never taken for a busy host
# (which would move the backstop until it had used its CPU time). Its spinners are never waited
# for and renew themselves (a fresh process every half second of CPU), so none is killed at the
# CPU-time limit.
SPINNERS_KEEP_ITS_CPU_BUSY = r"""
#include <csignal>
#include <ctime>
#include <unistd.h>
static void spin_forever() {
    for (;;) {
        clock_t start = clock();
        for (volatile unsigned long x = 0; clock() - start < CLOCKS_PER_SEC / 2; x++) {}
        if (fork() != 0) _exit(0);
    }
}
int main() {
    std::signal(SIGCHLD, SIG_IGN);
    for (int i = 0; i < 10; i++)
        if (fork() == 0) spin_forever();
    for (volatile unsigned long x = 0;; x++) {}
}
"""


def test_a_program_queued_behind_its_own_processes_is_a_tle_and_not_taken_for_a_busy_host() -> None:
    run = ProcessSandbox(isolation="standard").run_native(SPINNERS_KEEP_ITS_CPU_BUSY, [(0, "")], LIMITS)
    assert run.compiled, run.compile_log
    (case,) = run.cases
    assert case.status == "TLE" and "wall-clock backstop of 4 s" in case.detail, case.detail


# The same for the Python domains (the process backend's `run`: a program's `construct`, as the math
# and denoising problems run it): about 0.5 s of CPU with 3 s of wall-clock limit.
PYTHON_HALF_A_SECOND = (
    "import time\n"
    "def construct(parent):\n"
    "    start, x = time.process_time(), 0\n"
    "    while time.process_time() - start < 0.5:\n"
    "        x += 1\n"
    "    return [1.0, 2.0]\n"
)
PYTHON_LIMITS = SandboxLimits(timeout_s=3.0, memory_mb=512, cpus=1)


def test_a_python_candidate_starved_of_cpu_is_judged_on_its_own_time(busy_host) -> None:
    result = ProcessSandbox(isolation="standard").run(PYTHON_HALF_A_SECOND, "construct", None, PYTHON_LIMITS)
    assert result.ok and result.output == [1.0, 2.0], result.reason


def test_a_python_candidate_still_starved_at_the_cap_gets_no_verdict_but_an_infrastructure_failure(busy_host, monkeypatch) -> None:
    from evaluators.sandbox import process as process_module

    monkeypatch.setattr(process_module, "STARVED_WALL_FACTOR", 1.0)  # no room to move the limit
    with pytest.raises(InfrastructureError, match=r"the candidate could not be judged: the host was too busy") as raised:
        ProcessSandbox(isolation="standard").run(PYTHON_HALF_A_SECOND, "construct", None, PYTHON_LIMITS)
    assert infrastructure_failure(raised.value)  # retried by the engine, never a verdict


def test_a_sleeping_python_candidate_still_times_out_at_its_limit() -> None:
    program = "import time\ndef construct(parent):\n    time.sleep(1000)\n"
    result = ProcessSandbox(isolation="standard").run(program, "construct", None, PYTHON_LIMITS)
    assert not result.ok and result.reason.startswith("timeout after 3 s"), result.reason


# A candidate whose own processes queue for its CPUs (24 spinning processes on its one CPU of quota, as
# a fork bomb) waits for a CPU as much as a starved one, but it had its CPUs: it times out at its
# limit, and never passes for a busy host (its tasks wait 24/25 of the time: counted as the host's
# load, that moves the limit to its cap and ends in an infrastructure failure that the engine
# retries, then a failed step: a candidate would have stopped the run). Its spinners leave its process tree
# (double fork) and are never waited for, so only its cgroup, or in a bubblewrap sandbox the
# namespace's init, still counts their CPU.
TWENTY_FOUR_SPINNERS = (
    "import os, signal\n"
    "def construct(parent):\n"
    "    signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
    "    for _ in range(24):\n"
    "        if os.fork() == 0:\n"
    "            if os.fork() == 0:\n"
    "                while True:\n"
    "                    pass\n"
    "            os._exit(0)\n"
    "    while True:\n"
    "        pass\n"
)


def test_a_candidate_queued_behind_its_own_processes_times_out_and_is_not_taken_for_a_busy_host() -> None:
    result = ProcessSandbox(isolation="standard").run(TWENTY_FOUR_SPINNERS, "construct", None, PYTHON_LIMITS)
    assert not result.ok and result.reason.startswith("timeout after 3 s"), result.reason


# The same in a Docker container (runc: the container's processes have the host kernel's schedstat).
# The container is started before the host gets busy: only the candidate's run is measured.


@pytest.fixture
def docker_box():
    from tests.sandbox_backends import unavailable_outside_ci

    unavailable_outside_ci("python-math")
    from evaluators.sandbox.docker import DockerSandbox

    box = DockerSandbox(image="python-math", concurrency=1)
    warm = box.run("def construct(parent):\n    return [0.0]\n", "construct", None, PYTHON_LIMITS)
    assert warm.ok, warm.reason
    yield box
    box.close()


def test_a_python_candidate_starved_in_a_docker_container_is_judged_on_its_own_time(docker_box, busy_host) -> None:
    result = docker_box.run(PYTHON_HALF_A_SECOND, "construct", None, PYTHON_LIMITS)
    assert result.ok and result.output == [1.0, 2.0], result.reason


def test_a_python_candidate_still_starved_in_a_docker_container_gets_an_infrastructure_failure(docker_box, busy_host, monkeypatch) -> None:
    from evaluators.sandbox import docker as docker_module

    monkeypatch.setattr(docker_module, "STARVED_WALL_FACTOR", 1.0)  # no room to move the limit
    with pytest.raises(InfrastructureError, match=r"the candidate could not be judged: the host was too busy") as raised:
        docker_box.run(PYTHON_HALF_A_SECOND, "construct", None, PYTHON_LIMITS)
    assert infrastructure_failure(raised.value)


def test_a_sleeping_python_candidate_in_a_docker_container_still_times_out_at_its_limit(docker_box) -> None:
    program = "import time\ndef construct(parent):\n    time.sleep(1000)\n"
    result = docker_box.run(program, "construct", None, PYTHON_LIMITS)
    assert not result.ok and result.reason.startswith("timeout after 3 s"), result.reason


def test_a_candidate_queued_behind_its_own_processes_in_a_docker_container_times_out_and_is_not_taken_for_a_busy_host(docker_box) -> None:
    result = docker_box.run(TWENTY_FOUR_SPINNERS, "construct", None, PYTHON_LIMITS)
    assert not result.ok and result.reason.startswith("timeout after 3 s"), result.reason
