"""Host memory of an AtCoder evaluation against the number of cases (issue 27): a program that
prints the largest output a case may print (32 MiB of valid AHC039 polygons, so every case is
accepted and judged in full), evaluated on 6, 24 and 150 cases, 2 at once, by this tree's code and
by the baseline's (the last commit before outputs were judged and dropped as each case ends).

`python benchmarks/atcoder_memory.py [--cases 6,24,150] [--baseline a1c1c63] [--backend process]
[--now HEAD] [--write]` checks both commits out into temporary git worktrees, and runs each evaluation in a
fresh Python process (`problem.evaluate` as `discover evaluate` calls it, stop_at_first_failure
false) while this process samples the resident memory of that process and all its children (the
runners, the programs) every 20 ms. Reported per evaluation: the evaluating process's own peak
(ru_maxrss, exact), the peak of the sampled sum over its tree, the wall time and the verdicts.
`--write` saves benchmarks/results/atcoder_memory.{md,json}.

A baseline evaluation that would exhaust the machine is stopped when the memory the machine has
left falls under --keep-free-gb (default 3): its row then says "stopped" with the peak reached
so far, a lower bound. The machine may be shared: the peaks are this evaluation's own processes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
BASELINE = "a1c1c63"  # the last commit that kept every case's output until the evaluation ended
RECTANGLE = "4\\n20000 20000\\n80000 20000\\n80000 80000\\n20000 80000\\n"
LARGEST = (
    "#include <cstdio>\n#include <cstring>\n#include <string>\n"
    "int main() {\n"
    f'  std::string s; const char *r = "{RECTANGLE}";\n'
    "  size_t cap = 32u * 1024 * 1024, n = strlen(r);\n"
    "  while (s.size() + n <= cap) s += r;\n"
    "  fwrite(s.data(), 1, s.size(), stdout);\n"
    "}\n"
)
# Run in a fresh interpreter whose working directory is the tree under test (first on sys.path).
CHILD = """
import json, resource, sys, time
import evaluators
from evaluators.registry import get_problem
cases, backend, source = int(sys.argv[1]), sys.argv[2], sys.argv[3]
problem = get_problem("ahc039", cases=f"0-{cases - 1}", stop_at_first_failure=False, cpus=2, timeout_s=3000)
if backend == "docker":
    from evaluators.sandbox.docker import DockerSandbox
    box = DockerSandbox(image="cpp20", concurrency=1)
else:
    from evaluators.sandbox import ProcessSandbox
    box = ProcessSandbox()
start = time.monotonic()
result = problem.evaluate(source, None, box)
seconds = time.monotonic() - start
getattr(box, "close", lambda: None)()
rows = result.metrics.get("cases", [])
print(json.dumps({
    "module": evaluators.__file__,
    "self_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "seconds": seconds,
    "accepted": sum(r["verdict"] == "AC" for r in rows),
    "cases_run": len(rows),
    "scores": sorted({r["score"] for r in rows}),
    "reason": result.reason,
}))
"""


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(tree: Path, cases: int, backend: str, keep_free_gb: float) -> dict:
    """One evaluation in a fresh process of `tree`'s code; its peaks."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cases), backend, LARGEST],
        cwd=tree,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc = psutil.Process(child.pid)
    peak, stopped = 0, False
    while child.poll() is None:
        try:
            peak = max(peak, tree_rss(proc))
        except psutil.Error:
            pass
        if psutil.virtual_memory().available < keep_free_gb * 2**30:
            stopped = True
            for p in [*proc.children(recursive=True), proc]:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            break
        time.sleep(0.02)
    out, err = child.communicate()
    row = {"cases": cases, "tree_peak_mb": peak / 2**20, "stopped": stopped}
    if stopped:
        return row
    lines = out.strip().splitlines()
    if child.returncode != 0 or not lines:
        raise RuntimeError(f"the evaluation in {tree} failed (exit {child.returncode}):\n{err[-3000:]}")
    info = json.loads(lines[-1])
    if not info["module"].startswith(str(tree)):
        raise RuntimeError(f"the evaluation imported {info['module']}, not the code of {tree}")
    return {**row, **info}


def checkout(ref: str) -> tuple[Path, str]:
    """A temporary worktree at `ref` and its commit."""
    commit = subprocess.run(["git", "rev-parse", "--verify", ref + "^{commit}"], cwd=REPO, capture_output=True, text=True)
    if commit.returncode != 0:
        raise SystemExit(f"{ref}: not a commit of {REPO} ({commit.stderr.strip()})")
    path = Path(tempfile.mkdtemp(prefix="atc-base-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(path), ref], cwd=REPO, check=True, capture_output=True)
    return path, commit.stdout.strip()


def fmt(row: dict | None, key: str) -> str:
    if row is None:
        return "-"
    if row.get("stopped"):
        return f">{row['tree_peak_mb']:.0f} (stopped)" if key == "tree_peak_mb" else "stopped"
    return f"{row[key]:.0f}"


def table(results: dict) -> str:
    lines = [
        "| cases | baseline own peak MB | now own peak MB | baseline tree peak MB | now tree peak MB "
        "| tree ratio baseline/now | baseline s | now s | verdicts now |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n in results["cases"]:
        base = results["baseline"].get(str(n))
        now = results["now"].get(str(n))
        ratio = "-"
        if base and now:
            ratio = f"{base['tree_peak_mb'] / now['tree_peak_mb']:.1f}x" + (" (at least)" if base.get("stopped") else "")
        verdicts = f"{now['accepted']}/{now['cases_run']} AC" if now and not now.get("stopped") else "-"
        lines.append(
            f"| {n} | {fmt(base, 'self_peak_mb')} | {fmt(now, 'self_peak_mb')} | {fmt(base, 'tree_peak_mb')} | "
            f"{fmt(now, 'tree_peak_mb')} | {ratio} | {fmt(base, 'seconds')} | {fmt(now, 'seconds')} | {verdicts} |"
        )
    return "\n".join(lines)


def write(results: dict, backend: str) -> None:
    """benchmarks/results/atcoder_memory.{json,md}: rewritten after every evaluation, so that a run
    stopped early keeps what it measured."""
    out = REPO / "benchmarks" / "results"
    (out / "atcoder_memory.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    md = (
        "# AtCoder host memory against the number of cases (issue 27)\n\n"
        f"`python benchmarks/atcoder_memory.py --write` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{backend} backend, {psutil.cpu_count()} cores (shared), {psutil.virtual_memory().total / 2**30:.0f} GiB.\n"
        "A program printing 32 MiB of valid AHC039 polygons on every case (all accepted), 2 cases at once. "
        "Own peak: the evaluating process's ru_maxrss; tree peak: the sampled (20 ms) sum of the resident "
        "memory of that process and its children (runners, programs).\n"
        f"Now: {results['now_commit']}; baseline: {results.get('baseline_commit', '-')}.\n\n" + table(results) + "\n"
    )
    (out / "atcoder_memory.md").write_text(md, encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="6,24,150", help="comma-separated case counts")
    ap.add_argument("--now", default="HEAD", help="the commit measured as 'now' (checked out like the baseline)")
    ap.add_argument("--baseline", default=BASELINE, help="the commit to compare with ('none': this tree only)")
    ap.add_argument("--backend", choices=["process", "docker"], default="process")
    ap.add_argument("--keep-free-gb", type=float, default=3.0)
    ap.add_argument("--write", action="store_true", help="save benchmarks/results/atcoder_memory.{md,json}")
    args = ap.parse_args()
    counts = [int(c) for c in args.cases.split(",")]
    results: dict = {
        "cases": counts,
        "backend": args.backend,
        "now": {},
        "baseline": {},
    }
    now, results["now_commit"] = checkout(args.now)  # a snapshot: edits made meanwhile change nothing
    base = None
    if args.baseline != "none":
        base, results["baseline_commit"] = checkout(args.baseline)
    try:
        for n in counts:
            results["now"][str(n)] = measure(now, n, args.backend, args.keep_free_gb)
            print(f"now, {n} cases: {results['now'][str(n)]}", flush=True)
            if args.write:
                write(results, args.backend)
            if base is not None:
                results["baseline"][str(n)] = measure(base, n, args.backend, args.keep_free_gb)
                print(f"baseline, {n} cases: {results['baseline'][str(n)]}", flush=True)
                if args.write:
                    write(results, args.backend)
    finally:
        for tree in (now, base):
            if tree is not None:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
    print(table(results))


if __name__ == "__main__":
    main()
