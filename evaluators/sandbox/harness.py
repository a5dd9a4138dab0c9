"""Runs inside the sandbox: load candidate.py, call its entry point, write the value as JSON.

Started as `python -S -s -B -P harness.py JOB [STATUS_FD OUTPUT_FD]`. Uses only the standard
library, so nothing is imported that the candidate did not ask for. With -S no site module runs and
no .pth file adds anything to the path: the job's `sys_path` is the whole import path (the standard
library and the site-packages of the problem's packages, never this project's source).

First, before any candidate code, the launcher (confine.py, next to this file, loaded by its path)
makes this process what a candidate may be: the job's `confine` spec (the run's uid, the resource
limits, the seccomp filter) and, with STATUS_FD, its report to the host on a channel the candidate
never sees. Then the candidate is loaded from `candidate.py` and `entry(argument)` is called with the
argument from `input.json` (both next to JOB); the value goes, as JSON, to OUTPUT_FD (a file the host
opened and reads after the run) or, without one, to `output.json` in the working directory (the
Docker backend, whose runner reads it).
Exit codes: 0 value written; 1 the candidate raised (traceback on stderr); 3 the entry point is
missing; 4 the return value is not JSON data; confine.EXIT_NOT_CONFINED the launcher failed (no
candidate code ran; under a status channel the host knows it from the channel, never from this code).
The candidate shares this interpreter and can subvert all of it after the launcher is done; that
only hurts itself, since whatever it writes is untrusted data that the host verifies.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback

EXIT_RAISED, EXIT_NO_ENTRY, EXIT_BAD_VALUE = 1, 3, 4
OUTPUT_ENV = "DISCOVER_OUTPUT_FD"  # the value's descriptor, for programs that write it themselves


def _launcher(here: str):
    """confine.py, loaded by its path (the project is not on the import path)."""
    spec = importlib.util.spec_from_file_location("_discover_confine", os.path.join(here, "confine.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _to_json(value, depth: int = 0):
    """Plain JSON data from the return value: numpy arrays -> lists, numpy scalars -> numbers."""
    if depth > 100:
        raise ValueError("return value is nested more than 100 levels deep")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value  # NaN/inf stay as they are; the verifier rejects them
    np = sys.modules.get("numpy")  # a numpy value implies the candidate imported numpy
    if np is not None and isinstance(value, (np.ndarray, np.generic)):
        return _to_json(value.tolist(), depth + 1)
    if isinstance(value, (list, tuple)):
        return [_to_json(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_json(v, depth + 1) for k, v in value.items()}
    raise TypeError(f"return value contains a {type(value).__name__}, which is not JSON data")


def _print_candidate_traceback(err: BaseException) -> None:
    """The traceback without this harness's own frames."""
    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    traceback.print_exception(type(err), err, tb, file=sys.stderr)


def _write_value(data: str, output_fd: int | None) -> None:
    if output_fd is None:
        with open("output.json.part", "w", encoding="utf-8") as f:
            f.write(data)
        os.replace("output.json.part", "output.json")
        return
    with os.fdopen(output_fd, "w", encoding="utf-8") as f:
        f.write(data)


def main() -> int:
    job_path = os.path.abspath(sys.argv[1])
    status_fd = int(sys.argv[2]) if len(sys.argv) > 2 else None
    output_fd = int(sys.argv[3]) if len(sys.argv) > 3 else None
    here = os.path.dirname(job_path)
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    if job.get("sys_path") is not None:
        sys.path[:] = [str(p) for p in job["sys_path"]]
    launcher = _launcher(os.path.dirname(os.path.abspath(__file__)))
    try:
        launcher.enter(job.get("confine") or {"require_seccomp": False}, status_fd)
    except launcher.NotConfined as err:
        print(f"the sandbox could not confine the candidate: {err}", file=sys.stderr, flush=True)
        return launcher.EXIT_NOT_CONFINED
    if output_fd is not None:  # for a program that streams its value itself (the denoising driver)
        os.environ[OUTPUT_ENV] = str(output_fd)
    with open(os.path.join(here, "input.json"), encoding="utf-8") as f:
        argument = json.load(f)
    sys.dont_write_bytecode = True

    path = os.path.join(here, "candidate.py")
    with open(path, encoding="utf-8", errors="replace") as f:
        source = f.read()
    try:
        code = compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as err:  # ValueError: source with null bytes
        print("".join(traceback.format_exception_only(type(err), err)), end="", file=sys.stderr)
        return EXIT_RAISED
    spec = importlib.util.spec_from_file_location("candidate", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["candidate"] = module
    try:
        exec(code, module.__dict__)
        fn = getattr(module, job["entry"], None)
        if not callable(fn):
            print(f"program defines no function `{job['entry']}`", file=sys.stderr, flush=True)
            return EXIT_NO_ENTRY
        value = fn(argument)
    except BaseException as err:  # SystemExit too: the candidate never returned a value
        _print_candidate_traceback(err)
        return EXIT_RAISED

    try:
        data = json.dumps(_to_json(value), allow_nan=True)
    except (TypeError, ValueError, RecursionError) as err:
        print(f"bad return value: {err}", file=sys.stderr, flush=True)
        return EXIT_BAD_VALUE
    _write_value(data, output_fd)
    return 0


if __name__ == "__main__":
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # e.g. the output file hit RLIMIT_FSIZE
            pass
    # Skip interpreter teardown (atexit hooks, non-daemon threads the candidate left running).
    os._exit(code)
