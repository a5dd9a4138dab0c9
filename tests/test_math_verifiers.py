"""The mathematics verifiers (docs/method.md §5): published bounds reproduced, hostile input rejected with a
reason, the FFT guard, exact circle checks and the tolerance every report states."""

from __future__ import annotations

import json
import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.app import app
from evaluators.math.ac1 import ac1_bound
from evaluators.math.ac2 import ac2_bound
from evaluators.math.autoconvolution import autoconvolution
from evaluators.math.circles import CirclePackingProblem
from evaluators.registry import get_problem

MATH_PROBLEMS = ["erdos", "ac1", "ac2", "circles-26", "circles-32"]
# reference file -> (problem id, direction in which the source rounded its figure)
REFERENCE = {
    "erdos/haugland_2016.json": ("erdos", "up"),
    "erdos/alphaevolve_v2.json": ("erdos", "up"),
    "erdos/ttt_discover.json": ("erdos", "up"),
    "ac1/matolcsi_vinuesa_2010.json": ("ac1", "up"),
    "ac1/alphaevolve_v1.json": ("ac1", "up"),
    "ac1/alphaevolve_v2.json": ("ac1", "up"),
    "ac1/ttt_discover.json": ("ac1", "up"),
    "ac2/alphaevolve_v2.json": ("ac2", "down"),
    "circle_packing/ttt_discover_n26.json": ("circles-26", "nearest"),
}
CIRCLES_N26_SUM = "2.6359774"  # evaluators/math/published/README.md: sum of radii with zero tolerance


def _reported(path: Path) -> str:
    """The published figure as written (its digits matter: it is rounded to them)."""
    if "circle_packing" in str(path):
        return CIRCLES_N26_SUM
    return json.dumps(json.loads(path.read_text())["reported_bound"])


def _round(value: float, like: str, direction: str) -> Decimal:
    """`value` rounded to the decimals of `like`: up for upper bounds, down for lower bounds."""
    places = Decimal(1).scaleb(-len(like.split(".")[1]))
    mode = {"up": ROUND_CEILING, "down": ROUND_FLOOR}.get(direction)
    return Decimal(value).quantize(places, rounding=mode) if mode else Decimal(value).quantize(places)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_verify_cli_reproduces_every_reference_file(published: Path, name: str) -> None:
    problem, direction = REFERENCE[name]
    path = published / name
    result = CliRunner().invoke(app, ["verify", problem, str(path), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    reported = _reported(path)
    assert out["valid"] and out["reason"] == ""
    # The figures carry 4 to 7 decimals (1.5053, 0.9610, 0.380927, 2.6359774); each is the bound
    # rounded outward to its digits, and within 1e-6 wherever it has 6 or more decimals.
    decimals = len(reported.split(".")[1])
    assert abs(out["bound"] - float(reported)) <= max(1e-6, 10.0**-decimals)
    assert _round(out["bound"], reported, direction) == Decimal(reported)
    if problem.startswith("circles"):
        assert out["metrics"]["tolerance"] == 0.0 and out["reward"] == out["bound"]
    elif problem == "ac2":
        assert out["reward"] == out["bound"]
    else:
        assert out["reward"] == pytest.approx(1.0 / out["bound"], rel=1e-15)


def test_ac1_matches_thetaevolves_six_digit_figure_for_alphaevolve_v2(published: Path) -> None:
    # ThetaEvolve (paper 004) reports AlphaEvolve V2's construction as 1.503164.
    data = json.loads((published / "ac1" / "alphaevolve_v2.json").read_text())
    assert abs(get_problem("ac1").verify(data).metrics["bound"] - 1.503164) <= 1e-6


def _spec_ac1(f: np.ndarray) -> float:
    """docs/method.md §5 written out with the direct convolution and nothing else."""
    return 2 * len(f) * np.convolve(f, f).max() / f.sum() ** 2


def _spec_ac2(f: np.ndarray) -> float:
    c = np.convolve(f, f)
    y = np.concatenate(([0.0], c, [0.0]))  # m + 2 points of [-1/2, 1/2] with zero ends
    h = np.diff(np.linspace(-0.5, 0.5, len(c) + 2))
    l2 = np.sum(h / 3 * (y[:-1] ** 2 + y[:-1] * y[1:] + y[1:] ** 2))
    return l2 / ((np.abs(c).sum() / (len(c) + 1)) * np.abs(c).max())


# The full 30,000- and 50,000-piece records need an O(n^2) convolution for the comparison (seconds
# on a busy machine), so they run with the slow tests; benchmarks/verifier_speed.py shows them too.
FFT_CASES = [
    pytest.param("ac1/alphaevolve_v2.json", None, ac1_bound, _spec_ac1, id="ac1-1319"),
    pytest.param("ac2/alphaevolve_v2.json", 8000, ac2_bound, _spec_ac2, id="ac2-first-8000"),
    pytest.param("ac1/ttt_discover.json", None, ac1_bound, _spec_ac1, id="ac1-30000", marks=pytest.mark.slow),
    pytest.param("ac2/alphaevolve_v2.json", None, ac2_bound, _spec_ac2, id="ac2-50000", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name, pieces, bound, spec", FFT_CASES)
def test_fft_bound_agrees_with_the_direct_convolution_and_is_on_the_safe_side(published, name, pieces, bound, spec):
    f = np.asarray(json.loads((published / name).read_text())["values"])[:pieces]
    fast, plain = bound(f, "fft"), spec(f)
    assert abs(fast - plain) <= 1e-9 * plain
    if bound is ac1_bound:
        assert fast >= plain  # an upper bound may only move up
    else:
        assert fast <= plain  # a lower bound may only move down


def test_the_direct_method_certifies_on_the_safe_side_too() -> None:
    f = np.random.default_rng(4).random(1500)
    assert _spec_ac1(f) <= ac1_bound(f, "direct") <= _spec_ac1(f) * (1 + 1e-9)
    assert _spec_ac2(f) * (1 - 1e-9) <= ac2_bound(f, "direct") <= _spec_ac2(f)


def test_the_fft_error_bound_covers_the_actual_error() -> None:
    rng = np.random.default_rng(0)
    for f in (rng.random(5000), rng.random(5000) ** 8 * 1000, np.r_[np.full(3000, 1e-9), [1000.0]]):
        fast, error = autoconvolution(f, "fft")
        exact = np.convolve(f, f)  # itself within gamma_n of exact: far below `error`
        assert 0 < np.abs(fast - exact).max() <= error <= 1e-10 * exact.max()
    with pytest.raises(ValueError, match="method"):
        autoconvolution(np.ones(3), "fast")


@pytest.mark.parametrize("problem, constant_value", [("ac1", 2.0), ("ac2", None)])
def test_constant_sequences_give_the_known_values(problem: str, constant_value: float | None) -> None:
    result = get_problem(problem).verify([0.3] * 1000)
    assert result.valid
    if constant_value is not None:  # f * f of a constant is a triangle of height n v^2
        assert result.metrics["bound"] == pytest.approx(constant_value, rel=1e-12)
        assert result.reward == pytest.approx(0.5, rel=1e-12)
    else:  # the triangle's L2^2 / (L1 Linf) tends to 2/3
        assert result.reward == pytest.approx(2 / 3, abs=1e-3)


def test_the_ac_bounds_do_not_depend_on_scale() -> None:
    f = np.random.default_rng(1).random(3000)
    for problem in ("ac1", "ac2"):
        p = get_problem(problem)
        a, b = p.verify(list(f)), p.verify(list(f * 7.5))
        assert a.metrics["bound"] == pytest.approx(b.metrics["bound"], rel=1e-12)


# -- hostile input: every verifier rejects every one of these, with a reason --------------------

COMMON_HOSTILE = {
    "none": None,
    "string": "0.5, 0.5",
    "number": 3.0,
    "bool": True,
    "empty list": [],
    "empty object": {},
    "wrong key": {"vals": [0.5]},
}
SEQUENCE_HOSTILE = {
    "NaN": [float("nan")] + [0.5] * 9,
    "infinity": [0.5] * 9 + [float("inf")],
    "minus infinity": [float("-inf")] + [0.5] * 9,
    "negative": [0.5, -0.1, 0.5],
    "string item": ["0.5", 0.5],
    "bool item": [True, 0.5],
    "None item": [None, 0.5],
    "nested": [[0.5], 0.5],
    "matrix": [[0.5, 0.5], [0.5, 0.5]],
    "object item": [{"v": 0.5}],
    "huge int": [10**400, 1],
    "all zero": [0.0] * 50,
    "values None": {"values": None},
    "values string": {"values": "0.5"},
}
PER_PROBLEM_HOSTILE = {
    "erdos": {
        "above 1": [1.5, 0.5],
        "rescale leaves [0, 1]": [1.0, 0.0, 0.0, 0.0],
        "too many pieces": [0.5] * 1001,
    },
    "ac1": {"above the clamp": [1000.5, 1.0], "near-zero sum": [1e-4] * 50, "tiny positive": [1e-300] * 10},
    "ac2": {"above the clamp": [1.0, 1e6], "near-zero sum": [0.0] * 99 + [0.009], "denormal": [5e-324] * 10},
}


def _circle_cases(n: int) -> dict[str, object]:
    good = CirclePackingProblem(n=n).random_construction(np.random.default_rng(0))

    def edit(i: int, value: list) -> list:
        return [value if j == i else c for j, c in enumerate(good)]

    x0, y0, r0 = good[0]
    x1, y1, r1 = good[1]
    return {
        "too few": good[:-1],
        "too many": good + [[0.5, 0.5, 0.001]],
        "flat list": [v for c in good for v in c],
        "pair not triple": edit(0, [0.5, 0.5]),
        "four numbers": edit(0, [0.5, 0.5, 0.1, 0.0]),
        "NaN": edit(3, [float("nan"), 0.5, 0.01]),
        "infinite radius": edit(3, [0.5, 0.5, float("inf")]),
        "string": edit(0, ["0.5", 0.5, 0.01]),
        "bool": edit(0, [0.5, True, 0.01]),
        "negative radius": edit(0, [x0, y0, -r0]),
        "zero radius": edit(0, [x0, y0, 0.0]),
        "escapes left": edit(0, [0.01, 0.5, 0.02]),
        "escapes top": edit(0, [0.5, 0.995, 0.01]),
        "outside the square": edit(0, [1.5, 1.5, 0.01]),
        "overlap": edit(1, [x0, y0, r1]),
        "duplicate": edit(1, list(good[0])),
        "wrong key": {"circles": good},
    }


HOSTILE_CASES = [
    (problem, label, construction)
    for problem in MATH_PROBLEMS
    for label, construction in {
        **COMMON_HOSTILE,
        **(
            _circle_cases(int(problem.split("-")[1]))
            if problem.startswith("circles")
            else {**SEQUENCE_HOSTILE, **PER_PROBLEM_HOSTILE[problem]}
        ),
    }.items()
]


@pytest.mark.parametrize("problem, label, construction", HOSTILE_CASES, ids=[f"{p}-{lbl}" for p, lbl, _ in HOSTILE_CASES])
def test_every_verifier_rejects_hostile_constructions_with_a_reason(problem, label, construction) -> None:
    result = get_problem(problem).verify(construction)
    assert not result.valid and result.reward == 0.0 and result.reason, result


def test_rejections_name_what_is_wrong() -> None:
    ac1, ac2, circles = get_problem("ac1"), get_problem("ac2"), get_problem("circles-26")
    assert "NaN" in ac1.verify([float("nan"), 1.0]).reason
    assert "above 1000" in ac1.verify([2000.0, 1.0]).reason
    assert "sum" in ac2.verify([0.0] * 10).reason
    assert "exactly 26" in circles.verify([[0.5, 0.5, 0.1]]).reason
    assert "radii must be positive" in circles.verify(_circle_cases(26)["negative radius"]).reason
    assert "leaves the unit square" in circles.verify(_circle_cases(26)["escapes left"]).reason
    overlap = circles.verify(_circle_cases(26)["overlap"]).reason
    assert "overlap" in overlap and "tolerance 0" in overlap


# -- circle packing: exact checks and the tolerance --------------------------------------------


def test_circle_checks_are_exact_where_floats_would_round() -> None:
    p = CirclePackingProblem(n=2)
    touching = [[0.25, 0.5, 0.25], [0.75, 0.5, 0.25]]
    assert p.verify(touching).valid  # tangent circles are disjoint; tangent to the walls is inside
    r = math.nextafter(0.25, 1.0)  # 0.25 + r rounds to 0.5 in floats, so a float check passes it
    assert 0.25 + r == 0.5
    assert not p.verify([[0.25, 0.5, 0.25], [0.75, 0.5, r]]).valid
    assert not p.verify([[0.25, 0.5, 0.25], [math.nextafter(0.75, 1.0), 0.5, 0.25]]).valid  # escapes by 1 ulp


def test_the_tolerance_is_explicit_and_always_reported() -> None:
    overlapping = [[0.25, 0.5, 0.25], [0.75, 0.5, 0.25 + 5e-7]]
    strict, loose = CirclePackingProblem(n=2), CirclePackingProblem(n=2, tolerance=1e-6)
    assert not strict.verify(overlapping).valid and "tolerance 0" in strict.verify(overlapping).reason
    result = loose.verify(overlapping)
    assert result.valid and result.metrics["tolerance"] == 1e-6
    assert result.reward == pytest.approx(0.5 + 5e-7)
    assert "1e-06" in loose.description
    for bad in (-1e-6, float("nan"), "0"):
        with pytest.raises(ValueError, match="tolerance"):
            CirclePackingProblem(n=2, tolerance=bad)


def test_verify_cli_takes_a_tolerance_for_circles_only(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"circles_xyr": CirclePackingProblem(n=26).random_construction(np.random.default_rng(3))}))
    runner = CliRunner()
    out = runner.invoke(app, ["verify", "circles-26", str(path), "--tolerance", "1e-6"])
    assert out.exit_code == 0 and "tolerance 1e-06" in out.output
    assert "tolerance 0" in runner.invoke(app, ["verify", "circles-26", str(path)]).output
    wrong = runner.invoke(app, ["verify", "erdos", str(path), "--tolerance", "1e-6"])
    assert wrong.exit_code == 2 and "tolerance" in wrong.output
