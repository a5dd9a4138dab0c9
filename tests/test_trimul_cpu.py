"""TriMul on CPU (Must show 1): the correctness check and the run-time rules that need no timing,
under Triton's interpreter, on the test shapes with N = 32. A correct Triton kernel passes the
check (and is then invalid only because no GPU timed it); each hostile kernel is rejected with a
reason that names what it did, both by the rules read before it runs and, with those skipped, by
the driver and the checker at run time."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from evaluators.base import EvalResult
from evaluators.kernels.trimul.problem import INITIAL_KERNEL, NO_GPU, TriMulProblem
from evaluators.sandbox import ProcessSandbox
from evaluators.sandbox.gpus import GpuLeases
from evaluators.sandbox.view import WORK
from tests.trimul_kernels import CORRECT_TORCH, HOSTILE, PUBLISHED_STYLE

pytestmark = pytest.mark.slow

# The CPU path, whatever this machine has: no GPU to lease.
PROBLEM = TriMulProblem(device="cpu")
# The process sandbox's isolation: standard (bubblewrap), unless the GPU check's rehearsal runs these
# in the lent machine's environment, which has no bubblewrap (benchmarks/gpu_rehearsal.py, PAST_CUDA).
ISOLATION = os.environ.get("DISCOVER_TEST_SANDBOX_ISOLATION", "standard")


def _evaluate_all(sources: dict[str, str], static_rules: bool) -> dict[str, EvalResult]:
    box = ProcessSandbox(image="gpu", isolation=ISOLATION)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(PROBLEM.run_checks, src, box, static_rules) for name, src in sources.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.fixture(scope="module")
def verdicts() -> dict[str, EvalResult]:
    """Every kernel of this file through the full evaluation (rules read first), two at a time."""
    sources = {"initial": INITIAL_KERNEL, "correct_torch": CORRECT_TORCH, **{k: v[0] for k, v in HOSTILE.items()}}
    return _evaluate_all(sources, static_rules=True)


@pytest.fixture(scope="module")
def runtime_verdicts() -> dict[str, EvalResult]:
    """The hostile kernels that the rules read before running would stop, run with those rules skipped."""
    names = ("patches_the_clock", "patches_the_reference", "starts_a_thread", "returns_a_lazy_tensor")
    return _evaluate_all({n: HOSTILE[n][0] for n in names}, static_rules=False)


@pytest.mark.parametrize("name", ["initial", "correct_torch"])
def test_a_correct_triton_kernel_passes_the_check_under_the_interpreter(verdicts, name) -> None:
    v = verdicts[name]
    assert v.reason.startswith("correct on the CPU check (4 calls under Triton's interpreter)"), v.reason + v.observation[-2000:]
    assert NO_GPU in v.reason and not v.valid and v.reward == 0.0  # not timed: no GPU here


@pytest.mark.parametrize(
    "name", ["off_by_more_than_tolerance", "nan_where_none", "wrong_shape", "wrong_dtype", "caches_its_first_output", "mutates_its_inputs"]
)
def test_each_hostile_kernel_is_rejected_at_run_time_with_its_reason(verdicts, name) -> None:
    v = verdicts[name]
    assert not v.valid and v.reward == 0.0
    assert HOSTILE[name][1] in v.reason, v.reason + "\n" + v.observation[-2000:]
    assert "correct on the CPU check" not in v.reason


@pytest.mark.parametrize(
    "name, phrase",
    [
        ("patches_the_clock", "imports 'time'"),
        ("patches_the_reference", "imports 'evaluators.kernels.trimul.reference'"),
        ("starts_a_thread", "imports 'threading'"),
        ("returns_a_lazy_tensor", "subclasses torch.Tensor"),
    ],
)
def test_hostile_kernels_are_rejected_before_they_run(verdicts, name, phrase) -> None:
    v = verdicts[name]
    assert not v.valid and v.reason.startswith("rejected before running:") and phrase in v.reason, v.reason


@pytest.mark.parametrize("name", ["patches_the_clock", "patches_the_reference", "starts_a_thread", "returns_a_lazy_tensor"])
def test_the_run_time_rules_catch_them_too(runtime_verdicts, name) -> None:
    v = runtime_verdicts[name]
    assert not v.valid and HOSTILE[name][1] in v.reason, v.reason + "\n" + v.observation[-2000:]


def test_a_kernel_in_the_style_of_the_published_ones_passes_the_check() -> None:
    v = PROBLEM.run_checks(PUBLISHED_STYLE, ProcessSandbox(image="gpu", isolation=ISOLATION))
    assert v.reason.startswith("correct on the CPU check"), v.reason + v.observation[-2000:]


def test_without_a_gpu_auto_uses_the_cpu_check_and_cuda_says_so_in_one_line() -> None:
    none = GpuLeases(gpus=())
    cuda = TriMulProblem(device="cuda", leases=none).evaluate(CORRECT_TORCH, None, ProcessSandbox(image="gpu", isolation=ISOLATION))
    assert not cuda.valid and cuda.reason == NO_GPU and "\n" not in cuda.reason
    assert "gpu-h100" in NO_GPU and "nvidia-smi" in NO_GPU  # names the fix


def test_every_run_compiles_into_a_fresh_triton_cache_of_its_own() -> None:
    """docs/method.md §5c: no compilation or autotuning result is reused across candidates."""
    from evaluators.kernels.trimul.problem import SAMPLING, SHAPES, TIMING

    shape = SHAPES["tests"][0]
    job = {
        "device": "cpu",
        "source": CORRECT_TORCH,
        "kernel_program": PROBLEM.kernel_program,
        "tests": [shape],
        "test_seeds": [[shape["seed"]]],
        "benchmarks": [],
        "timing": TIMING,
        **SAMPLING,
    }
    box = ProcessSandbox(image="gpu", isolation=ISOLATION)
    dirs = []
    for _ in range(2):
        run = box.run(PROBLEM.driver_program, "main", job, PROBLEM.limits, device="cpu")
        assert run.ok and not run.output.get("error"), run.reason + run.logs[-2000:]
        dirs.append(run.output["triton_cache_dir"])
    # in the run's own working directory: a fresh tmpfs of each run's sandbox, gone with it
    # (tests/test_os_isolation.py: nothing of one run is there for the next)
    assert dirs == [f"{WORK}/triton-cache"] * 2, dirs
