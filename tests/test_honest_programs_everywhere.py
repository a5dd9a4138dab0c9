"""Honest programs keep their rewards under every backend (issue 36, Must show 2): the published
records returned by a program, a contest-style AHC058 program (random_device, clocks, a thread) and,
under gVisor, denoising's MAGIC seed (against the same program run outside any sandbox), on the process backend (bubblewrap and the seccomp
allow-lists), Docker (runc, the allow-list as its profile) and Docker under gVisor. The process
backend's and Docker's runs of the denoising seed, TriMul's kernels and torch.compile are in their
own suites (tests/test_denoising_sandbox.py, tests/test_trimul_cpu.py, tests/test_trimul_compile.py).

Docker and gVisor cases skip with the reason outside CI where no engine, image or runtime answers,
and fail in CI (tests/sandbox_backends.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluators.registry import get_problem
from tests.sandbox_backends import sandboxes_by_backend, unavailable_outside_ci

REPO = Path(__file__).resolve().parents[1]
PUBLISHED = REPO / "evaluators" / "math" / "published"
BACKENDS = ["process", "docker", "gvisor"]
RECORDS = [
    ("erdos", "erdos/ttt_discover.json"),
    ("ac1", "ac1/ttt_discover.json"),
    ("ac2", "ac2/alphaevolve_v2.json"),
    ("circles-26", "circle_packing/ttt_discover_n26.json"),
]
CONTEST_STYLE = (REPO / "tests" / "programs" / "ahc058_timed.cpp").read_text()


def _box(boxes, backend: str, image: str):
    if backend != "process":
        unavailable_outside_ci(image, gvisor=backend == "gvisor")
    return boxes(backend)


@pytest.fixture(scope="module")
def math_boxes():
    yield from sandboxes_by_backend("python-math")


@pytest.fixture(scope="module")
def cpp_boxes():
    yield from sandboxes_by_backend("cpp20")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("problem_name, record", RECORDS, ids=[r[0] for r in RECORDS])
def test_a_published_record_returned_by_a_program_keeps_its_reward(math_boxes, backend: str, problem_name: str, record: str) -> None:
    problem = get_problem(problem_name)
    data = json.loads((PUBLISHED / record).read_text())
    expected = problem.verify(data)
    assert expected.valid, expected.reason
    result = problem.evaluate(f"def construct(parent):\n    return {json.dumps(data)}\n", None, _box(math_boxes, backend, "python-math"))
    assert result.valid and result.reward == pytest.approx(expected.reward, rel=1e-12), (result.reason, result.observation[-500:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_contest_style_ahc058_program_scores_as_it_should(cpp_boxes, backend: str) -> None:
    problem = get_problem("ahc058", cases="0-2")
    result = problem.evaluate(CONTEST_STYLE, None, _box(cpp_boxes, backend, "cpp20"))
    # buy (0, 0) once, then wait: S = 500 apples on every generated input (tests/test_ahc_sandbox.py)
    assert result.valid, result.reason
    assert [row["score"] for row in result.metrics["cases"]] == [round(1e5 * 8.965784284662087)] * 3, result.metrics["cases"]


def test_the_magic_seed_keeps_its_reward_under_gvisor() -> None:
    from evaluators.bio.denoising.problem import program
    from evaluators.bio.denoising.report import run_program
    from evaluators.sandbox.docker import DockerSandbox

    unavailable_outside_ci("bio", gvisor=True)
    problem = get_problem("denoising")
    # the same program run in this process, on this machine (no figure recorded on another CPU)
    outside = problem.score_output(run_program("magic", problem.prepared().split))
    box = DockerSandbox(image="bio", concurrency=1, gvisor=True)
    try:
        result = problem.with_limits(timeout_s=600.0).evaluate(program("magic"), None, box)
    finally:
        box.close()
    assert outside.valid and result.valid, (outside.reason, result.reason, result.observation[-500:])
    assert result.reward == pytest.approx(outside.reward, rel=0.01)
