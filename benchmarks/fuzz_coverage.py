"""How much of the host-side parsers the fuzzing reaches: benchmarks/fuzz_parsers.py's targets under coverage.py.

    python benchmarks/fuzz_coverage.py [--minutes 8] [--examples 100] [--targets edits,atcoder] [--out DIR]

Each target of fuzz_parsers.py is fuzzed for its share of `--minutes` (the same cases, strategies and
checks) under coverage.py with branch measurement, over the project's own code (discover/,
evaluators/, storage/). Reported per target: every function of the project the fuzzing entered, with
its statements, the share of them run, its branches and the share of those taken, and the lines
never reached (what the inputs never got to). A function that reads an input shows how far the
inputs went into it; a function the fuzzed code only passes through shows as much of it as the
inputs needed. Tracing slows every call, so this run's timings and hangs are not reported
(fuzz_parsers.py's own run gives them); its failures are, as fuzz_parsers counts them. Writes
fuzz_coverage.json and fuzz_coverage.md to `--out` (with Hypothesis's caches in a temporary
folder there, removed at the end) and prints the Markdown.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import coverage

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import fuzz_parsers  # noqa: E402

SOURCES = [str(REPO / d) for d in ("discover", "evaluators", "storage")]


def covered_functions(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every function coverage.py saw entered, from its JSON report, by file and in its order there."""
    out = []
    for path, data in sorted(report["files"].items()):
        for name, fn in data.get("functions", {}).items():
            summary = fn["summary"]
            if not name or summary["covered_lines"] == 0:
                continue  # "" is the module's own top level: its imports, not a parser
            out.append(
                {
                    "file": str(Path(path).resolve().relative_to(REPO)),
                    "function": name,
                    "statements": summary["num_statements"],
                    "lines_pct": round(100.0 * summary["covered_lines"] / max(1, summary["num_statements"]), 1),
                    "branches": summary["num_branches"],
                    "branches_pct": round(100.0 * summary["covered_branches"] / summary["num_branches"], 1)
                    if summary["num_branches"]
                    else None,
                    "missing_lines": fn["missing_lines"],
                }
            )
    return out


def run(names: list[str], seconds: float, examples: int, scratch: Path) -> dict[str, Any]:
    fuzz_parsers.set_hypothesis_home_dir(scratch)  # Hypothesis's caches: in the temporary folder
    fuzz_parsers.warm_up()
    doc: dict[str, Any] = {"seconds_per_target": seconds, "examples_per_run": examples, "coverage": coverage.__version__, "targets": {}}
    for name in names:
        target = fuzz_parsers.TARGETS[name]()
        cov = coverage.Coverage(branch=True, source=SOURCES, data_file=None)
        cov.start()
        try:
            tally = fuzz_parsers.fuzz_target(target, seconds, examples, shrink=False)
        finally:
            cov.stop()
        out = scratch / f"{name}.json"
        cov.json_report(outfile=str(out))
        functions = covered_functions(json.loads(out.read_text()))
        doc["targets"][name] = {
            "inputs": tally.inputs,
            "failures": len(tally.failures),
            "functions": functions,
        }
        print(f"{name}: {len(functions)} functions entered", flush=True)
    return doc


def markdown(doc: dict[str, Any], machine: str) -> str:
    lines = [
        "# How much of the host-side parsers the fuzzing reaches",
        "",
        f"`python benchmarks/fuzz_coverage.py` (its docstring says what it does): {doc['seconds_per_target']:.0f} s per target "
        f"under coverage.py {doc['coverage']} (line and branch), {doc['examples_per_run']} inputs per Hypothesis run, {machine}.",
        "Timings and hangs are not measured here (tracing slows every call): benchmarks/results/fuzz_parsers.md has them.",
    ]
    for name, target in doc["targets"].items():
        statements = sum(fn["statements"] for fn in target["functions"])
        run_share = 100.0 * sum(fn["statements"] * fn["lines_pct"] / 100.0 for fn in target["functions"]) / max(1, statements)
        lines += [
            "",
            f"## {name}",
            "",
            f"Inputs: {target['inputs']}; failures: {target['failures']}; of the {statements} statements of the "
            f"{len(target['functions'])} functions entered, {run_share:.0f}% ran.",
            "",
            "| function | statements | lines run | branches | branches taken | lines never reached |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for fn in target["functions"]:
            missing = ", ".join(str(n) for n in fn["missing_lines"][:12]) + (" ..." if len(fn["missing_lines"]) > 12 else "")
            branches = "-" if fn["branches_pct"] is None else f"{fn['branches_pct']:.0f}%"
            row = [
                f"{fn['file']} `{fn['function']}`",
                str(fn["statements"]),
                f"{fn['lines_pct']:.0f}%",
                str(fn["branches"]),
                branches,
                missing,
            ]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=8.0, help="the whole budget, split evenly over the targets")
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--targets", default=",".join(fuzz_parsers.TARGETS))
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args(argv)
    names = [n for n in args.targets.split(",") if n]
    unknown = sorted(set(names) - set(fuzz_parsers.TARGETS))
    if unknown:
        ap.error(f"unknown targets {unknown}; known: {', '.join(fuzz_parsers.TARGETS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fuzz_coverage-", dir=args.out) as scratch:
        doc = run(names, args.minutes * 60.0 / len(names), args.examples, Path(scratch))
    machine = f"Python {platform.python_version()}, {platform.machine()}"
    doc["minutes"], doc["machine"] = args.minutes, machine
    (args.out / "fuzz_coverage.json").write_text(json.dumps(doc, indent=1) + "\n")
    text = markdown(doc, machine)
    (args.out / "fuzz_coverage.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
