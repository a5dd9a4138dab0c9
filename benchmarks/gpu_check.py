"""`make gpu-check`: every GPU test and benchmark of the project in one go, written to one results file.

    python benchmarks/gpu_check.py [--parts a,b,...] [--out benchmarks/results] [--merge FILE ...]
                                   [--max-seconds S] [--wheels DIR] [--list] [--merge-only]

On a CUDA machine it runs the parts below one after the other, each in a child process with its
own time limit, and after each part merges that part's record into
`OUT/gpu-<UTC date>-<gpu>.json` and rewrites `OUT/gpu-<UTC date>-<gpu>.md` from it: the versions
(Python, torch, CUDA, Triton, vLLM, transformers, peft, ...), the GPU, its driver, and per part the
exact command, its exit status and time, its figures (the JSON a benchmark writes with `--json`, or
a test run's JUnit counts and per-test outcomes) and the tail of its output.

Without a CUDA device it stops at once with exit status 2 and the message "no CUDA device",
writing nothing. Nothing in this repository has been measured by it yet: it was written and its
merging tested on a machine without a GPU (tests/test_gpu_check.py).

Parts (`--list` prints them with their commands and limits), in the order they run:
  train-fp32    benchmarks/training.py on the 8B shape, float32 LoRA, then a trainer offload/reload cycle timed
  train-bf16    the same step with bf16 LoRA (model.lora_dtype): MFU both ways
  resident      benchmarks/resident_step.py: a cold worker's step against a resident trainer's next one
  trimul-bench  benchmarks/trimul.py --repeats 5: the reference and the initial kernel per shape, the spread of 5 timings
  trimul-tests  pytest -m gpu tests/test_trimul_gpu.py but the two timings trimul-bench makes: hostile kernels
                rejected, a torch.compile kernel, the slow-empty-call attack (process sandbox)
  vllm-tests    pytest -m gpu tests/test_gpu_vllm.py (log-prob gap, hot-loaded adapters, forced answers,
                sleep/wake with and without an adapter, a two-step Erdős run)
  generation    benchmarks/generation.py: vLLM against the transformers backend, tokens/s, KV cache
  one-gpu       benchmarks/one_gpu.py: one copy of the weights at a time: park, wake, KV cache size,
                answer-phase prefix-cache hit rate, sleep, unpark, train step, free memory at each point
  step-time     benchmarks/step_time.py, 2 steps of G = 2 x K = 8 at 8k context (a reduced step)
The first five need no vLLM (`FIRST_CALL`): a bare lent machine runs them in one call, their limits
adding up to 540 s (`ONE_CALL_S`, docs/gpu-check.md), with pydantic's four wheels carried
(benchmarks/first_call_wheels.txt, in .whl/first-call after `make gpu-check REHEARSE=1`):

    python3 benchmarks/gpu_check.py --wheels .whl/first-call --out $OUT

`make gpu-check REHEARSE=1` (benchmarks/gpu_rehearsal.py) runs that call on a CPU machine in an
environment of the lent machine's packages, each part to its first CUDA call. Parts that need vLLM
are recorded as skipped where it cannot be imported. A part may run until only the later parts' limits are
left of `--max-seconds` (default 540): time an earlier part did not use passes on, never past the
call's end; a part that would get less than 30 s is recorded as not run. A
part that overruns its limit is interrupted (SIGINT: pytest still writes what it finished), then
killed, and recorded as timed out with whatever figures it wrote.

The vLLM parts need vLLM's wheels carried in parts: on a machine with a package registry,
`pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
--platform manylinux_2_35_x86_64 (and the older manylinux tags) -d wheels -r
benchmarks/gpu_check_wheels.txt`, then `tar cf wheels.tar -C wheels .` and `split -b 48M -d
wheels.tar part.`; copy the parts to /tmp/parts there. The call then runs them and writes to $OUT:

    python3 benchmarks/gpu_check.py --wheels /tmp/parts --parts vllm-tests,generation --merge FIRST.json --out $OUT

`--wheels DIR` installs DIR's *.whl and the wheels of the split tar DIR/part.* makes into /tmp/site
(those not installed there by an earlier call on the machine) and puts it first on the path of
every part. Copy each returned results file into benchmarks/results/
and pass it back with `--merge benchmarks/results/gpu-....json` on the next call: the parts merge
into one file (a part run again replaces its earlier record). `--merge-only` merges files without
running anything (no GPU needed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "triton", "vllm", "transformers", "peft", "tokenizers", "safetensors", "pydantic", "numpy", "pyarrow", "pytest")
SITE = Path("/tmp/site")
ONE_CALL_S = 540.0  # what the parts of one call to a lent GPU machine may take (10 minutes), less start, wheels and results
TAIL_CHARS = 4000


@dataclass(frozen=True)
class Part:
    name: str
    argv: tuple[str, ...]  # "{python}", "{json}" and "{junit}" are filled in when it runs
    timeout_s: int
    needs_vllm: bool = False
    env: dict[str, str] = field(default_factory=dict)
    what: str = ""


# A bare lent machine has no cgroup to bound the kernels' processes and, with no package registry,
# no bubblewrap: the TriMul parts then run their (trusted: ours) kernels with sandbox.isolation none,
# asked for by name and written into the results file with each part's environment. "{isolation}"
# in a part's arguments and environment is filled in when it runs (`isolation()`; the rehearsal on
# CPU fills in what the lent machine will have).
SANDBOX_ENV = {"DISCOVER_ALLOW_UNBOUNDED_PROCESS_TREE": "1", "DISCOVER_TEST_SANDBOX_ISOLATION": "{isolation}"}


def isolation() -> str:
    """sandbox.isolation for our own TriMul kernels here: bubblewrap's where it is installed, else none."""
    return "standard" if shutil.which("bwrap") else "none"


# In this order, within these limits, the parts that need no vLLM (what a bare lent GPU machine can
# run: torch and Triton, pydantic's four wheels carried) get their figures in one call of 540 s
# (`ONE_CALL_S`); the vLLM parts follow in a second call once its wheels are carried
# (docs/gpu-check.md). The limits are sized on the device time the rehearsal on CPU predicts for
# each part (benchmarks/results/gpu-rehearsal.md: the arithmetic, and the figures it assumes), with
# the most margin where the prediction rests most on assumption; time a part leaves unused passes on.
PARTS: tuple[Part, ...] = (
    Part(
        "train-fp32",
        (
            "{python}",
            "benchmarks/training.py",
            "--shape",
            "{shape}",
            "--lora-dtype",
            "float32",
            "--rollouts",
            "8",
            "--offload-cycles",
            "1",
            "--json",
            "{json}",
        ),
        100,
        what="one training step on the benchmark shape (8B unless --shape), float32 "
        "LoRA: tokens/s, MFU, peak memory; trainer offload/reload times",
    ),
    Part(
        "train-bf16",
        ("{python}", "benchmarks/training.py", "--shape", "{shape}", "--lora-dtype", "bfloat16", "--rollouts", "8", "--json", "{json}"),
        80,
        what="the same step with bf16 LoRA parameters",
    ),
    Part(
        "resident",
        ("{python}", "benchmarks/resident_step.py", "--shape", "{shape}", "--json", "{json}"),
        75,
        what="a cold worker's step (imports, model read from disk, first step) against a resident trainer's next step",
    ),
    Part(
        "trimul-bench",
        ("{python}", "benchmarks/trimul.py", "--repeats", "5", "--sandbox", "process", "--isolation", "{isolation}", "--json", "{json}"),
        110,
        env=SANDBOX_ENV,
        what="TriMul reference and initial kernel per shape, ratio to the published H100 figures, spread of 5 timings",
    ),
    Part(
        "trimul-tests",
        (
            "{python}",
            "-m",
            "pytest",
            "-q",
            "-s",
            "-m",
            "gpu",
            "-p",
            "no:cacheprovider",
            "tests/test_trimul_gpu.py",
            # the reference's and the initial kernel's timings and the five timings are trimul-bench's figures
            "--deselect",
            "tests/test_trimul_gpu.py::test_the_reference_and_the_initial_kernel_are_timed",
            "--deselect",
            "tests/test_trimul_gpu.py::test_five_timings_of_one_kernel_and_their_spread",
            "--junitxml",
            "{junit}",
        ),
        175,
        env=SANDBOX_ENV,
        what="TriMul: hostile kernels rejected, a torch.compile kernel timed, the slow-empty-call attack against its twin",
    ),
    Part(
        "vllm-tests",
        ("{python}", "-m", "pytest", "-q", "-s", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gpu_vllm.py", "--junitxml", "{junit}"),
        570,
        needs_vllm=True,
        what="vLLM with the resident trainer: log-prob gaps, adapters, sleep/wake, a two-step run",
    ),
    Part(
        "generation",
        ("{python}", "benchmarks/generation.py", "--shape", "{shape}", "--json", "{json}"),
        570,
        needs_vllm=True,
        what="vLLM against the transformers backend, tokens/s; vLLM's KV cache at 0.9",
    ),
    Part(
        "one-gpu",
        ("{python}", "benchmarks/one_gpu.py", "--shape", "{shape}", "--json", "{json}"),
        570,
        needs_vllm=True,
        what="one copy of the weights at a time: offload, sleep/wake, KV cache, prefix-cache hit rate",
    ),
    Part(
        "step-time",
        (
            "{python}",
            "benchmarks/step_time.py",
            "--shape",
            "{shape}",
            "--steps",
            "2",
            "--groups",
            "2",
            "--rollouts-per-group",
            "8",
            "--context-tokens",
            "8192",
            "--thinking-budget",
            "4096",
            "--json",
            "{json}",
        ),
        570,
        needs_vllm=True,
        env=SANDBOX_ENV,
        what="two reduced steps (G = 2, K = 8, 8k context), time by task",
    ),
)
BY_NAME = {p.name: p for p in PARTS}
FIRST_CALL = tuple(p for p in PARTS if not p.needs_vllm)  # what a bare lent machine runs in its first call


# ----------------------------------------------------------------------------- environment


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


PROBE = """
import json, torch
out = {"torch_cuda": torch.version.cuda, "available": torch.cuda.is_available()}
if out["available"]:
    p = torch.cuda.get_device_properties(0)
    out.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
               gpu_memory_GiB=p.total_memory / 2**30, capability=f"{p.major}.{p.minor}")
print(json.dumps(out))
"""


def probe_cuda() -> dict[str, Any] | str:
    """torch's view of CUDA, read in a child process (this one never holds a CUDA context that the
    parts would find taken from the GPU); a string says why there is none."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return f"torch cannot be imported or initialised here ({(done.stderr.strip().splitlines() or ['?'])[-1]})"
    info = json.loads(done.stdout.strip().splitlines()[-1])
    return info if info.pop("available") else "torch.cuda.is_available() is False"


def environment(cuda: dict[str, Any]) -> dict[str, Any]:
    """Versions, GPU and driver, read without importing vLLM (a broken vLLM must not stop the check)."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host": platform.node(),
        "versions": versions,
        "commit": os.environ.get("GPU_CHECK_COMMIT") or _run(["git", "-C", str(ROOT), "rev-parse", "HEAD"]) or "unknown",
    } | cuda
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    if smi:
        first = [s.strip() for s in smi.splitlines()[0].split(",")]
        env |= {"nvidia_smi": smi, "driver": first[1] if len(first) > 1 else None}
        cuda = re.search(r"CUDA Version:\s*([\d.]+)", _run(["nvidia-smi"]))
        env["driver_cuda"] = cuda.group(1) if cuda else None
    return env


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def results_stem(gpu: str, date: str) -> str:
    return f"gpu-{date}-{slug(gpu)}"


# ----------------------------------------------------------------------------- a part's record


def junit_figures(path: Path) -> dict[str, Any]:
    """Counts and per-test outcomes of a pytest --junitxml file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    tests = {}
    for case in root.iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
        tests[f"{case.get('classname', '')}::{case.get('name', '')}"] = {"outcome": outcome, "seconds": float(case.get("time", 0))}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {"counts": counts, "tests": tests}


def part_record(
    part: Part,
    command: str,
    returncode: int | None,
    seconds: float,
    output: str,
    figures: dict[str, Any] | None,
    env: dict[str, Any],
    status: str | None = None,
    started: str | None = None,
) -> dict[str, Any]:
    """What the results file keeps of one part's run."""
    if status is None:
        status = "timeout" if returncode is None else ("passed" if returncode == 0 else "failed")
    return {
        "part": part.name,
        "what": part.what,
        "command": command,
        "extra_env": filled_env(part, isolation()),
        "started_utc": started or _now(),
        "status": status,
        "returncode": returncode,
        "seconds": round(seconds, 2),
        "gpu": env.get("gpu"),
        "driver": env.get("driver"),
        "figures": figures or {},
        "output_tail": output[-TAIL_CHARS:],
    }


def run_part(part: Part, env_record: dict[str, Any], timeout_s: float, python: str, shape: str = "8b") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{part.name}-") as tmp:
        json_path, junit_path = Path(tmp) / "figures.json", Path(tmp) / "junit.xml"
        argv = filled_argv(part, python, str(json_path), str(junit_path), shape, isolation())
        command = shown(part, shape)
        child_env = os.environ | filled_env(part, isolation())
        child_env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([child_env["PYTHONPATH"]] if child_env.get("PYTHONPATH") else []))
        print(f"\n=== {part.name} (limit {timeout_s:.0f} s): {command}", flush=True)
        started = _now()
        t0 = time.perf_counter()
        code, output, _ = run_with_limit(argv, child_env, timeout_s)
        seconds = time.perf_counter() - t0
        figures: dict[str, Any] = {}
        if json_path.is_file():
            figures = json.loads(json_path.read_text())
        if junit_path.is_file():
            figures["junit"] = junit_figures(junit_path)
        print(output[-TAIL_CHARS:], flush=True)
        return part_record(part, command, code, seconds, output, figures, env_record, started=started)


def part_limit(part: Part, left_s: float, later: list[Part]) -> float:
    """How long `part` may run: until only the later parts' own limits are left of the call's time
    (a part that finished early passes its unused time on), and never past the call's end."""
    return max(0.0, min(left_s, max(part.timeout_s, left_s - sum(p.timeout_s for p in later))))


INTERRUPT_GRACE_S = 15  # after SIGINT at a part's limit, before SIGKILL


def _interruptible() -> None:
    """In the part's process before it starts: SIGINT back to its default. A command started in the
    background of a shell (or under an xdist worker) inherits SIGINT ignored, and Python then never
    raises KeyboardInterrupt: the part would lose what it finished and wait for the kill."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_with_limit(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[int | None, str, int]:
    """(exit status or None when it overran, its output, its pid). At the limit the part's process
    group gets SIGINT, so that pytest still writes the JUnit file of the tests it finished, then SIGKILL."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_interruptible
        )
        code: int | None
        try:
            code = proc.wait(timeout=timeout_s)
            note = ""
        except subprocess.TimeoutExpired:
            code = None
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=INTERRUPT_GRACE_S)
                note = f"\n[gpu-check: interrupted at its limit of {timeout_s:.0f} s]"
            except subprocess.TimeoutExpired:
                note = f"\n[gpu-check: killed at its limit of {timeout_s:.0f} s + {INTERRUPT_GRACE_S} s]"
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the part left running
        except ProcessLookupError:
            pass
        proc.wait()
        out.seek(0)
        return code, out.read().decode("utf-8", "replace") + note, proc.pid


def shown(part: Part, shape: str, isolation_: str | None = None) -> str:
    """The part's command as the results file shows it (placeholders named, extra environment first)."""
    isolation_ = isolation_ or isolation()
    text = " ".join(shlex.quote(a) for a in filled_argv(part, "python", "FIGURES.json", "JUNIT.xml", shape, isolation_))
    env = filled_env(part, isolation_)
    return " ".join(f"{k}={v}" for k, v in env.items()) + (" " if env else "") + text


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def filled_argv(part: Part, python: str, json_path: str, junit_path: str, shape: str, isolation_: str) -> list[str]:
    """A part's arguments with their placeholders replaced (plain replacement: code in an argument may hold braces)."""
    values = {"{python}": python, "{json}": json_path, "{junit}": junit_path, "{shape}": shape, "{isolation}": isolation_}
    out = []
    for arg in part.argv:
        for key, value in values.items():
            arg = arg.replace(key, value)
        out.append(arg)
    return out


def filled_env(part: Part, isolation_: str) -> dict[str, str]:
    """A part's extra environment, "{isolation}" filled in."""
    return {k: v.replace("{isolation}", isolation_) for k, v in part.env.items()}


# ----------------------------------------------------------------------------- the results file


def merge(base: dict[str, Any] | None, *others: dict[str, Any]) -> dict[str, Any]:
    """One results document from several: later parts replace earlier records of the same part
    (a re-run wins); the environment is the latest one that has a GPU, every part keeps its own GPU."""
    out: dict[str, Any] = {"kind": "gpu-check", "environment": {}, "parts": {}}
    for doc in ([base] if base else []) + list(others):
        if doc.get("kind") not in (None, "gpu-check"):
            raise ValueError(f"not a gpu-check results document: kind {doc.get('kind')!r}")
        if doc.get("environment", {}).get("gpu") or not out["environment"]:
            out["environment"] = doc.get("environment", {}) or out["environment"]
        for name, record in doc.get("parts", {}).items():
            out["parts"][name] = record
    order = [p.name for p in PARTS]
    out["parts"] = dict(sorted(out["parts"].items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))
    return out


def flatten(figures: Any, prefix: str = "", limit: int = 60) -> list[tuple[str, str]]:
    """Scalar figures as (dotted name, value) rows for the Markdown file; lists of dicts by index."""
    rows: list[tuple[str, str]] = []

    def walk(x: Any, name: str) -> None:
        if len(rows) >= limit:
            return
        if isinstance(x, dict):
            for k, v in x.items():
                if k != "tests":
                    walk(v, f"{name}.{k}" if name else str(k))
        elif isinstance(x, list) and x and all(isinstance(v, dict) for v in x):
            for i, v in enumerate(x):
                walk(v, f"{name}[{i}]")
        elif isinstance(x, float):
            rows.append((name, f"{x:.4g}"))
        else:
            rows.append((name, json.dumps(x) if not isinstance(x, str) else x))

    walk(figures, prefix)
    return rows


def markdown(doc: dict[str, Any]) -> str:
    env = doc.get("environment", {})
    lines = [
        f"# GPU check: {env.get('gpu', 'unknown GPU')}",
        "",
        "Written by `benchmarks/gpu_check.py` (`make gpu-check`); every figure below was measured by the command",
        "shown with it, on the GPU named with it. The JSON file beside this one holds the same records in full.",
        "",
        "| | |",
        "|---|---|",
    ]
    for key in (
        "gpu",
        "gpu_count",
        "gpu_memory_GiB",
        "capability",
        "driver",
        "driver_cuda",
        "torch_cuda",
        "python",
        "platform",
        "host",
        "commit",
    ):
        if key in env:
            value = env[key]
            lines.append(f"| {key} | {value:.1f} |" if isinstance(value, float) else f"| {key} | {value} |")
    for name, version in env.get("versions", {}).items():
        lines.append(f"| {name} | {version or 'not installed'} |")
    lines += ["", "| part | status | seconds | GPU |", "|---|---|---|---|"]
    for name, r in doc.get("parts", {}).items():
        lines.append(f"| {name} | {r['status']} | {r['seconds']} | {r.get('gpu') or ''} |")
    missing = [p.name for p in PARTS if p.name not in doc.get("parts", {})]
    if missing:
        lines += ["", f"Not run: {', '.join(missing)}."]
    for name, r in doc.get("parts", {}).items():
        lines += [
            "",
            f"## {name}: {r['status']}",
            "",
            r.get("what", ""),
            "",
            f"`{r['command']}`",
            "",
            f"Started {r.get('started_utc')}, {r['seconds']} s, exit status "
            f"{r['returncode']}, GPU {r.get('gpu')}, driver {r.get('driver')}.",
        ]
        junit = r.get("figures", {}).get("junit")
        if junit:
            c = junit["counts"]
            lines += ["", f"Tests: {c['passed']} passed, {c['failures']} failed, {c['errors']} errors, {c['skipped']} skipped."]
            lines += [f"- {t}: {v['outcome']} ({v['seconds']:.1f} s)" for t, v in junit["tests"].items()]
        rows = flatten({k: v for k, v in r.get("figures", {}).items() if k != "junit"})
        if rows:
            lines += ["", "| figure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
        if r.get("output_tail"):
            tail = r["output_tail"][-1500:].replace("```", "'''")
            lines += ["", "<details><summary>output (tail)</summary>", "", "```", tail, "```", "", "</details>"]
    return "\n".join(lines) + "\n"


def write_results(out_dir: Path, doc: dict[str, Any], date: str | None = None) -> tuple[Path, Path]:
    """`gpu-<date>-<gpu>.json` and `.md` in `out_dir`, written whole (temp file, then rename)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    date = date or dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    stem = results_stem(doc.get("environment", {}).get("gpu") or "unknown", date)
    paths = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    for path, text in zip(paths, (json.dumps(doc, indent=2, default=str) + "\n", markdown(doc))):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return paths


def load_docs(paths: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(Path(p).read_text()) for p in paths]


# ----------------------------------------------------------------------------- wheels


def wheels_in(folder: Path, unpack_to: Path) -> list[Path]:
    """The wheels a carried folder holds: its *.whl files (the first call's few), and the wheels of
    the split tar its part.* files make (prepare_wheels.sh's, for vLLM), unpacked into `unpack_to`."""
    wheels = sorted(folder.glob("*.whl"))
    parts = sorted(folder.glob("part.*"))
    if parts:
        tar = unpack_to / "wheels.tar"
        with tar.open("wb") as f:
            for p in parts:
                f.write(p.read_bytes())
        shutil.unpack_archive(str(tar), str(unpack_to / "wh"), format="tar")
        wheels += sorted((unpack_to / "wh").glob("*.whl"))
    if not wheels:
        raise SystemExit(f"gpu-check: no wheels (*.whl) and no wheel parts (part.*) in {folder}")
    return wheels


def install_wheels(folder: Path, site: Path = SITE, python: str = sys.executable, quiet: bool = False) -> None:
    """Install the wheels carried in `folder` into `site` (/tmp/site: those not installed there by an
    earlier call on this machine) and put it first on the path of this process and every part. The
    rehearsal on CPU installs the same wheels (its Python's builds) the same way."""
    done = site / ".installed"
    installed = set(done.read_text().split()) if done.is_file() else set()
    with tempfile.TemporaryDirectory(prefix="wheels-") as tmp:
        new = [w for w in wheels_in(folder, Path(tmp)) if w.name not in installed]
        if new:
            subprocess.run(
                [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", str(site)]
                + ["--upgrade", "--disable-pip-version-check", *map(str, new)],
                check=True,
                stdout=subprocess.DEVNULL if quiet else None,
            )
            site.mkdir(parents=True, exist_ok=True)
            done.write_text("\n".join(sorted(installed | {w.name for w in new})) + "\n")
    if site == SITE:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
        sys.path.insert(0, str(SITE))


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default=None, help="comma-separated part names (default: all, in order)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--merge", type=Path, nargs="*", default=[], help="earlier results files to merge into this one")
    ap.add_argument("--max-seconds", type=float, default=ONE_CALL_S, help="time for all parts together (the device allows 600 s a call)")
    ap.add_argument(
        "--wheels", type=Path, default=None, help="a carried folder of wheels (*.whl, or prepare_wheels.sh's part.*) to install first"
    )
    ap.add_argument("--shape", default="8b", help="the random Qwen3 shape of the benchmarks (8b; small for a quick first pass)")
    ap.add_argument("--list", action="store_true", help="print the parts and their commands, run nothing")
    ap.add_argument("--merge-only", action="store_true", help="merge --merge files into --out, run nothing (no GPU needed)")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.parts.split(",") if n.strip()] if args.parts else [p.name for p in PARTS]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown part(s) {unknown}; the parts are {[p.name for p in PARTS]}")
    if args.list:
        for p in PARTS:
            print(f"{p.name:13s} {p.timeout_s:4d} s  {shown(p, args.shape)}\n{'':20s}{p.what}")
        return 0
    if args.merge_only:
        if not args.merge:
            ap.error("--merge-only needs --merge FILE ...")
        paths = write_results(args.out, merge(None, *load_docs(args.merge)))
        print(f"merged {len(args.merge)} file(s) into {paths[0]} and {paths[1]}")
        return 0

    t_start = time.perf_counter()
    if args.wheels is not None:
        install_wheels(args.wheels)
    cuda = probe_cuda()
    if isinstance(cuda, str):
        print(f"gpu-check: no CUDA device: {cuda}; nothing was run and nothing was written", file=sys.stderr)
        return 2
    env_record = environment(cuda)
    vllm_ok = (
        subprocess.run(
            [sys.executable, "-c", "import vllm"],
            capture_output=True,
            env=os.environ
            | {"PYTHONPATH": os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))},
        ).returncode
        == 0
    )
    doc = merge(None, *load_docs(args.merge), {"environment": env_record, "parts": {}})
    paths = write_results(args.out, doc)
    runnable = [n for n in names if vllm_ok or not BY_NAME[n].needs_vllm]
    for name in names:
        part = BY_NAME[name]
        left = args.max_seconds - (time.perf_counter() - t_start)
        limit = part_limit(part, left, [BY_NAME[n] for n in runnable[runnable.index(name) + 1 :]] if name in runnable else [])
        if part.needs_vllm and not vllm_ok:
            record = part_record(
                part, shown(part, args.shape), None, 0.0, "", None, env_record, status="skipped: vLLM cannot be imported here"
            )
        elif limit < 30:
            record = part_record(part, shown(part, args.shape), None, 0.0, "", None, env_record, status="not run: time budget spent")
        else:
            record = run_part(part, env_record, limit, sys.executable, args.shape)
        doc = merge(doc, {"environment": env_record, "parts": {name: record}})
        paths = write_results(args.out, doc)
        print(f"=== {name}: {record['status']} ({record['seconds']} s); results in {paths[0]}", flush=True)
    failed = [n for n in names if not doc["parts"][n]["status"].startswith(("passed", "skipped"))]
    print(f"\ngpu-check: {len(names) - len(failed)} of {len(names)} part(s) passed or skipped; results {paths[0]} and {paths[1]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
