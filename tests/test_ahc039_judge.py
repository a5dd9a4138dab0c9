"""The AHC039 judge on hand-made outputs (issue 8, Must show 1 and 2): the statement's example,
every rule broken once with its reason, boundary points, several polygons, collinear vertices,
and point counts checked against an independent method on random rectilinear polygons."""

from __future__ import annotations

import numpy as np
import pytest

from evaluators.algorithms.ahc039 import Input, inside_mask, judge, judge_output, parse_input
from evaluators.algorithms.cases import public_inputs
from evaluators.algorithms.judging import MAX_OUTPUT_BYTES

SQUARE = [(10, 10), (20, 10), (20, 20), (10, 20)]
# The statement's example output (shown for seed 0 by the contest's visualizer).
EXAMPLE = "6\n15000 25000\n80000 25000\n80000 60000\n65000 60000\n65000 35000\n15000 35000\n"


def fmt(*polygons) -> str:
    return "".join(f"{len(p)}\n" + "".join(f"{x} {y}\n" for x, y in p) for p in polygons)


def points_input(mackerels, sardines) -> Input:
    pts = np.asarray(list(mackerels) + list(sardines), dtype=np.int64).reshape(-1, 2)
    return Input(n=len(mackerels), x=pts[:, 0].copy(), y=pts[:, 1].copy())


def cell_method(poly: np.ndarray, px: np.ndarray, py: np.ndarray) -> np.ndarray:
    """Independent reference: with integer vertices the closed polygon is a union of unit cells, so
    a lattice point is inside or on the boundary iff one of its four cells is inside; a cell's
    centre (half-integer) is never on the boundary, so plain ray casting decides it."""
    x, y = poly[:, 0] * 2, poly[:, 1] * 2
    nx, ny = np.roll(x, -1), np.roll(y, -1)
    vertical = x == nx
    ex, lo, hi = x[vertical], np.minimum(y, ny)[vertical], np.maximum(y, ny)[vertical]
    found = np.zeros(len(px), dtype=bool)
    for dx in (-1, 1):
        for dy in (-1, 1):
            cx, cy = 2 * px + dx, 2 * py + dy
            crossings = ((lo[None, :] < cy[:, None]) & (cy[:, None] < hi[None, :]) & (ex[None, :] > cx[:, None])).sum(axis=1)
            found |= crossings % 2 == 1
    return found


def skyline(rng: np.random.Generator, columns: int, collinear: bool = False) -> list[tuple[int, int]]:
    """A random simple rectilinear polygon: a base line and columns of random heights above it."""
    xs = np.sort(rng.choice(np.arange(100, 99_900), size=columns + 1, replace=False))
    base = int(rng.integers(100, 40_000))
    heights = rng.integers(base + 1, 99_900, size=columns)
    pts = [(int(xs[0]), base)]
    for i in range(columns):
        if i == 0 or heights[i] != heights[i - 1]:
            pts.append((int(xs[i]), int(heights[i])))
        if collinear:
            mid = (int(xs[i]) + int(xs[i + 1])) // 2
            if xs[i] < mid < xs[i + 1]:
                pts.append((mid, int(heights[i])))
        if i + 1 == columns or heights[i + 1] != heights[i]:
            pts.append((int(xs[i + 1]), int(heights[i])))
    pts.append((int(xs[-1]), base))
    return pts


def test_the_statements_example_output_on_seed_0() -> None:
    """The example polygon of the statement, judged on seed 0's input (the statement prints the
    polygon but not its score; 1739 is this judge's figure, checked by the independent method)."""
    inp = parse_input(public_inputs("ahc039")[0])
    verdict = judge_output(inp, EXAMPLE)
    poly = np.array([[15000, 25000], [80000, 25000], [80000, 60000], [65000, 60000], [65000, 35000], [15000, 35000]])
    reference = cell_method(poly, inp.x, inp.y)
    a, b = int(reference[:5000].sum()), int(reference[5000:].sum())
    assert verdict.valid and verdict.reason == ""
    assert (verdict.details["mackerels"], verdict.details["sardines"]) == (a, b) == (2481, 743)
    assert verdict.score == a - b + 1 == 1739


def test_points_on_the_boundary_are_inside() -> None:
    corner, edge_mid, inside, outside, just_out = (10, 10), (15, 20), (12, 13), (30, 30), (9, 15)
    inp = points_input([corner, edge_mid, inside, outside], [just_out, (20, 14)])
    verdict = judge_output(inp, fmt(SQUARE))
    assert verdict.details == {"mackerels": 3, "sardines": 1, "vertices": 4, "polygons": 1}
    assert verdict.score == 3 - 1 + 1


def test_the_score_is_never_below_zero() -> None:
    inp = points_input([(0, 0)], [(10, 10), (15, 15), (20, 20)])
    assert judge_output(inp, fmt(SQUARE)).score == 0


def test_several_polygons_the_last_counts() -> None:
    inp = points_input([(12, 12), (50, 50)], [(100, 100)])
    big = [(40, 40), (60, 40), (60, 60), (40, 60)]
    assert judge_output(inp, fmt(SQUARE, big)).details["mackerels"] == 1
    # only the last must be a valid net: an earlier one that crosses itself is just read
    bow_tie = [(0, 0), (10, 0), (10, 10), (20, 10), (20, 0), (30, 0), (30, 20), (0, 20)]
    crossed = [(0, 0), (20, 0), (20, 10), (5, 10), (5, 20), (15, 20), (15, 5), (0, 5)]
    assert judge_output(inp, fmt(crossed, bow_tie, big)).valid
    last_bad = judge_output(inp, fmt(big, crossed))
    assert not last_bad.valid and "polygon 2 (the last, which is scored)" in last_bad.reason
    # ...but every polygon must be readable
    unreadable = judge_output(inp, "3\n0 0\n1 0\n1 1\n" + fmt(big))
    assert not unreadable.valid and "polygon 1 has m = 3" in unreadable.reason


def test_collinear_vertices_are_allowed_and_change_nothing() -> None:
    inp = parse_input(public_inputs("ahc039")[3])
    plain = [(20000, 20000), (60000, 20000), (60000, 70000), (20000, 70000)]
    with_midpoints = [(20000, 20000), (40000, 20000), (60000, 20000), (60000, 45000), (60000, 70000), (20000, 70000), (20000, 30000)]
    a, b = judge_output(inp, fmt(plain)), judge_output(inp, fmt(with_midpoints))
    assert a.valid and b.valid and a.score == b.score
    reverse = judge_output(inp, fmt(with_midpoints[::-1]))  # the other orientation
    assert reverse.score == a.score


@pytest.mark.parametrize(
    "output, reason",
    [
        ("3\n0 0\n1 0\n1 1\n", "m = 3 vertices; m must lie in [4, 1000]"),
        ("1001\n" + "0 0\n" * 1001, "m = 1001 vertices"),
        ("4\n0 0\n10 0\n10 10\n-1 10\n", "polygon 1, vertex 3: x = -1 lies outside [0, 100000]"),
        ("4\n0 0\n100001 0\n100001 10\n0 10\n", "vertex 1: x = 100001 lies outside"),
        ("4\n0 0\n100000 0\n100000 100001\n0 100001\n", "vertex 2: y = 100001 lies outside"),
        ("4\n0 0\n10 0\n10 10.5\n0 10\n", "y of vertex 2 of polygon 1 (token 7) is '10.5', not an integer"),
        ("4\n0 0\n10 0\n10 ten\n0 10\n", "'ten', not an integer"),
        ("four\n0 0\n", "the vertex count of polygon 1 (token 1) is 'four'"),
        ("4\n0 0\n10 0\n10 10\n", "the output ends where x of vertex 3 of polygon 1 should be"),
        ("4\n0 0\n10 0\n10 0\n0 10\n", "vertices 1 and 2 are both (10, 0)"),
        ("4\n0 0\n10 0\n12 10\n0 10\n", "the edge from vertex 1 (10, 0) to vertex 2 (12, 10) is neither horizontal nor vertical"),
        (fmt([(0, 0), (10, 0), (10, 10), (0, 12)]), "the edge from vertex 2 (10, 10) to vertex 3 (0, 12)"),
        (
            fmt([(0, 0), (100000, 0), (100000, 100000), (60000, 100000), (60000, 1), (40000, 1), (40000, 100000), (0, 100000)]),
            "the total edge length is 599998, more than 400000",
        ),
        (fmt([(0, 0), (20, 0), (20, 10), (5, 10), (5, 20), (15, 20), (15, 5), (0, 5)]), "intersects itself"),  # edges cross
        (
            fmt([(0, 0), (10, 0), (10, 10), (20, 10), (20, 20), (10, 20), (10, 10), (0, 10)]),
            "vertices 2 and 6 are both (10, 10)",
        ),  # a pinch
        (fmt([(0, 0), (20, 0), (20, 10), (10, 10), (10, 0)]), "intersects itself"),  # a vertex on another edge
        (fmt([(0, 0), (20, 0), (10, 0), (10, 10), (0, 10)]), "intersects itself"),  # turning back along the line
        (fmt([(0, 0), (30, 0), (30, 10), (20, 10), (20, 5), (10, 5), (10, 10), (0, 10), (0, 5), (5, 5), (5, 0)]), "intersects itself"),
        (b"4 10 10 20 10 20 20 10 \xff", "not UTF-8"),
        # valid: the largest square (length exactly 400000), a notch, collinear vertices going on
        (fmt([(0, 0), (100000, 0), (100000, 100000), (0, 100000)]), None),
        (fmt([(0, 0), (10, 0), (10, 5), (20, 5), (20, 10), (10, 10), (10, 20), (0, 20)]), None),
        (fmt([(0, 0), (100000, 0), (100000, 100000), (0, 100000), (0, 50000), (0, 1)]), None),
    ],
    ids=[
        "m<4",
        "m>1000",
        "x<0",
        "x>1e5",
        "y>1e5",
        "decimal",
        "word",
        "count-word",
        "truncated",
        "duplicate",
        "slanted",
        "slanted-closing",
        "too-long",
        "crossing",
        "pinch",
        "t-junction",
        "turn-back",
        "shared-stretch",
        "not-utf8",
        "valid-square",
        "valid-notch",
        "valid-collinear",
    ],
)
def test_every_rule_broken_once_names_the_rule(output: str | bytes, reason: str | None) -> None:
    inp = points_input([(1, 1)], [(2, 2)])
    verdict = judge_output(inp, output)
    if reason is None:
        assert verdict.valid and verdict.reason == "", verdict.reason
    else:
        assert not verdict.valid and verdict.score == 0
        assert reason in verdict.reason, verdict.reason


def test_tokens_are_read_as_the_official_tools_read_them() -> None:
    inp = points_input([(12, 12)], [(100, 100)])
    assert judge_output(inp, "+4 10 10 20 10 020 20 10 20").valid  # a sign and leading zeros parse
    assert judge_output(inp, "4\u300010 10\u200320 10\n20 20\r\n10 20\t").valid  # Unicode whitespace separates
    assert not judge_output(inp, "4\x1c10 10 20 10 20 20 10 20").valid  # \x1c is not whitespace in Rust
    assert not judge_output(inp, "4 10 10 20 10 20 20 10 2_0").valid
    assert not judge_output(inp, "4 10 10 20 10 20 20 10 \u0662\u0660").valid  # Arabic-Indic digits


def test_counts_agree_with_an_independent_method_on_random_polygons() -> None:
    rng = np.random.default_rng(8)
    inp = parse_input(public_inputs("ahc039")[5])
    for trial in range(30):
        poly = np.array(skyline(rng, int(rng.integers(1, 120)), collinear=trial % 3 == 0))
        # lattice points on and next to the polygon's vertices and edges, and the case's fish
        near = np.concatenate([poly + d for d in ([0, 0], [1, 0], [-1, 0], [0, 1], [0, -1])])
        mids = (poly + np.roll(poly, -1, axis=0)) // 2
        px = np.concatenate([inp.x, near[:, 0], mids[:, 0]])
        py = np.concatenate([inp.y, near[:, 1], mids[:, 1]])
        assert np.array_equal(inside_mask(poly, px, py), cell_method(poly, px, py)), trial


def test_a_thousand_vertex_net_is_judged() -> None:
    inp = parse_input(public_inputs("ahc039")[0])
    teeth = []
    x = 20_000
    for _ in range(249):  # a comb: 4 vertices per tooth
        teeth += [(x, 30_300), (x + 60, 30_300), (x + 60, 30_100), (x + 80, 30_100)]
        x += 80
    poly = [(20_000, 30_000)] + teeth[:-1] + [(x - 20, 30_000)]
    verdict = judge_output(inp, fmt(poly))
    assert verdict.valid and verdict.details["vertices"] == len(poly) > 990
    reference = cell_method(np.array(poly), inp.x, inp.y)
    assert verdict.score == max(0, int(reference[:5000].sum()) - int(reference[5000:].sum()) + 1)


def test_bad_inputs_are_refused_with_the_problem_named() -> None:
    with pytest.raises(ValueError, match="not an AHC039 input"):
        judge("10 4 500 1\n1 2 3", "4 0 0 1 0 1 1 0 1")


# -- issue 21: as the official tool judges, in bounded time and memory ---------------------------------

TINY = "4\n0 0\n1 0\n1 1\n0 1\n"  # a legal 1x1 net: 18 bytes


@pytest.mark.parametrize("output", ["", "\n", "  \r\n\t", b""], ids=["empty", "newline", "blanks", "bytes"])
def test_an_empty_output_scores_1_as_the_official_tool_scores_it(output: str | bytes) -> None:
    """The official tool reads no polygon, scores the empty net: nothing inside, 0 - 0 + 1."""
    verdict = judge(public_inputs("ahc039")[0], output)
    assert verdict.valid and verdict.score == 1 and verdict.reason == ""


def test_a_5000_digit_number_gets_a_verdict() -> None:
    inp = points_input([(12, 12)], [(100, 100)])
    huge = "7" * 5000
    for output in (
        f"4 10 10 20 10 20 20 10 {huge}",
        f"{huge} 10 10",
        f"4 10 10 20 10 20 20 10 20\n-{huge}",
        f"4\n{huge} 0\n" + "4 10 10 20 10 20 20 10 20",  # inside the first polygon, with more after it
    ):
        verdict = judge_output(inp, output)
        assert not verdict.valid and verdict.score == 0
        assert "a number out of the 64-bit range" in verdict.reason, verdict.reason
    # leading zeros do not make a number large: the official tool parses it as 20
    assert judge_output(inp, "4 10 10 20 10 20 20 10 " + "0" * 5000 + "20").valid


def test_megabytes_of_tiny_polygons_are_judged_in_bounded_memory() -> None:
    """32 MiB of 4-vertex nets (the most a case may print) once took the judge 3.4 GB: now its
    allocations stay within a small multiple of the output, and the last polygon is scored."""
    import tracemalloc

    inp = parse_input(public_inputs("ahc039")[0])
    count = (MAX_OUTPUT_BYTES - 100) // len(TINY)
    last = fmt([(20000, 20000), (80000, 20000), (80000, 80000), (20000, 80000)])
    output = (TINY * count + last).encode()
    assert len(output) <= MAX_OUTPUT_BYTES
    tracemalloc.start()
    try:
        verdict = judge_output(inp, output)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert verdict.valid and verdict.details["polygons"] == count + 1
    assert verdict.score == judge_output(inp, last).score > 1
    assert peak < 12 * len(output), peak
    # a bad coordinate deep inside is found and named
    bad = (TINY * 1000 + "4\n0 0\n1 0\n1 100001\n0 1\n" + TINY).encode()
    assert judge_output(inp, bad).reason == "polygon 1001, vertex 2: y = 100001 lies outside [0, 100000]"


def test_an_output_over_the_cap_is_refused_before_it_is_read() -> None:
    inp = points_input([(12, 12)], [(100, 100)])
    verdict = judge_output(inp, b" " * (MAX_OUTPUT_BYTES + 1))
    assert not verdict.valid and verdict.reason.startswith("output too large")
