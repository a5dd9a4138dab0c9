"""A candidate that floods the host's seccomp listener (issue 43): every system call outside its
profile goes to a thread of the evaluating process, outside the candidate's cgroup, so a candidate
calling a new number in a loop made the host count (and later name) hundreds of thousands of
numbers, for its whole time limit. Now a run's refused calls are counted in bounded space
(`supervisor.DISTINCT_MAX` numbers, the rest together), the run is stopped past
`supervisor.REFUSED_MAX` refused calls with its own verdict, the verdict's fields are capped, and
nothing of the run is kept by the sandbox object afterwards. Python and compiled candidates alike.
"""

from __future__ import annotations

import json

import psutil

from evaluators.sandbox import ProcessSandbox, SandboxLimits
from evaluators.sandbox.native import NativeLimits
from evaluators.sandbox.supervisor import REFUSED_MAX

FLOOD_PY = """
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)

def construct(p):
    n, start = 1000, time.monotonic()
    while time.monotonic() - start < 50:  # a new, refused number each call, for most of the time limit
        libc.syscall(n)
        n += 1
    return [0.5]
"""

FLOOD_CPP = r"""
#include <unistd.h>
#include <sys/syscall.h>
#include <ctime>
int main() {
    long n = 1000;
    time_t start = time(nullptr);
    while (time(nullptr) - start < 50) syscall(n++);
    return 0;
}
"""

HOST_GROWTH_MB = 20  # what the evaluating process may grow by over one flooding run
VERDICT_BYTES = 64 * 1024


def _box() -> ProcessSandbox:
    """The process backend with bubblewrap and its seccomp listener (it refuses where bwrap cannot run: no skip)."""
    return ProcessSandbox(isolation="standard")


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def test_a_python_candidate_flooding_refused_calls_is_stopped_with_a_bounded_verdict() -> None:
    box = _box()
    box.run("def construct(p):\n    return [0.5]\n", "construct", None, SandboxLimits(timeout_s=60, memory_mb=512, cpus=1))
    before = _rss_mb()
    result = box.run(FLOOD_PY, "construct", None, SandboxLimits(timeout_s=60, memory_mb=512, cpus=1, max_output_bytes=100_000))
    grown = _rss_mb() - before
    assert not result.ok
    assert result.reason.startswith(f"stopped after more than {REFUSED_MAX} system calls outside the sandbox's python profile")
    assert "calls of other numbers" in result.reason  # past the first DISTINCT_MAX numbers, counted together
    assert "timeout" not in result.reason  # stopped for the flood, not served until its time limit
    size = len(json.dumps({"reason": result.reason, "logs": result.logs, "denied": result.denied}))
    assert size < VERDICT_BYTES, size
    assert grown < HOST_GROWTH_MB, f"the host process grew by {grown:.1f} MB"
    assert box.calls_seen == {}  # nothing of the run kept by the sandbox object


def test_a_compiled_case_flooding_refused_calls_is_stopped_with_a_bounded_detail() -> None:
    box = _box()
    before = _rss_mb()
    run = box.run_native(FLOOD_CPP, [(0, "")], NativeLimits(cpu_s=60.0, memory_mb=256, parallel=1))
    grown = _rss_mb() - before
    assert run.compiled, run.compile_log
    (case,) = run.cases
    assert case.status == "RE" and case.detail.startswith(f"stopped after more than {REFUSED_MAX} system calls"), case.detail
    assert len(case.detail) < VERDICT_BYTES and "calls of other numbers" in case.detail
    assert grown < HOST_GROWTH_MB, f"the host process grew by {grown:.1f} MB"
    assert box.calls_seen == {}


def test_a_verdicts_fields_are_bounded_whatever_the_candidate_writes() -> None:
    from evaluators.base import OBSERVATION_CHARS, REASON_CHARS, ParentView
    from evaluators.registry import get_problem

    huge = "def construct(p):\n    print('x' * 3_000_000)\n    raise ValueError('y' * 2_000_000)\n"
    problem = get_problem("ac1", timeout_s=30.0)
    result = problem.evaluate(huge, ParentView(code="", construction=[0.5] * 10), _box())
    assert (result.valid, result.reward) == (False, 0.0)
    assert len(result.reason) <= REASON_CHARS and len(result.observation) <= OBSERVATION_CHARS
    # and whatever path a text takes into a verdict, the verdict bounds it, saying how much was cut
    from evaluators.base import EvalResult

    made = EvalResult(reward=0.0, valid=False, reason="r" * 10**6, observation="o" * 10**6 + "END")
    assert len(made.reason) == REASON_CHARS and made.reason.endswith(f"[... {10**6 - REASON_CHARS} characters cut]")
    assert len(made.observation) == OBSERVATION_CHARS and made.observation.endswith("END")  # the output's tail kept
