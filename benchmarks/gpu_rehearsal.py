"""`make gpu-check REHEARSE=1`: the first call of the GPU check rehearsed on this CPU machine.

    python benchmarks/gpu_rehearsal.py [--parts a,b] [--out benchmarks/results] [--keep-venv]

A lent GPU machine has its image's packages and nothing else (benchmarks/device_image.txt), gets
one call of at most 10 minutes, and whatever fails there before the GPU is reached is device time
lost. This runs the first call's parts (`gpu_check.FIRST_CALL`) as that call runs them, as far as a
machine without a GPU can take them:

1. A virtual environment of the image's packages only (~/.cache/ttt-discover/gpu-rehearsal/venv, kept
   between runs, or DISCOVER_REHEARSAL_DIR/venv): the
   distributions the parts import, at the image's versions where the list gives them (else the
   newest release before the list was read, `IMAGE_READ`), with no project lock involved; then the
   wheels the first call carries (benchmarks/first_call_wheels.txt) installed the way the call
   installs them (`gpu_check.install_wheels` into a site folder put first on the path). The
   carried cp312 wheels are downloaded into `.whl/first-call`, the folder the real call carries.
2. Each part, in order, with the real call's arguments (the 8B shape included) and environment
   (sandbox isolation "none": the lent machine has no bubblewrap), in that environment, with
   benchmarks/rehearsal_site first on the path: torch reports one CUDA device and the first call
   that would initialise CUDA stops the process there and records where (sitecustomize.py); a fake
   nvidia-smi names one H200. A part passes when it got there: its own process stopped at the first
   CUDA call, or (TriMul) every kernel its tests ran got as far as the sandboxed process's question
   for a CUDA device, which the machine without a GPU answers no.
3. Each part's code past the GPU on CPU (`PAST_CUDA`: the same scripts' CPU variants, on tiny
   shapes, and the TriMul CPU check): what the image's library versions do with it (transformers 5,
   say) is seen here too.

Reported per part, in benchmarks/results/gpu-rehearsal.{json,md}: the imports resolved (every
module a process of the part imported, with the distribution it came from: image or carried),
the carried wheels it needed, bytes written to disk, time and CPU time here, and the device time
predicted for the real call with the arithmetic written out (`predict`). Exits 0 only when every
part reached CUDA and every check past it passed.

What differs from the lent machine, and is said in the report: Python 3.11 here, 3.12 there
(the same package versions, except `STANDINS`); the carried wheels are installed here as their
cp311 builds of the same versions; no GPU, so nothing measured past the first CUDA call says
anything about the GPU's speed.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.metadata
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(ROOT))

import gpu_check  # noqa: E402

IMAGE_LIST = HERE / "device_image.txt"
FIRST_CALL_WHEELS = HERE / "first_call_wheels.txt"
CARRIED = ROOT / ".whl" / "first-call"  # the folder the real first call carries (device `carry`), git-ignored
# The image's environment (5 GB, hard links into uv's cache) is kept between runs and clones, in the
# user's cache, rebuilt whenever what it must hold changes (its stamp, venv.requirements): building it
# (and compiling its bytecode, as pip does in the image) was most of the rehearsal's time.
WORK = Path(
    os.environ.get("DISCOVER_REHEARSAL_DIR")
    or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ttt-discover", "gpu-rehearsal")
)
SHIM = HERE / "rehearsal_site"  # sitecustomize.py and bin/nvidia-smi
IMAGE_READ = "2026-11-18"  # the image's list was read on 2026-11-17: an unversioned package is taken as of then
DEVICE_PYTHON = "3.12"  # the lent machine's (3.12.3)
DEVICE_PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
DEVICE_ISOLATION = "none"  # no bubblewrap on the lent machine (docs/gpu-check.md)
# The image's version where this machine's Python (3.11) has no wheel of it: the newest that has one, and why.
STANDINS = {"numpy": ("2.4.6", "numpy 2.5 ships no CPython 3.11 wheels")}
# What the sandboxed TriMul processes answer on a machine without a GPU: their first CUDA question
# (evaluators/kernels/trimul/driver.py and checker.py; tests/test_gpu_rehearsal.py holds them to it).
SANDBOX_NO_CUDA = "no CUDA device is visible"
REACHED_EXIT = 97  # rehearsal_site/sitecustomize.py's exit status at the first CUDA call
TRAVELS_MAX = 64 * 2**20  # what a device call takes along: the working tree and the carried paths
# Each command's limit here: this machine's speed and load say nothing about the lent machine's, so a
# part is never failed for its time here; its time goes into the prediction, which the report sets
# against the part's limit on the device.
CPU_LIMIT_S = 1200

# Modules the parts' code imports only on paths the first call does not take, and why. Every other
# third-party import of the parts must be in the image or carried (tests/test_gpu_rehearsal.py);
# the rehearsal itself shows these are not imported (its venv does not have them).
NOT_ON_THE_CHECKS_PATH = {
    "docker": "the Docker SDK, asked for only to use the Docker backend; a lent machine has no Docker engine and TriMul runs "
    "in the process backend",
    "pyseccomp": "the process backend's seccomp filter, built only with sandbox.isolation standard (bubblewrap); the lent "
    "machine has none and runs isolation none",
    "gguf": "reads packaged GGUF models (model.name smollm2-135m); the check's models are random Qwen3 shapes",
    "prefect": "tests/conftest.py's Prefect server fixtures, which the TriMul GPU tests do not use",
}

# Past the first CUDA call, on CPU: the command that runs each part's code further with the image's
# packages ("{python}" filled in). The benchmarks' own CPU variants (tiny shapes) and TriMul's CPU check.
PAST_CUDA: dict[str, tuple[str, ...]] = {
    "train-fp32": ("{python}", "benchmarks/training.py", "--lora-dtype", "float32", "--offload-cycles", "1"),
    "train-bf16": ("{python}", "benchmarks/training.py", "--lora-dtype", "bfloat16"),
    "resident": ("{python}", "benchmarks/resident_step.py"),
    # the hostile kernels only: under numpy >= 2.4 (the image has 2.5.2) Triton 3.6's interpreter fails on
    # a loop bound taken from a kernel argument (`int()` of a one-element array), so the initial kernel's
    # CPU check fails here; the GPU runs compiled Triton, not the interpreter (pyproject.toml keeps numpy < 2.4)
    "trimul-tests": ("{python}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_trimul_cpu.py", "-k", "hostile"),
}

# Device costs the rehearsal cannot measure, assumed for the predictions (each used by name in the
# arithmetic the report prints). The first real call measures them; set the figures against these.
ASSUMED = {
    "peak_TFLOPs": 989.4,  # dense bf16 of an H100 SXM / H200 (benchmarks/gpu_common.py)
    "MFU": 0.35,  # of the 8B LoRA step at the paper's lengths (counted FLOPs, benchmarks/training.py)
    "model_init_s": 5.0,  # random init of the 8B weights on the GPU (kernel launches per tensor)
    "host_device_GBps": 12.0,  # pageable copies between host and GPU memory (offload, load)
    "disk_write_GBps": 1.0,  # safetensors written to the lent machine's disk
    "disk_read_GBps": 2.0,  # read back (mostly from the page cache)
    # one TriMul evaluation of a kernel that is timed: three processes' CUDA start-up, Triton's compile,
    # 18 checked calls, per benchmark shape 24 calibration round trips and up to 100 timed calls
    # (evaluators/kernels/trimul/problem.py, TIMING), the checker's reference for the sampled calls
    "trimul_timed_eval_s": 12.0,
    "trimul_rejected_eval_s": 4.0,  # one that is stopped at its first wrong call (or before it runs): start-up, compile, a call
}

# The TriMul evaluations each test of tests/test_gpu_rehearsal.py makes on a GPU, (timed, rejected):
# here every one stops at its first evaluation, which gets no CUDA device, so they are declared
# (tests/test_gpu_rehearsal.py holds the names to the test file). A hostile kernel is evaluated
# twice, with the rules read before running and without (some are stopped before they run).
TRIMUL_TEST_EVALUATIONS = {
    "test_the_reference_and_the_initial_kernel_are_timed": (2, 0),
    "test_each_hostile_kernel_earns_nothing": (0, 2),
    "test_a_side_stream_kernel_earns_nothing": (0, 2),
    "test_five_timings_of_one_kernel_and_their_spread": (5, 0),
    "test_an_honest_torch_compile_kernel_is_timed_and_rewarded": (1, 0),
    "test_slowing_the_calls_it_is_not_timed_on_gains_nothing_on_a_gpu": (2, 0),
}


# ----------------------------------------------------------------------------- package lists


def norm(name: str) -> str:
    """A distribution's name as package indexes compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_list(path: Path) -> dict[str, str | None]:
    """`name` or `name==version` lines (comments and blanks skipped) -> {normalised name: version or None}."""
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[norm(name)] = version.strip() or None
    return out


def image_packages() -> dict[str, str | None]:
    return read_list(IMAGE_LIST)


def carried_packages() -> dict[str, str | None]:
    return read_list(FIRST_CALL_WHEELS)


# ----------------------------------------------------------------------------- what the parts import


@dataclass(frozen=True)
class ImportSite:
    module: str  # top-level name
    where: str  # file:line
    guarded: bool  # inside a try that catches ImportError (or broader)


LOCAL_PACKAGES = ("cli", "discover", "evaluators", "flows", "storage", "tests")


def _local_file(name: str) -> Path | None:
    """The checkout's file of module `name` (a package's __init__.py), or None when it is not ours."""
    parts = name.split(".")
    bases = [ROOT] if parts[0] in LOCAL_PACKAGES else [HERE]  # benchmarks' scripts import their neighbours
    for base in bases:
        p = base.joinpath(*parts)
        if (p / "__init__.py").is_file():
            return p / "__init__.py"
        if p.with_suffix(".py").is_file():
            return p.with_suffix(".py")
    return None


def _catches_import_errors(node: ast.Try) -> bool:
    names = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
    for h in node.handlers:
        if h.type is None:
            return True
        caught = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        if any(isinstance(c, ast.Name) and c.id in names for c in caught):
            return True
    return False


def _imports(tree: ast.AST, modname: str, is_package: bool):
    """(imported module name, line, guarded) for every import in the module, at any depth, except
    under `if TYPE_CHECKING:`."""

    def walk(node: ast.AST, guarded: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                for a in child.names:
                    yield a.name, child.lineno, guarded
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    pkg = modname.split(".") if is_package else modname.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (child.level - 1)]
                    base = ".".join(pkg + ([child.module] if child.module else []))
                else:
                    base = child.module or ""
                yield base, child.lineno, guarded
                for a in child.names:
                    yield f"{base}.{a.name}", child.lineno, guarded
            yield from walk(child, guarded or (isinstance(child, ast.Try) and _catches_import_errors(child)))

    yield from walk(tree, False)


def third_party_imports(entries: list[Path], modules: list[str] = ()) -> list[ImportSite]:
    """Every import of a module outside the checkout and the standard library made by `entries` (files)
    and `modules` (names run with -m), following the checkout's own modules they import, at any depth
    (a function's imports included: they run when it does)."""
    seen: set[Path] = set()
    sites: list[ImportSite] = []

    def visit(path: Path, modname: str) -> None:
        if path in seen:
            return
        seen.add(path)
        tree = ast.parse(path.read_text(), str(path))
        for name, line, guarded in _imports(tree, modname, path.name == "__init__.py"):
            local = _local_file(name) if name else None
            if local is not None:
                visit(local, name)
                continue
            top = name.split(".")[0]
            if top and top not in sys.stdlib_module_names and _local_file(top) is None and top != "__future__":
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                sites.append(ImportSite(top, f"{shown}:{line}", guarded))

    for entry in entries:
        visit(entry, entry.stem)
    sites += [ImportSite(m.split(".")[0], "(run with python -m)", False) for m in modules]
    return sites


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distribution_of(module: str) -> str:
    """The (normalised) distribution that provides top-level `module` in this environment, or the
    module's own name where none here does."""
    dists = _packages_distributions().get(module)
    return norm(dists[0]) if dists else norm(module)


def part_entries(part: gpu_check.Part) -> tuple[list[Path], list[str]]:
    """The files a part runs (its script, or pytest's test files and their conftest) and the modules it runs with -m."""
    files, modules = [], []
    argv = list(part.argv)
    for i, arg in enumerate(argv):
        if arg.endswith(".py"):
            files.append(ROOT / arg)
        if arg == "-m" and i + 1 < len(argv) and argv[i - 1] == "{python}":
            modules.append(argv[i + 1])
    if "pytest" in modules:
        files.append(ROOT / "tests" / "conftest.py")
    return files, modules


def unprovided_imports(part: gpu_check.Part) -> list[ImportSite]:
    """A part's imports that neither the image nor the carried wheels provide and that are neither
    guarded nor declared off the check's path (NOT_ON_THE_CHECKS_PATH): each would fail on the machine."""
    provided = set(image_packages()) | set(carried_packages())
    files, modules = part_entries(part)
    return [
        s
        for s in third_party_imports(files, modules)
        if not s.guarded and s.module not in NOT_ON_THE_CHECKS_PATH and distribution_of(s.module) not in provided
    ]


def needed_distributions(parts: list[gpu_check.Part]) -> list[str]:
    """The image's distributions the parts import (what the rehearsal's environment installs, with their requirements)."""
    image = image_packages()
    out = set()
    for part in parts:
        files, modules = part_entries(part)
        for s in third_party_imports(files, modules):
            d = distribution_of(s.module)
            if d in image and s.module not in NOT_ON_THE_CHECKS_PATH:
                out.add(d)
    return sorted(out)


# ----------------------------------------------------------------------------- the environment


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    print("$ " + " ".join(map(str, cmd)), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def pip() -> list[str]:
    """A pip to download wheels with (the project's environment has none: uv made it)."""
    tools = ROOT / ".cache" / "tools" / "bin" / "python"
    return [str(tools), "-m", "pip"] if tools.exists() else [sys.executable, "-m", "pip"]


def uv() -> str:
    for candidate in (ROOT / ".cache" / "tools" / "bin" / "uv", shutil.which("uv")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    raise SystemExit("gpu rehearsal: uv is needed to build the image's environment (make setup installs it in .cache/tools)")


def requirement_lines(names: list[str]) -> tuple[list[str], list[str]]:
    """(requirement lines for the image's `names`, notes on where they differ from the image)."""
    image = image_packages()
    lines, notes = [], []
    for name in names:
        version = image[name]
        if name in STANDINS:
            standin, why = STANDINS[name]
            notes.append(f"{name} {standin} instead of the image's {version}: {why}")
            version = standin
        lines.append(f"{name}=={version}" if version else name)
        if not version:
            notes.append(f"{name}: the image's version was not published; the newest before {IMAGE_READ} is used")
    return lines, notes


def download_carried(dest: Path, python_version: str) -> list[Path]:
    """The first call's wheels (benchmarks/first_call_wheels.txt) for CPython `python_version` on x86-64 Linux, into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    want = carried_packages()
    have = {norm(w.name.split("-")[0]): w for w in dest.glob("*.whl")}
    if any(name not in have or f"-{version}-" not in have[name].name for name, version in want.items()):
        for w in dest.glob("*.whl"):
            w.unlink()
        plat = [a for p in DEVICE_PLATFORMS for a in ("--platform", p)]
        _run(
            [
                *pip(),
                "download",
                "-q",
                "--disable-pip-version-check",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                python_version,
            ]
            + ["--implementation", "cp", *plat, "-d", str(dest), "-r", str(FIRST_CALL_WHEELS)]
        )
    return sorted(dest.glob("*.whl"))


def working_tree_bytes() -> int:
    """The bytes of what a device call sends of the checkout: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True, check=True
    ).stdout
    paths = {ROOT / p for p in listed.decode().split("\0") if p}
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def build_environment(parts: list[gpu_check.Part], fresh: bool) -> tuple[Path, Path, dict[str, Any]]:
    """(the venv's python, the carried wheels' site folder, what was installed and how it differs from the machine)."""
    venv, site = WORK / "venv", WORK / "site"
    names = needed_distributions(parts) + ["pytest"]
    lines, notes = requirement_lines(sorted(set(names)))
    stamp = WORK / "venv.requirements"
    wanted = "\n".join(lines) + f"\n# exclude-newer {IMAGE_READ}\n"
    if fresh or not (venv / "bin" / "python").exists() or not stamp.is_file() or stamp.read_text() != wanted:
        shutil.rmtree(venv, ignore_errors=True)
        shutil.rmtree(site, ignore_errors=True)
        WORK.mkdir(parents=True, exist_ok=True)
        _run([uv(), "venv", "-q", "--seed", "--python", sys.executable, str(venv)])  # with pip: the call installs wheels with it
        req = WORK / "requirements.txt"
        req.write_text("\n".join(lines) + "\n")
        env = os.environ | {"UV_LINK_MODE": os.environ.get("UV_LINK_MODE_REHEARSAL", "hardlink"), "UV_COMPILE_BYTECODE": "1"}
        env.pop("VIRTUAL_ENV", None)
        _run(
            [uv(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--exclude-newer", IMAGE_READ, "-r", str(req)], env=env
        )
        stamp.write_text(wanted)
    python = venv / "bin" / "python"
    # the carried wheels, as the call installs them: into a site folder first on the path
    cp311 = download_carried(WORK / "carried-cp311", f"{sys.version_info.major}.{sys.version_info.minor}")
    gpu_check.install_wheels(WORK / "carried-cp311", site=site, python=str(python), quiet=True)
    installed = json.loads(
        subprocess.run(
            [uv(), "pip", "list", "--python", str(python), "--format", "json"], capture_output=True, text=True, check=True
        ).stdout
    )
    image = image_packages()
    carried = carried_packages()
    extra = sorted(norm(d["name"]) for d in installed if norm(d["name"]) not in image and norm(d["name"]) not in carried)
    return (
        python,
        site,
        {
            "python": subprocess.run(
                [str(python), "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True
            ).stdout.strip(),
            "device_python": DEVICE_PYTHON,
            "installed": {norm(d["name"]): d["version"] for d in installed},
            "not_in_the_image_list": extra,
            "carried_here_as": [w.name for w in cp311],
            "differences": notes,
        },
    )


# ----------------------------------------------------------------------------- running a part


@dataclass
class Run:
    returncode: int | None
    seconds: float
    cpu_seconds: float
    bytes_written: int
    output: str
    records: list[dict[str, Any]]
    pid: int
    junit: dict[str, Any] | None


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def run(argv: list[str], env: dict[str, str], timeout_s: float, junit: Path | None = None, cache: Path | None = None) -> Run:
    """One command as the GPU check runs a part (`gpu_check.run_with_limit`), with its time, CPU time
    and bytes written (the kernel's count of what it and its waited-for descendants wrote, plus what
    it left in `cache`), and the shim's records."""
    markers = Path(env["GPU_CHECK_REHEARSAL_DIR"]) if env.get("GPU_CHECK_REHEARSAL_DIR") else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    code, output, pid = gpu_check.run_with_limit(argv, env, timeout_s)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    written = (after.ru_oublock - before.ru_oublock) * 512 + (_tree_bytes(cache) if cache and cache.exists() else 0)
    records = [json.loads(p.read_text()) for p in sorted(markers.glob("*.json"))] if markers else []
    figures = gpu_check.junit_figures(junit) if junit is not None and junit.is_file() else None
    return Run(code, seconds, cpu, written, output, records, pid, figures)


def rehearse_part(part: gpu_check.Part, python: Path, site: Path, scratch: Path) -> dict[str, Any]:
    """The part to its first CUDA call (with the real call's arguments) and its code past it on CPU."""
    scratch.mkdir(parents=True)
    markers, cache = scratch / "markers", scratch / "cache"
    markers.mkdir()
    junit = scratch / "junit.xml"
    argv = gpu_check.filled_argv(part, str(python), str(scratch / "figures.json"), str(junit), "8b", DEVICE_ISOLATION)
    base = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and not k.startswith("DISCOVER_")}
    base |= {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "DISCOVER_CACHE": str(cache)}
    env = base | gpu_check.filled_env(part, DEVICE_ISOLATION)
    env |= {
        "PYTHONPATH": os.pathsep.join([str(SHIM), env["PYTHONPATH"]]),
        "PATH": os.pathsep.join([str(SHIM / "bin"), env.get("PATH", "")]),
        "GPU_CHECK_REHEARSAL_DIR": str(markers),
    }
    print(f"\n=== {part.name}: to the first CUDA call: {gpu_check.shown(part, '8b', DEVICE_ISOLATION)}", flush=True)
    to_cuda = run(argv, env, CPU_LIMIT_S, junit=junit, cache=cache)
    figures = json.loads((scratch / "figures.json").read_text()) if (scratch / "figures.json").is_file() else {}
    verdict = reached(part, to_cuda, figures)
    print(f"    {verdict['status']}: {verdict['detail']}", flush=True)
    past = None
    if part.name in PAST_CUDA:
        past_argv = [a.replace("{python}", str(python)) for a in PAST_CUDA[part.name]]
        past_env = base | gpu_check.filled_env(part, DEVICE_ISOLATION)
        print(f"=== {part.name}: past it, on CPU: {' '.join(past_argv[1:])}", flush=True)
        p = run(past_argv, past_env, CPU_LIMIT_S, cache=cache)
        past = {
            "command": " ".join(["python", *past_argv[1:]]),
            "returncode": p.returncode,
            "seconds": round(p.seconds, 1),
            "passed": p.returncode == 0,
            "output_tail": p.output[-2500:],
        }
        print(f"    {'passed' if past['passed'] else 'FAILED'} ({past['seconds']} s)", flush=True)
    modules: dict[str, str | None] = {}
    for r in to_cuda.records:
        modules.update({m: d for m, d in r["modules"].items() if d})
    image, carried = image_packages(), carried_packages()
    dists = sorted({norm(d) for d in modules.values() if d})
    return {
        "part": part.name,
        "command": gpu_check.shown(part, "8b", DEVICE_ISOLATION),
        "limit_s": part.timeout_s,
        "reached_cuda": verdict["status"] == "reached",
        "status": verdict["status"],
        "detail": verdict["detail"],
        "where": verdict.get("where", []),
        "returncode": to_cuda.returncode,
        "seconds": round(to_cuda.seconds, 2),
        "cpu_seconds": round(to_cuda.cpu_seconds, 2),
        "bytes_written": to_cuda.bytes_written,
        "processes": len(to_cuda.records),
        "distributions_imported": {d: ("carried" if d in carried else "image" if d in image else "NEITHER") for d in dists},
        "carried_needed": [d for d in dists if d in carried],
        "tests": sorted(to_cuda.junit["tests"]) if to_cuda.junit else [],
        "past_cuda": past,
        "output_tail": to_cuda.output[-3000:],
    }


def reached(part: gpu_check.Part, r: Run, figures: dict[str, Any]) -> dict[str, Any]:
    """Whether the part got to its first CUDA call, and where (see the module docstring)."""
    provided = set(image_packages()) | set(carried_packages())
    unprovided = sorted({m for rec in r.records for m, d in rec["modules"].items() if d and norm(d) not in provided})
    if unprovided:
        return {"status": "failed", "detail": f"imported modules neither the image nor the carried wheels provide: {unprovided}"}
    main = [rec for rec in r.records if rec["pid"] == r.pid]
    if r.returncode == REACHED_EXIT and main and main[0]["reached_cuda"]:
        ours = [w for w in main[0]["where"] if w.startswith(str(ROOT))] or main[0]["where"]
        return {"status": "reached", "detail": f"first CUDA call at {ours[-1].removeprefix(str(ROOT) + '/')}", "where": main[0]["where"]}
    if r.junit is not None:
        bad = {t: v for t, v in r.junit["tests"].items() if v["outcome"] in ("failed", "error") and not _no_cuda_failure(r.output, t)}
        if bad or not r.junit["tests"]:
            return {"status": "failed", "detail": f"tests that failed before any CUDA call: {sorted(bad) or 'none collected'}"}
        return {
            "status": "reached",
            "detail": f"{len(r.junit['tests'])} tests ran; every kernel they evaluated got as far as the sandboxed process's "
            "question for a CUDA device (each failing test stopped at its first)",
        }
    kernels = figures.get("kernels") or {}
    if kernels and all(SANDBOX_NO_CUDA in k["reason"] for k in kernels.values()) and "Traceback" not in r.output:
        return {
            "status": "reached",
            "detail": f"its {len(kernels)} kernels got as far as the sandboxed process's question for a CUDA device",
        }
    tail = (r.output.strip().splitlines() or ["(no output)"])[-1]
    return {"status": "failed", "detail": f"exit status {r.returncode} before any CUDA call: {tail}"}


def _no_cuda_failure(output: str, test_id: str) -> bool:
    """Whether pytest's report of failed test `test_id` shows it failed at the sandbox's missing CUDA device."""
    name = test_id.split("::")[-1]
    start = output.find(f"_ {name} _")
    if start < 0:
        return False
    end = output.find("\n___", start + 1)
    return SANDBOX_NO_CUDA in output[start : end if end > 0 else None]


# ----------------------------------------------------------------------------- predictions


def _weights(shape: str) -> int:
    """Parameters of a Qwen3 shape (embedding, layers, norms, head)."""
    from discover.policy.qwen3_model import SHAPES

    c = SHAPES[shape]
    h, i, layers, d = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["head_dim"]
    attn = h * c["num_attention_heads"] * d * 2 + h * c["num_key_value_heads"] * d * 2 + 2 * d
    per_layer = attn + 3 * h * i + 2 * h
    head = 0 if c.get("tie_word_embeddings") else c["vocab_size"] * h
    return c["vocab_size"] * h + layers * per_layer + h + head


def _step_flops(shape: str, comps: list) -> float:
    """Counted FLOPs of a training step on `comps` (benchmarks/training.py), with the learner's forward
    that gradient checkpointing computes again: a quarter more (two forwards and a backward of about
    two forwards are counted)."""
    from training import counted_flops

    from discover.policy.qwen3_model import SHAPES

    counted, _ = counted_flops(SimpleNamespace(**SHAPES[shape]), comps, 0)
    return counted * 1.25


def _trimul_term(timed: int, rejected: int, what: str) -> tuple[str, float, str]:
    a = ASSUMED
    seconds = timed * a["trimul_timed_eval_s"] + rejected * a["trimul_rejected_eval_s"]
    how = f"{timed} timed x {a['trimul_timed_eval_s']} s + {rejected} rejected x {a['trimul_rejected_eval_s']} s"
    return (f"TriMul evaluations' GPU work ({what})", seconds, how)


def predict(part: gpu_check.Part, rehearsed: dict[str, Any]) -> dict[str, Any]:
    """The device time predicted for the real call's part: the time to the first CUDA call measured here, plus
    the GPU's work by the arithmetic shown (ASSUMED figures by name)."""
    a = ASSUMED
    cpu_side = rehearsed["seconds"]
    terms: list[tuple[str, float, str]] = [("to the first CUDA call (measured here)", cpu_side, f"{cpu_side:.1f} s")]
    argv = gpu_check.filled_argv(part, "python", "F.json", "J.xml", "8b", DEVICE_ISOLATION)
    rate = a["peak_TFLOPs"] * 1e12 * a["MFU"]
    if part.name.startswith("train-"):
        import training

        args = training.parser().parse_args(argv[2:])
        from discover.policy.qwen3_model import SHAPES

        comps = training.rollouts(
            args.rollouts, args.prompt_tokens, args.min_completion, args.max_completion, SHAPES[args.shape]["vocab_size"]
        )
        warm, step = _step_flops(args.shape, comps[:1]), _step_flops(args.shape, comps)
        gb = _weights(args.shape) * 2 / 1e9
        terms += [
            ("random 8B weights on the GPU", a["model_init_s"], "model_init_s"),
            ("warm-up step (1 rollout)", warm / rate, f"{warm / 1e15:.2f} PFLOP / ({a['peak_TFLOPs']} TFLOP/s x MFU {a['MFU']})"),
            ("the timed step", step / rate, f"{step / 1e15:.2f} PFLOP / ({a['peak_TFLOPs']} TFLOP/s x MFU {a['MFU']})"),
        ]
        if args.offload_cycles:
            secs = args.offload_cycles * 2 * gb / a["host_device_GBps"]
            terms.append(("offload and reload", secs, f"{args.offload_cycles} x 2 x {gb:.1f} GB / {a['host_device_GBps']} GB/s"))
    elif part.name == "resident":
        import resident_step
        import training

        args = resident_step.parser().parse_args(argv[2:])
        from discover.policy.qwen3_model import SHAPES

        comps = training.rollouts(
            args.rollouts, args.prompt_tokens, args.completion_tokens, args.completion_tokens, SHAPES[args.shape]["vocab_size"]
        )
        step = _step_flops(args.shape, comps)
        gb = _weights(args.shape) * 2 / 1e9
        terms += [
            ("random 8B weights on the GPU", a["model_init_s"], "model_init_s"),
            ("written to disk once", gb / a["disk_write_GBps"], f"{gb:.1f} GB / {a['disk_write_GBps']} GB/s"),
            (
                "read back and moved to the GPU",
                gb / a["disk_read_GBps"] + gb / a["host_device_GBps"],
                f"{gb:.1f} GB / {a['disk_read_GBps']} GB/s + {gb:.1f} GB / {a['host_device_GBps']} GB/s",
            ),
            ("two steps", 2 * step / rate, f"2 x {step / 1e15:.2f} PFLOP / ({a['peak_TFLOPs']} TFLOP/s x MFU {a['MFU']})"),
        ]
    elif part.name == "trimul-bench":
        timed = 2 + int(argv[argv.index("--repeats") + 1])  # the reference, the initial kernel, its repeats
        terms.append(_trimul_term(timed, 0, "the reference, the initial kernel and its repeats"))
    elif part.name == "trimul-tests":
        counts = [TRIMUL_TEST_EVALUATIONS[t.split("::")[-1].split("[")[0]] for t in rehearsed["tests"]]
        terms.append(_trimul_term(sum(c[0] for c in counts), sum(c[1] for c in counts), f"{len(counts)} tests"))
    total = sum(t[1] for t in terms)
    written = _weights("8b") * 2 if part.name == "resident" else 0  # the only part that writes the model to disk
    return {
        "predicted_s": round(total, 1),
        "device_bytes_written": rehearsed.get("bytes_written", 0) + written,
        "limit_s": part.timeout_s,
        "fits": total <= part.timeout_s,
        "arithmetic": [{"term": t, "seconds": round(s, 1), "as": how} for t, s, how in terms],
    }


# ----------------------------------------------------------------------------- report


def markdown(doc: dict[str, Any]) -> str:
    env = doc["environment"]
    lines = [
        "# GPU check rehearsed on CPU",
        "",
        f"Written by `make gpu-check REHEARSE=1` (benchmarks/gpu_rehearsal.py) at commit {doc['commit']}, {doc['date']}, on "
        f"{doc['machine']}. Every part of the first call run in an environment of the lent machine's image's packages "
        f"(Python {env['python']} here, {env['device_python']} there), with the real call's arguments, to its first CUDA "
        "call; then its code past that call on CPU. The device times are predictions: the arithmetic is shown, its "
        "assumed figures (ASSUMED in the script) are what the first real call measures.",
        "",
        f"Result: **{'every part reached its first CUDA call' if doc['ok'] else 'NOT every part got there'}**; "
        f"limits add up to {doc['limits_total_s']} s, predictions to {doc['predicted_total_s']} s. What the call takes along: "
        f"the working tree {doc['travels']['working_tree_bytes']:,} bytes + the carried wheels {doc['travels']['carried_bytes']:,} "
        f"bytes of at most {doc['travels']['max_bytes']:,}.",
        "",
        "| part | reached CUDA | here s | CPU s | bytes written here | carried wheels needed | past CUDA on CPU | predicted "
        "device s | limit s | predicted bytes written there |",
        "|---|---|---:|---:|---:|---|---|---:|---:|---:|",
    ]
    for r in doc["parts"]:
        past = r["past_cuda"]
        lines.append(
            f"| {r['part']} | {'yes' if r['reached_cuda'] else 'NO: ' + r['detail']} | {r['seconds']} | {r['cpu_seconds']} | "
            f"{r['bytes_written']:,} | {', '.join(r['carried_needed']) or 'none'} | "
            f"{'n/a' if past is None else ('passed' if past['passed'] else 'FAILED')} | {r['prediction']['predicted_s']} | "
            f"{r['prediction']['limit_s']} | {r['prediction']['device_bytes_written']:,} |"
        )
    lines += ["", "## Environment", ""]
    lines += [f"- {d}" for d in env["differences"]] or ["- no differences in versions"]
    lines += [f"- installed: {', '.join(f'{k} {v}' for k, v in sorted(env['installed'].items()))}"]
    extra = ", ".join(env["not_in_the_image_list"]) or "none"
    lines += [f"- installed though neither the image's list nor the carried wheels have them (requirements of listed packages): {extra}"]
    lines += [
        f"- the carried wheels (the real call carries their cp312 builds, {doc['carried']['bytes']:,} bytes in "
        f"`{doc['carried']['folder']}`): {', '.join(doc['carried']['files'])}"
    ]
    for r in doc["parts"]:
        lines += ["", f"## {r['part']}", "", f"`{r['command']}`", "", r["detail"]]
        if r["where"]:
            lines += ["", "Where the first CUDA call came from (innermost last):", ""] + [f"- `{w}`" for w in r["where"]]
        lines += ["", "Distributions imported: " + ", ".join(f"{d} ({s})" for d, s in r["distributions_imported"].items())]
        p = r["prediction"]
        lines += ["", f"Predicted device time {p['predicted_s']} s (limit {p['limit_s']} s):", ""]
        lines += [f"- {t['term']}: {t['seconds']} s ({t['as']})" for t in p["arithmetic"]]
        if r["past_cuda"]:
            pc = r["past_cuda"]
            lines += ["", f"Past CUDA on CPU: `{pc['command']}`: {'passed' if pc['passed'] else 'FAILED'} ({pc['seconds']} s)."]
            if not pc["passed"]:
                lines += ["", "```", pc["output_tail"][-1500:].replace("```", "'''"), "```"]
        if not r["reached_cuda"]:
            lines += ["", "```", r["output_tail"][-1500:].replace("```", "'''"), "```"]
    lines += ["", "## Assumed device figures", ""] + [f"- {k}: {v}" for k, v in ASSUMED.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default=None, help="comma-separated parts of the first call (default: all, in order)")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="where gpu-rehearsal.json and .md are written")
    ap.add_argument("--fresh", action="store_true", help="build the image's environment again even if it is up to date")
    args = ap.parse_args(argv)
    first = list(gpu_check.FIRST_CALL)
    names = [n.strip() for n in args.parts.split(",")] if args.parts else [p.name for p in first]
    unknown = [n for n in names if n not in {p.name for p in first}]
    if unknown:
        ap.error(f"not parts of the first call: {unknown}; they are {[p.name for p in first]}")
    parts = [p for p in first if p.name in names]
    missing = {p.name: [f"{s.module} ({s.where})" for s in unprovided_imports(p)] for p in parts}
    missing = {k: v for k, v in missing.items() if v}
    if missing:
        print(f"gpu rehearsal: imports neither the image nor the carried wheels provide: {missing}", file=sys.stderr)
        return 1
    carried = download_carried(CARRIED, DEVICE_PYTHON)
    python, site, env = build_environment(parts, args.fresh)
    results = []
    with tempfile.TemporaryDirectory(prefix="gpu-rehearsal-") as tmp:
        for part in parts:
            r = rehearse_part(part, python, site, Path(tmp) / part.name)
            r["prediction"] = predict(part, r)
            results.append(r)
    tree, carried_bytes = working_tree_bytes(), sum(w.stat().st_size for w in carried)
    fits = tree + carried_bytes <= TRAVELS_MAX
    ok = fits and all(r["reached_cuda"] and (r["past_cuda"] is None or r["past_cuda"]["passed"]) for r in results)
    doc = {
        "kind": "gpu-rehearsal",
        "ok": ok,
        "date": time.strftime("%Y-%m-%d"),
        "commit": gpu_check._run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]) or "unknown",
        "machine": f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the end",
        "environment": env,
        "carried": {
            "folder": str(CARRIED.relative_to(ROOT)),
            "files": [w.name for w in carried],
            "bytes": carried_bytes,
        },
        "travels": {"working_tree_bytes": tree, "carried_bytes": carried_bytes, "max_bytes": TRAVELS_MAX, "fits": fits},
        "limits_total_s": sum(p.timeout_s for p in parts),
        "predicted_total_s": round(sum(r["prediction"]["predicted_s"] for r in results), 1),
        "assumed": ASSUMED,
        "parts": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-rehearsal.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "gpu-rehearsal.md").write_text(markdown(doc))
    print(f"\n{markdown(doc).split('## Environment')[0]}")
    print(f"gpu rehearsal: {'every part reached its first CUDA call' if ok else 'FAILED'}; report in {args.out / 'gpu-rehearsal.md'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
