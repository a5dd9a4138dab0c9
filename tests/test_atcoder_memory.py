"""AtCoder host memory does not grow with the number of cases (issue 27): each case's raw output
is judged as the case ends and dropped, so at most `parallel` + 1 outputs are alive at once (one
in each slot, one in the judge), on the process backend and the Docker backend alike.

The count is behavioural: every output the sandbox side produces (the runner's raw report and the
CaseRun made from it) is tracked by a weak reference, and each time the judge sees a case the
number of cases whose output is still alive is recorded. Before the fix every output stayed in
the evaluation's list of finished cases until the end, so the count reached the number of cases.
"""

from __future__ import annotations

import base64
import gc
import threading
import weakref

import pytest

from evaluators.registry import get_problem
from evaluators.sandbox import native
from evaluators.sandbox.native import NativeLimits, run_program
from tests.sandbox_backends import either_backend

# A valid AHC039 answer (a square), printed again and again: the judge reads every polygon and
# scores the last one, so a large output is still accepted.
RECTANGLE = "4\n20000 20000\n80000 20000\n80000 80000\n20000 80000\n"


class Outputs:
    """Weak references to every object holding a case's raw output, by case; `alive()` counts the
    cases with at least one still alive, `peak` the largest count seen when the judge looked."""

    def __init__(self):
        self.lock = threading.Lock()
        self.refs: list[tuple[int, weakref.ref]] = []
        self.peak = 0
        self.seen = 0

    def track(self, case: int, obj) -> None:
        with self.lock:
            self.refs.append((case, weakref.ref(obj)))

    def alive(self) -> int:
        with self.lock:
            return len({case for case, ref in self.refs if ref() is not None and _holds_output(ref())})

    def look(self) -> None:
        count = self.alive()
        with self.lock:
            self.peak = max(self.peak, count)
            self.seen += 1


def _holds_output(obj) -> bool:
    return bool(obj["stdout"]) if isinstance(obj, dict) else bool(obj.stdout)


class Raw(dict):
    """A runner's report (a dict the test can hold a weak reference to)."""


@pytest.fixture
def outputs(monkeypatch) -> Outputs:
    """Track every CaseRun the sandbox side makes from a runner's report."""
    tracked = Outputs()
    real = native.classify

    def classify(raw, limits):
        run = real(raw, limits)
        tracked.track(run.case, run)
        return run

    monkeypatch.setattr(native, "classify", classify)
    return tracked


class FakeSession:
    """A runner that 'runs' every case at once and reports `size` bytes of output: the slots race
    ahead of the judge, which is where outputs used to pile up."""

    def __init__(self, outputs: Outputs, payload: bytes):
        self.outputs = outputs
        self.encoded = base64.b64encode(payload).decode()
        self.size = len(payload)

    def start(self, setup, timeout):
        return {"kind": "ready", "ok": True, "binary": "", "log": "", "seconds": 0.0}

    def case(self, index, text, timeout):
        raw = Raw(
            kind="case",
            index=index,
            exit_code=0,
            signal=None,
            timed_out=False,
            cpu_s=0.01,
            wall_s=0.01,
            peak_kb=4096,
            stdout=self.encoded,
            stdout_bytes=self.size,
            stderr="",
            clean=True,
        )
        self.outputs.track(index, raw)
        return raw

    def end(self, timeout):
        return {"kind": "end", "clean": True}

    def close(self):
        pass


class FakeSandbox:
    """run_native as both backends do it (native.run_program), with fake runners."""

    def __init__(self, outputs: Outputs, payload: bytes):
        self.outputs, self.payload = outputs, payload

    def run_native(self, source, cases, limits, on_case=None):
        return run_program(lambda slot: FakeSession(self.outputs, self.payload), source, cases, limits, _looking(self.outputs, on_case))


def _looking(outputs: Outputs, on_case):
    def look(run):
        outputs.look()
        return on_case(run) if on_case is not None else True

    return look


@pytest.mark.parametrize("parallel", [1, 2, 3])
def test_the_judge_never_sees_more_than_parallel_plus_one_outputs_alive(outputs, parallel) -> None:
    payload = (RECTANGLE * 2000).encode()  # 100 kB: enough to matter, quick to judge
    problem = get_problem("ahc039", cases="0-39", stop_at_first_failure=False, cpus=parallel)
    result = problem.evaluate("int main() {}", None, FakeSandbox(outputs, payload))
    assert result.valid and result.metrics["cases_passed"] == 40, result.reason
    assert outputs.seen == 40
    assert outputs.peak <= parallel + 1, f"{outputs.peak} outputs alive at once with {parallel} slots"
    gc.collect()
    assert outputs.alive() == 0


def test_the_finished_cases_keep_their_verdicts_but_not_their_outputs(outputs) -> None:
    payload = b"1 2 3\n" * 1000
    cases = [(k, "") for k in range(12)]
    seen: list[int] = []
    run = run_program(
        lambda slot: FakeSession(outputs, payload),
        "",
        cases,
        NativeLimits(parallel=2),
        _looking(outputs, lambda r: seen.append(len(r.stdout)) or True),
    )
    assert sorted(c.case for c in run.cases) == list(range(12)) and all(c.status == "OK" for c in run.cases)
    assert seen == [len(payload)] * 12  # the judge saw every output whole
    assert all(c.stdout == b"" for c in run.cases)
    assert outputs.peak <= 3
    del run
    gc.collect()
    assert outputs.alive() == 0


def test_without_a_judge_the_outputs_are_returned(outputs) -> None:
    run = run_program(lambda slot: FakeSession(outputs, b"42\n"), "", [(0, ""), (1, "")], NativeLimits(parallel=2))
    assert [c.stdout for c in sorted(run.cases, key=lambda c: c.case)] == [b"42\n", b"42\n"]


# -- a real program printing close to the output cap, on both backends ------------------------------

LARGEST = (
    "#include <cstdio>\n#include <cstring>\n#include <string>\n"
    "int main() {\n"
    f'  std::string s; const char *r = "{RECTANGLE.encode("unicode_escape").decode()}";\n'
    "  size_t cap = 32u * 1024 * 1024, n = strlen(r);\n"
    "  while (s.size() + n <= cap) s += r;\n"
    "  fwrite(s.data(), 1, s.size(), stdout);\n"
    "}\n"
)


@pytest.fixture(params=["process", "docker"])
def sandbox(request):
    yield from either_backend(request.param, "cpp20")


def test_a_program_printing_the_largest_output_keeps_at_most_parallel_plus_one_alive(sandbox, outputs) -> None:
    cases = 6
    problem = get_problem("ahc039", cases=f"0-{cases - 1}", stop_at_first_failure=False, cpus=2, timeout_s=400)
    inner = sandbox.run_native
    sandbox.run_native = lambda source, inputs, limits, on_case=None: inner(source, inputs, limits, _looking(outputs, on_case))
    try:
        result = problem.evaluate(LARGEST, None, sandbox)
    finally:
        del sandbox.run_native
    rows = result.metrics.get("cases", [])
    assert [r["verdict"] for r in rows] == ["AC"] * cases, result.reason or result.observation
    expected = problem.judge_case(0, (RECTANGLE * ((32 << 20) // len(RECTANGLE))).encode()).score
    assert rows[0]["score"] == expected
    assert outputs.seen == cases
    assert outputs.peak <= 3, f"{outputs.peak} outputs alive at once with 2 slots"
    gc.collect()
    assert outputs.alive() == 0
