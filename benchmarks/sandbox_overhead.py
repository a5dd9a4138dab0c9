"""Per-evaluation overhead of the sandbox backends (issue 4, Must show 3).

`python benchmarks/sandbox_overhead.py [--repeats N]` runs the same check (call `construct`,
score its value with the Erdős verifier) in-process, in the process backend, in the docker
backend with a warm pool and in the docker backend cold (a new container per evaluation), for a
trivial program and for a one-second program, and prints mean seconds per evaluation and the
ratio to in-process. Docker rows are skipped, with the reason, when no engine or image is there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluators.math.erdos import ErdosProblem  # noqa: E402
from evaluators.sandbox import ProcessSandbox, SandboxLimits, docker_unavailable  # noqa: E402

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
    args = parser.parse_args()
    backends = {"process": ProcessSandbox()}
    why = docker_unavailable("python-math")
    if not why:
        from evaluators.sandbox.docker import DockerSandbox

        backends["docker-warm"] = DockerSandbox(image="python-math", concurrency=1)
        backends["docker-cold"] = Cold()
    print(f"{'program':<11} {'backend':<12} {'s/eval':>9} {'overhead s':>11} {'x in-process':>13}")
    for label, program in PROGRAMS.items():
        base = measure(lambda: in_process(program), args.repeats)  # noqa: B023 (called at once)
        print(f"{label:<11} {'in-process':<12} {base:9.4f} {0.0:11.4f} {1.0:13.2f}")
        for name, box in backends.items():
            t = measure(lambda: through(box, program), args.repeats)  # noqa: B023 (called at once)
            print(f"{label:<11} {name:<12} {t:9.4f} {t - base:11.4f} {t / base:13.2f}")
    if why:
        print(f"docker rows skipped: {why}")
    for box in backends.values():
        getattr(getattr(box, "box", box), "close", lambda: None)()
    return 0


if __name__ == "__main__":
    sys.exit(main())
