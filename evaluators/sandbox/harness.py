"""Runs inside the sandbox: load candidate.py, call its entry point, write the value as JSON.

Started by `ProcessSandbox` as `python -S -s -B -P harness.py job.json` with cwd = the run's temp
dir. Uses only the standard library, so nothing is imported that the candidate did not ask for.
With -S no site module runs and no .pth file (an editable install's) adds the project to the
path: the job's `sys_path` is the whole import path (the standard library and site-packages,
never the project's source), so a candidate cannot import the evaluators or their data.
When the job names `cgroup_procs` (the run's cgroup, evaluators/sandbox/cgroups.py), the
harness writes its pid there first, so its whole process tree is counted and bounded.
When the job names `isolation` (the process backend, evaluators/sandbox/isolation.py), the harness
then enters new namespaces: from here on it runs as PID 2 of its own PID namespace, with a
read-only view of the host, fresh /tmp and /dev/shm, no network, Landlock and seccomp; the process
its parent started stays outside and exits as it does.
Exit codes: 0 value written to output.json; 1 the candidate raised (traceback on stderr);
3 the entry point is missing; 4 the return value is not JSON data; 5 the harness could not join
the cgroup; 6 it could not isolate the candidate (no candidate code ran in either case).
The candidate shares this interpreter and can subvert all of it; that only hurts itself,
since whatever it leaves in output.json is untrusted data that the parent verifies.

When job.json names a `uid` (the process backend does so when it runs as root), the harness
drops to that unprivileged uid/gid after setting the limits and before any candidate code runs,
so that RLIMIT_NPROC binds, root-only files stay unreadable and host processes cannot be signalled;
with the job's `keyctl` it then joins a new anonymous session keyring, its own.
Standard-library directories the new uid cannot traverse (e.g. an interpreter under /root) are
kept importable through directory descriptors opened before the drop (/proc/self/fd/N).
The docker backend runs this file unchanged inside the container, as a non-root user already.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import sys
import traceback

EXIT_RAISED, EXIT_NO_ENTRY, EXIT_BAD_VALUE, EXIT_NO_CGROUP, EXIT_NO_ISOLATION = 1, 3, 4, 5, 6
ISOLATION_FAILED = "isolation-failed"  # written by root in the run directory: why isolation failed


def _set_limits(job: dict) -> None:
    """Resource limits, applied before any candidate code runs (inherited by its children)."""
    mb = 1024 * 1024
    if job.get("address_space", True):  # off for CUDA programs (SandboxLimits.limit_address_space)
        resource.setrlimit(resource.RLIMIT_AS, (job["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (job["cpu_s"], job["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["fsize_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # RLIMIT_NPROC counts every task (process or thread) of the user, and root ignores it.
    resource.setrlimit(resource.RLIMIT_NPROC, (job["nproc"],) * 2)
    # No POSIX message queues (they outlive the run, and nothing a candidate computes needs one).
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    os.umask(0o077)  # files it creates (in /tmp too) are its own unless it says otherwise


def _join_cgroup(paths: list) -> bool:
    """Move this process into the run's cgroup (every hierarchy); False if any write failed."""
    for path in paths:
        try:
            with open(path, "w", encoding="ascii") as f:
                f.write(str(os.getpid()))
        except OSError as err:
            print(f"could not join the run's cgroup ({path}): {err}", file=sys.stderr, flush=True)
            return False
    return True


def _isolate(spec: dict) -> bool:
    """Namespaces, mounts, Landlock and seccomp (isolation.py, loaded by its path: the project is not
    on the import path); returns in the candidate's process only. False (and why, in the run
    directory's ISOLATION_FAILED, written before any candidate code ran) when it failed."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "isolation.py")
    module_spec = importlib.util.spec_from_file_location("_discover_isolation", path)
    isolation = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(isolation)
    # The run directory as it is now: a failure half-way leaves us in new mounts, our cwd read-only.
    here = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        isolation.enter(spec)
    except isolation.IsolationError as err:
        fd = os.open(ISOLATION_FAILED, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=here)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(str(err))
        print(f"the sandbox could not isolate the candidate: {err}", file=sys.stderr, flush=True)
        return False
    finally:
        os.close(here)  # never left to the candidate: it opens the host's view of the run directory
    return True


def _reachable_by_others(path: str) -> bool:
    """True when every directory from / down to `path` is searchable by any user."""
    path = os.path.realpath(path)
    while True:
        try:
            if not os.stat(path).st_mode & 0o001:
                return False
        except OSError:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def _drop_privileges(uid: int, gid: int, keyctl: int | None = None) -> None:
    """Become `uid`:`gid` with no supplementary groups; keep sys.path importable. With `keyctl`
    (the system call's number, from the host), join a new anonymous session keyring of the uid."""
    import ctypes  # imported now: the standard library may be unreachable after the drop

    libc = ctypes.CDLL(None, use_errno=True)
    moved = {}  # unreachable directory -> /proc/self/fd/N
    for i, entry in enumerate(sys.path):
        if entry and os.path.isdir(entry) and not _reachable_by_others(entry):
            fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
            moved[entry] = sys.path[i] = f"/proc/self/fd/{fd}"

    def remap(path: str) -> str:
        for old, new in moved.items():
            if path == old or path.startswith(old + os.sep):
                return new + path[len(old) :]
        return path

    for module in list(sys.modules.values()):  # packages already imported find submodules here
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            search[:] = [remap(p) for p in search]
    sys.path_importer_cache.clear()
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("could not drop privileges")
    # setuid() made the process non-dumpable, which hides /proc/self/fd from itself.
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    if keyctl is not None:
        # KEYCTL_JOIN_SESSION_KEYRING with no name: @s is new and the run's alone, not the session
        # keyring inherited from us (whose keys a possessor may read, and which concurrent runs
        # would share). Where it fails (no keys in the kernel, a seccomp filter) the candidate
        # cannot use keyrings either.
        libc.syscall.restype = ctypes.c_long
        libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(1), None)


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


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        job = json.load(f)
    if job.get("sys_path") is not None:
        sys.path[:] = [str(p) for p in job["sys_path"]]
    if not _join_cgroup(job.get("cgroup_procs") or []):
        return EXIT_NO_CGROUP
    if job.get("isolation") and not _isolate(job["isolation"]):
        return EXIT_NO_ISOLATION
    _set_limits(job)
    if job.get("uid") is not None:
        _drop_privileges(int(job["uid"]), int(job["gid"]), job.get("keyctl"))
    with open("input.json", encoding="utf-8") as f:
        argument = json.load(f)
    sys.dont_write_bytecode = True

    path = os.path.abspath("candidate.py")
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
    with open("output.json.part", "w", encoding="utf-8") as f:
        f.write(data)
    os.replace("output.json.part", "output.json")
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
