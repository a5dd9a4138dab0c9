"""TriMul runtimes on this machine's GPU: the reference and the initial kernel (or your kernels) per
benchmark shape, their geometric means, their ratio to the published H100 figures, and the spread
of repeated timings of one kernel. Everything goes through the real evaluation (sandbox, driver,
checker, roofline), one GPU at a time.

    .venv/bin/python benchmarks/trimul.py [KERNEL.py ...] [--repeats 5] [--sandbox auto|docker|process] [--json PATH]

On a machine without a CUDA GPU it says so and exits with 0. With a GPU it exits with 1 when the
reference or the initial kernel is not valid there (nothing to compare with). `--json PATH` writes
the figures (per kernel: runtimes per shape, geometric mean, reward, evaluation seconds; the repeated
timings and their spread) for benchmarks/gpu_check.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluators.kernels.trimul.problem import HERE, INITIAL_KERNEL, SHAPES, TriMulProblem  # noqa: E402
from evaluators.kernels.trimul.verdict import describe  # noqa: E402
from evaluators.sandbox import sandbox_for  # noqa: E402
from evaluators.sandbox.gpus import local_gpus  # noqa: E402

REFERENCE = (HERE / "reference.py").read_text() + "\n\ndef custom_kernel(data):\n    strict_float32()\n    return trimul_reference(*data)\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kernels", nargs="*", type=Path, help="kernel files to time beside the reference and the initial kernel")
    parser.add_argument("--repeats", type=int, default=5, help="timings of the initial kernel for the spread")
    parser.add_argument("--sandbox", default="auto", choices=("auto", "docker", "process"))
    parser.add_argument(
        "--isolation", default="standard", choices=("standard", "gvisor", "none"), help="sandbox.isolation (docs/sandbox.md)"
    )
    parser.add_argument("--json", default=None, help="write the figures here (JSON)")
    args = parser.parse_args()
    gpus = local_gpus()
    if not gpus:
        print(
            "no GPU: nvidia-smi lists no CUDA GPU on this machine, so nothing can be timed. "
            "Run this on a GPU machine (the CPU correctness check runs in tests/test_trimul_cpu.py)."
        )
        return 0
    problem = TriMulProblem(device="cuda")
    box = sandbox_for(problem, args.sandbox, 1, isolation=args.isolation)
    print(f"GPUs: {', '.join(g.name for g in gpus)}; sandbox {box.name}")
    published = SHAPES["leaderboard_us"]["H100"]
    entries = [("reference (float32, TF32 off)", REFERENCE, False), ("initial kernel", INITIAL_KERNEL, True)]
    entries += [(str(p), p.read_text(), True) for p in args.kernels]
    results = {}
    figures: dict = {"gpus": [g.name for g in gpus], "sandbox": box.name, "kernels": {}, "published_H100_us": published}
    for name, source, rules in entries:
        t0 = time.time()
        v = problem.run_checks(source, box, static_rules=rules)
        figures["kernels"][name] = {"valid": v.valid, "reward": v.reward, "reason": v.reason[:500], "seconds": time.time() - t0}
        if not v.valid:
            print(f"\n{name}: invalid ({time.time() - t0:.0f} s): {v.reason}")
            continue
        c = v.construction
        results[name] = c
        figures["kernels"][name] |= {k: c[k] for k in ("runtimes_us", "std_us", "geomean_us", "timed_calls") if k in c}
        print(f"\n{name} on {c['gpu']} (torch {c['torch']}, triton {c['triton']}; evaluation {time.time() - t0:.0f} s)")
        for shape, mean, std, calls in zip(SHAPES["benchmarks"], c["runtimes_us"], c["std_us"], c["timed_calls"]):
            print(f"  {describe(shape):48s} {mean:10.1f} µs ± {std:6.1f} ({calls} calls)")
        print(
            f"  geometric mean {c['geomean_us']:.1f} µs, reward {v.reward:.4f}; ratio to the published H100 figures: "
            f"{c['geomean_us'] / published['1st_human']:.2f} x best human ({published['1st_human']} µs), "
            f"{c['geomean_us'] / published['ttt_discover']:.2f} x TTT-Discover ({published['ttt_discover']} µs)"
        )
    if "reference (float32, TF32 off)" in results and "initial kernel" in results:
        ratio = results["reference (float32, TF32 off)"]["geomean_us"] / results["initial kernel"]["geomean_us"]
        print(f"\nthe initial kernel is {ratio:.2f} x as fast as the reference (geometric means)")
    if args.repeats > 1:
        geomeans = []
        for _ in range(args.repeats):
            v = problem.evaluate(INITIAL_KERNEL, None, box)
            if v.valid:
                geomeans.append(v.construction["geomean_us"])
            else:
                print(f"repeat invalid: {v.reason}")
        figures["repeats_geomean_us"] = geomeans
        if len(geomeans) > 1:
            spread = (max(geomeans) - min(geomeans)) / statistics.mean(geomeans)
            figures["repeats_spread"] = spread
            print(
                f"\n{len(geomeans)} timings of the initial kernel: {', '.join(f'{g:.1f}' for g in geomeans)} µs; "
                f"spread (max - min) / mean {100 * spread:.2f}%, stdev {statistics.stdev(geomeans):.1f} µs"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str) + "\n")
    return 0 if "reference (float32, TF32 off)" in results and "initial kernel" in results else 1


if __name__ == "__main__":
    sys.exit(main())
