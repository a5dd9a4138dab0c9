"""torch.compile in TriMul's sandbox (issue 27 B): an honest kernel compiled by Inductor is checked and
timed like any other.

It failed at import before (`getpwuid(): uid not found`: the sandbox's uid has no passwd entry and
Inductor names its directories after the user), then in g++ (Inductor's precompiled header on CPU,
118 MB, is over the default 64 MB file limit). The timer now names the user in the environment
(USER, LOGNAME: getpass reads them first), keeps Inductor's caches, headers and debug output in the
run's own directory, and TriMul's file limit is 256 MB. On CPU, Inductor compiles C++ with the
host's g++ (the process backend). Not checked on Docker: the `gpu` image is not built here, and its
Dockerfile installs gcc but no g++, so Inductor on CPU could not build there (on a GPU, Inductor
emits Triton and needs no C++ compiler; tests/test_trimul_gpu.py has the GPU check, not run here).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evaluators.kernels.trimul.problem import SAMPLING, SHAPES, TriMulProblem
from evaluators.sandbox import ProcessSandbox
from tests.trimul_kernels import TORCH_COMPILE

pytestmark = pytest.mark.slow

PROBLEM = TriMulProblem(device="cpu", cpu_timing=True)

_RUN_THE_TIMER = """
import json, sys
program, job = sys.argv[1], json.loads(sys.argv[2])
namespace = {"__name__": "timer"}
exec(compile(open(program).read(), "timer", "exec"), namespace)
report = namespace["main"](job)
print(json.dumps({"error": report.get("error"), "rejected": report.get("rejected"), "calls": len(report["calls"])}))
"""


def test_an_honest_torch_compile_kernel_is_checked_and_timed_on_the_process_backend() -> None:
    v = PROBLEM.run_checks(TORCH_COMPILE, ProcessSandbox(image="gpu"))  # the rules read first: it keeps them
    assert v.reason.startswith("correct on the CPU check (4 calls"), v.reason + v.observation[-3000:]
    assert v.metrics["cpu_best_us"] > 0 and v.metrics["cpu_mean_us"] >= v.metrics["cpu_best_us"]
    assert not v.valid and v.reward == 0.0  # no reward without a GPU (tests/test_trimul_gpu.py on one)


def test_inductors_files_stay_in_the_runs_directory(tmp_path: Path) -> None:
    """The timer alone (no sandbox), with HOME and TMPDIR pointing outside the run: nothing lands there."""
    outside, run = tmp_path / "outside", tmp_path / "run"
    outside.mkdir()
    run.mkdir()
    program = tmp_path / "timer.py"
    program.write_text(PROBLEM.driver_program)
    shape = [s for s in SHAPES["tests"] if s["seqlen"] == 32][0]
    job = {
        "device": "cpu",
        "source": TORCH_COMPILE,
        "kernel_program": PROBLEM.kernel_program,
        "tests": [shape],
        "test_seeds": [[shape["seed"]]],
        "benchmarks": [],
        "timing": {},
        **SAMPLING,
    }
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(outside), "TMPDIR": str(outside), "LANG": "C.UTF-8"}
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_THE_TIMER, str(program), json.dumps(job)],
        cwd=run,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"error": None, "rejected": None, "calls": 1}, proc.stderr[-3000:]
    assert sorted(p.name for p in outside.iterdir()) == []
    made = {p.relative_to(run).parts[0] for p in run.rglob("*")}
    assert "torchinductor_sandbox" in made, sorted(made)  # its precompiled headers: named after USER, in TMPDIR = the run
    assert not any(p.name.startswith("torchinductor_") and p.name != "torchinductor_sandbox" for p in run.iterdir())
