"""Fuzzing the host-side code that reads what an untrusted candidate returns, with Hypothesis.

    python benchmarks/fuzz_parsers.py --minutes 60 [--out benchmarks/results] [--examples 100] [--targets edits,atcoder]

What a candidate (a program the model wrote) or the model's answer hands back is read on the host,
outside any sandbox, so that code must never crash, hang or take super-linear time, whatever it
reads. Four targets, each fuzzed with random and structure-aware inputs:
- `edits`: applying SEARCH/REPLACE answers (discover/edits.py `parse_blocks`, `apply_edits`,
  `apply_blocks`); its documented error is `EditError` (a ValueError), nothing else;
- `verdicts`: a sandbox's raw output turned into a verdict (evaluators/sandbox/run_outputs.py
  `parse_output`, the Docker runner's report (`DockerSandbox._result`), the mathematics problems'
  `evaluate` from output.json's bytes, TriMul's driver and checker reports (verdict.py and the CPU
  check)); documented: none, a bad output is an invalid `EvalResult` (or `SandboxResult`);
- `values`: a model's answer turned into a candidate (discover/evaluation.py `candidate_of`, both
  answer formats), a construction into a verdict (each problem's `verify`), a candidate's code into
  its archive key (`archive_key`) and TriMul's rules read from a kernel's source (`check_source`);
  documented: none (None with a reason, an invalid verdict, a list of broken rules);
- `atcoder`: a program's stdout judged (AHC039 and AHC058 `judge_output`) and a contest evaluation
  from its case runs (`AtCoderProblem.evaluate`); documented: none, a bad output is a wrong answer.
An exception that is not one of the target's documented errors is a failure, and so is an output
that breaks the result's own contract (a valid verdict with a reward that is not finite, an invalid
one without a reason, a verdict that cannot be stored as JSON, a wrong answer scored above 0, a
no-op edit that changes the program). A failure does not stop the run: Hypothesis shrinks it to a
minimal input, which is recorded, and the next run goes on. Every call is timed, and one over
`HANG_S` seconds of CPU time (or `WALL_HANG_S` of wall time) is recorded as a hang with its input's
size (a call still running after
`HARD_STOP_S` is interrupted where Python can be); every call runs under the recursion limit it
has in production (`FREE_FRAMES`: Hypothesis raises the limit while a test runs).

The `--minutes` are split evenly over the targets, and a target's share evenly over its functions,
each fuzzed in fresh Hypothesis runs (`--examples` inputs each, random seeds: `derandomize=False`,
no example database) until its share is spent; then a linearity probe per target times inputs of
n and 8n (under the size caps the code states) and gives the ratio (about 8: linear; about 64:
quadratic). Writes fuzz_parsers.json and fuzz_parsers.md to `--out` and prints the Markdown;
Hypothesis's caches go to a temporary folder inside `--out`, removed at the end, and nothing is
written anywhere else. The structure of a run is fixed; its inputs are not.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import platform
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import hypothesis  # noqa: E402
from hypothesis import HealthCheck, Phase, Verbosity, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis import target as steer  # noqa: E402
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

from discover.edits import Block, EditError, apply_blocks, apply_edits, parse_blocks  # noqa: E402
from discover.evaluation import candidate_of  # noqa: E402
from evaluators.algorithms.ahc039 import PurseSeineProblem  # noqa: E402
from evaluators.algorithms.ahc058 import AppleGameProblem  # noqa: E402
from evaluators.algorithms.judging import MAX_OUTPUT_BYTES  # noqa: E402
from evaluators.base import EvalResult, Judgement, ParentView  # noqa: E402
from evaluators.sandbox.base import SandboxLimits, SandboxResult  # noqa: E402
from evaluators.sandbox.native import CaseRun, NativeRun  # noqa: E402
from evaluators.sandbox.run_outputs import compose_logs, parse_output  # noqa: E402
from storage.tables import record_to_json  # noqa: E402

HANG_S = 2.0  # a call that takes more CPU seconds than this is a hang
WALL_HANG_S = 5 * HANG_S  # and so is one that takes more wall seconds than this (CPU time is steady on a loaded machine, wall time not)
HARD_STOP_S = 60.0  # a call still running is interrupted (SIGALRM; C code such as a regular expression runs on)
TEXT_CHARS = 32_768  # the largest structure-aware text input (a quadratic parser takes seconds there)
BIG_BYTES = 262_144  # the largest structure-aware output (outputs are linear-time by contract)
REPEAT_MAX = 20_000  # a piece of input repeated up to this many times
SHORT_REPR = 240  # characters of an input's repr in a report
MIN_EXAMPLES = 5  # inputs every Hypothesis run tries, even past its target's share of the time
# Frames a target may use below its caller, as in production: Python's default recursion limit (1000)
# less the frames of a worker thread above a judge (Prefect's task runner, the engine, judge_candidate).
# Hypothesis raises the limit while a test runs, which would hide a RecursionError and turn it into
# slow deep recursion; each call runs under this limit instead.
FREE_FRAMES = 900


class Violation(AssertionError):
    """A result that breaks its own contract (an exception of the benchmark, never of a target)."""


class CallTimeout(BaseException):
    """A call still running after HARD_STOP_S (a BaseException, so no target's `except Exception` takes it)."""


class ShareSpent(BaseException):
    """Ends a Hypothesis run when its target's time is spent (Hypothesis lets a BaseException through)."""


FAILURES = (Exception, SystemExit, GeneratorExit)  # what Hypothesis takes for a failing input


# -- the targets: what is fuzzed, with which inputs, and what a result must keep ---------------------


@dataclass
class Case:
    """One function fuzzed: a strategy of inputs, the call (which checks the result), each input's size."""

    name: str
    strategy: st.SearchStrategy
    call: Callable[[Any], Any]
    size: Callable[[Any], int]


@dataclass
class Probe:
    """A linearity probe: the time of `call(make(n))` against that of `call(make(8 n))`."""

    name: str
    unit: str  # what n counts
    n: int
    make: Callable[[int], Any]
    call: Callable[[Any], Any]
    cap: str  # the size cap the code states for this input, and where


@dataclass
class Target:
    name: str
    what: str
    documented: tuple[type[BaseException], ...]  # the exceptions it may raise on bad input
    documented_where: str
    cases: list[Case]
    probes: list[Probe]


def _size(value: Any) -> int:
    """Characters or bytes of an input; of a tuple or list, its parts' together."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, (tuple, list)):
        return sum(_size(v) for v in value)
    if isinstance(value, Block):
        return _size(value.search) + _size(value.replace)
    if isinstance(value, (dict, int, float)) or value is None:
        return len(json.dumps(value, allow_nan=True, default=repr))
    return len(repr(value))


_RUN = re.compile(r"(.{1,16}?)\1{7,}", re.S)
_RUN_BYTES = re.compile(rb"(.{1,16}?)\1{7,}", re.S)


def _expr(value: Any) -> str:
    """A Python expression for `value`, with runs of a repeated piece written as `piece * count`."""
    if isinstance(value, (str, bytes)):
        parts, at = [], 0
        for m in (_RUN if isinstance(value, str) else _RUN_BYTES).finditer(value):
            if m.start() > at:
                parts.append(repr(value[at : m.start()]))
            parts.append(f"{m.group(1)!r} * {len(m.group(0)) // len(m.group(1))}")
            at = m.end()
        if at < len(value):
            parts.append(repr(value[at:]))
        return " + ".join(parts) or repr(value)
    if isinstance(value, tuple):
        return "(" + ", ".join(_expr(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list) and len(value) > 8 and all(type(v) is type(value[0]) and v == value[0] for v in value):
        return f"[{value[0]!r}] * {len(value)}"
    return repr(value)


def _short(value: Any, limit: int = SHORT_REPR) -> str:
    """`value` as a Python expression (`_expr`), its middle cut when long."""
    text = _expr(value)
    if len(text) <= limit:
        return text
    half = (limit - 40) // 2
    return f"{text[:half]} ...[{len(text) - 2 * half} characters]... {text[-half:]}"


def check_verdict(result: Any) -> None:
    """An EvalResult that the archive, the store and the rewards can take."""
    if not isinstance(result, EvalResult):
        raise Violation(f"returned a {type(result).__name__}, not an EvalResult")
    if result.valid and not math.isfinite(result.reward):
        raise Violation(f"a valid verdict with reward {result.reward!r}")
    if not result.valid and not result.reason.strip():
        raise Violation("an invalid verdict without a reason")
    try:
        json.dumps(record_to_json(result), allow_nan=True, sort_keys=True)  # what CandidateStore.put writes
    except (TypeError, ValueError, RecursionError) as err:
        raise Violation(f"a verdict that cannot be stored as JSON: {type(err).__name__}: {err}") from None


def check_judgement(result: Any) -> None:
    if not isinstance(result, Judgement):
        raise Violation(f"returned a {type(result).__name__}, not a Judgement")
    if result.valid and not (isinstance(result.score, int) and result.score >= 0):
        raise Violation(f"an accepted output with score {result.score!r}")
    if not result.valid and (result.score != 0 or not result.reason):
        raise Violation(f"a wrong answer with score {result.score!r} and reason {result.reason!r}")


# -- strategies shared by the targets ---------------------------------------------------------------

SPECIAL_NUMBERS: list[Any] = [
    0,
    1,
    -1,
    0.0,
    -0.0,
    0.5,
    1.0,
    -1.0,
    1e-300,
    5e-324,
    1e308,
    1.7976931348623157e308,
    float("nan"),
    float("inf"),
    float("-inf"),
    1000.0,
    1000.0000000001,
    1 + 1e-12,
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63) - 1,
    10**308,
    10**309,
    10**400,
]
NUMBERS = st.one_of(st.sampled_from(SPECIAL_NUMBERS), st.floats(0, 1), st.integers(0, 1000), st.floats(), st.integers())
SCALARS = st.one_of(NUMBERS, st.booleans(), st.none(), st.text(max_size=8))
JSON = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20
)
COUNTS = st.one_of(st.integers(1, 8), st.integers(1, REPEAT_MAX))  # mostly few, sometimes many
GARBAGE = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\xef\xbb\xbf", b"\r", b"\x1c", "\u3000".encode(), b"NaN", b"-Infinity", b"[", b"{"]


def repeated(pieces: st.SearchStrategy[str], limit: int = TEXT_CHARS) -> st.SearchStrategy[str]:
    """A run of pieces repeated a few times or thousands of times (large inputs from a few choices)."""
    return st.tuples(st.lists(pieces, min_size=1, max_size=4), COUNTS).map(lambda t: ("".join(t[0]) * t[1])[:limit])


def soup(pieces: st.SearchStrategy[str], limit: int = TEXT_CHARS) -> st.SearchStrategy[str]:
    """Text made of structure pieces, runs of them and random text."""
    part = st.one_of(pieces, repeated(pieces, limit), st.text(max_size=16))
    return st.lists(part, max_size=24).map(lambda parts: "".join(parts)[:limit])


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` with a few cuts, insertions, byte changes or repeated slices."""
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(("cut", "insert", "change", "repeat")))
        at = draw(st.integers(0, len(data)))
        if op == "cut":
            data = data[:at] if draw(st.booleans()) else data[at:]
        elif op == "insert":
            data = data[:at] + draw(st.one_of(st.binary(max_size=8), st.sampled_from(GARBAGE))) + data[at:]
        elif op == "change" and at < len(data):
            data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
        elif op == "repeat":
            piece = data[at : at + draw(st.integers(1, 64))]
            data = data[:at] + piece * draw(st.integers(1, 2000)) + data[at:]
    return data[: 4 * BIG_BYTES]


def _paths(value: Any, path: tuple = (), out: list | None = None, limit: int = 2000) -> list[tuple]:
    """Every place in a JSON value, as a path of keys and indices (at most `limit` of them)."""
    out = [] if out is None else out
    if len(out) >= limit:
        return out
    out.append(path)
    if isinstance(value, dict):
        for k, v in value.items():
            _paths(v, (*path, k), out, limit)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _paths(v, (*path, i), out, limit)
    return out


@st.composite
def mutated_json(draw: st.DrawFn, value: Any) -> Any:
    """`value` (a JSON value, copied) with a few places replaced by another value or removed."""
    value = json.loads(json.dumps(value, allow_nan=True))
    for _ in range(draw(st.integers(0, 3))):
        places = _paths(value)
        path = places[draw(st.integers(0, len(places) - 1))]
        if not path:
            value = draw(JSON)
            continue
        parent = value
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()):
            parent[path[-1]] = draw(JSON)
        elif isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.pop(path[-1])
    return value


def encoded(values: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """The JSON bytes a program could return: a value's JSON, mutated, or raw shapes that break JSON readers."""
    raw = st.one_of(
        st.binary(max_size=64),
        st.tuples(st.sampled_from([b"[", b'{"a":', b"1", b"-", b" ", b"[1,", b'"\\u0000']), COUNTS).map(lambda t: t[0] * t[1]),
        st.integers(1, 6000).map(lambda k: b"[" + b"7" * k + b"]"),  # a number of k digits (int() refuses > 4300)
    )
    dumped = values.map(lambda v: json.dumps(v, allow_nan=True).encode())
    return st.one_of(dumped, dumped.flatmap(mutated), raw)


# -- target 1: edits ---------------------------------------------------------------------------------

EDIT_LINES = ["def f(x):", "    return x", "    pass", "", "    x = 1  ", "    x = 1", "# comment", "\tif x:", "}", "    pass\r", " "]
MARKERS = ["<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE", "<<<<<<< SEARCH  ", "=======\r", ">>>>>>> REPLACE\t", "```", "```python"]
EDIT_PIECES = st.sampled_from([m + "\n" for m in MARKERS] + [line + "\n" for line in EDIT_LINES] + ["<<<<<<<", "\n", "=" * 7, "\r\n"])
LINE = st.one_of(st.sampled_from(EDIT_LINES), st.text(alphabet=" \tx=()#:\r", max_size=8))


@st.composite
def edit_inputs(draw: st.DrawFn, noop: bool = False) -> tuple[str, str]:
    """(parent program, answer): blocks that copy slices of the parent (exactly, with trailing
    whitespace changed, or not at all), unclosed blocks, empty SEARCH parts, many blocks of one
    frequent line; the parent's lines repeated up to thousands of times. With `noop`, every block
    replaces its SEARCH lines by themselves (so an applied answer must give the parent back)."""
    lines = draw(st.lists(LINE, max_size=40)) * draw(st.one_of(st.just(1), st.integers(1, 600)))
    lines = lines[:20_000]
    blocks = []
    for _ in range(draw(st.integers(0 if not noop else 1, 6))):
        kind = "slice" if noop else draw(st.sampled_from(("slice", "slice", "rstrip", "random", "empty", "many", "unclosed", "stray")))
        if kind in ("slice", "rstrip") and lines:
            start = draw(st.integers(0, len(lines) - 1))
            search = lines[start : start + draw(st.integers(1, 6))]
            if kind == "rstrip":
                search = [s.rstrip() + draw(st.sampled_from(["", " ", "\t"])) for s in search]
        elif kind == "many":
            search = [draw(LINE)]
            blocks += [(search, [draw(LINE)])] * draw(st.integers(1, 3000))
            continue
        elif kind == "empty":
            search = [""] * draw(st.integers(0, 3))
        else:
            search = draw(st.lists(LINE, max_size=4))
        replace = list(search) if noop else draw(st.lists(LINE, max_size=4))
        if kind == "unclosed":
            blocks.append((search, None))
        elif kind == "stray":
            blocks.append((search + [draw(st.sampled_from(MARKERS))], replace))
        else:
            blocks.append((search, replace))
    parts = []
    for search, replace in blocks:
        parts += [MARKERS[0], *search]
        if replace is not None:
            parts += [MARKERS[1], *replace, MARKERS[2]]
    around = draw(st.sampled_from(("", "Here is my edit:\n```\n", "```diff\n")))
    answer = around + "\n".join(parts) + ("\n```" if around else "")
    return "\n".join(lines), answer


def _call_parse_blocks(answer: str) -> None:
    blocks = parse_blocks(answer)
    if not blocks or not all(isinstance(b, Block) for b in blocks):
        raise Violation(f"parse_blocks returned {blocks!r}")


def _call_apply_edits(inputs: tuple[str, str]) -> None:
    parent, answer = inputs
    if not isinstance(apply_edits(parent, answer), str):
        raise Violation("apply_edits returned no text")


def _call_noop(inputs: tuple[str, str]) -> None:
    parent, answer = inputs
    if apply_edits(parent, answer) != parent:
        raise Violation("blocks that replace their SEARCH lines by themselves changed the program")


def _call_apply_blocks(inputs: tuple[str, list[Block]]) -> None:
    parent, blocks = inputs
    if not isinstance(apply_blocks(parent, blocks), str):
        raise Violation("apply_blocks returned no text")


def _edits_probe(n: int) -> tuple[str, str]:
    """A parent of n lines, half of them one frequent line, and n/8 blocks of two lines each."""
    lines = [f"    value_{k} = {k}" if k % 2 else "    pass" for k in range(n)]
    blocks = [f"{MARKERS[0]}\n    pass\n    value_{k} = {k}\n{MARKERS[1]}\n    value_{k} = {2 * k}\n{MARKERS[2]}" for k in range(1, n, 8)]
    return "\n".join(lines), "\n".join(blocks)


def _edits_crowd_probe(n: int) -> tuple[str, str]:
    """A parent of n equal lines and one block of n/2 of them (refused by the locating budget)."""
    return "\n".join(["x = 1"] * n), "\n".join([MARKERS[0], *["x = 1"] * (n // 2), MARKERS[1], "y", MARKERS[2]])


def _edits_probe_call(inputs: tuple[str, str]) -> None:
    try:
        apply_edits(*inputs)
    except EditError:
        pass


def edits_target() -> Target:
    """discover/edits.py (pure text functions: nothing to set up)."""
    blocks = st.lists(st.builds(Block, st.lists(LINE, max_size=4).map(tuple), st.lists(LINE, max_size=3).map(tuple)), max_size=8)
    return Target(
        name="edits",
        what="discover/edits.py: parse_blocks, apply_edits, apply_blocks on the model's SEARCH/REPLACE answers",
        documented=(EditError,),
        documented_where=(
            "discover/edits.py module docstring: 'each failure an `EditError` whose message names the block' (EditError(ValueError))"
        ),
        cases=[
            Case("parse_blocks(random text)", st.text(max_size=400), _call_parse_blocks, _size),
            Case("parse_blocks(marker soup)", soup(EDIT_PIECES), _call_parse_blocks, _size),
            Case("apply_edits(parent, answer)", edit_inputs(), _call_apply_edits, _size),
            Case("apply_edits(no-op blocks) == parent", edit_inputs(noop=True), _call_noop, _size),
            Case(
                "apply_blocks(parent, Block list)",
                st.tuples(soup(st.sampled_from([s + "\n" for s in EDIT_LINES])), blocks),
                _call_apply_blocks,
                _size,
            ),
        ],
        probes=[
            Probe(
                "apply_edits: n lines, n/8 blocks",
                "parent lines",
                4_000,
                _edits_probe,
                _edits_probe_call,
                "none stated: linear in parent + answer",
            ),
            Probe(
                "apply_edits: n equal lines, one block of n/2",
                "parent lines",
                4_000,
                _edits_crowd_probe,
                _edits_probe_call,
                "LOCATE_WORK_PER_LINE = 20 places per line",
            ),
        ],
    )


# -- target 2: verdicts (a sandbox's raw output to a result) ---------------------------------------


@cache
def math_problems() -> dict[str, Any]:
    from evaluators.registry import get_problem

    return {name: get_problem(name, timeout_s=5.0) for name in ("erdos", "ac1", "ac2", "circles-26")}


@cache
def trimul_problem() -> Any:
    from evaluators.kernels.trimul.problem import TriMulProblem

    return TriMulProblem(device="cpu", cpu_timing=True)


Output = tuple[bytes, bytes, bytes]  # a run's output.json, stdout and stderr


class OutputSandbox:
    """A sandbox whose runs return given raw bytes (output.json, stdout, stderr), read as the backends
    read them; an entry may be a function of the run's argument (a trusted program's answer)."""

    name = "fuzz"

    def __init__(self, outputs: list[Output | Callable[[Any], Output]]):
        self.outputs = list(outputs)

    def run(
        self, program: str, entry: str, argument: Any, limits: SandboxLimits, data_dir: Any = None, device: Any = None
    ) -> SandboxResult:
        given = self.outputs.pop(0) if self.outputs else (b"", b"", b"")
        data, out, err = given(argument) if callable(given) else given
        cap = int(limits.max_output_bytes)
        logs, _ = compose_logs(out[-cap:], len(out) > cap, err[-cap:], len(err) > cap, cap)
        value, reason = parse_output(data, cap)
        return SandboxResult(ok=not reason, output=value, reason=reason, logs=logs)


def sequences(max_len: int) -> st.SearchStrategy[Any]:
    """A step function's values: short lists, long repeated runs, in an object or not."""
    runs = st.tuples(st.lists(st.one_of(st.floats(0, 1), NUMBERS), min_size=1, max_size=5), st.integers(1, max_len)).map(
        lambda t: (t[0] * t[1])[:max_len]
    )
    values = st.one_of(st.lists(NUMBERS, max_size=40), runs)
    return st.one_of(values, values.map(lambda v: {"values": v}))


def circles(n: int) -> st.SearchStrategy[Any]:
    coordinate = st.one_of(st.floats(0, 1), NUMBERS)
    triple = st.one_of(st.tuples(coordinate, coordinate, coordinate).map(list), st.lists(coordinate, max_size=4))
    packing = st.one_of(st.lists(triple, min_size=n, max_size=n), st.lists(triple, max_size=n + 2))
    return st.one_of(packing, packing.map(lambda c: {"circles_xyr": c}))


CONSTRUCTIONS = st.one_of(sequences(1_200), sequences(50_000), circles(26), JSON)
LOG_BYTES = st.one_of(st.binary(max_size=64), st.tuples(st.binary(min_size=1, max_size=8), COUNTS).map(lambda t: t[0] * t[1]))


def _call_parse_output(inputs: tuple[bytes, int]) -> None:
    data, cap = inputs
    value, reason = parse_output(data, cap)
    if (reason and value is not None) or not isinstance(reason, str):
        raise Violation(f"parse_output returned ({_short(value, 60)}, {reason!r})")


def _call_math_evaluate(inputs: tuple[str, bytes, bytes, bytes]) -> None:
    name, data, out, err = inputs
    problem = math_problems()[name]
    check_verdict(problem.evaluate("def construct(parent):\n    return parent\n", ParentView("", None), OutputSandbox([(data, out, err)])))


@st.composite
def docker_reports(draw: st.DrawFn) -> dict[str, Any]:
    """The Docker runner's report of one run: what the candidate controls (its output, logs, exit code)."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "stdout": b64(draw(LOG_BYTES)),
        "stdout_cut": draw(st.booleans()),
        "stderr": b64(draw(LOG_BYTES)),
        "stderr_cut": draw(st.booleans()),
        "timed_out": draw(st.booleans()),
        "rc": draw(st.one_of(st.integers(-64, 255), st.sampled_from([0, 1, 3, 4, -9, -11, -24, -25]))),
        "output_error": draw(st.one_of(st.none(), st.just(""), st.text(max_size=40))),
        "output": draw(st.one_of(st.none(), st.just(""), encoded(CONSTRUCTIONS).map(b64))),
    }


def _call_docker_result(inputs: tuple[dict, int]) -> None:
    from evaluators.sandbox.docker import DockerSandbox

    report, cap = inputs
    result = DockerSandbox._result(None, report, SandboxLimits(max_output_bytes=cap))  # type: ignore[arg-type]  # uses no state
    if not isinstance(result, SandboxResult) or (not result.ok and not result.reason):
        raise Violation(f"a run's result {result!r}")


GPU_NAMES = st.one_of(
    st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA H200", "A100", "", "cpu", "NVIDIA GeForce RTX 4090"]), st.text(max_size=12)
)
TIMES_MS = st.one_of(st.floats(0.001, 100.0), NUMBERS)


@st.composite
def trimul_reports(draw: st.DrawFn, job: dict) -> tuple[Any, Any]:
    """(driver report, what the checker adds) for `job`: a report complete and consistent, then mutated in a
    few places, or a small hostile one (calls that are not objects, fields of the wrong types), which a
    failure shrinks to. The driver's report is untrusted (it shares a process with the candidate); the
    checker is trusted, and `checker_answer` gives its answer."""
    extra = draw(st.fixed_dictionaries({}, optional={"failure": st.text(max_size=20), "error": st.text(max_size=20), "gpu": GPU_NAMES}))
    if not draw(st.booleans()):
        call = st.fixed_dictionaries(
            {},
            optional={
                "set": st.sampled_from(["tests", "benchmarks"]) | JSON,
                "shape": st.integers(0, 2) | JSON,
                "kind": st.sampled_from(["test", "warmup", "timed"]) | JSON,
                "seed": st.integers(0, 9),
                "ms": TIMES_MS,
            },
        )
        small = st.fixed_dictionaries({"calls": st.lists(call | JSON, max_size=4) | JSON}, optional={"versions": JSON, "gpu": JSON})
        return draw(small), extra
    calls: list[dict] = []
    seed = 1
    for i, seeds in enumerate(job["test_seeds"]):
        calls += [{"set": "tests", "shape": i, "kind": "test", "seed": s} for s in seeds]
    for i in range(len(job["benchmarks"])):
        calls.append({"set": "benchmarks", "shape": i, "kind": "warmup", "seed": seed, "ms": 1.0})
        for _ in range(draw(st.integers(job["timing"]["min_calls"], job["timing"]["min_calls"] + 3))):
            seed += 1
            calls.append({"set": "benchmarks", "shape": i, "kind": "timed", "seed": seed, "ms": draw(st.floats(0.001, 100.0))})
    timed = [c for c in calls if c["kind"] == "timed"]
    for _ in range(draw(st.integers(0, 2)) if timed else 0):  # a few hostile times among plausible ones
        timed[draw(st.integers(0, len(timed) - 1))]["ms"] = draw(TIMES_MS)
    gpu = draw(GPU_NAMES)
    report = {
        "calls": calls,
        "versions": {"torch": "2.9.0", "triton": "3.5.0"},
        "gpu": {"name": gpu},
        "benchmarks": [{"calls": 3} for _ in job["benchmarks"]],
    }
    return draw(mutated_json(report)), extra


def checker_answer(job: dict, calls: Any, extra: dict) -> dict | None:
    """What evaluators/kernels/trimul/checker.py (trusted) answers for the driver's `calls`: every call
    counted as checked, with `extra` (a failure, an error, its GPU's name); None where it would fail
    (a call it cannot read: not an object, no such set or shape, no kind, an unhashable seed)."""
    if not isinstance(calls, list):
        return None
    for call in calls:
        if not isinstance(call, dict) or call.get("set") not in ("tests", "benchmarks") or "kind" not in call:
            return None
        shape, seed = call.get("shape"), call.get("seed", [])
        if not isinstance(shape, int) or not -len(job[call["set"]]) <= shape < len(job[call["set"]]):
            return None
        if not isinstance(seed, (int, float, str, type(None))):
            return None
    return {"checked": len(calls), **extra}


@cache
def trimul_jobs() -> dict[str, dict]:
    """The jobs TriMulProblem builds: the GPU timing run's (verdict.timed_verdict) and the CPU check's."""
    from evaluators.kernels.trimul.problem import CPU_SEQLEN, CPU_TIMING, SAMPLING, SHAPES, TIMING

    tests = [s for s in SHAPES["tests"] if s["seqlen"] == CPU_SEQLEN]
    seeds = [[s["seed"], None] if i == 0 else [s["seed"]] for i, s in enumerate(tests)]
    return {
        "timed": {"device": "cuda", "tests": [], "test_seeds": [], "benchmarks": SHAPES["benchmarks"], "timing": TIMING, **SAMPLING},
        "cpu": {"device": "cpu", "tests": tests, "test_seeds": seeds, "benchmarks": tests[:1], "timing": CPU_TIMING, **SAMPLING},
    }


def _call_timed_verdict(inputs: tuple[Any, dict, str]) -> None:
    """The GPU path's host side after the runs, in TriMulProblem._phase's order: the report's check, the
    checker's answer, then verdict.timed_verdict."""
    from evaluators.kernels.trimul import verdict

    report, extra, logs = inputs
    job = trimul_jobs()["timed"]
    if not isinstance(report, dict) or verdict.report_problem(job, report):  # refused by _run, or an invalid verdict
        return
    checked = checker_answer(job, report.get("calls") or [], extra)
    if checked is None or checked.get("error") or checked.get("failure") or checked["checked"] != len(report["calls"]):
        return  # _phase's invalid verdict
    check_verdict(verdict.timed_verdict(job, report, checked, logs))


def _call_trimul_cpu(inputs: tuple[bytes, dict, bytes]) -> None:
    """TriMulProblem's CPU check from the driver's raw output, the checker answering as checker_answer says."""
    from evaluators.kernels.trimul.problem import INITIAL_KERNEL

    driver, extra, logs = inputs

    def checker(job: dict) -> Output:
        answer = checker_answer(job, job["calls"], extra)
        return (b"", b"", b"Traceback ...\nKeyError: 'set'\n") if answer is None else (json.dumps(answer).encode(), b"", b"")

    sandbox = OutputSandbox([(driver, logs, b""), checker])
    check_verdict(trimul_problem().run_checks(INITIAL_KERNEL, sandbox, static_rules=False))


def _driver_bytes(pair: st.SearchStrategy[tuple[Any, dict]]) -> st.SearchStrategy[tuple[bytes, dict, bytes]]:
    """(the driver's output.json, mutated as bytes too; the checker's part; the driver's stdout)."""
    dump = lambda v: json.dumps(v, allow_nan=True).encode()  # noqa: E731
    return st.tuples(pair, LOG_BYTES).flatmap(lambda t: st.tuples(mutated(dump(t[0][0])), st.just(t[0][1]), st.just(t[1])))


def _ac1_probe(n: int) -> tuple[str, bytes, bytes, bytes]:
    """output.json of about n bytes: a step function of n/20 values."""
    values = [0.25 + (k % 97) / 200.0 for k in range(max(1, n // 20))]
    return "ac1", json.dumps(values).encode(), b"", b""


def verdicts_target() -> Target:
    from evaluators.sandbox.docker import DockerSandbox  # noqa: F401  (imported before the first call is timed)

    math_problems()
    trimul_problem()
    trimul_jobs()
    caps = st.sampled_from([1_000_000, 4_000_000, 64, 0])
    return Target(
        name="verdicts",
        what=(
            "a sandbox's raw output to a result: run_outputs.parse_output, DockerSandbox._result (the runner's report), "
            "MathProblem.evaluate (erdos, ac1, ac2, circles-26) from output.json's bytes, TriMul's driver report (untrusted) "
            "through TriMulProblem._phase's checks and verdict.timed_verdict, and through the CPU check from its bytes (the "
            "trusted checker's answer modelled by checker_answer)"
        ),
        documented=(),
        documented_where=(
            "none raised: run_outputs.parse_output returns (None, reason) ('(value, \"\") or (None, reason)'); "
            "MathProblem.evaluate/verify return EvalResult.invalid (evaluators/base.py: 'invalid means reward 0'; "
            "sequence.check_sequence '(None, the reason)'); trimul/verdict.py 'checks it is complete and consistent' "
            "and returns EvalResult.invalid; judge_candidate (discover/evaluation.py) turns any other exception into an "
            "'evaluator fault' verdict, which is the bug this looks for"
        ),
        cases=[
            Case("parse_output(random bytes)", st.tuples(st.binary(max_size=200), caps), _call_parse_output, _size),
            Case("parse_output(JSON-ish bytes)", st.tuples(encoded(CONSTRUCTIONS), caps), _call_parse_output, _size),
            Case(
                "MathProblem.evaluate(output.json bytes)",
                st.tuples(st.sampled_from(["erdos", "ac1", "ac2", "circles-26"]), encoded(CONSTRUCTIONS), LOG_BYTES, LOG_BYTES),
                _call_math_evaluate,
                _size,
            ),
            Case("DockerSandbox._result(runner report)", st.tuples(docker_reports(), caps), _call_docker_result, _size),
            Case(
                "trimul verdict.timed_verdict(report)",
                st.tuples(st.just(0).flatmap(lambda _: trimul_reports(trimul_jobs()["timed"])), st.text(max_size=30)).map(
                    lambda t: (t[0][0], t[0][1], t[1])
                ),
                _call_timed_verdict,
                _size,
            ),
            Case(
                "TriMulProblem CPU check(driver bytes)",
                st.just(0).flatmap(lambda _: _driver_bytes(trimul_reports(trimul_jobs()["cpu"]))),
                _call_trimul_cpu,
                _size,
            ),
        ],
        probes=[
            Probe(
                "ac1 evaluate: output.json of n bytes",
                "bytes",
                125_000,
                _ac1_probe,
                _call_math_evaluate,
                "max_output_bytes = 4,000,000 (AutocorrelationProblem)",
            )
        ],
    )


# -- target 3: values (an answer to a candidate, a construction to a verdict, code to a key) -------


@cache
def value_problems() -> dict[str, Any]:
    from evaluators.toy.digits import DigitsProblem

    return {
        "toy": DigitsProblem(),
        "toy-lenient": DigitsProblem(lenient=True),
        **math_problems(),
        "ahc039": ahc039(),
        "trimul": trimul_problem(),
    }


PARENT_PROGRAM = (
    "import numpy as np\n\ndef construct(parent):\n    n = 600\n    values = [0.5] * n\n"
    "    for _ in range(20):\n        pass\n    return values\n"
)
ANSWER_PIECES = st.sampled_from(
    [
        "```python\n",
        "```py\n",
        "```cpp\n",
        "```c++ \n",
        "```\n",
        "```",
        "\n```\n",
        "\n   ```",
        "~~~\n",
        "def construct(parent):\n    return [0.5] * 10\n",
        "int main() { return 0; }\n",
        "1234",
        "\u0663",
        "<<<<<<< SEARCH\n",
        "=======\n",
        ">>>>>>> REPLACE\n",
        "    n = 600\n",
        "    pass\n",
        "\n",
        " ",
    ]
)
CODE_PIECES = st.sampled_from(["/*", "*/", "/* ", "//", "#", '"', "'", "\\", "\n", " ", "\t", "int x;", "x = 1  # c\n", "/**/", "*", "/"])
KERNEL_PIECES = st.sampled_from(
    [
        "-",
        "~",
        "not ",
        "(",
        ")",
        "[",
        "]",
        "x",
        "1",
        "+",
        "**",
        ".",
        "lambda: ",
        " if x else ",
        "import torch\n",
        "import triton\n",
        "@triton.jit\n",
        "def custom_kernel(data):\n",
        "    ",
        "\n",
        "getattr(",
        "__class__",
        "torch.compile",
        "'",
        '"""',
        "\x00",
        "x.y = 1\n",
    ]
)


def _call_candidate_of(inputs: tuple[str, str, str, str]) -> None:
    name, answer, parent, answer_format = inputs
    candidate, why = candidate_of(value_problems()[name], answer, parent, answer_format)
    if (candidate is None and not why) or (candidate is not None and (why or not isinstance(candidate, str))):
        raise Violation(f"candidate_of returned ({_short(candidate, 60)}, {why!r})")


def _call_verify(inputs: tuple[str, Any]) -> None:
    name, construction = inputs
    check_verdict(value_problems()[name].verify(construction))


def _call_archive_key(inputs: tuple[str, str, Any]) -> None:
    name, code, construction = inputs
    key = value_problems()[name].archive_key(code, construction)
    if not (isinstance(key, str) and len(key) == 64):
        raise Violation(f"archive_key returned {key!r}")


def _call_check_source(source: str) -> None:
    from evaluators.kernels.trimul.static_rules import check_source

    problems = check_source(source)
    if not (isinstance(problems, list) and all(isinstance(p, str) for p in problems)):
        raise Violation(f"check_source returned {_short(problems, 80)}")


def values_target() -> Target:
    from evaluators.kernels.trimul.static_rules import check_source  # noqa: F401  (imported before the first call is timed)

    value_problems()
    program_problems = st.sampled_from(["toy", "toy-lenient", "erdos", "ahc039", "trimul"])
    return Target(
        name="values",
        what=(
            "an answer to a candidate (discover/evaluation.py candidate_of, answer formats program and edits), a construction "
            "to a verdict (each problem's verify), a candidate's code to its archive key (archive_key: evaluators/parsing.py "
            "normalize_code), a kernel's source to TriMul's broken rules (static_rules.check_source)"
        ),
        documented=(),
        documented_where=(
            "none raised: candidate_of returns '(candidate, \"\") or (None, reason)' (EditError is caught there); "
            "Problem.parse 'or None'; Problem.verify returns an EvalResult (evaluators/base.py); archive_key returns a "
            "key; check_source 'every broken rule ... in source order' (it catches SyntaxError and ValueError)"
        ),
        cases=[
            Case(
                "candidate_of(answer)",
                st.tuples(
                    program_problems,
                    soup(ANSWER_PIECES),
                    st.sampled_from([PARENT_PROGRAM, "", "x\n" * 50]),
                    st.sampled_from(["program", "edits"]),
                ),
                _call_candidate_of,
                _size,
            ),
            Case(
                "Problem.verify(construction)",
                st.tuples(
                    st.sampled_from(["toy", "erdos", "ac1", "ac2", "circles-26", "ahc039", "trimul"]),
                    st.one_of(CONSTRUCTIONS, st.text(alphabet="0123456789x", max_size=120)),
                ),
                _call_verify,
                _size,
            ),
            Case(
                "archive_key(code)",
                st.tuples(st.sampled_from(["erdos", "ahc039", "trimul"]), soup(CODE_PIECES), st.one_of(st.none(), sequences(50))),
                _call_archive_key,
                _size,
            ),
            Case("trimul check_source(kernel source)", soup(KERNEL_PIECES), _call_check_source, _size),
        ],
        probes=[
            Probe(
                "candidate_of (program): a fenced answer of n lines",
                "answer lines",
                20_000,
                lambda n: ("erdos", "```python\n" + "x = 1\n" * n + "```\n", "", "program"),
                _call_candidate_of,
                "none stated: an answer is bounded by the model's max_tokens",
            ),
            Probe(
                "archive_key (C++): '/* ' repeated n times",
                "repeats",
                300,
                lambda n: ("ahc039", "/* " * n, None),
                _call_archive_key,
                "none stated: a C++ program is bounded by the model's max_tokens",
            ),
        ],
    )


# -- target 4: AtCoder outputs ----------------------------------------------------------------------


@cache
def ahc039() -> Any:
    return PurseSeineProblem(cases="0-1")


@cache
def ahc058() -> Any:
    return AppleGameProblem(cases="0-1")


@cache
def contest_inputs() -> dict[str, Any]:
    return {"ahc039": ahc039().parse_input(ahc039().case_input(0)), "ahc058": ahc058().parse_input(ahc058().case_input(0))}


SEPARATORS = st.sampled_from([" ", "\n", " \n", "\t", "\r\n", "\u3000", "\xa0", "\x1c", "  ", "\n\n"])
I64_EDGES = [2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 10**19, 10**30, 10**5000]


def _digits(value: int) -> str:
    """str(value), or 5000 nines for a number past int's 4300-digit limit of str()."""
    return str(value) if abs(value) < 10**4000 else "9" * 5000


@st.composite
def token(draw: st.DrawFn, value: int) -> str:
    """An integer as a contestant's program could print it: signed, zero-padded, or not a number at all."""
    text = _digits(value)
    form = draw(st.integers(0, 11))
    if form == 0:
        return "+" + text
    if form == 1:
        return "00" + text
    if form == 2:
        return text + ".0"
    if form == 3:
        return "\u0663"  # a non-ASCII digit
    return text


@st.composite
def ahc039_outputs(draw: st.DrawFn) -> bytes:
    """Polygons: rectangles (valid), random vertex lists, wrong counts, coordinates outside [0, 1e5] or the
    64-bit range; repeated many times, cut, with garbage bytes."""
    coordinate = st.one_of(st.integers(0, 100_000), st.sampled_from([-1, 100_001, 0, 100_000, *I64_EDGES]))
    polygons: list[list[int]] = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            x1, x2 = sorted(draw(st.lists(st.integers(0, 100_000), min_size=2, max_size=2, unique=True)))
            y1, y2 = sorted(draw(st.lists(st.integers(0, 100_000), min_size=2, max_size=2, unique=True)))
            polygons.append([4, x1, y1, x2, y1, x2, y2, x1, y2])
        elif kind == 1:
            m = draw(st.integers(4, 12))
            polygons.append([m, *draw(st.lists(coordinate, min_size=2 * m, max_size=2 * m))])
        elif kind == 2:
            m = draw(st.sampled_from([0, 3, 1001, -4, 2**63, 1000]))
            polygons.append([m, *draw(st.lists(coordinate, max_size=12))])
        else:  # a staircase of up to 1000 vertices (the quadratic checks' worst size), valid
            steps = draw(st.integers(1, 499))
            flat = [0, 0]
            for k in range(steps):
                flat += [k * 100, (k + 1) * 100, (k + 1) * 100, (k + 1) * 100]
            flat += [steps * 100, 0]
            polygons.append([len(flat) // 2, *flat])
    repeat = draw(st.one_of(st.just(1), st.integers(1, 2000)))
    seps = [draw(SEPARATORS) for _ in range(3)]
    values = [v for p in polygons for v in p]
    tokens = [_digits(v) for v in values]
    for _ in range(draw(st.integers(0, 2)) if values else 0):
        at = draw(st.integers(0, len(values) - 1))
        tokens[at] = draw(token(values[at]))
    text = "".join(t + seps[k % 3] for k, t in enumerate(tokens))
    return draw(mutated((text * repeat)[:BIG_BYTES].encode()))


@st.composite
def ahc058_outputs(draw: st.DrawFn) -> bytes:
    """Action lines: `-1`, `i j` in and out of range, comments, blank lines, three tokens, numbers past 64
    bits, Unicode whitespace; a pattern of them repeated up to thousands of times."""
    line = st.one_of(
        st.just("-1"),
        st.tuples(st.integers(-1, 5), st.integers(-1, 11)).map(lambda t: f"{t[0]} {t[1]}"),
        st.sampled_from(["# comment", "", "   ", "#", "0 0 0", "1", "+0 00", "-0 1", "99999999999999999999 0", "0\u30000", "a b", "0\t0"]),
        st.text(max_size=10),
    )
    pattern = draw(st.lists(line, min_size=1, max_size=12))
    lines = (pattern * draw(st.one_of(st.integers(1, 60), st.integers(1, 5000))))[: BIG_BYTES // 4]
    newline = draw(st.sampled_from(["\n", "\r\n", "\n\n"]))
    return draw(mutated(newline.join(lines).encode()[:BIG_BYTES]))


def _call_judge(inputs: tuple[str, bytes | str]) -> None:
    name, output = inputs
    problem = ahc039() if name == "ahc039" else ahc058()
    check_judgement(problem.judge_output(contest_inputs()[name], output))


class CasesSandbox:
    """A sandbox whose compiled program's case runs are given: status, CPU seconds, memory, stdout, stderr."""

    name = "fuzz"

    def __init__(self, runs: list[tuple[str, str, float, float, bytes, str]], compiled: bool, error: str):
        self.runs, self.compiled, self.error = runs, compiled, error

    def run_native(self, source: str, cases: Any, limits: Any, on_case: Any = None) -> NativeRun:
        if not self.compiled:
            return NativeRun(compiled=False, compile_log=self.error, error="compile error")
        done, stopped = [], False
        for (case, _), (status, detail, cpu_s, peak_mb, stdout, stderr) in zip(cases, self.runs):
            run = CaseRun(case=case, status=status, detail=detail, cpu_s=cpu_s, wall_s=cpu_s, peak_mb=peak_mb, stdout=stdout, stderr=stderr)
            done.append(run)
            if on_case is not None and not on_case(run):
                stopped = True
                break
        return NativeRun(compiled=True, cases=tuple(done), error="" if len(done) == len(cases) else self.error, stopped=stopped)


def _call_contest_evaluate(inputs: tuple[str, list, bool, str, bool]) -> None:
    name, runs, compiled, error, stop = inputs
    problem = (ahc039() if name == "ahc039" else ahc058()).with_cases("0-1", stop_at_first_failure=stop)
    check_verdict(problem.evaluate("int main() {}", None, CasesSandbox(runs, compiled, error)))


def _ahc039_probe(n: int) -> tuple[str, bytes]:
    """About n bytes of valid rectangles (every one read, the last one judged)."""
    square = b"4\n10 10\n10 90000\n90000 90000\n90000 10\n"
    return "ahc039", square * max(1, n // len(square))


def _ahc058_probe(n: int) -> tuple[str, bytes]:
    """About n bytes of comment lines, then T = 500 actions of doing nothing."""
    comment = b"# a comment line of a plan\n"
    return "ahc058", comment * max(1, n // len(comment)) + b"-1\n" * 500


def atcoder_target() -> Target:
    contest_inputs()  # the public cases' inputs, read and parsed before the first call is timed
    runs = st.lists(
        st.tuples(
            st.sampled_from(["OK", "OK", "OK", "TLE", "MLE", "OLE", "RE"]),
            st.text(max_size=40),
            st.floats(0, 10),
            st.floats(0, 4096),
            st.one_of(ahc039_outputs(), ahc058_outputs(), st.binary(max_size=100)),
            st.text(max_size=200),
        ),
        max_size=3,
    )
    return Target(
        name="atcoder",
        what="AHC039 and AHC058 judge_output on a program's stdout; AtCoderProblem.evaluate from the case runs (stdout, status, resources)",
        documented=(),
        documented_where=(
            "none raised: judge_output returns Judgement.wrong (ahc039.py/ahc058.py: a bad output 'is a wrong answer'; "
            "judging.py: 'a number out of the 64-bit range is a wrong answer (\"number out of range\"), never an exception'); "
            "AtCoderProblem.evaluate returns an EvalResult"
        ),
        cases=[
            Case("ahc039 judge_output(random bytes)", st.tuples(st.just("ahc039"), st.binary(max_size=300)), _call_judge, _size),
            Case("ahc039 judge_output(polygons)", st.tuples(st.just("ahc039"), ahc039_outputs()), _call_judge, _size),
            Case(
                "ahc039 judge_output(text)",
                st.tuples(st.just("ahc039"), soup(SEPARATORS | st.sampled_from(["4", "0", "100000", "-", "+"]))),
                _call_judge,
                _size,
            ),
            Case("ahc058 judge_output(random bytes)", st.tuples(st.just("ahc058"), st.binary(max_size=300)), _call_judge, _size),
            Case("ahc058 judge_output(action lines)", st.tuples(st.just("ahc058"), ahc058_outputs()), _call_judge, _size),
            Case(
                "AtCoderProblem.evaluate(case runs)",
                st.tuples(st.sampled_from(["ahc039", "ahc058"]), runs, st.booleans(), st.text(max_size=40), st.booleans()),
                _call_contest_evaluate,
                _size,
            ),
        ],
        probes=[
            Probe(
                "ahc039 judge_output: n bytes of rectangles",
                "bytes",
                262_144,
                _ahc039_probe,
                _call_judge,
                f"MAX_OUTPUT_BYTES = {MAX_OUTPUT_BYTES:,}",
            ),
            Probe(
                "ahc058 judge_output: n bytes of comments + 500 actions",
                "bytes",
                262_144,
                _ahc058_probe,
                _call_judge,
                f"MAX_OUTPUT_BYTES = {MAX_OUTPUT_BYTES:,}",
            ),
        ],
    )


TARGETS: dict[str, Callable[[], Target]] = {
    "edits": edits_target,
    "verdicts": verdicts_target,
    "values": values_target,
    "atcoder": atcoder_target,
}


# -- running ------------------------------------------------------------------------------------------


def _depth() -> int:
    frame, depth = sys._getframe(1), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


class production_stack:
    """The recursion limit a target has in production (FREE_FRAMES below the caller), restored after."""

    def __enter__(self) -> None:
        self.saved = sys.getrecursionlimit()
        sys.setrecursionlimit(_depth() + FREE_FRAMES)

    def __exit__(self, *exc: Any) -> None:
        sys.setrecursionlimit(self.saved)


class hard_stop:
    """Interrupt a call after `seconds` with CallTimeout (in the main thread, when no other timer runs
    there, such as pytest-timeout's; otherwise nothing)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.armed = threading.current_thread() is threading.main_thread() and signal.getitimer(signal.ITIMER_REAL)[0] == 0

    def _fire(self, signum: int, frame: Any) -> None:
        raise CallTimeout(f"still running after {self.seconds:g} s")

    def __enter__(self) -> None:
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc: Any) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)


@dataclass
class Tally:
    """What fuzzing one target found."""

    runs: int = 0  # Hypothesis runs
    inputs: int = 0  # calls made
    inputs_by_case: Counter = field(default_factory=Counter)
    largest: int = 0
    slowest_s: float = 0.0
    slowest_size: int = 0
    slowest_case: str = ""
    slowest_input: str = ""
    failing_inputs: int = 0  # calls that raised an undocumented exception (shrinking's included)
    failed_runs: int = 0  # runs that ended in a failure
    failures: dict[tuple, dict] = field(default_factory=dict)  # distinct: (case, type, where) -> details
    hangs: list[dict] = field(default_factory=list)
    documented: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    def timed(self, case: Case, value: Any, size: int, seconds: float, wall: float) -> None:
        """One call: `seconds` of CPU time (what a hang is measured in), `wall` seconds of wall time."""
        self.inputs += 1
        self.inputs_by_case[case.name] += 1
        self.largest = max(self.largest, size)
        if seconds > self.slowest_s:
            self.slowest_s, self.slowest_size, self.slowest_case = seconds, size, case.name
            self.slowest_input = _short(value)
        if seconds > HANG_S or wall > WALL_HANG_S:
            entry = {"case": case.name, "seconds": round(seconds, 3), "wall_s": round(wall, 3), "size": size, "input": _short(value)}
            self.hangs.append(entry)

    def failed(self, case: Case, err: BaseException, value: Any) -> None:
        frames = traceback.extract_tb(err.__traceback__)
        inner = frames[-1] if frames else None
        where = f"{_relative(inner.filename)}:{inner.lineno}" if inner else "?"
        key = (case.name, type(err).__name__, where)
        message = (str(err).strip().splitlines() or [""])[0][:300]
        entry = self.failures.setdefault(
            key, {"case": case.name, "type": type(err).__name__, "where": where, "message": message, "input": _short(value), "runs": 0}
        )
        entry["runs"] += 1
        if len(repr(value)) < len(entry["input"]):  # keep the smallest of the minimal inputs
            entry["input"], entry["message"] = _short(value), message


def _relative(filename: str) -> str:
    try:
        return str(Path(filename).resolve().relative_to(REPO))
    except ValueError:
        return Path(filename).name


def _inner(err: BaseException) -> BaseException:
    """The candidate's exception inside Hypothesis's wrappers (a flaky failure)."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


def fuzz_case(target: Target, case: Case, tally: Tally, examples: int, stop_at: float, shrink: bool = True) -> None:
    """One Hypothesis run of `case`: `examples` inputs (fewer once `stop_at` passes), shrinking a failure
    (Hypothesis bounds that itself; it may overrun the target's share) unless `shrink` is false."""
    last: dict[str, Any] = {}
    failing, tried = [False], [0]

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        phases=(Phase.generate, Phase.target, Phase.shrink) if shrink else (Phase.generate, Phase.target),
        report_multiple_bugs=False,
        print_blob=False,
    )
    @given(case.strategy)
    def run(value: Any) -> None:
        tried[0] += 1
        if not failing[0] and tried[0] > MIN_EXAMPLES and time.monotonic() >= stop_at:
            raise ShareSpent  # the function's share of the time is spent (never while a failure is shrunk)
        last["value"] = value
        size = case.size(value)
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            with hard_stop(HARD_STOP_S), production_stack():
                case.call(value)
        except target.documented as err:
            tally.documented[type(err).__name__] += 1
        except CallTimeout:
            pass  # recorded as a hang below; not shrunk
        except FAILURES:
            failing[0] = True
            tally.failing_inputs += 1
            raise
        finally:
            seconds = time.process_time() - start_cpu
            tally.timed(case, value, size, seconds, time.perf_counter() - start)
        steer(seconds / max(1, size) * 1e6, label="microseconds per unit of input")  # towards slow inputs

    try:
        run()
    except ShareSpent:
        pass
    except FAILURES as err:  # every failure is recorded, and the next run goes on
        tally.failed_runs += 1
        tally.failed(case, _inner(err), last.get("value"))
    tally.runs += 1


def warm_up() -> None:
    """Hypothesis's one-time work (its Unicode tables, the constants it reads from the fuzzed modules'
    source), done before any target's clock starts."""

    @settings(max_examples=2, database=None, deadline=None, suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)
    @given(st.text(), st.binary())
    def first(text: str, data: bytes) -> None:
        pass

    first()


def fuzz_target(target: Target, seconds: float, examples: int, shrink: bool = True) -> Tally:
    """The target's functions in turn, each in fresh Hypothesis runs until its equal share of `seconds` is
    spent (at least one run each; a function that overruns its share takes it from those after it)."""
    tally = Tally()
    start = time.monotonic()
    for k, case in enumerate(target.cases):
        stop_at = start + seconds * (k + 1) / len(target.cases)
        fuzz_case(target, case, tally, examples, stop_at, shrink)
        while time.monotonic() < stop_at:
            fuzz_case(target, case, tally, examples, stop_at, shrink)
    tally.seconds = time.monotonic() - start
    return tally


def probe(p: Probe, scale: float = 1.0, repeats: int = 3) -> dict[str, Any]:
    """The least CPU time of `repeats` calls (fewer past a second) at size n and at 8 n, and their ratio.
    CPU time of this process, not wall time: the ratio holds on a loaded machine."""
    n = max(8, int(p.n * scale))
    times = []
    for size in (n, 8 * n):
        value = p.make(size)
        best = math.inf
        for _ in range(repeats):
            start = time.process_time()
            try:
                with hard_stop(HARD_STOP_S), production_stack():
                    p.call(value)
            except CallTimeout:
                best = min(best, HARD_STOP_S)
                break
            elapsed = time.process_time() - start
            best = min(best, elapsed)
            if elapsed > 1.0:
                break
        times.append(best)
    return {
        "name": p.name,
        "unit": p.unit,
        "n": n,
        "input_size_n": _size(p.make(n)),
        "seconds_n": round(times[0], 6),
        "seconds_8n": round(times[1], 6),
        "ratio": round(times[1] / max(times[0], 1e-9), 2),
        "cap": p.cap,
    }


def run_benchmark(
    seconds_per_target: float,
    examples: int = 100,
    targets: list[str] | None = None,
    probe_scale: float = 1.0,
    shrink: bool = True,
    storage: Path | None = None,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """Fuzz each target for `seconds_per_target`, then probe it; the report as a dict. Hypothesis keeps
    its caches (Unicode tables, constants read from the fuzzed modules) in `storage` (default: a
    .hypothesis folder in the working directory, Hypothesis's own)."""
    if storage is not None:
        set_hypothesis_home_dir(storage)
    try:
        return _run(seconds_per_target, examples, targets or list(TARGETS), probe_scale, shrink, log)
    finally:
        if storage is not None:
            set_hypothesis_home_dir(None)


def _run(
    seconds_per_target: float, examples: int, targets: list[str], probe_scale: float, shrink: bool, log: Callable[[str], None]
) -> dict[str, Any]:
    wall0, cpu0 = time.monotonic(), time.process_time()
    doc: dict[str, Any] = {
        "seconds_per_target": seconds_per_target,
        "examples_per_run": examples,
        "shrink": shrink,
        "hang_s": HANG_S,
        "wall_hang_s": WALL_HANG_S,
        "hard_stop_s": HARD_STOP_S,
        "hypothesis": hypothesis.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "targets": {},
    }
    warm_up()
    for name in targets:
        target = TARGETS[name]()
        log(f"fuzzing {name} for {seconds_per_target:g} s ({len(target.cases)} functions) ...")
        tally = fuzz_target(target, seconds_per_target, examples, shrink)
        log(f"probing {name} ...")
        probes = [probe(p, probe_scale) for p in target.probes]
        hangs = sorted(tally.hangs, key=lambda h: -h["seconds"])
        doc["targets"][name] = {
            "what": target.what,
            "documented_errors": [f"{t.__module__}.{t.__qualname__}" for t in target.documented],
            "documented_where": target.documented_where,
            "functions": [c.name for c in target.cases],
            "seconds": round(tally.seconds, 1),
            "hypothesis_runs": tally.runs,
            "inputs": tally.inputs,
            "inputs_by_function": dict(tally.inputs_by_case),
            "largest_input": tally.largest,
            "slowest_call": {
                "cpu_seconds": round(tally.slowest_s, 4),
                "size": tally.slowest_size,
                "function": tally.slowest_case,
                "input": tally.slowest_input,
            },
            "failures": {
                "failed_runs": tally.failed_runs,
                "failing_inputs": tally.failing_inputs,
                "distinct": list(tally.failures.values()),
            },
            "hangs": {"count": len(hangs), "slowest": hangs[:10]},
            "documented_seen": dict(tally.documented),
            "linearity": probes,
        }
    doc["wall_s"] = round(time.monotonic() - wall0, 1)
    doc["cpu_s"] = round(time.process_time() - cpu0, 1)
    doc["failures"] = sum(len(t["failures"]["distinct"]) for t in doc["targets"].values())
    doc["hangs"] = sum(t["hangs"]["count"] for t in doc["targets"].values())
    return doc


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# Fuzzing the host-side parsers of what a candidate returns",
        "",
        f"`python benchmarks/fuzz_parsers.py` (its docstring says what it does): {doc['seconds_per_target']:g} s per target, "
        f"{doc['examples_per_run']} inputs per Hypothesis run, Hypothesis {doc['hypothesis']}, Python {doc['python']}, {doc['machine']}. "
        f"Wall time {doc['wall_s']:.1f} s, CPU time {doc['cpu_s']:.1f} s. A call over {doc['hang_s']:g} CPU seconds "
        f"(or {doc['wall_hang_s']:g} wall seconds) is a hang; the slowest call is in CPU seconds. "
        f"Found: {doc['failures']} distinct failures, {doc['hangs']} hangs.",
        "",
        "| target | runs | inputs | largest input | slowest call | failures (runs / distinct) | hangs | documented errors seen |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in doc["targets"].items():
        slow = t["slowest_call"]
        seen = ", ".join(f"{k} {v}" for k, v in t["documented_seen"].items()) or "-"
        lines.append(
            f"| {name} | {t['hypothesis_runs']} | {t['inputs']} | {t['largest_input']:,} | {slow['cpu_seconds']:.3f} s ({slow['size']:,}, "
            f"{slow['function']}) | {t['failures']['failed_runs']} / {len(t['failures']['distinct'])} | {t['hangs']['count']} | {seen} |"
        )
    lines += ["", "Linearity (the least CPU time of up to 3 calls at n and at 8 n; about 8 is linear, about 64 quadratic):", ""]
    lines += ["| target | probe | n | CPU s at n | CPU s at 8n | ratio | size cap stated |", "|---|---|---|---|---|---|---|"]
    for name, t in doc["targets"].items():
        for p in t["linearity"]:
            lines.append(
                f"| {name} | {p['name']} | {p['n']:,} {p['unit']} ({p['input_size_n']:,} chars) | {p['seconds_n']:.4f} | "
                f"{p['seconds_8n']:.4f} | {p['ratio']:.1f} | {p['cap']} |"
            )
    for name, t in doc["targets"].items():
        lines += [
            "",
            f"## {name}",
            "",
            t["what"] + ".",
            "",
            f"Documented errors: {', '.join(t['documented_errors']) or 'none'} ({t['documented_where']}).",
        ]
        lines += ["", "Inputs per function: " + ", ".join(f"{k} {v}" for k, v in t["inputs_by_function"].items()) + "."]
        for f in t["failures"]["distinct"]:
            lines.append(
                f"- FAILURE in {f['case']}: {f['type']} at {f['where']}: {f['message']} (in {f['runs']} runs); "
                f"minimal input: `{f['input']}`"
            )
        for h in t["hangs"]["slowest"]:
            lines.append(
                f"- HANG in {h['case']}: {h['seconds']:.2f} CPU s ({h['wall_s']:.2f} s wall) on an input of size {h['size']:,}: "
                f"`{h['input']}`"
            )
    return "\n".join(lines) + "\n"


def report(doc: dict[str, Any], out: Path) -> None:
    """fuzz_parsers.json and fuzz_parsers.md in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "fuzz_parsers.json").write_text(json.dumps(doc, indent=2, allow_nan=True) + "\n")
    (out / "fuzz_parsers.md").write_text(markdown(doc))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="the whole budget, split evenly over the targets")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--examples", type=int, default=100, help="inputs per Hypothesis run")
    ap.add_argument("--targets", default=",".join(TARGETS), help=f"a comma-separated subset of {', '.join(TARGETS)}")
    args = ap.parse_args(argv)
    names = [n for n in args.targets.split(",") if n]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        ap.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fuzz_parsers-", dir=args.out) as scratch:  # Hypothesis's caches, removed after
        doc = run_benchmark(args.minutes * 60.0 / len(names), args.examples, names, storage=Path(scratch))
    doc["minutes"] = args.minutes
    report(doc, args.out)
    print((args.out / "fuzz_parsers.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
