"""TriMul's clock against kernels that go after the round trip subtracted from them (issue 27).

The timer subtracts, from each timed call's round trip, the round trip of a call that does no
work. Measured through the candidate's own process, that figure was the candidate's to inflate: a
kernel that spun through every "empty" call (SLOW_EMPTY_CALLS) had 90% of its time subtracted
away. These tests hold the timer to what a kernel really spends, with figures that do not depend
on the machine's speed: the kernel logs its own compute (a perf_counter around its work, in its
own process, per call) and the timer's time for the same calls must not fall far below it; the
same kernel without the trick is run beside it. On CPU, under Triton's interpreter, with the CPU
check's timing (docs/problems/trimul.md, "What a kernel can and cannot influence").
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from evaluators.base import EvalResult
from evaluators.kernels.trimul.problem import TriMulProblem
from evaluators.kernels.trimul.static_rules import check_source
from evaluators.sandbox import ProcessSandbox
from tests.sandbox_backends import without_isolation
from tests.trimul_kernels import CACHES_BY_IDENTITY, HONEST_LOGGING, SLOW_EMPTY_CALLS

pytestmark = pytest.mark.slow

PROBLEM = TriMulProblem(device="cpu", cpu_timing=True)
PASSED = "correct on the CPU check"
# The timer's time of a call against the kernel's own perf_counter around its work in that call:
# the time also holds the handover and copies, less a trusted calibration of those, so it is about
# the compute or more; timer noise on a loaded 2-core machine is far below half of the compute of
# the Triton interpreter's calls, while the trick measured a tenth of it.
AT_LEAST = 0.5


@pytest.fixture()
def log_dir():
    """A directory the sandbox's uid can reach, with log files it can append to but not remove."""
    path = Path(tempfile.mkdtemp(prefix="trimul-clock-"))
    path.chmod(0o755)
    yield path
    for f in path.iterdir():
        f.unlink()
    path.rmdir()


def _log(log_dir: Path, name: str) -> Path:
    path = log_dir / name
    path.touch()
    path.chmod(0o666)  # root-owned: what the run's uid leaves in /tmp is removed after the run, this is not
    return path


def _run(source: str, log: Path) -> EvalResult:
    # The kernel logs into a file of the host, which the sandbox's OS isolation (a read-only host, a
    # fresh /tmp) forbids: these tests of the clock run on the layer underneath (the clock is the same)
    box = without_isolation(ProcessSandbox(image="gpu"))
    return PROBLEM.run_checks(f"COMPUTE_LOG = {str(log)!r}\n" + source, box, False)


def _compute_us(log: Path) -> list[float]:
    return [1e6 * float(line) for line in log.read_text().split()]


def test_the_attacks_are_refused_by_the_rules_and_run_past_them() -> None:
    for source in (SLOW_EMPTY_CALLS, CACHES_BY_IDENTITY):
        assert check_source("COMPUTE_LOG = 'x'\n" + source)  # torch.sys, torch.builtins, data_ptr ...


def test_a_kernel_that_slows_the_calls_it_is_not_timed_on_gains_nothing(log_dir) -> None:
    """The slow-empty-call attack is timed at its real compute or more, like the same kernel without the trick."""
    attack_log, honest_log = _log(log_dir, "attack"), _log(log_dir, "honest")
    attack = _run(SLOW_EMPTY_CALLS, attack_log)
    honest = _run(HONEST_LOGGING, honest_log)
    for name, v, log in (("attack", attack, attack_log), ("honest", honest, honest_log)):
        assert v.reason.startswith(PASSED), f"{name}: {v.reason}\n{v.observation[-2000:]}"
        compute = _compute_us(log)
        assert compute, f"{name}: the kernel logged no compute"
        # The best timed call is not under half the kernel's fastest compute of the run.
        assert v.metrics["cpu_best_us"] >= AT_LEAST * min(compute), (name, v.metrics, sorted(compute)[:5])
    # and the trick buys nothing against its honest twin beyond what two runs on a shared machine vary
    assert attack.metrics["cpu_best_us"] >= 0.2 * honest.metrics["cpu_best_us"], (attack.metrics, honest.metrics)


def test_a_kernel_caching_outputs_by_input_identity_gets_no_hit_or_is_wrong(log_dir) -> None:
    log = _log(log_dir, "identity")
    v = _run(CACHES_BY_IDENTITY, log)
    outcomes = log.read_text().split()
    assert outcomes and set(outcomes) <= {"hit", "miss"}, outcomes
    if "hit" in outcomes:  # a stale result for new inputs at a reused address: wrong, or a reply without work
        assert not v.valid and v.reward == 0.0, v.reason
        assert "checked output values are wrong" in v.reason or "no slower than the calibration" in v.reason, v.reason
    else:  # every call computed: timed as what it is
        assert v.reason.startswith(PASSED), v.reason + v.observation[-2000:]
