"""The mathematics problems as a run uses them: seeds (random or from a file), descriptions,
contexts, candidates run in the process sandbox, and `discover plot`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.app import app
from evaluators.base import ParentView
from evaluators.math.problem import STARTERS
from evaluators.registry import get_problem
from evaluators.sandbox import ProcessSandbox

MATH_PROBLEMS = ["erdos", "ac1", "ac2", "circles-26", "circles-32"]
runner = CliRunner()


@pytest.mark.parametrize("problem", MATH_PROBLEMS)
def test_seeds_are_reproducible_and_valid(problem: str) -> None:
    p = get_problem(problem)
    seeds = p.seeds(np.random.default_rng(5), 4)
    assert seeds == p.seeds(np.random.default_rng(5), 4) and len(seeds) == 4
    for seed in seeds:
        starter = getattr(p, "starter", "")
        assert seed.code == ((STARTERS / starter).read_text() if starter else "")
        result = p.verify(seed.construction)
        assert result.valid and result.reward > 0, result.reason
        json.dumps(seed.construction)  # plain data, as the archive stores it


@pytest.mark.parametrize("problem", ["ac1", "ac2"])
def test_ac_seeds_repeat_one_value_1000_to_8000_times(problem: str) -> None:
    seeds = get_problem(problem).seeds(np.random.default_rng(0), 20)
    lengths = {len(s.construction) for s in seeds}
    assert all(1000 <= n <= 8000 for n in lengths) and len(lengths) > 1
    for s in seeds:
        assert len(set(s.construction)) == 1 and 0 <= s.construction[0] <= 1


def test_circle_seeds_are_spread_packings() -> None:
    p = get_problem("circles-32")
    for s in p.seeds(np.random.default_rng(2), 5):
        assert len(s.construction) == 32 and 0.8 < p.verify(s.construction).reward < 2.0


@pytest.mark.parametrize(
    "problem, name",
    [("erdos", "erdos/ttt_discover.json"), ("ac1", "ac1/alphaevolve_v2.json"), ("circles-26", "circle_packing/ttt_discover_n26.json")],
)
def test_seeds_file_with_one_record(published: Path, problem: str, name: str) -> None:
    path = published / name
    p = get_problem(problem, seeds_file=str(path))
    seeds = p.seeds(np.random.default_rng(0), 1)
    assert len(seeds) == 1
    data = json.loads(path.read_text())
    assert seeds[0].construction == data.get("values", data.get("circles_xyr"))
    assert p.verify(seeds[0].construction).valid


def test_seeds_file_with_a_list_of_constructions(tmp_path: Path) -> None:
    sequences = tmp_path / "ac.json"
    sequences.write_text(json.dumps([[0.5] * 10, {"values": [0.2, 0.4]}, [1.0] * 3]))
    seeds = get_problem("ac2", seeds_file=str(sequences)).seeds(np.random.default_rng(0), 1)
    assert [s.construction for s in seeds] == [[0.5] * 10, [0.2, 0.4], [1.0] * 3]  # all, whatever the count

    packings = tmp_path / "circles.json"
    one = get_problem("circles-26").random_construction(np.random.default_rng(1))
    two = get_problem("circles-26").random_construction(np.random.default_rng(2))
    packings.write_text(json.dumps([one, {"circles_xyr": two}]))
    assert [s.construction for s in get_problem("circles-26", seeds_file=str(packings)).seeds(np.random.default_rng(0), 8)] == [one, two]


def test_a_bad_seeds_file_fails_when_the_seeds_are_drawn(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    bad = tmp_path / "bad.json"
    for text, message in [
        ("[0.5, NaN]", "construction 0 is invalid for ac1: value 1 is NaN"),
        ("[[0.5], [-1.0]]", "construction 1 is invalid"),
        ("{not json", "not valid JSON"),
        ("[]", "neither one construction"),
        ('"values"', "neither one construction"),
    ]:
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            get_problem("ac1", seeds_file=str(bad)).seeds(rng, 1)
    with pytest.raises(ValueError, match="does not exist"):
        get_problem("erdos", seeds_file=str(tmp_path / "absent.json")).seeds(rng, 1)
    bad.write_text(json.dumps([[0.5, 0.5, 0.1]] * 32))  # 32 circles for the 26-circle problem
    with pytest.raises(ValueError, match="exactly 26"):
        get_problem("circles-26", seeds_file=str(bad)).seeds(rng, 1)


@pytest.mark.parametrize("problem", MATH_PROBLEMS)
def test_descriptions_state_the_contract_the_limits_and_the_scoring(problem: str) -> None:
    p = get_problem(problem, timeout_s=30.0, memory_mb=512, cpus=1)
    d = p.description
    assert "def construct(parent):" in d and "```python" in d
    assert "30 s wall clock" in d and "512 MB" in d and "1 CPU" in d
    assert "reward" in d and "best known" in d.lower()
    p.limits = p.limits.__class__(timeout_s=99.0)  # a run's sandbox settings replace the limits
    assert "99 s wall clock" in p.description
    assert get_problem(problem).limits.timeout_s == 1100.0  # App. B: up to 1100 s, 1 GB, 2 CPUs


def test_render_state_shows_short_constructions_in_full() -> None:
    ac1 = get_problem("ac1")
    small = ac1.render_state("def construct(p):\n    return [1.0] * 4\n", [1.0] * 4)
    assert "```python" in small and "4 pieces" in small and "Values: [1, 1, 1, 1]" in small and "bound 2.0000" in small
    large = ac1.render_state("", [0.5] * 5000)
    assert "5000 pieces" in large and "Values:" not in large and "construct(parent)" in large
    circles = get_problem("circles-26").render_state("", get_problem("circles-26").random_construction(np.random.default_rng(0)))
    assert "26 circles" in circles and circles.count("\n[") == 26
    assert "none usable" in get_problem("ac2").render_state("", [-1.0])


@pytest.fixture(scope="module")
def sandbox() -> ProcessSandbox:
    return ProcessSandbox()


def test_ac_candidates_run_in_the_sandbox_and_return_plain_data(sandbox: ProcessSandbox) -> None:
    ac1 = get_problem("ac1", timeout_s=30.0, cpus=1)
    program = "import numpy as np\ndef construct(parent):\n    return np.asarray(parent) * 2 + np.linspace(0, 1, len(parent))\n"
    child = ac1.evaluate(program, ParentView(code="", construction=[0.5] * 3000), sandbox)
    assert child.valid and child.metrics["pieces"] == 3000 and isinstance(child.construction, list)
    bound = ac1.verify(child.construction).metrics["bound"]
    assert child.reward == pytest.approx(1.0 / bound)

    cheat = "def construct(parent):\n    print('bound 0.1, reward 99')\n    return [0.0] * 10 + [1e-9]\n"
    result = get_problem("ac2", timeout_s=30.0).evaluate(cheat, None, sandbox)
    assert not result.valid and "sum" in result.reason and "reward 99" in result.observation


@pytest.mark.parametrize("problem", ["ac1", "ac2"])
def test_ac_starter_programs_improve_on_a_random_seed(sandbox: ProcessSandbox, problem: str) -> None:
    # docs/method.md §5a: each AC seed state carries a starter program; run on its own seed it must return a
    # valid, better construction (AC1: LP steps from the constant 2.0 to about 1.54; AC2: 2/3 up).
    p = get_problem(problem)
    seed = p.seeds(np.random.default_rng(3), 1)[0]
    before = p.verify(seed.construction)
    after = p.evaluate(seed.code, ParentView(code=seed.code, construction=seed.construction), sandbox)
    assert after.valid, after.reason
    assert after.reward > before.reward * 1.05
    assert "pieces, bound" in after.observation


def test_circle_candidates_run_in_the_sandbox(sandbox: ProcessSandbox) -> None:
    p = get_problem("circles-26", timeout_s=30.0, cpus=1)
    grid = (
        "import numpy as np\n"
        "def construct(parent):\n"
        "    xs = (np.arange(6) + 0.5) / 6\n"
        "    pts = [(x, y) for y in xs for x in xs][:26]\n"
        "    return np.array([[x, y, RADIUS] for x, y in pts])\n"
    )
    # Tangent circles on a float grid overlap by ~1e-17 in exact arithmetic: zero tolerance sees it.
    assert "overlap" in p.evaluate(grid.replace("RADIUS", "1 / 12"), None, sandbox).reason
    result = p.evaluate(grid.replace("RADIUS", "1 / 12 * (1 - 1e-12)"), None, sandbox)
    assert result.valid and result.reward == pytest.approx(26 / 12) and result.metrics["tolerance"] == 0.0
    grown = grid.replace("RADIUS", "1 / 11.9")
    assert "leaves the unit square" in p.evaluate(grown, None, sandbox).reason
    assert "exactly 26" in p.evaluate("def construct(parent):\n    return parent\n", ParentView("", [[0.5, 0.5, 0.1]]), sandbox).reason


@pytest.mark.parametrize(
    "problem, construction",
    [
        ("erdos", [0.2, 0.7, 0.9, 0.6, 0.5, 0.3]),
        ("ac1", {"values": [1.0, 0.4, 0.8, 0.2]}),
        ("ac2", [0.0, 1.0, 0.5, 1.0, 0.0]),
        ("circles-26", "seed"),
    ],
)
def test_plot_writes_a_png(tmp_path: Path, problem: str, construction) -> None:
    if construction == "seed":
        construction = {"circles_xyr": get_problem(problem).random_construction(np.random.default_rng(0))}
    data, out = tmp_path / "c.json", tmp_path / "out.png"
    data.write_text(json.dumps(construction))
    result = runner.invoke(app, ["plot", problem, str(data), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_refuses_invalid_constructions_and_problems_without_plots(tmp_path: Path) -> None:
    data, out = tmp_path / "c.json", tmp_path / "out.png"
    data.write_text("[0.5, -1]")
    bad = runner.invoke(app, ["plot", "ac1", str(data), "-o", str(out)])
    assert bad.exit_code == 1 and "negative" in bad.output and not out.exists()
    toy = runner.invoke(app, ["plot", "toy", str(data), "-o", str(out)])
    assert toy.exit_code == 2 and "no plot" in toy.output


def test_summary_metrics_are_the_bound_and_the_circles_tolerance(tmp_path: Path) -> None:
    erdos = get_problem("erdos").verify([0.5] * 10)
    assert get_problem("erdos").summary_metrics(erdos) == {"bound": pytest.approx(erdos.metrics["bound"])}
    packing = [[0.5, 0.5, 0.01]] + [[0.05 + 0.035 * i, 0.05, 0.01] for i in range(25)]
    circles = get_problem("circles-26", tolerance=1e-6)
    assert circles.summary_metrics(circles.verify(packing)) == {
        "bound": pytest.approx(0.26),
        "tolerance": 1e-6,
    }
    for name in ("erdos", "ac1", "ac2", "circles-26"):
        assert get_problem(name).summary_metrics(get_problem(name).verify("nonsense")) == {}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(packing))
    assert "valid: reward 0.26, bound 0.26, tolerance 0\n" in CliRunner().invoke(app, ["verify", "circles-26", str(path)]).output


def test_a_missing_seeds_file_is_the_problems_own_preflight() -> None:
    assert get_problem("erdos", seeds_file="/nonexistent/seeds.json").preflight("process") == [
        f"problem_options.seeds_file '/nonexistent/seeds.json' does not exist (relative paths are taken from {Path.cwd()})"
    ]
    assert get_problem("erdos").preflight("docker") == []
