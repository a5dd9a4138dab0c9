"""TriMul on a GPU (Must show 2), skipped without CUDA: the reference's and the initial kernel's
runtimes per benchmark shape with their geometric mean and ratio to the published H100 figures,
every hostile kernel (plus a side-stream and a lazy-tensor kernel) earning 0 whether the rules read
before running are on or off, and five timings of one kernel with their spread.

Run on a GPU machine with `pytest -m gpu -s tests/test_trimul_gpu.py` (the sandbox is Docker with
the gpu image when it is built, else the process backend); the figures are printed."""

from __future__ import annotations

import os
import shutil
import statistics

import pytest

from evaluators.kernels.trimul.problem import HERE, INITIAL_KERNEL, SHAPES, TriMulProblem
from evaluators.kernels.trimul.verdict import describe
from evaluators.sandbox import sandbox_for
from tests.trimul_kernels import HONEST_LOGGING, HOSTILE, SIDE_STREAM, SLOW_EMPTY_CALLS, TORCH_COMPILE

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or shutil.which("nvidia-smi") is None, reason="needs a CUDA GPU"),
]

# The reference itself as a candidate (it has no Triton kernel, so it runs with the rules read
# before running skipped): the baseline the initial kernel and the published figures compare with.
REFERENCE_AS_KERNEL = (HERE / "reference.py").read_text() + (
    "\n\ndef custom_kernel(data):\n    strict_float32()\n    return trimul_reference(*data)\n"
)


@pytest.fixture(scope="module")
def problem() -> TriMulProblem:
    return TriMulProblem(device="cuda")


@pytest.fixture(scope="module")
def box(problem):
    # DISCOVER_TEST_SANDBOX_ISOLATION: `make gpu-check` on a lent machine without bubblewrap runs
    # these (our own kernels) with sandbox.isolation none, and says so in its results file
    return sandbox_for(problem, "auto", 1, isolation=os.environ.get("DISCOVER_TEST_SANDBOX_ISOLATION", "standard"))


def _table(name: str, result) -> None:
    published = SHAPES["leaderboard_us"]["H100"]
    c = result.construction
    print(f"\n{name} on {c['gpu']} (torch {c['torch']}, triton {c['triton']})")
    for shape, mean, std in zip(SHAPES["benchmarks"], c["runtimes_us"], c["std_us"]):
        print(f"  {describe(shape):45s} {mean:10.1f} µs ± {std:.1f}")
    print(
        f"  geometric mean {c['geomean_us']:.1f} µs, reward {result.reward:.4f}; "
        f"x {c['geomean_us'] / published['1st_human']:.2f} the best human H100 kernel ({published['1st_human']} µs), "
        f"x {c['geomean_us'] / published['ttt_discover']:.2f} TTT-Discover's ({published['ttt_discover']} µs)"
    )


def test_the_reference_and_the_initial_kernel_are_timed(problem, box) -> None:
    initial = problem.evaluate(INITIAL_KERNEL, None, box)
    assert initial.valid and initial.reward > 0, initial.reason + initial.observation[-3000:]
    _table("initial kernel", initial)
    reference = problem.run_checks(REFERENCE_AS_KERNEL, box, static_rules=False)
    assert reference.valid, reference.reason + reference.observation[-3000:]
    _table("reference (PyTorch, float32, TF32 off)", reference)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_kernel_earns_nothing(problem, box, name) -> None:
    for static_rules in (True, False):
        v = problem.run_checks(HOSTILE[name][0], box, static_rules=static_rules)
        print(f"\n{name} (rules read first: {static_rules}): {v.reason}")
        assert not v.valid and v.reward == 0.0


def test_a_side_stream_kernel_earns_nothing(problem, box) -> None:
    for static_rules in (True, False):
        v = problem.run_checks(SIDE_STREAM, box, static_rules=static_rules)
        print(f"\nside stream (rules read first: {static_rules}): {v.reason}")
        assert not v.valid and v.reward == 0.0


def test_five_timings_of_one_kernel_and_their_spread(problem, box) -> None:
    runs = [problem.evaluate(INITIAL_KERNEL, None, box) for _ in range(5)]
    assert all(r.valid for r in runs), [r.reason for r in runs]
    geomeans = [r.construction["geomean_us"] for r in runs]
    spread = (max(geomeans) - min(geomeans)) / statistics.mean(geomeans)
    print(
        f"\nfive timings of the initial kernel: {', '.join(f'{g:.1f}' for g in geomeans)} µs; "
        f"spread (max - min) / mean = {100 * spread:.2f}%, stdev {statistics.stdev(geomeans):.1f} µs"
    )
    for i in range(len(SHAPES["benchmarks"])):
        per_shape = [r.construction["runtimes_us"][i] for r in runs]
        print(f"  shape {i}: {min(per_shape):.1f} .. {max(per_shape):.1f} µs")


def test_an_honest_torch_compile_kernel_is_timed_and_rewarded(problem, box) -> None:
    """Issue 27 B on a GPU (Inductor emits Triton there): valid, reward > 0."""
    v = problem.evaluate(TORCH_COMPILE, None, box)
    assert v.valid and v.reward > 0, v.reason + v.observation[-3000:]
    _table("torch.compile kernel", v)


def test_slowing_the_calls_it_is_not_timed_on_gains_nothing_on_a_gpu(problem, box) -> None:
    """Issue 27 A on a GPU: the slow-empty-call attack against its honest twin (both log to /dev/null).
    A GPU's run-to-run spread is a few percent; the attack once gained 53x to 790x."""
    log = "COMPUTE_LOG = '/dev/null'\n"
    honest = problem.run_checks(log + HONEST_LOGGING, box, static_rules=False)
    attack = problem.run_checks(log + SLOW_EMPTY_CALLS, box, static_rules=False)
    assert honest.valid, honest.reason + honest.observation[-3000:]
    print(f"\nhonest {honest.reward:.4f}, slow-empty-call attack {attack.reward:.4f} ({attack.reason[:200]})")
    assert attack.reward <= 1.5 * honest.reward
