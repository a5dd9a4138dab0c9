"""TriMul (docs/method.md §5c): a Triton kernel for AlphaFold3's outgoing triangle multiplicative update,
rewarded by 1500 / geometric-mean runtime on the benchmark shapes, 0 unless correct on every test
shape and every timed call.

One evaluation, on a machine with a GPU:
1. static_rules.py reads the source; a broken rule is the reason for 0 before anything runs.
2. One GPU is leased (evaluators/sandbox/gpus.py) and its model checked against the declared type
   (the pool's DISCOVER_GPU_TYPE, else the problem's `gpu_type`) before anything is timed.
3. The timer (driver.py) runs in the sandbox on that GPU and starts the kernel process
   (kernel_process.py), the only process that runs the candidate; it hands fresh inputs over as
   its clock starts, copies the output itself, and sends out samples of every output
   (docs/method.md §5c, the two-process clock).
4. The checker (checker.py), trusted code in another sandbox run on the same GPU that never imports
   the candidate, regenerates every call's inputs, computes the reference and judges the samples.
   Only a kernel correct on every test shape goes on to be timed: a second driver run does, per
   benchmark shape, a warm-up and timed calls, all on fresh inputs and all sampled, less the round
   trip of a trusted no-work kernel calibrated in a process of its own before the candidate's
   process started (driver.py, `calibrate`), and the checker judges those too.
5. verdict.py checks the driver's report, the roofline floors (roofline.py) and scores it.

Without a GPU (or with `device: cpu`) steps 3 and 4 run on the CPU under Triton's interpreter, on
the three test shapes with N = 32 (the others take minutes each under the interpreter), plus a
repeat of the first on fresh inputs; a kernel that passes is still invalid, with a reason saying
it was not timed because no GPU is here. The test and benchmark shapes are vendored from the GPU
MODE TriMul competition's task definition (shapes.json, its "source" field).
"""

from __future__ import annotations

import dataclasses
import json
from functools import cached_property
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from evaluators.base import BaseProblem, EvalResult, ParentView, SeedState
from evaluators.kernels.trimul import verdict
from evaluators.kernels.trimul.description import TEMPLATE
from evaluators.kernels.trimul.static_rules import check_source
from evaluators.parsing import last_fenced_block
from evaluators.sandbox.base import SandboxLimits
from evaluators.sandbox.gpus import GPU_LEASES, GPU_TYPE_ENV, GpuLeases, declared_gpu_type, wrong_gpu_reason

HERE = Path(__file__).resolve().parent
SHAPES = json.loads((HERE / "shapes.json").read_text())
INITIAL_KERNEL = (HERE / "initial_kernel.py").read_text()
CPU_SEQLEN = 32  # the CPU check uses the test shapes with this N
TARGET_US = 1000.0  # the released prompt's target runtime

# App. B / docs/method.md §5a: evaluation time limit 530 s for kernels. Memory is host memory of the process.
PAPER_LIMITS = {"timeout_s": 530.0, "memory_mb": 16384, "cpus": 4}
CHECKER_TIMEOUT_S = 600.0  # the trusted checker's own limit (it recomputes the reference per call)
MAX_OUTPUT_BYTES = 128 << 20  # the driver's report carries the output samples
# The largest file a run may write: torch.compile's Inductor on CPU precompiles a header of 118 MB
# (torch 2.11; g++ died of RLIMIT_FSIZE at the default 64 MB).
MAX_FILE_MB = 256
SAMPLING = {
    "full_check_elements": 1 << 20,  # outputs up to this many elements come back whole
    "sample_elements": {"test": 1 << 18, "timed": 1 << 12},  # else this many positions, drawn after the call
    "x_sample_elements": 1 << 10,  # positions of x compared bit for bit (in-place writes)
}
TIMING = {  # per benchmark shape, as the competition's harness: until the standard error is 0.1% of the mean
    "max_calls": 100,
    "min_calls": 3,
    "rel_err": 0.001,
    "kernel_budget_s": 10.0,
    "wall_budget_s": 30.0,
}
# The CPU check's timing (`cpu_timing=True`): the two-process clock on CPU, on the first CPU test
# shape, so that tests can compare what kernels get from it; never a reward.
CPU_TIMING = {"max_calls": 5, "min_calls": 3, "rel_err": 0.001, "kernel_budget_s": 20.0, "wall_budget_s": 30.0}


def _installed(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


class TriMulProblem(BaseProblem):
    name = "trimul"
    image = "gpu"
    needs_gpu = True
    needs_sandbox = True
    target = verdict.REWARD_SCALE_US / TARGET_US

    def __init__(
        self,
        gpu_type: str | None = None,
        device: str = "auto",
        timeout_s: float = PAPER_LIMITS["timeout_s"],
        memory_mb: int = PAPER_LIMITS["memory_mb"],
        cpus: int = PAPER_LIMITS["cpus"],
        leases: GpuLeases | None = None,
        cpu_timing: bool = False,
    ):
        if device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', got {device!r}")
        self.gpu_type = gpu_type
        self.device = device
        self.leases = leases or GPU_LEASES
        self.cpu_timing = cpu_timing
        self.limits = SandboxLimits(
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            cpus=cpus,
            max_output_bytes=MAX_OUTPUT_BYTES,
            max_file_mb=MAX_FILE_MB,
            max_processes=256,
            limit_address_space=False,
        )

    # -- the text, the seeds, parsing ------------------------------------------------------------

    @property
    def description(self) -> str:
        gpu = f"an NVIDIA {self.gpu_type}" if self.gpu_type else "the evaluating machine's NVIDIA GPU"
        bench = "\n".join(
            f"  ({s['bs']}, {s['seqlen']}, {s['dim']}, {s['hiddendim']}, {s['distribution']}, {'no mask' if s['nomask'] else 'mask'})"
            for s in SHAPES["benchmarks"]
        )
        return TEMPLATE.format(
            tests=len(SHAPES["tests"]),
            benchmarks=len(SHAPES["benchmarks"]),
            benchmark_list=bench,
            scale=verdict.REWARD_SCALE_US,
            human=verdict.reward_for(SHAPES["leaderboard_us"]["H100"]["1st_human"]),
            target=self.target,
            gpu=gpu,
            torch=_installed("torch"),
            triton=_installed("triton"),
            timeout=self.limits.timeout_s,
        )

    def seeds(self, rng: np.random.Generator, count: int) -> list[SeedState]:
        """docs/method.md §5: kernels start from a plain unoptimised kernel (initial_kernel.py)."""
        return [SeedState(code=INITIAL_KERNEL) for _ in range(count)]

    def parse(self, answer: str) -> str | None:
        return last_fenced_block(answer, languages=("python", "py"))

    def verify(self, construction: Any) -> EvalResult:
        return EvalResult.invalid("TriMul states are kernels, not constructions: score one with `discover evaluate trimul KERNEL.py`")

    def archive_key(self, code: str, construction: Any) -> str:
        return super().archive_key(code, None)  # the timings differ between runs of the same kernel

    def render_state(self, code: str, construction: Any) -> str:
        text = super().render_state(code, None)
        if isinstance(construction, dict) and construction.get("runtimes_us"):
            rows = "\n".join(f"  {verdict.describe(s)}: {t:.1f} us" for s, t in zip(SHAPES["benchmarks"], construction["runtimes_us"]))
            text += f"\n\nRuntimes on {construction.get('gpu', 'the GPU')} (geometric mean {construction['geomean_us']:.1f} us):\n{rows}"
        return text

    # -- evaluation ------------------------------------------------------------------------------

    def summary_metrics(self, result: EvalResult) -> dict[str, float]:
        """The geometric-mean runtime in µs on the benchmark shapes, when the kernel was timed."""
        return {"geomean_us": float(result.metrics["geomean_us"])} if "geomean_us" in result.metrics else {}

    def declared_gpu_type(self) -> str | None:
        """The GPU type timings must come from: the pool's declaration, else the `gpu_type` option."""
        return declared_gpu_type() or self.gpu_type

    def evaluate(self, candidate: str, parent: ParentView | None, sandbox: Any) -> EvalResult:
        return self.run_checks(candidate, sandbox)

    def run_checks(self, source: str, sandbox: Any, static_rules: bool = True) -> EvalResult:
        """Everything of one evaluation; `static_rules=False` skips step 1 (tests of the run-time rules)."""
        if static_rules:
            problems = check_source(source)
            if problems:
                more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
                return EvalResult.invalid(f"rejected before running: {problems[0]}{more}")
        gpus = () if self.device == "cpu" else self.leases.gpus
        if not gpus:
            if self.device == "cuda":
                return EvalResult.invalid(NO_GPU)
            return self._cpu_check(source, sandbox)
        return self._timed(source, sandbox)

    def _run(self, sandbox: Any, program: str, job: dict, limits: SandboxLimits, device: str) -> tuple[dict | None, str, str]:
        """(report, why not, logs) of one sandbox run."""
        run = sandbox.run(program, "main", job, limits, device=device)
        if not run.ok:
            return None, run.reason, run.logs
        if not isinstance(run.output, dict):
            return None, "the driver returned no report", run.logs
        return run.output, "", run.logs

    def _checker_job(self, job: dict, report: dict) -> dict:
        keys = ("device", "tests", "benchmarks", *SAMPLING)
        return {**{k: job[k] for k in keys}, "calls": report.get("calls") or []}

    def _judge_samples(self, job: dict, report: dict, sandbox: Any, device: str) -> tuple[dict | None, str]:
        limits = dataclasses.replace(self.limits, timeout_s=CHECKER_TIMEOUT_S, max_output_bytes=1 << 20)
        checked, why, logs = self._run(sandbox, self.checker_program, self._checker_job(job, report), limits, device)
        return checked, (f"the checker failed: {why} {logs[-300:]}".strip() if why else "")

    def _cpu_check(self, source: str, sandbox: Any) -> EvalResult:
        tests = [s for s in SHAPES["tests"] if s["seqlen"] == CPU_SEQLEN]
        seeds = [[s["seed"], None] if i == 0 else [s["seed"]] for i, s in enumerate(tests)]
        job = {
            "device": "cpu",
            "source": source,
            "kernel_program": self.kernel_program,
            "tests": tests,
            "test_seeds": seeds,
            "benchmarks": tests[:1] if self.cpu_timing else [],
            "timing": CPU_TIMING,
            **SAMPLING,
        }
        limits = dataclasses.replace(self.limits, limit_address_space=True)  # no CUDA: RLIMIT_AS holds
        report, _, rejected = self._phase(job, sandbox, "cpu", limits)
        if rejected:
            return rejected
        calls = sum(1 for c in report["calls"] if c["set"] == "tests")
        metrics = {"cpu_check_calls": float(calls)}
        if job["benchmarks"]:  # the CPU clock's figures, for comparing kernels; never a reward
            timed = [c["ms"] for c in report["calls"] if c["kind"] == "timed"]
            metrics.update({"cpu_mean_us": 1e3 * sum(timed) / len(timed), "cpu_best_us": 1e3 * min(timed)})
        return EvalResult(
            reward=0.0,
            valid=False,
            reason=f"correct on the CPU check ({calls} calls under Triton's interpreter), but {NO_GPU}",
            metrics=metrics,
            observation=report["logs"],
        )

    def _phase(
        self, job: dict, sandbox: Any, device: str, limits: SandboxLimits | None = None
    ) -> tuple[dict | None, dict | None, EvalResult | None]:
        """One driver run and the checker's judgement of it: (report, checked, None) or a rejection."""
        report, why, logs = self._run(sandbox, self.driver_program, job, limits or self.limits, device)
        if report is None:
            return None, None, EvalResult.invalid(why, observation=logs)
        why = verdict.report_problem(job, report)
        if not why:
            checked, why = self._judge_samples(job, report, sandbox, device)
            why = why or verdict.checker_failure(checked)
            if not why and checked.get("checked") != len(report["calls"]):
                why = f"the checker judged {checked.get('checked')} of {len(report['calls'])} calls"
        if why:
            return None, None, EvalResult.invalid(why, observation=logs)
        report["logs"] = logs
        return report, checked, None

    def _timed(self, source: str, sandbox: Any) -> EvalResult:
        """Correctness on every test shape first (a wrong kernel is never timed), then the timing."""
        declared = self.declared_gpu_type()
        with self.leases.lease() as gpu:
            wrong = wrong_gpu_reason(declared, [gpu], f"{GPU_TYPE_ENV} or gpu_type") if declared else ""
            if wrong:
                return EvalResult.invalid(wrong)
            base = {
                "device": "cuda",
                "source": source,
                "kernel_program": self.kernel_program,
                "gpu_type": declared,
                "timing": TIMING,
                **SAMPLING,
            }
            tests = {**base, "tests": SHAPES["tests"], "test_seeds": [[s["seed"]] for s in SHAPES["tests"]], "benchmarks": []}
            _, _, rejected = self._phase(tests, sandbox, gpu.index)
            if rejected:
                return rejected
            timing = {**base, "tests": [], "test_seeds": [], "benchmarks": SHAPES["benchmarks"]}
            report, checked, rejected = self._phase(timing, sandbox, gpu.index)
            if rejected:
                return rejected
        return verdict.timed_verdict(timing, report, checked, report.pop("logs"))

    @cached_property
    def driver_program(self) -> str:
        """inputs.py, handover.py and driver.py: the timer, which never runs the candidate (§5c, the two-process clock)."""
        return "\n\n".join((HERE / f).read_text() for f in ("inputs.py", "handover.py", "driver.py"))

    @cached_property
    def kernel_program(self) -> str:
        """handover.py and kernel_process.py: the candidate's own process, started by the timer."""
        return "\n\n".join((HERE / f).read_text() for f in ("handover.py", "kernel_process.py"))

    @cached_property
    def checker_program(self) -> str:
        """inputs.py, reference.py and checker.py: what judges the samples, in another process."""
        return "\n\n".join((HERE / f).read_text() for f in ("inputs.py", "reference.py", "checker.py"))


NO_GPU = (
    "not timed: no CUDA GPU on this machine (nvidia-smi lists none). TriMul's reward is 1500 / geometric-mean "
    "runtime measured on a GPU: evaluate it on a machine with one, e.g. a worker of the gpu-h100 pool"
)
