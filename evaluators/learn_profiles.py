"""Derive the seccomp allow-lists (evaluators/sandbox/syscall_lists.py) from what honest programs call.

      python -m evaluators.learn_profiles [--kinds python,gpu,compiler,program] [--cases 0-2]
        [--program KIND=FILE ...] [--check]

Runs honest programs of every domain in the process sandbox with filters that let every system call
through while the host writes each one down (syscalls.bpf(kind, "learn"); supervisor.Listener with
`learn`), then prints each kind's calls that syscall_lists.py does not allow yet:
- python: each math problem's starter program on a random parent and on each published record,
  a program that returns each published record as it is, and denoising's programs (MAGIC,
  magic-impute, ALRA) under the bio image's packages;
- gpu: TriMul's initial kernel and a kernel built by torch.compile, on the CPU check (Triton's
  interpreter; on a GPU machine the same command learns what CUDA needs);
- compiler, program: AHC039's initial program and AHC058's seed on a few public cases.
`--program python=FILE` (or gpu=, cpp=) adds a program of your own (a published program, say): a
Python file defining the entry point of its problem's kind, or a C++ file run on AHC058's cases.
`--check` runs the same programs under the filters as they are and prints the calls they refused
(exit status 1 when any). Needs root (the sandbox's uid) or a user with unprivileged user namespaces, and bubblewrap.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from evaluators.sandbox.process import ProcessSandbox
from evaluators.sandbox.syscall_lists import COMPILER, GPU_EXTRA, LAUNCHER, PROGRAM, PYTHON
from evaluators.sandbox.syscalls import CONDITIONAL

PUBLISHED = Path(__file__).resolve().parent / "math" / "published"
# an honest contest-style AHC058 program (random_device, clocks, a thread), run with the seeds
CONTEST_STYLE = Path(__file__).resolve().parents[1] / "tests" / "programs" / "ahc058_timed.cpp"
MATH = {"erdos": "erdos", "ac1": "ac1", "ac2": "ac2", "circles-26": "circle_packing"}
MODE = "learn"  # --check: "notify", the filters as they run candidates (what they refuse is printed)
KNOWN = {"python": set(PYTHON), "gpu": set(PYTHON) | set(GPU_EXTRA) | set(COMPILER), "compiler": set(COMPILER), "program": set(PROGRAM)}


def _box(image: str, seen: dict) -> ProcessSandbox:
    box = ProcessSandbox(image=image)
    box.seccomp_mode = MODE
    box.calls_seen = seen
    return box


def _say(what: str, result) -> None:
    status = "ok" if result.valid else f"invalid: {result.reason[:200]}"
    print(f"  {what}: {status}", file=sys.stderr, flush=True)


def learn_python(learned: dict, extra: list[Path]) -> None:
    from evaluators.registry import get_problem

    box = _box("python-math", learned)
    rng = np.random.default_rng(0)
    for name, folder in MATH.items():
        problem = get_problem(name)
        from evaluators.base import ParentView

        code = problem.seeds(rng, 1)[0].code
        parent = problem.random_construction(rng)
        if code.strip():
            _say(f"{name} starter", problem.evaluate(code, ParentView(code, parent), box))
        for record in sorted((PUBLISHED / folder).glob("*.json")):
            data = json.loads(record.read_text())
            returning = f"def construct(parent):\n    return {json.dumps(data)}\n"
            _say(f"{name} {record.name} returned", problem.evaluate(returning, None, box))
            if code.strip():
                _say(f"{name} starter on {record.name}", problem.evaluate(code, ParentView(code, problem.verify(data).construction), box))
    for path in extra:
        print(f"  {path}: {box.run(path.read_text(), 'main', None, get_problem('erdos').limits).reason or 'ok'}", file=sys.stderr)
    denoising = get_problem("denoising")
    from evaluators.bio.denoising.problem import program

    bio = _box("bio", learned)
    for which in ("magic", "magic_impute", "alra"):
        _say(f"denoising {which}", denoising.evaluate(program(which), None, bio))


def learn_gpu(learned: dict, extra: list[Path]) -> None:
    from evaluators.kernels.trimul.problem import INITIAL_KERNEL, TriMulProblem

    problem = TriMulProblem(device="cpu", cpu_timing=True)
    box = _box("gpu", learned)
    kernels = {"initial kernel": INITIAL_KERNEL} | {str(p): p.read_text() for p in extra}
    try:
        from tests.trimul_kernels import TORCH_COMPILE

        kernels["torch.compile kernel"] = TORCH_COMPILE
    except ImportError:
        pass
    for what, source in kernels.items():
        result = problem.run_checks(source, box)
        print(f"  trimul {what}: {result.reason[:200]}", file=sys.stderr, flush=True)


def learn_native(learned: dict, extra: list[Path], cases: str) -> None:
    from evaluators.registry import get_problem

    box = _box("python-math", learned)
    for name in ("ahc039", "ahc058"):
        problem = get_problem(name, cases=cases)
        code = problem.seeds(np.random.default_rng(0), 1)[0].code
        _say(f"{name} seed", problem.evaluate(code, None, box))
        if name == "ahc058":
            for path in [*([CONTEST_STYLE] if CONTEST_STYLE.is_file() else []), *extra]:
                _say(f"{name} {path.name}", problem.evaluate(path.read_text(), None, box))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="python,gpu,compiler,program")
    parser.add_argument("--cases", default="0-2", help="public AtCoder cases to run (default 0-2)")
    parser.add_argument("--check", action="store_true", help="run under the filters as they are and print what they refuse")
    parser.add_argument("--program", action="append", default=[], help="KIND=FILE: python=, gpu= or cpp= a program of your own")
    args = parser.parse_args(argv)
    global MODE
    MODE = "notify" if args.check else "learn"
    kinds = set(args.kinds.split(","))
    extra: dict[str, list[Path]] = {"python": [], "gpu": [], "cpp": []}
    for item in args.program:
        kind, _, file = item.partition("=")
        if kind not in extra or not file:
            parser.error(f"--program {item!r}: give python=FILE, gpu=FILE or cpp=FILE")
        extra[kind].append(Path(file))
    learned: dict[str, dict[str, int]] = {}
    if "python" in kinds:
        learn_python(learned, extra["python"])
    if "gpu" in kinds:
        learn_gpu(learned, extra["gpu"])
    if kinds & {"compiler", "program"}:
        learn_native(learned, extra["cpp"], args.cases)
    if args.check:
        refused = {kind: calls for kind, calls in learned.items() if calls}
        print(f"refused: {json.dumps(refused)}" if refused else "refused: nothing")
        return 1 if refused else 0
    for kind in sorted(learned):
        calls = sorted(learned[kind])
        new = [c for c in calls if c not in KNOWN.get(kind, set()) and c not in LAUNCHER and c not in CONDITIONAL]
        print(f"{kind}: {len(calls)} calls seen; not allowed yet: {json.dumps(new)}")
        print(f"{kind} all: {json.dumps(calls)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
