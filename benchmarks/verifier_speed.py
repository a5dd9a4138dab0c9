"""How much faster the FFT verifiers of AC1 and AC2 are than the direct convolution, and that they
certify the same bound (docs/method.md §5; issue 3, "Fast verifiers").

For every reference sequence it times the bound with the O(n log n) FFT convolution and with the
O(n^2) direct one (np.convolve), each the best of several repeats, and prints both times, their
ratio and the relative difference of the two certified bounds (which must stay below 1e-9).

    .venv/bin/python benchmarks/verifier_speed.py [--published evaluators/math/published] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evaluators.math.ac1 import ac1_bound  # noqa: E402
from evaluators.math.ac2 import ac2_bound  # noqa: E402

BOUNDS = {"ac1": ac1_bound, "ac2": ac2_bound}


def best_time(fn, repeats: int) -> tuple[float, float]:
    """(fastest wall time in seconds, the value) over `repeats` calls."""
    times, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return min(times), value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--published", type=Path, default=ROOT / "evaluators" / "math" / "published")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    rows, worst = [], 0.0
    for problem, bound in BOUNDS.items():
        for path in sorted((args.published / problem).glob("*.json")):
            f = np.asarray(json.loads(path.read_text())["values"], dtype=np.float64)
            t_fft, b_fft = best_time(lambda: bound(f, "fft"), args.repeats)  # noqa: B023 (called at once)
            t_direct, b_direct = best_time(lambda: bound(f, "direct"), args.repeats)  # noqa: B023 (called at once)
            rel = abs(b_fft - b_direct) / abs(b_direct)
            worst = max(worst, rel)
            rows.append((problem, path.stem, len(f), t_direct, t_fft, t_direct / t_fft, b_fft, rel))

    print(
        f"{'problem':8} {'construction':24} {'pieces':>7} {'direct ms':>10} {'fft ms':>8} {'ratio':>7} {'bound (fft)':>14} {'rel. diff':>9}"
    )
    for problem, name, n, t_direct, t_fft, ratio, b, rel in rows:
        print(f"{problem:8} {name:24} {n:7d} {1e3 * t_direct:10.2f} {1e3 * t_fft:8.2f} {ratio:6.1f}x {b:14.10f} {rel:9.1e}")
    print(f"largest relative difference between the two certified bounds: {worst:.1e} (must be < 1e-9)")
    return 0 if worst < 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
