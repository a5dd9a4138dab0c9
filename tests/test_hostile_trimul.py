"""TriMul against kernels that attack the evaluator (docs/method.md §5c, the allow-list and the two-process clock).

Every attack of tests/trimul_kernels.py ATTACKS is refused by the rules read before it runs, with
the construct and its line. Then each is run past those rules (the driver called directly), where
the second line must hold: the timer's clock, inputs and report live in a process the kernel
cannot reach, so an attack is rejected at run time or is timed like the honest kernel doing the
same work (CORRECT_TORCH), never faster. Both on the process backend and, where the GPU image
exists, the docker backend; on CPU, under Triton's interpreter, with the CPU check's timing.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from evaluators.base import EvalResult
from evaluators.kernels.trimul.problem import INITIAL_KERNEL, TriMulProblem
from evaluators.kernels.trimul.static_rules import check_source
from evaluators.sandbox import ProcessSandbox
from tests.sandbox_backends import unavailable_outside_ci
from tests.trimul_kernels import ATTACKS, CORRECT_TORCH

PROBLEM = TriMulProblem(device="cpu", cpu_timing=True)
PASSED = "correct on the CPU check"
# A reply before the work: caught by a time under the calibration's (a trusted kernel doing no work), the
# unwritten NaNs or the late write.
REPLIED_EARLY = ("no slower than the calibration", "NaN/inf where the reference has none", "changed after the kernel process replied")
# What each attack gets past the rules: "timed" (it passes the check and is timed like the honest
# kernel) or a phrase (or phrases, any one) of its rejection.
OUTCOMES = {
    "os_via_torch_runs_a_shell": "timed",
    "patches_every_clock_and_the_checks": "timed",
    "reduce_getattr_builds_names": "timed",
    "runs_the_evaluators_reference": "timed",
    "wraps_the_drivers_call": REPLIED_EARLY,
    "replies_early_and_finishes_in_a_thread": REPLIED_EARLY,
    "reads_and_writes_files_with_numpy_and_torch": "timed",
    "forges_the_report_after_exit": "timed",
    "spawns_a_thread": "it started a thread",
    "patches_torch_functions_globally": "replaced torch.equal",
    # wrong values; on a busy machine a reply this quick may be caught first as one without work
    "returns_its_input": ("checked output values are wrong", "no slower than the calibration"),
    "returns_a_cached_result": ("checked output values are wrong", "no slower than the calibration"),
    "reads_the_timers_memory": "timed",
}
# Forged figures are orders of magnitude off (a forged report says 0.001 µs, an unworked reply
# about 0); real ones on a shared 2-core CPU, from two evaluations at once, vary up to 5 times.
NOT_FASTER = 0.05


def test_every_attack_has_an_expected_outcome() -> None:
    assert set(OUTCOMES) == set(ATTACKS)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_the_rules_refuse_each_attack_naming_the_construct_and_line(name: str) -> None:
    source, phrase = ATTACKS[name]
    problems = check_source(source)
    if phrase is None:  # honest syntax, dishonest values: only the run can tell
        assert problems == []
        return
    hits = [p for p in problems if phrase in p]
    assert hits and hits[0].startswith("line "), problems


def _evaluate_all(box, sources: dict[str, str]) -> dict[str, EvalResult]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(PROBLEM.run_checks, src, box, False) for name, src in sources.items()}
        return {name: f.result() for name, f in futures.items()}


def _phrases(expected) -> tuple[str, ...]:
    return (expected,) if isinstance(expected, str) else tuple(expected)


def _with_honest(attacks: dict[str, str]) -> dict[str, str]:
    """The attacks with the honest kernel first, in the middle and last (see `_judge`)."""
    names = list(attacks)
    half = len(names) // 2
    return {
        "honest": CORRECT_TORCH,
        **{k: attacks[k] for k in names[:half]},
        "honest-2": CORRECT_TORCH,
        **{k: attacks[k] for k in names[half:]},
        "honest-3": CORRECT_TORCH,
    }


def _judge(verdicts: dict[str, EvalResult], names) -> None:
    """Every attack's outcome as OUTCOMES says; all the wrong ones listed at once.

    The honest kernel is evaluated three times among the attacks (`_with_honest`) and its fastest
    time is the reference: a busy machine only ever slows a run down (one honest evaluation among
    concurrent ones was measured here at 2-3 s a call against its usual 30-80 ms, with and without
    the OS isolation), so a single honest figure could make a normal attack look faster."""
    runs = [v for k, v in verdicts.items() if k.startswith("honest")]
    for v in runs:
        assert v.reason.startswith(PASSED), v.reason + v.observation[-2000:]
    honest = min(runs, key=lambda v: v.metrics["cpu_best_us"])
    wrong = []
    for name in names:
        v = verdicts[name]
        expected = OUTCOMES[name]
        if v.valid or v.reward != 0.0:  # nothing is rewarded without a GPU
            wrong.append(f"{name}: rewarded {v.reward}")
        elif expected == "timed" and not v.reason.startswith(PASSED):
            wrong.append(f"{name}: expected to be timed, got: {v.reason}\n{v.observation[-1500:]}")
        elif expected == "timed" and v.metrics["cpu_best_us"] < NOT_FASTER * honest.metrics["cpu_best_us"]:
            wrong.append(f"{name}: timed at {v.metrics['cpu_best_us']:.1f} µs, the honest kernel at {honest.metrics['cpu_best_us']:.1f} µs")
        elif expected != "timed" and (not any(p in v.reason for p in _phrases(expected)) or v.reason.startswith(PASSED)):
            wrong.append(f"{name}: expected a rejection with {expected!r}, got: {v.reason}\n{v.observation[-1500:]}")
    assert not wrong, "\n\n".join(wrong)


@pytest.mark.slow
def test_past_the_rules_no_attack_beats_the_honest_kernel_on_the_process_backend() -> None:
    verdicts = _evaluate_all(ProcessSandbox(image="gpu"), _with_honest({k: v[0] for k, v in ATTACKS.items()}))
    _judge(verdicts, ATTACKS)


@pytest.mark.slow
def test_the_initial_kernel_is_timed_by_the_cpu_clock() -> None:
    v = PROBLEM.run_checks(INITIAL_KERNEL, ProcessSandbox(image="gpu"))
    assert v.reason.startswith(PASSED), v.reason + v.observation[-2000:]
    assert v.metrics["cpu_best_us"] > 0 and v.metrics["cpu_mean_us"] >= v.metrics["cpu_best_us"]


@pytest.mark.slow
def test_past_the_rules_no_attack_beats_the_honest_kernel_on_the_docker_backend() -> None:
    unavailable_outside_ci(PROBLEM.image)  # `make test` builds the gpu image: in CI a missing one fails
    from evaluators.sandbox.docker import DockerSandbox

    names = [
        "patches_every_clock_and_the_checks",
        "replies_early_and_finishes_in_a_thread",
        "forges_the_report_after_exit",
        "reads_the_timers_memory",
    ]
    with DockerSandbox(image=PROBLEM.image, concurrency=2) as box:
        verdicts = _evaluate_all(box, _with_honest({k: ATTACKS[k][0] for k in names}))
    _judge(verdicts, names)


# A kernel that leaves a grandchild behind (double fork, new session) to write a file after the run.
# The kernel goes on only once the grandchild runs (it writes its pid, then says so through a pipe),
# and the grandchild writes its marker only once the run has reported (the test creates REPORTED),
# so however slow the machine, the grandchild certainly lives through the run and only a grandchild
# that outlived it can write the marker.
_LINGERER = (
    """
import os
import time

_started, _announce = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(GRANDCHILD, "w") as f:
            f.write(str(os.getpid()))
        os.write(_announce, b"1")
        _deadline = time.monotonic() + 900
        while not os.path.exists(REPORTED) and time.monotonic() < _deadline:
            time.sleep(0.05)
        with open(MARKER, "w") as f:
            f.write("outlived the run")
    os._exit(0)
os.close(_announce)
os.read(_started, 1)
os.close(_started)
os.wait()
"""
    + CORRECT_TORCH
)

_RUN_THE_TIMER = """
import json, os, sys, time
program, job, pidfile, reported, marker = sys.argv[1], json.loads(sys.argv[2]), *sys.argv[3:]
namespace = {"__name__": "timer"}
exec(compile(open(program).read(), "timer", "exec"), namespace)
report = namespace["main"](job)
# No sandbox here to kill what is left: only the timer's own cleanup can. The grandchild must be gone
# now, before anyone is told the run is over (a zombie is gone: it runs nothing).
pid = int(open(pidfile).read())
try:
    with open(f"/proc/{pid}/stat") as f:
        alive = f.read().rsplit(")", 1)[1].split()[0] != "Z"
except OSError:
    alive = False
open(reported, "w").close()  # a grandchild still alive writes its marker now
if alive:  # let it show what it does, then end it
    deadline = time.monotonic() + 60
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(pid, 9)
summary = {"error": report.get("error"), "rejected": report.get("rejected"), "calls": len(report["calls"])}
print(json.dumps({**summary, "grandchild_alive": alive}))
"""
# The timer's run (the Triton interpreter on CPU) on a loaded 2-core machine: generous.
TIMER_RUN_TIMEOUT_S = 900


@pytest.mark.slow
def test_the_timer_kills_everything_the_kernel_started_before_it_reports(tmp_path) -> None:
    """The timer alone, outside any sandbox: a grandchild the kernel left behind is gone before the report."""
    import json
    import subprocess
    import sys

    from evaluators.kernels.trimul.problem import SAMPLING, SHAPES

    marker, grandchild, reported = tmp_path / "marker", tmp_path / "grandchild.pid", tmp_path / "reported"
    program = tmp_path / "timer.py"
    program.write_text(PROBLEM.driver_program)
    shape = [s for s in SHAPES["tests"] if s["seqlen"] == 32][0]
    names = f"MARKER = {str(marker)!r}\nGRANDCHILD = {str(grandchild)!r}\nREPORTED = {str(reported)!r}\n"
    job = {
        "device": "cpu",
        "source": names + _LINGERER,
        "kernel_program": PROBLEM.kernel_program,
        "tests": [shape],
        "test_seeds": [[shape["seed"]]],
        "benchmarks": [],
        "timing": {},
        **SAMPLING,
    }
    workdir = tmp_path / "run"
    workdir.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_THE_TIMER, str(program), json.dumps(job), str(grandchild), str(reported), str(marker)],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=TIMER_RUN_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    # The kernel ran (its one test call checked) with the grandchild alive beside it ...
    assert summary == {"error": None, "rejected": None, "calls": 1, "grandchild_alive": False}, proc.stderr[-3000:]
    # ... which was killed with the kernel process before the report: it never wrote its marker.
    assert not marker.exists()


@pytest.mark.gpu
def test_on_a_gpu_no_attack_past_the_rules_beats_the_honest_kernel() -> None:
    """Never run on this repository's CPU machines: the same attacks timed by the GPU half of the clock."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from evaluators.sandbox import sandbox_for

    gpu = TriMulProblem(device="cuda")
    box = sandbox_for(gpu, "auto")
    honest = gpu.run_checks(CORRECT_TORCH, box, False)
    assert honest.valid, honest.reason
    for name, (source, _) in ATTACKS.items():
        v = gpu.run_checks(source, box, False)
        if OUTCOMES[name] == "timed":
            assert v.reward <= honest.reward / NOT_FASTER, (name, v.reward, honest.reward)
        else:
            assert not v.valid and v.reward == 0.0, (name, v.reason)
