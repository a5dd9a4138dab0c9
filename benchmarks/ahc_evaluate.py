"""`discover evaluate` of a trivial valid program on all 150 public cases of each AtCoder problem
(issue 8, Must show 3): the reward, the wall time on this machine's cores, and the sandbox's
overhead per case, container against process backend; plus the judges' speed.

`python benchmarks/ahc_evaluate.py [--cases 0-149] [--repeats 2]` evaluates, per contest and
backend, the same trivial program `repeats` times (the first docker evaluation starts its
containers: "cold"; later ones reuse them: "warm") exactly as `discover evaluate` does
(`problem.evaluate` in the problem's sandbox, 2 cases at once), and prints one row per evaluation:
total wall seconds, the compile seconds, the seconds of the case phase, and that phase per case
(with 2 slots, wall x 2 / cases) against the program's own wall time per case: the difference is
the sandbox's overhead per case. Docker rows are skipped, with the reason, without an engine or
the cpp20 image. The machine may be shared: run it twice and compare ratios, not seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluators.algorithms import ahc039, ahc058  # noqa: E402
from evaluators.algorithms.cases import public_inputs  # noqa: E402
from evaluators.registry import get_problem  # noqa: E402
from evaluators.sandbox import ProcessSandbox, docker_unavailable  # noqa: E402

TRIVIAL = {
    "ahc039": '#include <cstdio>\nint main() { puts("4\\n20000 20000\\n80000 20000\\n80000 80000\\n20000 80000"); }\n',
    "ahc058": '#include <cstdio>\nint main() { puts("0 0"); for (int t = 1; t < 500; t++) puts("-1"); }\n',
}


def evaluate_once(problem, sandbox, source: str) -> dict:
    start = time.monotonic()
    result = problem.evaluate(source, None, sandbox)
    wall = time.monotonic() - start
    m = result.metrics
    run_phase = wall - m.get("compile_s", 0.0)
    n = m.get("cases_run", 0) or 1
    slots = problem.limits.cpus
    own = statistics.mean(row["cpu_s"] for row in m["cases"]) if m.get("cases") else 0.0
    return {
        "valid": result.valid,
        "reward": result.reward,
        "passed": m.get("cases_passed", 0),
        "cases": n,
        "wall_s": wall,
        "compile_s": m.get("compile_s", 0.0),
        "run_s": run_phase,
        "per_case_ms": 1000 * run_phase * slots / n,
        "own_cpu_ms": 1000 * own,
        "reason": result.reason,
    }


def judge_speed() -> list[str]:
    inp = ahc039.parse_input(public_inputs("ahc039")[0])
    teeth, x = [], 20_000
    for _ in range(249):
        teeth += [(x, 30_300), (x + 60, 30_300), (x + 60, 30_100), (x + 80, 30_100)]
        x += 80
    poly = np.array([(20_000, 30_000)] + teeth[:-1] + [(x - 20, 30_000)])
    output = f"{len(poly)}\n" + "".join(f"{a} {b}\n" for a, b in poly)
    lines = []
    for label, fn in (
        (f"AHC039 count 10,000 points in a {len(poly)}-vertex polygon", lambda: ahc039.inside_mask(poly, inp.x, inp.y)),
        (f"AHC039 validate a {len(poly)}-vertex polygon", lambda: ahc039.polygon_error(poly)),
        ("AHC039 whole judgement (read, validate, count)", lambda: ahc039.judge_output(inp, output)),
    ):
        fn()
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        lines.append(f"{label}: {1000 * statistics.median(times):.1f} ms (median of 20)")
    inp58 = ahc058.parse_input(public_inputs("ahc058")[0])
    plan = "0 0\n" + "-1\n" * 499
    t0 = time.perf_counter()
    for _ in range(20):
        ahc058.judge_output(inp58, plan)
    lines.append(f"AHC058 whole judgement (500 turns): {1000 * (time.perf_counter() - t0) / 20:.1f} ms (mean of 20)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="0-149")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    backends = [("process", ProcessSandbox)]
    why = docker_unavailable("cpp20")
    if not why:
        from evaluators.sandbox.docker import DockerSandbox

        backends.append(("docker", lambda: DockerSandbox(image="cpp20", concurrency=1)))
    rows = []
    for contest in ("ahc039", "ahc058"):
        problem = get_problem(contest, cases=args.cases)
        for name, make in backends:
            box = make()
            for k in range(args.repeats):
                r = evaluate_once(problem, box, TRIVIAL[contest])
                rows.append((contest, name if name == "process" else f"docker-{'cold' if k == 0 else 'warm'}", r))
                print(f"  {contest} {rows[-1][1]}: {r['wall_s']:.1f} s", file=sys.stderr, flush=True)
            if hasattr(box, "close"):
                box.close()

    print(
        f"Trivial valid program, cases {args.cases}, {problem.limits.cpus} cases at "
        f"once, this machine's {len(__import__('os').sched_getaffinity(0))} cores"
    )
    print("| contest | backend | reward | passed | wall s | compile s | cases s | per case ms | program CPU ms | overhead ms/case |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for contest, backend, r in rows:
        print(
            f"| {contest} | {backend} | {r['reward']:.6f} | {r['passed']}/{r['cases']} | {r['wall_s']:.1f} | {r['compile_s']:.1f} | "
            f"{r['run_s']:.1f} | {r['per_case_ms']:.0f} | {r['own_cpu_ms']:.1f} | {r['per_case_ms'] - r['own_cpu_ms']:.0f} |"
        )
    for contest in ("ahc039", "ahc058"):
        proc = [r["per_case_ms"] - r["own_cpu_ms"] for c, b, r in rows if c == contest and b == "process"]
        warm = [r["per_case_ms"] - r["own_cpu_ms"] for c, b, r in rows if c == contest and b == "docker-warm"]
        if proc and warm:
            print(f"{contest}: docker (warm) / process overhead per case = {statistics.mean(warm) / statistics.mean(proc):.2f}")
    if why:
        print(f"docker rows skipped: {why}")
    print()
    for line in judge_speed():
        print(line)


if __name__ == "__main__":
    main()
