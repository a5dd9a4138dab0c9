"""A busy host does not turn a valid compiled program into a TLE (issue 43). A case's wall-clock
backstop exists for programs that sleep or block; the time a program spends runnable but waiting
for a CPU (the kernel's schedstat run_delay) is added to it, up to `NativeLimits.starved_wall_s`,
and a program still short of CPU there gets no verdict: the evaluation raises SessionError, an
infrastructure failure (retried by the engine), never a zero reward.

The tests make the host busy themselves: HOGS_PER_CPU spinning processes on every CPU of this
machine, each in a session of its own (so the kernel's autogroup scheduling counts each apart, as
it does the processes of separate jobs), so the program gets a small share of whichever CPU it is
given, whatever else runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from evaluators.sandbox import ProcessSandbox
from evaluators.sandbox import native as native_module
from evaluators.sandbox.base import infrastructure_failure
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


@pytest.fixture
def busy_host():
    """HOGS_PER_CPU spinning processes on each CPU this process may use, ended after the test."""
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
