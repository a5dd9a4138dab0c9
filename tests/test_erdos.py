"""Erdős minimum overlap (docs/method.md §5): the verifier, the seeds, the prompt and an end-to-end run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from evaluators.base import EvalResult, ParentView
from evaluators.math.erdos import ErdosProblem
from evaluators.sandbox import ProcessSandbox, SandboxResult


@pytest.fixture
def problem() -> ErdosProblem:
    return ErdosProblem(timeout_s=120.0, memory_mb=1024, cpus=1)


@pytest.mark.parametrize("name", ["haugland_2016", "alphaevolve_v2", "ttt_discover"])
def test_verify_reproduces_published_bounds(problem, published, name):
    data = json.loads((published / "erdos" / f"{name}.json").read_text())
    result = problem.verify(data["values"])
    assert result.valid, result.reason
    assert abs(result.metrics["bound"] - data["reported_bound"]) <= 1e-6
    assert result.reward == pytest.approx(1.0 / result.metrics["bound"])
    assert result.metrics["pieces"] == len(data["values"])
    assert result.construction == [float(v) for v in data["values"]]


def test_constant_half_gives_bound_one_half(problem):
    result = problem.verify([0.5] * 50)
    assert result.valid and result.metrics["bound"] == pytest.approx(0.5)
    assert result.reward == pytest.approx(2.0)


def test_rescaling_makes_the_bound_scale_invariant(problem):
    h = np.clip(0.6 + np.random.default_rng(0).normal(0, 0.1, 80), 0, 1)
    a, b = problem.verify(list(h)), problem.verify(list(h * 0.9))
    assert a.valid and b.valid
    assert a.metrics["bound"] == pytest.approx(b.metrics["bound"], abs=1e-12)
    assert b.construction == pytest.approx(list(h * 0.9))  # as given, before the rescale


def test_object_with_values_is_accepted(problem):
    assert problem.verify({"values": [0.5] * 10}).valid


@pytest.mark.parametrize(
    "construction",
    [
        None,
        "0.5, 0.5",
        3.0,
        {"vals": [0.5]},
        [],
        [0.5] * 1001,
        ["0.5", 0.5],
        [True, 0.5],
        [None, 0.5],
        [[0.5], 0.5],
        [float("nan"), 0.5],
        [float("inf"), 0.5],
        [-0.1, 0.5],
        [1.5, 0.5],
        [0.0, 0.0, 0.0],
        [1.0, 0.0, 0.0, 0.0],  # rescaling to sum n/2 = 2 doubles the 1.0
    ],
)
def test_invalid_constructions_are_rejected(problem, construction):
    result = problem.verify(construction)
    assert not result.valid and result.reward == 0.0 and result.reason


def test_at_most_1000_pieces_is_allowed(problem):
    assert problem.verify([0.5] * 1000).valid


def test_seeds_are_reproducible_and_near_one_half(problem):
    seeds = problem.seeds(np.random.default_rng(7), 5)
    again = problem.seeds(np.random.default_rng(7), 5)
    assert seeds == again and len(seeds) == 5
    for seed in seeds:
        assert seed.code == ""
        assert 40 <= len(seed.construction) <= 100
        assert all(isinstance(v, float) and 0 <= v <= 1 for v in seed.construction)
        assert abs(np.mean(seed.construction) - 0.5) < 0.1
        assert problem.verify(seed.construction).valid


def test_parse_takes_the_last_python_block(problem):
    answer = "```python\ndef construct(p): return 1\n```\ntext\n```py\ndef construct(p): return 2\n```\n```text\nno\n```"
    assert problem.parse(answer) == "def construct(p): return 2"
    assert problem.parse("no code here") is None


def test_description_names_the_contract_and_limits(problem):
    d = problem.description
    assert "construct(parent)" in d and "```python" in d
    assert "0.380876" in d and "120 s" in d and "1024 MB" in d
    assert problem.limits.timeout_s == 120.0 and problem.limits.cpus == 1
    assert ErdosProblem().limits.timeout_s == 1100.0


def test_render_state_small_and_large(problem):
    small = problem.render_state("def construct(p):\n    return [0.5] * 4\n", [0.5] * 4)
    assert "```python" in small and "4 pieces" in small and "0.500000" in small
    assert "bound 0.50000000" in small
    large = problem.render_state("", [0.5] * 300)
    assert "300 pieces" in large and "construct(parent)" in large and "Values:" not in large
    assert "none usable" in problem.render_state("", None)


class _FakeSandbox:
    name = "fake"

    def __init__(self, result: SandboxResult):
        self.result, self.calls = result, []

    def run(self, program, entry, argument, limits):
        self.calls.append((program, entry, argument, limits))
        return self.result


def test_evaluate_passes_the_parent_and_limits_and_keeps_logs(problem):
    sandbox = _FakeSandbox(SandboxResult(ok=True, output=[0.5] * 8, logs="hello"))
    result = problem.evaluate("code", ParentView(code="", construction=[0.4] * 8), sandbox)
    assert result.valid and result.observation == "hello"
    assert sandbox.calls == [("code", "construct", [0.4] * 8, problem.limits)]
    failed = problem.evaluate("code", None, _FakeSandbox(SandboxResult(ok=False, reason="timeout after 1 s", logs="x")))
    assert failed == EvalResult.invalid("timeout after 1 s", observation="x")


def test_end_to_end_in_the_process_sandbox(problem):
    sandbox = ProcessSandbox()
    good = problem.evaluate("import numpy as np\ndef construct(parent):\n    return np.full(50, 0.5)\n", None, sandbox)
    assert good.valid and good.reward == pytest.approx(2.0) and good.metrics["pieces"] == 50

    parent = ParentView(code="", construction=[0.2, 0.6, 0.7, 0.5])
    child = problem.evaluate("def construct(parent):\n    return parent[::-1]\n", parent, sandbox)
    assert child.valid and child.construction == [0.5, 0.7, 0.6, 0.2]

    nan = problem.evaluate("def construct(parent):\n    return [float('nan')] * 10\n", None, sandbox)
    assert not nan.valid and nan.reward == 0.0 and "NaN" in nan.reason

    crash = problem.evaluate("def construct(parent):\n    print('trying')\n    1 / 0\n", None, sandbox)
    assert not crash.valid and "ZeroDivisionError" in crash.reason and "trying" in crash.observation
    assert math.isfinite(good.reward)
