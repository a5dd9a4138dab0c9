"""Per-evaluation overhead of the sandbox backends, side by side in one run (issue 36, Must show 3).

    python benchmarks/sandbox_overhead.py [--repeats N] [--baseline REV] [--skip-docker] [--out DIR]

The same three workloads under each backend:
- "trivial": a Python program that returns 50 numbers, scored by the Erdős verifier;
- "one-second": the same after one second of busy work;
- "case": one case of a trivial compiled program (seconds per case: (20 cases - 1 case) / 19,
  compilation excluded).
Backends (columns):
- "bare": the process backend with `sandbox.isolation: none` (the harness, rlimits and the cgroup,
  no sandbox): what every other column adds to;
- "before": the process backend of revision REV (default BASELINE: the last one whose compiled
  programs started under the Python launcher; a92d372 is the last before bubblewrap, with its own
  namespaces, read-only host, Landlock and seccomp deny-list), run from a git worktree of this
  repository in a process of its own;
- "bwrap": today's process backend (bubblewrap, the minimal view, the seccomp allow-list and its
  listener);
- "docker": a warm Docker container of the python-math or cpp20 image (runc, the allow-list as its
  seccomp profile);
- "gvisor": the same under gVisor's runsc.
Prints mean seconds per evaluation (or per case) and each column's ratio to "bare"; with --out,
writes sandbox_overhead.json and .md there. Docker and gVisor columns are left out, with the
reason, where no engine, image or runtime is there.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BASELINE = "91e2310"  # the last revision with compiled programs under the Python launcher (issue 43); a92d372: before bubblewrap (issue 36)
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
CASES = 20
TRIVIAL_CPP = '#include <cstdio>\nint main() { int n; if (scanf("%d", &n) == 1) printf("%d\\n", 2 * n); }\n'

# Runs in a process of its own with a revision's code first on the import path (this tree's, or
# the baseline's worktree): times one column's sandboxes on the workloads above, prints JSON.
DRIVER = """
import json, statistics, sys, time
from evaluators.math.erdos import ErdosProblem
from evaluators.sandbox import ProcessSandbox, SandboxLimits
from evaluators.sandbox.native import NativeLimits

column, programs, cpp, cases, repeats = json.loads(sys.argv[1])
if column in ("before", "bwrap"):
    python_box = native_box = ProcessSandbox()
elif column == "bare":
    python_box = native_box = ProcessSandbox(isolation="none")
else:
    from evaluators.sandbox.docker import DockerSandbox
    python_box = DockerSandbox(image="python-math", concurrency=1, gvisor=column == "gvisor")
    native_box = DockerSandbox(image="cpp20", concurrency=1, gvisor=column == "gvisor")
limits = SandboxLimits(timeout_s=30.0, memory_mb=1024, cpus=1)
problem = ErdosProblem(timeout_s=30.0, memory_mb=1024, cpus=1)

def through(program):
    run = python_box.run(program, "construct", None, limits)
    assert run.ok, run.reason
    return problem.verify(run.output).reward

def measure(fn):
    fn()  # warm-up (imports, a pool's first container)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.mean(times)

def timed(n):
    start = time.perf_counter()
    run = native_box.run_native(cpp, [(i, f"{i}\\n") for i in range(n)], NativeLimits(parallel=1))
    assert run.compiled and all(c.status == "OK" for c in run.cases), run
    return time.perf_counter() - start

out = {label: measure(lambda: through(program)) for label, program in programs.items()}
timed(1)
out["case"] = (timed(cases) - timed(1)) / (cases - 1)
for box in {id(python_box): python_box, id(native_box): native_box}.values():
    getattr(box, "close", lambda: None)()
print(json.dumps(out))
"""


def missing_columns(skip_docker: bool) -> dict[str, str]:
    """The columns of today's code that cannot run here, with why."""
    from evaluators.sandbox import docker_unavailable

    why = "--skip-docker" if skip_docker else docker_unavailable("python-math") or docker_unavailable("cpp20")
    if why:
        return {"docker": why, "gvisor": why}
    from evaluators.sandbox.docker_engine import gvisor_missing

    why = gvisor_missing()
    return {"gvisor": why} if why else {}


def time_column(column: str, tree: Path, repeats: int) -> dict[str, float]:
    """The workloads under `column`'s sandboxes, with `tree`'s code, in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps([column, PROGRAMS, TRIVIAL_CPP, CASES, repeats])],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {column} column failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_revision(rev: str, repeats: int) -> dict[str, float]:
    """The workloads under revision `rev`'s process backend, from a git worktree of it."""
    where = Path(tempfile.mkdtemp(prefix="discover-baseline-"))
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where / "tree"), rev], check=True, capture_output=True)
    try:
        return time_column("before", where / "tree", repeats)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where / "tree")], check=False, capture_output=True)


def table(results: dict[str, dict[str, float]]) -> str:
    columns = list(results)
    lines = [
        "| workload | " + " | ".join(f"{c} s" for c in columns) + " | " + " | ".join(f"{c} / bare" for c in columns if c != "bare") + " |"
    ]
    lines.append("|---" * (1 + 2 * len(columns) - 1) + "|")
    for workload in (*PROGRAMS, "case"):
        bare = results["bare"][workload]
        cells = [f"{results[c][workload]:.4f}" for c in columns]
        ratios = [f"{results[c][workload] / bare:.2f}" for c in columns if c != "bare"]
        lines.append(f"| {workload} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--baseline", default=BASELINE, help=f"the revision of the 'before' column (default {BASELINE}; '' leaves it out)")
    parser.add_argument("--skip-docker", action="store_true", help="leave the docker and gvisor columns out")
    parser.add_argument("--out", type=Path, help="write sandbox_overhead.json and .md into this directory")
    args = parser.parse_args()
    missing = missing_columns(args.skip_docker)
    results: dict[str, dict[str, float]] = {}
    started = time.time()
    for column in ("bare", "before", "bwrap", "docker", "gvisor"):
        if column in missing or (column == "before" and not args.baseline):
            continue
        print(f"timing {column} ...", file=sys.stderr, flush=True)
        results[column] = time_revision(args.baseline, args.repeats) if column == "before" else time_column(column, REPO, args.repeats)
    load = os.getloadavg()[0]
    text = table(results)
    notes = [f"{c}: left out ({why})" for c, why in missing.items()]
    header = (
        f"{platform.node()} {platform.machine()}, kernel {platform.release()}, {os.cpu_count()} CPUs, load average {load:.1f} at the end, "
        f"{args.repeats} repeats, {time.time() - started:.0f} s in all; 'before' is revision {args.baseline or '(left out)'}"
    )
    print(header)
    print(text)
    for note in notes:
        print(note)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sandbox_overhead.json").write_text(
            json.dumps({"setup": header, "seconds": results, "missing": missing}, indent=2) + "\n"
        )
        (args.out / "sandbox_overhead.md").write_text(
            "# Sandbox overhead (benchmarks/sandbox_overhead.py)\n\n" + header + "\n\n" + text + "\n\n" + "".join(f"- {n}\n" for n in notes)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
