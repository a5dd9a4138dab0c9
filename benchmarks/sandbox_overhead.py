"""Per-evaluation overhead of the sandbox backends (issue 4, Must show 3).

`python benchmarks/sandbox_overhead.py [--repeats N]` runs the same check (call `construct`,
score its value with the Erdős verifier) in-process, in the process backend, in the docker
backend with a warm pool and in the docker backend cold (a new container per evaluation), for a
trivial program and for a one-second program, and prints mean seconds per evaluation and the
ratio to in-process. Docker rows are skipped, with the reason, when no engine or image is there
(or with --process-only). The process backend runs twice, side by side: isolated (namespaces,
Landlock, seccomp: evaluators/sandbox/isolation.py) and "process-bare" without that isolation (the
layer underneath: uids, cgroups, rlimits), and the isolated/bare ratio is printed, for Python runs
and, where g++ is installed, per case of a compiled program (a trivial program on 20 cases).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluators.math.erdos import ErdosProblem  # noqa: E402
from evaluators.sandbox import ProcessSandbox, SandboxLimits, docker_unavailable  # noqa: E402
from evaluators.sandbox.native import NativeLimits  # noqa: E402

PROGRAMS = {
    "trivial": "def construct(parent):\n    return [0.5] * 50\n",
    "one-second": (
        "import time\n"
        "def construct(parent):\n"
        "    end = time.perf_counter() + 1.0\n"
        "    while time.perf_counter() < end:\n"
        "        pass\n"
        "    return [0.5] * 50\n"
    ),
}
LIMITS = SandboxLimits(timeout_s=30.0, memory_mb=1024, cpus=1)
PROBLEM = ErdosProblem(timeout_s=30.0, memory_mb=1024, cpus=1)


def in_process(program: str) -> float:
    namespace: dict = {}
    exec(compile(program, "<candidate>", "exec"), namespace)
    return PROBLEM.verify(namespace["construct"](None)).reward


def through(sandbox, program: str) -> float:
    run = sandbox.run(program, "construct", None, LIMITS)
    assert run.ok, run.reason
    return PROBLEM.verify(run.output).reward


class Cold:
    """A docker sandbox without a warm pool: every evaluation creates and removes a container."""

    name = "docker-cold"

    def __init__(self):
        from evaluators.sandbox.docker import DockerSandbox

        self.box = DockerSandbox(image="python-math", concurrency=1, warm=False)

    def run(self, *args):
        return self.box.run(*args)


def bare() -> ProcessSandbox:
    """The process backend without namespaces, Landlock and seccomp (as before issue 27's isolation)."""
    box = ProcessSandbox()
    box.isolation = {"namespaces": False, "landlock": False, "seccomp": None}
    return box


CASES = 20
TRIVIAL_CPP = '#include <cstdio>\nint main() { int n; if (scanf("%d", &n) == 1) printf("%d\\n", 2 * n); }\n'


def per_case(box: ProcessSandbox) -> float:
    """Seconds per case of a trivial compiled program: (20 cases - 1 case) / 19, compilation excluded."""

    def timed(n: int) -> float:
        start = time.perf_counter()
        run = box.run_native(TRIVIAL_CPP, [(i, f"{i}\n") for i in range(n)], NativeLimits(parallel=1))
        assert run.compiled and all(c.status == "OK" for c in run.cases), run
        return time.perf_counter() - start

    timed(1)  # warm-up
    return (timed(CASES) - timed(1)) / (CASES - 1)


def measure(fn, repeats: int) -> float:
    fn()  # warm-up (imports, the pool's first container)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.mean(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--process-only", action="store_true", help="skip the docker rows")
    args = parser.parse_args()
    isolated = ProcessSandbox()
    backends = {"process": isolated, "process-bare": bare()}
    print(f"process backend isolation here: missing {isolated.isolation_missing or 'nothing'}")
    why = "--process-only" if args.process_only else docker_unavailable("python-math")
    if not why:
        from evaluators.sandbox.docker import DockerSandbox

        backends["docker-warm"] = DockerSandbox(image="python-math", concurrency=1)
        backends["docker-cold"] = Cold()
    print(f"{'program':<11} {'backend':<12} {'s/eval':>9} {'overhead s':>11} {'x in-process':>13}")
    for label, program in PROGRAMS.items():
        base = measure(lambda: in_process(program), args.repeats)  # noqa: B023 (called at once)
        print(f"{label:<11} {'in-process':<12} {base:9.4f} {0.0:11.4f} {1.0:13.2f}")
        seconds = {}
        for name, box in backends.items():
            t = seconds[name] = measure(lambda: through(box, program), args.repeats)  # noqa: B023 (called at once)
            print(f"{label:<11} {name:<12} {t:9.4f} {t - base:11.4f} {t / base:13.2f}")
        print(f"{label:<11} process isolated / bare: {seconds['process'] / seconds['process-bare']:.2f}")
    if why:
        print(f"docker rows skipped: {why}")
    if shutil.which("g++"):
        cases = {"process": per_case(isolated), "process-bare": per_case(backends["process-bare"])}
        print(f"compiled program, s/case: isolated {cases['process']:.4f}, bare {cases['process-bare']:.4f}, ", end="")
        print(f"isolated / bare {cases['process'] / cases['process-bare']:.2f}")
    for box in backends.values():
        getattr(getattr(box, "box", box), "close", lambda: None)()
    return 0


if __name__ == "__main__":
    sys.exit(main())
