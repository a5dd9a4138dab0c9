"""AHC039 "Purse Seine Fishing": the judge of one output, written from the statement, and the problem.

Input: N (5000), then N mackerels and N sardines, distinct integer points of [0, 1e5]^2.
Output: one or more polygons, each `m` then m vertices `x y`; the last one is scored, the earlier
ones only have to read correctly (4 <= m <= 1000, integer coordinates in [0, 1e5]).
The scored polygon: distinct vertices, axis-parallel edges (the edge from the last vertex back to
the first included), total edge length at most 4e5, no self-intersection (edges that are not
adjacent share no point; adjacent edges share only their common vertex, so three consecutive
collinear vertices are fine but a turn back along the same line is not), either orientation.
Case score: max(0, a - b + 1), a and b the mackerels and sardines inside, the boundary counting
as inside.

Where the statement is silent, the official tool (the contest's Rust `tools`, `parse_output` and
`compute_score`) is the rule, and this judge follows it:
- tokens: split on Unicode whitespace, each parsed as `parse::<i64>()` ("+5", "007", "-0" are
  numbers; a number outside the 64-bit range is a parse error: a wrong answer, judging.py); line
  breaks, blank lines and extra whitespace mean nothing; every token must be read, so anything after
  the last polygon that is not a polygon is a wrong answer;
- an empty output (no polygon at all) scores 1: the tool scores the empty net, nothing inside;
- earlier polygons are only read (count in [4, 1000], coordinates in [0, 1e5]), never checked for
  shape; the last is checked and scored (validity is the tool's: its checks, consecutive vertices
  equal, a slanted edge, a turn back, non-neighbouring edges meeting, length over 4e5, reject exactly
  the polygons the rules above reject; only the wording of the reason differs);
- not UTF-8: a wrong answer (the tool reads the output as a String).
Bounds (not the tool's, which has none): at most judging.MAX_OUTPUT_BYTES of output (the sandbox's
cap on a case's output) is read; reading is linear in the output's size with NumPy (32 MiB of tiny
polygons: about 10 bytes of memory a byte of output), and only the last polygon is kept, so the
quadratic checks below see at most 1,000 vertices.

Everything is exact integer arithmetic on NumPy int64 arrays (coordinates are at most 1e5).
Counting 10,000 points against a 1,000-vertex polygon is O((n + m) log(n + m) + m^2 / 8) bytes of
work: boundary points by binary search on sorted point keys, interior points by a parity table over
the polygon's compressed coordinates (a ray to +x crosses the vertical edges to the right).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evaluators.algorithms.contest import AtCoderProblem
from evaluators.algorithms.judging import OUT_OF_RANGE, decode_output, output_too_large, read_integers, shorten
from evaluators.base import Judgement

COORD_MAX = 100_000
MIN_VERTICES, MAX_VERTICES = 4, 1000
MAX_LENGTH = 400_000
_KEY = COORD_MAX + 1  # key = major * _KEY + minor orders points by (major, minor)


@dataclass(frozen=True)
class Input:
    n: int  # mackerels; the same number of sardines follow
    x: np.ndarray  # int64, 2n values: mackerels first
    y: np.ndarray


def parse_input(text: str) -> Input:
    """Read an input file; ValueError naming the problem when it is not an AHC039 input."""
    try:
        values = [int(t) for t in text.split()]
    except ValueError:
        raise ValueError("not an AHC039 input: it holds a token that is not an integer") from None
    if not values or values[0] < 1 or len(values) != 1 + 4 * values[0]:
        raise ValueError(f"not an AHC039 input: expected N and then 2N points (4N integers), got {len(values)} integers")
    pts = np.asarray(values[1:], dtype=np.int64).reshape(-1, 2)
    if pts.min() < 0 or pts.max() > COORD_MAX:
        raise ValueError(f"not an AHC039 input: a coordinate lies outside [0, {COORD_MAX}]")
    return Input(n=values[0], x=pts[:, 0].copy(), y=pts[:, 1].copy())


def read_polygons(text: str) -> tuple[list[np.ndarray], int, str]:
    """The last polygon of the output (as a list of one (m, 2) int64 array; [] for an empty output),
    how many polygons were read, or ([], 0, the first reading error).

    The earlier polygons are only checked as the official tool reads them (a count in [4, 1000],
    then 2m coordinates in [0, 1e5]) and not kept: reading is linear in the output's size, and what
    is kept is bounded by the statement's largest polygon."""
    ints = read_integers(text)
    values, n = ints.values, ints.count
    polygons, last, i = 0, None, 0

    def not_read(index: int, what: str) -> str:
        if ints.bad is not None and index == ints.bad:
            why = "a number out of the 64-bit range" if ints.bad_reason == OUT_OF_RANGE else "not an integer"
            return f"{what} (token {index + 1}) is {shorten(ints.bad_token)}, {why}"
        return f"the output ends where {what} should be (after {n} tokens)"

    # Walk the vertex counts (one step a polygon), then check every coordinate read at once.
    heads: list[int] = []
    stop_err = ""
    while i < n:
        if i >= len(values):
            stop_err = not_read(i, f"the vertex count of polygon {len(heads) + 1}")
            break
        m = int(values[i])
        if not MIN_VERTICES <= m <= MAX_VERTICES:
            stop_err = f"polygon {len(heads) + 1} has m = {m} vertices; m must lie in [{MIN_VERTICES}, {MAX_VERTICES}]"
            break
        heads.append(i)
        i += 1 + 2 * m
        if i > len(values):  # this polygon's coordinates run past the integers read: reported below
            break
    read_to = min(i, len(values))  # the coordinates read before the walk stopped
    is_coord = np.ones(read_to, dtype=bool)
    is_coord[heads] = False
    outside = np.flatnonzero(is_coord & ((values[:read_to] < 0) | (values[:read_to] > COORD_MAX)))
    if len(outside):
        at = int(outside[0])
        k = int(np.searchsorted(heads, at, side="right"))
        j = at - heads[k - 1] - 1
        return [], 0, f"polygon {k}, vertex {j // 2}: {'xy'[j % 2]} = {values[at]} lies outside [0, {COORD_MAX}]"
    if stop_err:
        return [], 0, stop_err
    if i > len(values):  # the last polygon's first coordinate that is missing or not an integer
        j = len(values) - heads[-1] - 1
        return [], 0, not_read(len(values), f"{'xy'[j % 2]} of vertex {j // 2} of polygon {len(heads)}")
    polygons = len(heads)
    if heads:
        last = (heads[-1] + 1, i)
    if last is None:
        return [], 0, ""
    return [values[last[0] : last[1]].reshape(-1, 2).copy()], polygons, ""


def polygon_error(poly: np.ndarray) -> str:
    """Why `poly` is not a valid net, or "" when it is (the statement's conditions 1-4)."""
    m = len(poly)
    x, y = poly[:, 0], poly[:, 1]
    keys = x * _KEY + y
    order = np.argsort(keys, kind="stable")
    same = np.flatnonzero(keys[order][1:] == keys[order][:-1])
    if len(same):
        a, b = sorted((int(order[same[0]]), int(order[same[0] + 1])))
        return f"vertices {a} and {b} are both ({x[a]}, {y[a]}); all vertices must be distinct"
    nx, ny = np.roll(x, -1), np.roll(y, -1)
    slanted = np.flatnonzero((x != nx) & (y != ny))
    if len(slanted):
        i = int(slanted[0])
        j = (i + 1) % m
        return f"the edge from vertex {i} ({x[i]}, {y[i]}) to vertex {j} ({x[j]}, {y[j]}) is neither horizontal nor vertical"
    length = int(np.abs(nx - x).sum() + np.abs(ny - y).sum())
    if length > MAX_LENGTH:
        return f"the total edge length is {length}, more than {MAX_LENGTH}"
    return _crossing(poly)


def _crossing(poly: np.ndarray) -> str:
    """The first pair of edges that breaks simplicity, or "" (condition 4)."""
    m = len(poly)
    x, y = poly[:, 0], poly[:, 1]
    nx, ny = np.roll(x, -1), np.roll(y, -1)
    idx = np.arange(m)
    h = idx[y == ny]  # horizontal edges i: vertex i to vertex i+1
    v = idx[x == nx]
    h_lo, h_hi = np.minimum(x[h], nx[h]), np.maximum(x[h], nx[h])
    v_lo, v_hi = np.minimum(y[v], ny[v]), np.maximum(y[v], ny[v])

    def adjacent(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d = np.abs(a[:, None] - b[None, :])
        return (d == 1) | (d == m - 1)

    # A horizontal and a vertical edge meet in at most one point; adjacent ones meet at their
    # common vertex, which is allowed, so only non-adjacent pairs may not meet.
    hx = (h_lo[:, None] <= x[v][None, :]) & (x[v][None, :] <= h_hi[:, None])
    meet = hx & (v_lo[None, :] <= y[h][:, None]) & (y[h][:, None] <= v_hi[None, :])
    if meet.any():
        bad = meet & ~adjacent(h, v)
        if bad.any():
            a, b = np.argwhere(bad)[0]
            return _pair_reason(poly, int(h[a]), int(v[b]), "cross or touch")
    # Parallel edges can only meet on the same line: compare the edges of each line among themselves.
    # Non-adjacent ones may share no point, adjacent ones only their common vertex (a zero-length overlap).
    for edges, line, lo, hi in ((h, y[h], h_lo, h_hi), (v, x[v], v_lo, v_hi)):
        order = np.argsort(line, kind="stable")
        bounds = np.flatnonzero(np.diff(line[order])) + 1
        for group in np.split(order, bounds):
            if len(group) < 2:
                continue
            e, a_lo, a_hi = edges[group], lo[group], hi[group]
            overlap = np.maximum(a_lo[:, None], a_lo[None, :]) - np.minimum(a_hi[:, None], a_hi[None, :])  # <= 0: shared points
            adj = adjacent(e, e)
            bad = np.triu((~adj & (overlap <= 0)) | (adj & (overlap < 0)), k=1)
            if bad.any():
                a, b = np.argwhere(bad)[0]
                return _pair_reason(poly, int(e[a]), int(e[b]), "overlap" if adj[a, b] else "overlap or touch")
    return ""


def _pair_reason(poly: np.ndarray, i: int, j: int, how: str) -> str:
    m = len(poly)
    i, j = sorted((i, j))

    def edge(k: int) -> str:
        a, b = poly[k], poly[(k + 1) % m]
        return f"edge {k} ({a[0]}, {a[1]})-({b[0]}, {b[1]})"

    return f"the polygon intersects itself: {edge(i)} and {edge(j)} {how}"


def inside_mask(poly: np.ndarray, px: np.ndarray, py: np.ndarray) -> np.ndarray:
    """For each point, whether it lies inside `poly` or on its boundary (exact, vectorised)."""
    x, y = poly[:, 0], poly[:, 1]
    nx, ny = np.roll(x, -1), np.roll(y, -1)
    horizontal = y == ny
    on_edge = _on_segments(py, px, y[horizontal], np.minimum(x, nx)[horizontal], np.maximum(x, nx)[horizontal])
    on_edge |= _on_segments(px, py, x[~horizontal], np.minimum(y, ny)[~horizontal], np.maximum(y, ny)[~horizontal])
    return on_edge | _odd_crossings(x[~horizontal], np.minimum(y, ny)[~horizontal], np.maximum(y, ny)[~horizontal], px, py)


def _on_segments(major: np.ndarray, minor: np.ndarray, line: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Points with major == line and lo <= minor <= hi for some segment, by binary search."""
    keys = major * _KEY + minor
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    start = np.searchsorted(sorted_keys, line * _KEY + lo, side="left")
    stop = np.searchsorted(sorted_keys, line * _KEY + hi, side="right")
    cover = np.zeros(len(keys) + 1, dtype=np.int64)
    np.add.at(cover, start, 1)
    np.add.at(cover, stop, -1)
    hit = np.empty(len(keys), dtype=bool)
    hit[order] = np.cumsum(cover[:-1]) > 0
    return hit


def _odd_crossings(ex: np.ndarray, lo: np.ndarray, hi: np.ndarray, px: np.ndarray, py: np.ndarray) -> np.ndarray:
    """Whether a ray from each point towards +x crosses an odd number of vertical edges
    (x = ex, lo <= y < hi: half-open, so a ray through a vertex counts once). Exact for points
    not on the boundary; a table of parities over the compressed coordinates answers each point."""
    ys = np.unique(np.concatenate([lo, hi]))
    xs = np.unique(ex)
    if len(ys) < 2 or len(xs) == 0:
        return np.zeros(len(px), dtype=bool)
    col = np.searchsorted(xs, ex)
    flips = np.zeros((len(ys), len(xs) + 1), dtype=np.uint8)
    np.bitwise_xor.at(flips, (np.searchsorted(ys, lo), col), 1)
    np.bitwise_xor.at(flips, (np.searchsorted(ys, hi), col), 1)
    present = np.bitwise_xor.accumulate(flips, axis=0)  # edges of column k spanning slab s
    right = np.bitwise_xor.accumulate(present[:, ::-1], axis=1)[:, ::-1]  # parity of edges at columns >= k
    slab = np.searchsorted(ys, py, side="right") - 1  # ys[slab] <= py < ys[slab + 1]
    first_right = np.searchsorted(xs, px, side="right")  # columns with x > px
    inside = (slab >= 0) & (slab < len(ys) - 1)
    out = np.zeros(len(px), dtype=bool)
    out[inside] = right[slab[inside], first_right[inside]] == 1
    return out


def judge_output(inp: Input, output: bytes | str) -> Judgement:
    """The contest's verdict on one output: WA with the first broken rule, or the case score."""
    too_large = output_too_large(output)
    if too_large:
        return Judgement.wrong(too_large)
    text = decode_output(output)
    if text is None:
        return Judgement.wrong("the output is not UTF-8 text")
    polygons, count, err = read_polygons(text)
    if err:
        return Judgement.wrong(err)
    if not polygons:  # the official tool scores an empty net: nothing inside, max(0, 0 - 0 + 1)
        return Judgement(valid=True, score=1, details={"mackerels": 0, "sardines": 0, "vertices": 0, "polygons": 0})
    poly = polygons[-1]
    err = polygon_error(poly)
    if err:
        which = f"polygon {count} (the last, which is scored)" if count > 1 else "the polygon"
        return Judgement.wrong(f"{which}: {err}")
    inside = inside_mask(poly, inp.x, inp.y)
    a, b = int(inside[: inp.n].sum()), int(inside[inp.n :].sum())
    return Judgement(
        valid=True,
        score=max(0, a - b + 1),
        details={"mackerels": a, "sardines": b, "vertices": len(poly), "polygons": count},
    )


def judge(input_text: str, output: bytes | str) -> Judgement:
    return judge_output(parse_input(input_text), output)


class PurseSeineProblem(AtCoderProblem):
    """AHC039 Purse Seine Fishing: reward = mean case score / 1500 (the released code's scale)."""

    name = contest = "ahc039"
    scale = 1500.0
    # docs/method.md §5a: the prompt's target. The contest's 1st place (a human) scored 566,997 over its 150
    # official cases: that mean per case, in reward units.
    target = 566_997 / 150 / 1500.0
    builtin_program = "ahc039_initial.cpp"  # our own simple program (the paper started from a strong published one)

    def parse_input(self, text: str) -> Input:
        return parse_input(text)

    def judge_output(self, parsed_input: Input, output: bytes | str) -> Judgement:
        return judge_output(parsed_input, output)
