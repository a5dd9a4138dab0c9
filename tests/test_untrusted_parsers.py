"""What the fuzzing benchmark (benchmarks/fuzz_parsers.py) found in the host-side code that reads what
a candidate returns, each kept as its minimal input: every one gets a verdict or a documented
answer, never an exception, and the C++ archive key is computed as the regular expression it
replaced did, in linear time."""

from __future__ import annotations

import random
import re

import pytest

from evaluators.algorithms.ahc039 import PurseSeineProblem
from evaluators.algorithms.judging import read_integers
from evaluators.kernels.trimul import verdict
from evaluators.kernels.trimul.static_rules import check_source
from evaluators.parsing import normalize_code
from evaluators.sandbox.native import NativeRun

JOB = {"test_seeds": [[1]], "benchmarks": [{}], "timing": {"min_calls": 1}}
VERSIONS = {"torch": "2.11.0", "triton": "3.6.0"}


@pytest.mark.parametrize(
    "report",
    [
        {"calls": 1},
        {"calls": [0]},
        {"calls": [{"set": "benchmarks", "shape": 0, "kind": "warmup"}, {"set": "benchmarks", "shape": 0}]},
        {"calls": [{"set": "tests", "shape": "0"}]},
        [],
        {"versions": "x", "calls": []},
        {"calls": [], "benchmarks": 1},  # found by benchmarks/fuzz_parsers.py: was a TypeError
    ],
    ids=[
        "calls-not-a-list",
        "call-not-an-object",
        "call-without-kind",
        "shape-not-a-number",
        "not-an-object",
        "versions",
        "benchmarks-not-a-list",
    ],
)
def test_a_malformed_driver_report_is_a_reason_not_an_exception(report: object) -> None:
    why = verdict.report_problem(JOB, report)  # type: ignore[arg-type]
    assert isinstance(why, str) and why


@pytest.mark.parametrize(
    "ms", [10**400, 1e300, verdict.MAX_CALL_MS * 1.001, 0, -1.0], ids=["over-a-float", "huge", "over-an-hour", "zero", "negative"]
)
def test_a_timed_call_without_a_time_a_call_can_take_is_refused_before_anything_is_computed_from_it(ms: float) -> None:
    """A time of 1e300 ms once passed and overflowed the spread's squares (OverflowError: found by
    benchmarks/fuzz_parsers.py); a time is positive and at most an hour."""
    calls = [
        {"set": "tests", "shape": 0, "kind": "test"},
        {"set": "benchmarks", "shape": 0, "kind": "warmup"},
        {"set": "benchmarks", "shape": 0, "kind": "timed", "seed": 1, "ms": ms},
    ]
    why = verdict.report_problem(JOB, {"calls": calls, "versions": VERSIONS})
    assert why == "benchmark shape 0: a timed call has no time between 0 and 3.6e+06 ms"
    calls[-1]["ms"] = 0.25
    assert verdict.report_problem(JOB, {"calls": calls, "versions": VERSIONS}) == ""
    assert verdict.runtimes_us(JOB, {"calls": calls}) == [250.0]


@pytest.mark.parametrize("source", ["x" + ".y" * 330, "-" * 494 + "1", "-" * 5966], ids=["attributes", "unary", "parser-stack"])
def test_a_kernel_nested_too_deeply_is_a_broken_rule(source: str) -> None:
    assert check_source(source) == ["the kernel is nested too deeply to check (an expression or statement nested hundreds of levels)"]


def test_a_token_with_a_non_ascii_character_after_many_digits_is_not_an_integer() -> None:
    for text in ("4" * 19 + "\x80", "1234567890123456789a"):
        read = read_integers(text)
        assert (read.count, read.bad, read.bad_reason) == (1, 0, "not an integer"), text
    read = read_integers("1 2 " + "9" * 20)
    assert list(read.values) == [1, 2] and read.bad == 2 and read.bad_reason == "number out of range"


def test_the_cpp_archive_key_strips_comments_as_the_regular_expression_did() -> None:
    """The linear scanner gives what `//[^\\n]*|/\\*.*?\\*/` (DOTALL) gave on every string of comment
    markers tried; on `/* ` repeated (no `*/`: the expression rescanned to the end from each) nothing
    is a comment."""
    old, space = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL), re.compile(r"\s+")
    pieces = ["/", "*", " ", "\n", "a", "//", "/*", "*/", "/*/", '"']
    rng = random.Random(7)
    for _ in range(5000):
        code = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        assert normalize_code(code, "cpp") == space.sub("", old.sub("", code)), repr(code)
    assert normalize_code("/* " * 50_000, "cpp") == "/*" * 50_000
    assert normalize_code("int a; // x\n/* y */ int b;", "cpp") == "inta;intb;"


class _NoCaseRan:
    """A sandbox whose program compiled and ran no case, with a blank error (what the fuzzer gave)."""

    name = "blank"

    def __init__(self, compiled: bool) -> None:
        self.compiled = compiled

    def run_native(self, source: str, cases: object, limits: object, on_case: object = None) -> NativeRun:
        return NativeRun(compiled=self.compiled, error=" \n", compile_log="")


@pytest.mark.parametrize("compiled", [True, False], ids=["no-case-ran", "not-compiled"])
def test_an_atcoder_evaluation_that_ran_no_case_is_invalid_with_a_reason(compiled: bool) -> None:
    problem = PurseSeineProblem().with_cases("0-1", stop_at_first_failure=False)
    result = problem.evaluate("int main() {}", None, _NoCaseRan(compiled))
    assert not result.valid and result.reward == 0.0
    assert result.reason == ("only 0 of 2 cases ran" if compiled else "compile error")


@pytest.mark.parametrize("checked", [{"failure": "\r"}, {"error": "  \n"}, {"failure": ["not", "text"]}], ids=["cr", "blank", "a-list"])
def test_a_checker_failure_without_words_still_gives_a_verdict_with_a_reason(checked: dict) -> None:
    """A failure of "\\r" made an invalid verdict with a blank reason (found by benchmarks/fuzz_parsers.py)."""
    calls = [
        {"set": "tests", "shape": 0, "kind": "test"},
        {"set": "benchmarks", "shape": 0, "kind": "warmup"},
        {"set": "benchmarks", "shape": 0, "kind": "timed", "seed": 1, "ms": 0.25},
    ]
    result = verdict.timed_verdict(JOB, {"calls": calls, "versions": VERSIONS}, checked, "")
    assert not result.valid and result.reason.strip(), result
