"""The contract every sandbox backend keeps: run untrusted Python (or a compiled program) under limits,
return plain data; and the one rule that tells the infrastructure's failures from the rest
(`infrastructure_failure`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

DATA_ENV = "DISCOVER_DATA"  # inside a run: where the read-only data directory is, when one is given


class InfrastructureError(RuntimeError):
    """The machine failed, not the candidate nor its judge: no sandbox backend here, the Docker
    engine refused or went away, a container or runner was lost. The engine retries it and a step
    fails loudly when it persists; it is never a candidate's verdict."""


def starved(waited_s: float, ran_s: float, limit_s: float) -> InfrastructureError:
    """A Python candidate stopped at its time limit while its processes still waited for a CPU
    (a busy host): no verdict for it, an infrastructure failure that the engine retries."""
    return InfrastructureError(
        f"the candidate could not be judged: the host was too busy (its processes waited {waited_s:.1f} s for a CPU in "
        f"{ran_s:.1f} s of its {limit_s:g} s limit); the evaluation is retried as an infrastructure failure "
        "(fewer parallel evaluations, or a less loaded machine, avoid it)"
    )


class BackendRefused(ValueError):
    """A problem refuses to run candidates in this sandbox backend (it cannot keep the problem's
    secrets there); the message is one line naming the fix. Not the candidate's fault, nor the
    machine's: `discover evaluate` prints it, a run's pre-flight refuses it before starting."""


def infrastructure_failure(err: BaseException) -> bool:
    """Whether an exception raised while a candidate was scored is the infrastructure's (retry it)
    rather than a fault of the problem's judging of that candidate (a verdict: reward 0).

    The one rule, used by discover/evaluation.py: the infrastructure's are
    - `InfrastructureError` (what the backends raise for themselves);
    - the compiled-program runner's `SessionError` (evaluators/sandbox/native.py: a runner that
      died, hung or broke its protocol; no compiler in the sandbox);
    - the Docker SDK's errors (`docker.errors.DockerException`: the engine refused, a container
      was lost, an image is missing);
    - `OSError`: the operating system refused something (fork, a socket, a file, the disk); the
      HTTP errors of the Docker SDK's transport (`requests`' RequestException, socket timeouts)
      are OSErrors too.
    Anything else (ValueError, MemoryError, RecursionError, IndexError, OverflowError, ...) comes
    from judging what the candidate wrote, and is that candidate's verdict.
    """
    if isinstance(err, (InfrastructureError, OSError)):
        return True
    from evaluators.sandbox.native import SessionError

    if isinstance(err, SessionError):
        return True
    try:
        from docker.errors import DockerException
    except ImportError:  # no Docker SDK: no Docker errors either
        return False
    return isinstance(err, DockerException)


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one candidate run (docs/method.md §5 gives each problem's values)."""

    timeout_s: float = 60.0  # wall clock; the whole process tree is killed past it
    memory_mb: int = 1024  # address-space limit of the candidate process
    cpus: int = 2  # CPU threads offered to numeric libraries
    max_output_bytes: int = 1_000_000  # cap on captured stdout+stderr and on the returned data
    max_processes: int = 64  # process-count limit, where the backend can enforce it
    max_file_mb: int = 64  # the largest file the candidate may write (RLIMIT_FSIZE), its return value included
    # RLIMIT_AS = memory_mb. Off for CUDA programs, which reserve far more address space than they
    # use; the docker backend's memory limit (a cgroup) still bounds their real memory.
    limit_address_space: bool = True


@dataclass(frozen=True)
class SandboxResult:
    """What came back from one run. `output` is the entry point's return value as JSON data."""

    ok: bool  # True when the entry point returned and its value was read back
    output: Any = None  # JSON-decoded return value of the entry point
    reason: str = ""  # why not ok: "timeout after 5.0 s", "exit code 1", "memory limit", ...
    logs: str = ""  # tail of stdout+stderr, capped
    duration_s: float = 0.0
    denied: str = ""  # the system calls outside the sandbox's profile that were refused (EPERM), named; "" if none


class Sandbox(Protocol):
    name: str

    def run(
        self,
        program: str,
        entry: str,
        argument: Any,
        limits: SandboxLimits,
        data_dir: Path | None = None,
        device: str | None = None,
    ) -> SandboxResult:
        """Run `program`, call its function `entry(argument)` and return the value as plain data.

        `argument` and the return value cross the boundary as JSON, never pickle. `data_dir`, when
        given, is a host directory the run may read but not write (a problem's inputs: contest
        cases, training counts); the run finds it at the path in the environment variable
        DISCOVER_DATA (`/data` in a container). Nothing the evaluator must keep secret goes there.
        `device` picks the GPU the run sees: None is the backend's default (a GPU sandbox sees every
        GPU), "cpu" none, and a GPU index or UUID (evaluators/sandbox/gpus.py) that GPU alone.
        """
        ...

    def run_native(self, source: str, cases: Any, limits: Any, on_case: Any = None) -> Any:
        """Compile a C++ program once and run it on each (index, input text) case; each case's raw
        result (status, CPU time, peak memory, stdout) goes to `on_case` for the host to judge.

        Only problems with compiled programs call it (the AtCoder problems); types and limits are
        in evaluators/sandbox/native.py (NativeLimits, CaseRun, NativeRun).
        """
        ...


TMPFS_MB = 256  # a candidate's /tmp (Docker: charged to the container's memory; process: to the run's cgroup)


def tmpfs_mb(limits: SandboxLimits) -> int:
    """/tmp's size: TMPFS_MB, or room for two files of the largest size the candidate may write."""
    return max(TMPFS_MB, 2 * int(limits.max_file_mb) + 64)
