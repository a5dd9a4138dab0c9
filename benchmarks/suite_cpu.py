"""Where `make test`'s time goes: per test file, its wall time and the CPU time of everything it ran.

    python benchmarks/suite_cpu.py [--workers N] [--hogs N] [--out DIR] [--label NAME] [PYTEST_ARGS...]
    python benchmarks/suite_cpu.py --summarise LOG.jsonl [--elapsed-s S] [--returncode N] [--out DIR] [--label NAME]

Runs the suite as `make test` runs pytest (`-n TEST_WORKERS --dist loadgroup -m "not exclusive"`, then
the `exclusive` tests alone) with
`DISCOVER_TEST_CPU_LOG` set (tests/cpu_accounting.py: each worker in a cgroup of its own, every
process a test starts counted, reaped or not), optionally beside N CPU hogs (`yes`, as CI's busy
check does), and prints per file: tests, wall seconds (summed over its tests), CPU seconds, and CPU
per wall second: near 1 a file computes, near 0 it waits (on servers, restarts, sleeps, or a CPU).
Also the whole run: elapsed, the machine's busy CPU seconds, and how much of it the tests' cgroups
and Docker's containers account for. Needs root (it makes cgroups). With --out, writes
suite_cpu[-LABEL].json (every test's record) and .md. `--summarise` reads the log of a run made
otherwise (`DISCOVER_TEST_CPU_LOG=LOG bash .ci/run` from a fresh clone), whose elapsed time and exit
code are then given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent not idle since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def summarise(records: list[dict], run: dict, label: str) -> str:
    files: dict[str, dict] = defaultdict(lambda: {"tests": 0, "wall_s": 0.0, "cpu_s": 0.0, "docker_cpu_s": 0.0})
    for r in records:
        f = files[r["file"]]
        f["tests"] += 1
        for key in ("wall_s", "cpu_s", "docker_cpu_s"):
            f[key] += r[key]
    total_cpu = sum(f["cpu_s"] for f in files.values())
    lines = [
        f"# Where the suite's time goes{f' ({label})' if label else ''}",
        "",
        f"benchmarks/suite_cpu.py on {run['machine']}, {run['cpus']} CPUs, {run['workers']} xdist workers, "
        f"{run['hogs']} CPU hogs beside it, revision {run['revision']}.",
        "",
        f"- pytest: {run['elapsed_s']:.0f} s elapsed, exit code {run['returncode']}, {len(records)} tests",
        f"- the machine's busy CPU over the run: {run['machine_busy_s']:.0f} s (0: not measured) "
        f"(of {run['elapsed_s'] * run['cpus']:.0f} s available); the tests' own cgroups: {total_cpu:.0f} s",
        "",
        "Per file, by CPU seconds (wall: summed over its tests; CPU/wall near 0: waiting, near 1 or more: computing;",
        "docker: the Docker engine's containers over the same time, shared with whatever else ran):",
        "",
        "| file | tests | wall s | CPU s | CPU/wall | docker CPU s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, f in sorted(files.items(), key=lambda kv: -kv[1]["cpu_s"]):
        ratio = f["cpu_s"] / f["wall_s"] if f["wall_s"] else 0.0
        lines.append(f"| {name} | {f['tests']} | {f['wall_s']:.0f} | {f['cpu_s']:.0f} | {ratio:.2f} | {f['docker_cpu_s']:.0f} |")
    lines += ["", "The 25 tests with the most CPU:", "", "| test | wall s | CPU s |", "|---|---:|---:|"]
    for r in sorted(records, key=lambda r: -r["cpu_s"])[:25]:
        lines.append(f"| {r['test']} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default=os.environ.get("TEST_WORKERS", "3"))
    parser.add_argument("--hogs", type=int, default=0, help="CPU hogs (`yes`) to run beside the suite")
    parser.add_argument("--out", type=Path, help="write suite_cpu[-LABEL].json and .md here")
    parser.add_argument("--label", default="")
    parser.add_argument("--summarise", type=Path, help="summarise this log of an earlier run instead of running")
    parser.add_argument("--elapsed-s", type=float, default=0.0, help="with --summarise: pytest's elapsed seconds in that run")
    parser.add_argument("--returncode", type=int, default=None, help="with --summarise: that run's exit code")
    args, pytest_args = parser.parse_known_args()
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    run = {"machine": platform.node(), "cpus": os.cpu_count(), "workers": args.workers, "hogs": args.hogs, "revision": revision}
    if args.summarise:
        log = args.summarise
        run.update(elapsed_s=args.elapsed_s, returncode=args.returncode, machine_busy_s=0.0)
    else:
        log = Path(tempfile.mkdtemp(prefix="suite-cpu-")) / "tests.jsonl"
        hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, start_new_session=True) for _ in range(args.hogs)]
        busy, started = machine_busy_s(), time.monotonic()
        try:
            env = {**os.environ, "DISCOVER_TEST_CPU_LOG": str(log)}
            parallel = ["-n", str(args.workers), "--dist", "loadgroup", "-m", "not exclusive"]
            returncodes = [
                subprocess.run([sys.executable, "-m", "pytest", "-q", *phase, *pytest_args], cwd=REPO, env=env).returncode
                for phase in (parallel, ["-m", "exclusive"])  # as `make test`: the tests that load every CPU alone, after
            ]
        finally:
            for hog in hogs:
                hog.kill()
        returncode = next((code for code in returncodes if code not in (0, 5)), 0)  # 5: no test selected
        run.update(elapsed_s=time.monotonic() - started, returncode=returncode, machine_busy_s=machine_busy_s() - busy)
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    report = summarise(records, run, args.label)
    print(report)
    if args.out:
        stem = "suite_cpu" + (f"-{args.label}" if args.label else "")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{stem}.json").write_text(json.dumps({"run": run, "tests": records}, indent=1) + "\n")
        (args.out / f"{stem}.md").write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
