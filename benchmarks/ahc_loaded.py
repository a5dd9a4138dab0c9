"""A contest-style AHC058 program on all 150 public cases, on an idle machine and beside two CPU hogs
(issue 43, Must show 4): whether the evaluation is valid, its mean score, its wall time, and how
often an evaluation was an infrastructure failure because a case was starved of CPU (counted,
then the evaluation run again, as the engine's retry does).

    python benchmarks/ahc_loaded.py [--cases 0-149] [--hogs 2] [--tries 3] [--out DIR]

The program is tests/programs/ahc058_timed.cpp's (fast input, std::random_device, a helper thread,
clock() and steady_clock) with the time budget of a contest program: it works until it has used
BUDGET_S of CPU time (clock()), near AHC058's 2 s limit, then answers. Its plan is the simple one
(buy once, then wait), so its score is known and must not change with the load; what the load
changes is how long the cases take in wall-clock time, which is where a busy host used to turn
valid programs into TLEs (a wall-clock backstop). The hogs are spinning Python processes, each in
a session of its own (the kernel's autogroup schedules each apart, as separate jobs), started
after the idle evaluation and ended after the loaded one. With --out, writes ahc_loaded.json and
.md there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evaluators.registry import get_problem  # noqa: E402
from evaluators.sandbox import ProcessSandbox  # noqa: E402
from evaluators.sandbox.base import infrastructure_failure  # noqa: E402

BUDGET_S = 1.8  # CPU seconds the program works for, of the contest's 2
SPIN = "    while (chrono::duration<double>(chrono::steady_clock::now() - start).count() < 0.15) acc += rng() % 7;\n"


def program() -> str:
    """ahc058_timed.cpp, working until BUDGET_S of CPU time instead of 0.15 s of wall time."""
    source = (REPO / "tests" / "programs" / "ahc058_timed.cpp").read_text()
    assert SPIN in source, "tests/programs/ahc058_timed.cpp changed: update SPIN"
    return source.replace(SPIN, f"    while (double(clock() - cpu0) / CLOCKS_PER_SEC < {BUDGET_S}) acc += rng() % 7;\n")


def evaluate(problem, source: str, tries: int) -> dict:
    """One evaluation, run again (up to `tries` in all) when it is an infrastructure failure."""
    starved, start = [], time.monotonic()
    for _ in range(tries):
        try:
            result = problem.evaluate(source, None, ProcessSandbox(isolation="standard"))
        except Exception as err:  # noqa: BLE001 - an infrastructure failure is counted and tried again
            if not infrastructure_failure(err):
                raise
            starved.append(str(err)[:300])
            continue
        cases = result.metrics.get("cases", [])
        return {
            "valid": result.valid,
            "reason": result.reason,
            "mean_score": statistics.fmean(r["score"] for r in cases) if cases else None,
            "cases": len(cases),
            "max_cpu_s": max((r["cpu_s"] for r in cases), default=0.0),
            "wall_s": round(time.monotonic() - start, 1),
            "starved_evaluations": len(starved),
            "starved": starved,
        }
    return {"valid": False, "reason": f"starved {tries} times", "wall_s": round(time.monotonic() - start, 1), "starved": starved}


def hogs(n: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL, start_new_session=True) for _ in range(n)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="0-149")
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    problem, source = get_problem("ahc058", cases=args.cases), program()
    rows = {"idle": evaluate(problem, source, args.tries)}
    print("idle:", {k: v for k, v in rows["idle"].items() if k != "starved"}, flush=True)
    spinning = hogs(args.hogs)
    try:
        time.sleep(2)
        load_before = os.getloadavg()[0]
        rows["loaded"] = evaluate(problem, source, args.tries)
        rows["loaded"]["load_average_1min_end"] = round(os.getloadavg()[0], 1)
        rows["loaded"]["load_average_1min_start"] = round(load_before, 1)
    finally:
        for hog in spinning:
            hog.kill()
            hog.wait()
    print("loaded:", {k: v for k, v in rows["loaded"].items() if k != "starved"}, flush=True)
    doc = {
        "machine": f"{platform.machine()}, kernel {platform.release()}, {os.cpu_count()} CPUs",
        "cases": args.cases,
        "hogs": args.hogs,
        "budget_cpu_s": BUDGET_S,
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip(),
        "rows": rows,
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ahc_loaded.json").write_text(json.dumps(doc, indent=2) + "\n")
        lines = [
            "# A contest-style AHC058 program, idle and beside two CPU hogs (benchmarks/ahc_loaded.py)",
            "",
            f"{doc['machine']}, commit {doc['commit']}, cases {args.cases}, {args.hogs} hogs (spinning processes, "
            f"each in a session of its own), the program working until {BUDGET_S} s of CPU time (AtCoder's limit: 2 s), "
            "process backend (bubblewrap), 2 cases at once.",
            "",
            "| machine | valid | mean score | cases | max CPU s of a case | wall s | evaluations starved (run again) |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for name, row in rows.items():
            score = f"{row['mean_score']:.1f}" if row.get("mean_score") is not None else "-"
            lines.append(
                f"| {name} | {row['valid']} | {score} | {row.get('cases', '-')} | {row.get('max_cpu_s', 0):.2f} | "
                f"{row['wall_s']} | {len(row['starved'])} |"
            )
        for name, row in rows.items():
            for why in row["starved"]:
                lines.append(f"\n{name}, starved: {why}")
        (args.out / "ahc_loaded.md").write_text("\n".join(lines) + "\n")
    return 0 if all(r["valid"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
