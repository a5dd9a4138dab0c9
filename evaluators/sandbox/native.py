"""Compiled programs in the sandbox: compile once, run each case under a contest's limits, and bring
each case's raw stdout back to the host, which judges it (the judge never runs where the program can
reach it).

One trusted runner (native_runner.py) does the work on both backends; this module drives it.
`run_program` opens `limits.parallel` runner sessions ("slots"): the first compiles the source and
returns the binary, the others receive it, and each slot takes the next case from a shared queue
until none is left, the caller's `on_case` asks to stop (the first failing case, say) or the
evaluation's deadline passes. Each case runs alone on one CPU: the process backend pins each slot
to its own core and gives each case's cgroup a quota of one CPU (which, unlike pinning, the program
cannot undo), the docker backend gives each slot its own one-CPU container. Under the process
backend as root each slot has its own uid and gid: its directory, the runner's work directories and
the binary are root's with access for that gid alone (native_runner.py), so a program of another
evaluation cannot enter, read or run them. The process backend also isolates the compiler and each
case in a bubblewrap sandbox of its own (view.py's compiler and program views, the launcher
confine.py with the "compiler" or "program" seccomp profile; docs/sandbox.md, Process).

Host memory does not grow with the number of cases: a case's raw output (up to `output_bytes`) is
judged as that case ends, in one judging thread, and dropped once `on_case` has seen it; only the
verdict's fields stay (NativeRun.cases hold no output when there is an `on_case`). A slot whose
case ended while the judge is busy with another output waits with its own before it runs the next
case, so at most `parallel` + 1 outputs are alive at once (one in each slot, one being judged),
whatever the number of cases (benchmarks/results/atcoder_memory.md).

Verdicts of a case (`classify`), from what the runner measured:
- TLE: CPU time (user + system, wait4's rusage of the program and the children it reaped; and the
  CPU of the case's cgroup, which counts the processes it left unreaped too: the container's
  while the case ran, or under the process backend the case's own cgroup) above `cpu_s`, SIGXCPU,
  or no exit before the wall-clock backstop `wall_s` (moved later by the time the program waited
  for a CPU, up to `starved_wall_s`: a program still starved there gets no verdict, the evaluation
  raises SessionError, an infrastructure failure, and is retried: a busy host never turns a valid
  program into a TLE);
- MLE: the out-of-memory killer fired in the container or the case's cgroup (the process
  backend's: `memory_mb` + CASE_HEADROOM_MB for the whole tree), the peak resident set (wait4's
  ru_maxrss) is above `memory_mb`, or the program died after an allocation failed (RLIMIT_AS is
  the limit plus 512 MB, so a program that asks for far more memory than it may use fails to
  allocate; where the process backend may run without a cgroup, this is how it stops most
  excess early). ru_maxrss never reads
  below the runner's own resident size at fork (about 10 MB): a small program's peak is shown so;
- OLE: more than `output_bytes` of output (RLIMIT_FSIZE, SIGXFSZ);
- RE: any other signal or a non-zero exit status;
- OK: exited with 0 in time: the caller judges its stdout.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from evaluators.sandbox import bwrap

RUNNER = Path(__file__).with_name("native_runner.py")
# The AtCoder command line of docs/method.md §5b ({src} and {out} are filled in by the runner).
COMPILE_COMMAND = ("g++", "-std=gnu++20", "-O2", "-DONLINE_JUDGE", "-DATCODER", "-o", "{out}", "{src}")
BACKSTOP_S = 20.0  # the host gives up on a runner this long after its own limit should have ended a job
# A program's wall-clock limit is moved later by the time it waited for a CPU (a busy host: generation,
# training and other evaluations share the machine), up to this many times the limit; a program still
# short of CPU then gets no verdict: the evaluation is an infrastructure failure (retried), never a
# timeout that zeroes the reward, since a reward must not depend on the host's load.
STARVED_WALL_FACTOR = 10.0
CASE_HEADROOM_MB = 64  # a case's cgroup: its memory limit plus this (page cache of its output)
COMPILE_TASKS = 64  # tasks of the compiler's tree (g++, cc1plus, as, ld)
CASE_TMPFS_MB = 512  # each scratch tmpfs of the compiler or a case under the process backend (charged to its cgroup)
ALLOCATION_FAILED = ("std::bad_alloc", "Cannot allocate memory", "memory exhausted", "out of memory")


@dataclass(frozen=True)
class NativeLimits:
    """Limits of one evaluation of a compiled program."""

    cpu_s: float = 2.0  # CPU time per case
    memory_mb: int = 1024  # peak resident memory per case
    parallel: int = 2  # cases run at once, each on its own CPU
    deadline_s: float = 530.0  # the whole evaluation, compilation included
    output_bytes: int = 32 * 1024 * 1024  # stdout per case
    max_processes: int = 64  # processes and threads of the program
    compile_timeout_s: float = 120.0  # wall and CPU; generous, a busy machine compiles slowly
    compile_memory_mb: int = 4096  # address space of the compiler
    binary_mb: int = 256  # largest binary (RLIMIT_FSIZE of the compiler)

    @property
    def wall_s(self) -> float:
        """The wall-clock backstop per case: a little above the CPU limit (sleeping programs)."""
        return 1.5 * self.cpu_s + 1.0

    @property
    def starved_wall_s(self) -> float:
        """The latest a case's backstop may be moved to for the time its program waited for a CPU."""
        return STARVED_WALL_FACTOR * self.wall_s


@dataclass(frozen=True)
class CaseRun:
    """What one case's run gave: a status, what it used, and its raw output for the judge."""

    case: int
    status: str  # "OK" | "TLE" | "MLE" | "OLE" | "RE"
    detail: str  # why, for anything but OK: "CPU time 2.31 s > 2 s", "killed by SIGSEGV", ...
    cpu_s: float
    wall_s: float
    peak_mb: float
    stdout: bytes = field(repr=False)
    stderr: str = field(default="", repr=False)  # its tail


@dataclass(frozen=True)
class NativeRun:
    """The outcome of compiling a program and running it on cases."""

    compiled: bool
    compile_log: str = ""  # the compiler's messages (tail)
    compile_s: float = 0.0
    cases: tuple[CaseRun, ...] = ()  # in the order they finished
    error: str = ""  # why cases that were asked for did not run: the deadline, a broken sandbox
    stopped: bool = False  # `on_case` asked to stop


class SessionError(RuntimeError):
    """A runner that died, hung or broke the protocol: an infrastructure failure, not a verdict."""


class Session(Protocol):
    """One runner: `start` sends the setup and returns its "ready" report, `case` one case's raw
    result, `end` the final report; `close` ends it (killing it if needed)."""

    def start(self, setup: dict[str, Any], timeout: float) -> dict[str, Any]: ...

    def case(self, index: int, text: str, timeout: float) -> dict[str, Any]: ...

    def end(self, timeout: float) -> dict[str, Any]: ...

    def close(self) -> None: ...


def classify(raw: dict[str, Any], limits: NativeLimits) -> CaseRun:
    """A case's status from the runner's measurements (module docstring, "Verdicts")."""
    cpu = float(raw["cpu_s"])
    note = ""
    cgroup = raw.get("cgroup_cpu_s")
    if cgroup is not None and cgroup > cpu + 0.05:  # processes it did not reap used CPU too
        cpu, note = float(cgroup), " (with the processes it left running)"
    peak = raw["peak_kb"] / 1024.0
    sig, code = raw.get("signal"), raw.get("exit_code")
    stderr = raw.get("stderr", "")
    status, detail = "OK", ""
    if raw.get("flooded"):  # stopped by the sandbox: too many refused system calls
        status, detail = "RE", raw.get("denied_calls") or "stopped after too many refused system calls"
    elif raw["timed_out"]:
        status, detail = "TLE", f"still running after the wall-clock backstop of {limits.wall_s:g} s (CPU time {cpu:.2f} s)"
    elif sig == signal.SIGXCPU or cpu > limits.cpu_s:
        status, detail = "TLE", f"CPU time {cpu:.2f} s{note} > {limits.cpu_s:g} s"
    elif raw.get("oom_kills"):
        status, detail = "MLE", f"killed by the out-of-memory killer (peak resident memory {peak:.0f} MB, limit {limits.memory_mb} MB)"
    elif peak > limits.memory_mb:
        status, detail = "MLE", f"peak resident memory {peak:.0f} MB > {limits.memory_mb} MB"
    elif (sig is not None or code) and any(s in stderr for s in ALLOCATION_FAILED):
        status, detail = "MLE", f"a memory allocation failed (address space capped at {limits.memory_mb + 512} MB; {_exit(sig, code)})"
    elif sig == signal.SIGKILL and raw.get("oom_kills") is None:
        status, detail = "MLE", "killed by SIGKILL: the memory limit, most likely"
    elif sig == signal.SIGXFSZ or raw["stdout_bytes"] > limits.output_bytes:
        status, detail = "OLE", f"more than {limits.output_bytes} bytes of output"
    elif sig is not None or code:
        status, detail = "RE", _exit(sig, code)
    if status != "OK" and raw.get("denied_calls") and not raw.get("flooded"):
        detail += f"; {raw['denied_calls']}"
    return CaseRun(
        case=int(raw["index"]),
        status=status,
        detail=detail,
        cpu_s=cpu,
        wall_s=float(raw["wall_s"]),
        peak_mb=peak,
        stdout=base64.b64decode(raw["stdout"]),
        stderr=stderr,
    )


def starved_message(raw: dict[str, Any], limits: NativeLimits) -> str:
    """Why a case got no verdict: its program waited for a CPU for most of its time (one line)."""
    cpu = max(float(raw.get("cpu_s") or 0.0), float(raw.get("cgroup_cpu_s") or 0.0))
    return (
        f"case {raw['index']} could not be judged: the host was too busy (its program waited {float(raw['starved_s']):.1f} s for a CPU "
        f"and ran {cpu:.2f} s of its {limits.cpu_s:g} s in {float(raw['wall_s']):.1f} s); "
        "the evaluation is retried as an infrastructure failure (fewer parallel evaluations, or a less loaded machine, avoid it)"
    )


def _exit(sig: int | None, code: int | None) -> str:
    if sig is not None:
        try:
            return f"killed by {signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    return f"exit code {code}"


def run_program(
    open_session: Callable[[int], Session],
    source: str,
    cases: Sequence[tuple[int, str]],
    limits: NativeLimits,
    on_case: Callable[[CaseRun], bool] | None = None,
    compile_command: Sequence[str] = COMPILE_COMMAND,
) -> NativeRun:
    """Compile `source` once and run it on `cases` ((index, input text) pairs) in parallel slots.

    `open_session(slot)` gives a runner for slot 0, 1, ...; `on_case` sees each case as it
    finishes (in one judging thread, while the slots go on) and returns False to stop handing out
    cases (a case or two already started still finish). With an `on_case`, the returned cases
    hold no stdout (it was judged and dropped as each case ended); without one they keep it.
    """
    deadline = time.monotonic() + limits.deadline_s
    base = {
        "cpu_s": limits.cpu_s,
        "wall_s": limits.wall_s,
        "starved_wall_s": limits.starved_wall_s,
        "memory_mb": limits.memory_mb,
        "output_bytes": limits.output_bytes,
        "compile_timeout_s": limits.compile_timeout_s,
        "compile_memory_mb": limits.compile_memory_mb,
        "binary_mb": limits.binary_mb,
    }
    try:
        first = open_session(0)
    except SessionError as err:
        return NativeRun(compiled=False, error=f"the sandbox failed to start: {err}")
    try:
        ready = first.start(
            {**base, "source": source, "command": list(compile_command), "return_binary": len(cases) > 0 and limits.parallel > 1},
            timeout=limits.compile_timeout_s + BACKSTOP_S,
        )
    except SessionError as err:
        first.close()
        return NativeRun(compiled=False, error=f"the sandbox failed while compiling: {err}")
    compile_log, compile_s = str(ready.get("log", "")), float(ready.get("seconds", 0.0))
    if ready.get("missing"):  # not the program's fault: the sandbox cannot compile anything
        first.close()
        raise SessionError(compile_log)
    if not ready["ok"]:
        try:
            first.end(timeout=BACKSTOP_S)
        except SessionError:
            pass
        first.close()
        return NativeRun(compiled=False, compile_log=compile_log, compile_s=compile_s)

    pending: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
    for c in cases:
        pending.put(c)
    done: list[CaseRun] = []
    lock = threading.Lock()
    state = {"stop": False, "error": "", "starved": ""}

    def slot(k: int, session: Session | None) -> None:
        try:
            if session is None:
                session = open_session(k)
                session.start({**base, "binary": ready["binary"]}, timeout=BACKSTOP_S)
            while not state["stop"]:
                if time.monotonic() > deadline:
                    with lock:
                        state["stop"] = True
                        state["error"] = state["error"] or f"the evaluation's time limit ({limits.deadline_s:g} s) ran out"
                    break
                try:
                    index, text = pending.get_nowait()
                except queue.Empty:
                    break
                raw = session.case(index, text, timeout=limits.starved_wall_s + BACKSTOP_S)
                if raw.get("starved_s"):  # the host's load, not the program: no verdict for it
                    with lock:
                        state["stop"] = True
                        state["starved"] = state["starved"] or starved_message(raw, limits)
                    break
                run = classify(raw, limits)
                del raw
                # At most one output waits for or is in the judge: a slot holds its own until the
                # judge is free, then goes on with the next case (parallel + 1 outputs at most).
                handoff.acquire()
                try:
                    judged.append(judging.submit(finish, [run]))  # a box the judge empties
                except BaseException:
                    handoff.release()
                    raise
                del run
            session.end(timeout=BACKSTOP_S)
        except SessionError as err:
            with lock:
                state["stop"] = True
                state["error"] = state["error"] or f"the sandbox failed: {err}"
        finally:
            if session is not None:
                session.close()

    def finish(box: list[CaseRun]) -> None:
        run = box.pop()  # the executor's work item keeps no reference to the output
        try:
            keep = on_case(run) if on_case is not None else True
            with lock:
                # the output is dropped once the caller has judged it (kept when nobody saw it)
                done.append(replace(run, stdout=b"") if on_case is not None else run)
                if not keep:
                    state["stop"] = True
        finally:
            handoff.release()

    handoff = threading.BoundedSemaphore(1)  # the judge's one output (module docstring)
    judged: list[Future] = []
    threads = [threading.Thread(target=slot, args=(0, first), daemon=True)]
    threads += [threading.Thread(target=slot, args=(k, None), daemon=True) for k in range(1, min(limits.parallel, len(cases)))]
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="judge") as judging:  # off the slots' path
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for future in judged:
        future.result()  # a judge that raised is our bug: let it show
    if state["starved"]:  # the infrastructure's failure (base.infrastructure_failure): the evaluation is retried
        raise SessionError(state["starved"])
    stopped = state["stop"] and not state["error"]
    error = state["error"] if len(done) < len(cases) and not stopped else ""
    return NativeRun(compiled=True, compile_log=compile_log, compile_s=compile_s, cases=tuple(done), error=error, stopped=stopped)


# -- the process backend's sessions --------------------------------------------------------------


class ReplyReader:
    """Reads the runner's "<token> <JSON>" lines from chunks of its stdout, with a deadline."""

    def __init__(self, token: str, recv: Callable[[float], bytes], describe_death: Callable[[], str]):
        self.token = token.encode()
        self.recv = recv  # recv(seconds) -> bytes; b"" at end of stream; raises TimeoutError
        self.describe_death = describe_death
        self.buffer = bytearray()

    def read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(memoryview(self.buffer)[:end])
                self.buffer = self.buffer[end + 1 :]  # a fresh buffer: a case's output is not held on to
                token, _, payload = line.partition(b" ")
                if token != self.token:
                    continue  # not a report (the runner writes nothing else, but be safe)
                try:
                    return json.loads(payload)
                except ValueError as err:
                    raise SessionError(f"unreadable report from the runner: {err}") from None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SessionError(f"the runner did not answer within {timeout:g} s")
            try:
                chunk = self.recv(remaining)
            except TimeoutError:
                continue
            if not chunk:
                raise SessionError("the runner exited: " + self.describe_death())
            self.buffer.extend(chunk)


def message(payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload).encode()
    return str(len(data)).encode() + b"\n" + data


class LocalSession:
    """A runner process on this machine (the process backend): pinned to the core that the fewest
    of our runners use, and, when we are root, dropping the program to a fresh unprivileged uid.

    `isolation` (ProcessSandbox's): "standard" puts the compiler and each case in a bubblewrap
    sandbox of their own (view.compiler_view, view.program_view) under the launcher and the
    "compiler" or "program" seccomp profile; "none" runs them as they are (trusted code only).
    `seen` ({kind: {call: count}}) collects the calls the filters refused; with `learn` the filters
    let every call through and it collects them all (learn_profiles.py)."""

    def __init__(
        self,
        slot: int,
        limits: NativeLimits,
        layout: Any = None,
        isolation: str = "standard",
        seen: dict | None = None,
        learn: bool = False,
    ):
        from evaluators.sandbox.reaping import acquire_run_uid

        self.limits = limits
        self.layout = layout  # evaluators/sandbox/cgroups.py's Layout: each case gets a cgroup; None: none
        self.seen = seen if seen is not None else {}
        self.learn = learn
        self.token = secrets.token_hex(16)
        self.parent = tempfile.mkdtemp(prefix="discover-native-")  # 0700, ours
        self.uid = acquire_run_uid()
        if self.uid is not None:
            # only the program's gid may pass (its name under /tmp can be listed): another
            # evaluation's program, another uid and gid, cannot reach this one's binary or files
            os.chown(self.parent, -1, self.uid)
            os.chmod(self.parent, 0o710)
        self.cpu = _take_core()
        workdir = os.path.join(self.parent, "w")
        self.sandbox, self.fds = self._sandbox(workdir, isolation) if isolation != "none" else (None, [])
        self.common = {
            "token": self.token,
            "marker": secrets.token_hex(16),
            "uid": self.uid,
            "gid": self.uid,
            "cpu": self.cpu,
            "workdir": workdir,
            "nproc": limits.max_processes,
            "cgroup": False,  # the host's cgroup counts everyone's processes; each case gets its own (case())
            "scratch": [],
            "case_dir": True,
            "sandbox": self.sandbox,
        }
        self.stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(RUNNER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr,
                start_new_session=True,
                close_fds=True,
                pass_fds=self.fds,
                cwd=self.parent,
            )
        except OSError as err:
            self._release()
            raise SessionError(f"could not start the runner: {err}") from None
        self.reader = ReplyReader(self.token, self._recv, self._death)
        self.ended = False

    def _sandbox(self, workdir: str, isolation: str) -> tuple[dict[str, Any], list[int]]:
        """The runner's `sandbox` setup (native_runner.Child): bubblewrap's command line for the
        compiler and for a case, their files' descriptors, the launcher and the filters."""
        from evaluators.sandbox import bwrap, compiled_launcher, syscalls, view

        if isolation != "standard":
            raise SessionError(f"compiled programs run under sandbox.isolation 'standard' or 'none', not {isolation!r}")
        uid = self.uid if self.uid is not None else os.getuid()
        gid = self.uid if self.uid is not None else os.getgid()
        # the C launcher (confine.c) where it could be built, else confine.py under the interpreter
        built = compiled_launcher.binary()
        bin_dir, case_dir = os.path.join(workdir, "bin"), os.path.join(workdir, "case")
        views = {
            "compiler": view.compiler_view(os.path.join(workdir, "build"), uid, gid, CASE_TMPFS_MB, interpreter=not built),
            "program": view.program_view(bin_dir, case_dir, uid, gid, CASE_TMPFS_MB, interpreter=not built),
        }
        launcher = f"{view.BOX}/confine" if built else f"{view.BOX}/confine.py"
        prefix, fds = {}, {}
        for kind, v in views.items():
            v.bind(built or str(Path(__file__).with_name("confine.py")), launcher)
            prefix[kind], fds[kind] = bwrap.command(v, "/")
        mode = "learn" if self.learn else "notify"
        setup = {
            "prefix": prefix,
            "fds": fds,
            "python": None if built else os.path.realpath(sys.executable),
            "launcher": launcher,
            "seccomp": {kind: base64.b64encode(syscalls.bpf(kind, mode)).decode() for kind in views},
            "listener": True,
            "learn": self.learn,
        }
        return setup, [fd for kind in fds for fd in fds[kind]]

    def _recv(self, timeout: float) -> bytes:
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise TimeoutError
        return os.read(fd, 1 << 20)

    def _death(self) -> str:
        self.stderr.seek(0)
        lines = self.stderr.read().decode("utf-8", "replace").strip().splitlines()
        return lines[-1][:500] if lines else f"exit status {self.proc.poll()}"

    def _send(self, payload: dict[str, Any]) -> None:
        try:
            self.proc.stdin.write(message(payload))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as err:
            raise SessionError(f"the runner is gone ({err}): {self._death()}") from None

    def start(self, setup: dict[str, Any], timeout: float) -> dict[str, Any]:
        if "source" not in setup or self.layout is None:
            self._send({**setup, **self.common})
            return self._counted(self.reader.read(timeout))
        with self._cgroup(self.limits.compile_memory_mb, COMPILE_TASKS + bwrap.TASKS) as group:  # the compiler's tree too
            self._send({**setup, **self.common, "cgroup_procs": group.procs_files})
            return self._counted(self.reader.read(timeout))

    def case(self, index: int, text: str, timeout: float) -> dict[str, Any]:
        if self.layout is None:
            self._send({"kind": "case", "index": index, "input": text})
            return self._counted(self.reader.read(timeout))
        with self._cgroup(self.limits.memory_mb + CASE_HEADROOM_MB, self.limits.max_processes + bwrap.TASKS) as group:
            self._send({"kind": "case", "index": index, "input": text, "cgroup_procs": group.procs_files})
            raw = self._counted(self.reader.read(timeout))
            group.kill()  # anything the runner could not find (it kills by uid or marker)
            used = group.cpu_s()  # the whole tree's CPU, reaped or not, less the launcher's start
            raw["cgroup_cpu_s"] = None if used is None else max(0.0, used - float(raw.get("launcher_cpu_s", 0.0)))
            raw["oom_kills"] = group.oom_kills()
            return raw

    def _counted(self, raw: dict[str, Any]) -> dict[str, Any]:
        """A report of the runner with its denied calls named (or counted, when learning); a case
        whose sandbox could not start is the infrastructure's failure."""
        from evaluators.sandbox import syscalls

        if raw.get("setup_failed"):
            raise SessionError(f"the sandbox could not start the program: {raw['setup_failed']}")
        kind = "compiler" if raw.get("kind") == "ready" else "program"
        counts = {(int(a), int(n)): int(c) for a, n, c in raw.pop("denied", None) or []}
        if self.learn:  # deriving profiles: every call made is written down; nothing else is kept
            seen = self.seen.setdefault(kind, {})
            for key, c in counts.items():
                seen[syscalls.name(*key)] = seen.get(syscalls.name(*key), 0) + c
        elif counts:
            raw["denied_calls"] = syscalls.describe(counts, kind, bool(raw.get("flooded")))
        return raw

    @contextmanager
    def _cgroup(self, memory_mb: int, tasks: int) -> Iterator[Any]:
        from evaluators.sandbox.cgroups import RunCgroup

        try:
            # one CPU of quota (cpu.max / cpu.cfs_quota_us): core pinning alone can be undone by the
            # program (sched_setaffinity), the quota cannot, so a spinning tree never takes the CPU
            # of a case of another evaluation running at the same time
            group = RunCgroup(self.layout, memory_mb, tasks, cpus=1)
        except OSError as err:
            raise SessionError(f"could not make a cgroup for the program: {err}") from None
        try:
            yield group
        finally:
            group.remove()

    def end(self, timeout: float) -> dict[str, Any]:
        self._send({"kind": "end"})
        report = self.reader.read(timeout)
        self.ended = True
        return report

    def close(self) -> None:
        from evaluators.sandbox.reaping import kill_group

        if self.ended:  # it is exiting on its own
            try:
                self.proc.wait(timeout=BACKSTOP_S)
            except subprocess.TimeoutExpired:
                pass
        kill_group(self.proc.pid)  # a runner that hung, and anything left in its session
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._release()

    def _release(self) -> None:
        from evaluators.sandbox.reaping import kill_uid, release_run_uid, remove_tree

        self.stderr.close()
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        if self.uid is not None:
            kill_uid(self.uid)
            release_run_uid(self.uid)
        remove_tree(self.parent)
        _give_core(self.cpu)


_cores_in_use: dict[int, int] = {}  # core -> runner sessions of this process pinned to it
_cores_lock = threading.Lock()


def _take_core() -> int:
    """The allowed core with the fewest of our sessions: slots of concurrent evaluations spread
    over the cores, and no two share one while a core is free."""
    with _cores_lock:
        core = min(sorted(os.sched_getaffinity(0)), key=lambda c: _cores_in_use.get(c, 0))
        _cores_in_use[core] = _cores_in_use.get(core, 0) + 1
        return core


def _give_core(core: int) -> None:
    with _cores_lock:
        _cores_in_use[core] -= 1
