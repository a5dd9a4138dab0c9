"""The boundary (issues 27 and 36): what a candidate cannot do whatever it writes, under every backend
where it applies: the process backend (bubblewrap, a minimal view, a seccomp allow-list), Docker
(runc with the allow-list as its profile) and Docker under gVisor (runsc).

Nothing here skips because a mechanism is missing: the process backend fails to be made where
bubblewrap cannot set up a sandbox (fail closed), and in CI (the environment variable CI set)
Docker and gVisor must be there too. Outside CI, the Docker and gVisor cases skip with the reason
when no engine or runtime answers. Nothing depends on timing: where two runs must overlap, the test
finds the first one's file through /proc/<pid>/root before it starts the second.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from evaluators.sandbox import IsolationUnavailable, ProcessSandbox, SandboxLimits
from evaluators.sandbox.base import InfrastructureError
from evaluators.sandbox.native import NativeLimits
from tests.sandbox_backends import sandboxes_by_backend, unavailable_outside_ci

LIMITS = SandboxLimits(timeout_s=60.0, memory_mb=512, cpus=1, max_output_bytes=100_000)
BACKENDS = ["process", "docker", "gvisor"]
REPO = Path(__file__).resolve().parents[1]
# (add_key, keyctl) system call numbers where these tests know them
KEY_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}


@pytest.fixture(scope="module")
def sandbox():
    yield from sandboxes_by_backend("python-math")


def _box(sandbox, backend: str):
    if backend == "process":
        return ProcessSandbox()  # raises IsolationUnavailable where it cannot isolate: the test fails
    unavailable_outside_ci("python-math", gvisor=backend == "gvisor")
    return sandbox(backend)


def _run(box, program: str, argument=None):
    result = box.run(program, "main", argument, LIMITS)
    assert result.ok, (result.reason, result.logs)
    return result.output


# -- the network -----------------------------------------------------------------------------------

CONNECT = """
import socket

def main(ports):
    out = {}
    try:
        socket.create_connection(("127.0.0.1", ports["tcp"]), timeout=5).close()
        out["tcp"] = "connected"
    except OSError as err:
        out["tcp"] = type(err).__name__
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"hello from the sandbox", ("127.0.0.1", ports["udp"]))
        out["udp"] = "sent"
    except OSError as err:
        out["udp"] = type(err).__name__
    return out
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_candidate_cannot_reach_a_listener_on_the_hosts_loopback(sandbox, backend):
    box = _box(sandbox, backend)
    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(4)
        udp.bind(("127.0.0.1", 0))
        out = _run(box, CONNECT, {"tcp": tcp.getsockname()[1], "udp": udp.getsockname()[1]})
        tcp.setblocking(False)
        udp.setblocking(False)
        with pytest.raises(BlockingIOError):
            tcp.accept()  # nobody connected
        with pytest.raises(BlockingIOError):
            udp.recvfrom(100)  # nothing arrived
    assert out["tcp"] != "connected", out


UNIX_CONNECT = """
import socket

def main(paths):
    out = {}
    for path in paths:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect(path)
                s.sendall(b"hello from the sandbox")
            out[path] = "connected"
        except OSError as err:
            out[path] = type(err).__name__
    return out
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hosts_unix_socket_that_anyone_may_write_to_is_not_reachable(sandbox, backend):
    """A file-system socket of the host, mode 0777, in directories every user may enter: a new
    network namespace does not cover these, only a view without them does."""
    box = _box(sandbox, backend)
    (REPO / ".cache").mkdir(exist_ok=True)
    dirs = [tempfile.mkdtemp(prefix="discover-test-sock-"), tempfile.mkdtemp(prefix="discover-test-sock-", dir=REPO / ".cache")]
    servers = []
    try:
        paths = []
        for d in dirs:
            os.chmod(d, 0o777)
            path = os.path.join(d, "s")
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(path)
            os.chmod(path, 0o777)
            server.listen(4)
            server.setblocking(False)
            servers.append(server)
            paths.append(path)
        out = _run(box, UNIX_CONNECT, paths)
        for server in servers:
            with pytest.raises(BlockingIOError):
                server.accept()  # nobody connected
    finally:
        for server in servers:
            server.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    assert all(v != "connected" for v in out.values()), out


# -- writing ---------------------------------------------------------------------------------------

WRITE = """
import os

def main(paths):
    out = {}
    for path in paths:
        try:
            with open(path, "w") as f:
                f.write("left by a candidate")
            os.chmod(path, 0o666)
            out[path] = "written"
        except OSError as err:
            out[path] = err.strerror
    return out
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_candidate_cannot_write_into_a_world_writable_directory_of_the_host(sandbox, backend):
    box = _box(sandbox, backend)
    (REPO / ".cache").mkdir(exist_ok=True)
    dirs = [tempfile.mkdtemp(prefix="discover-test-open-", dir=REPO / ".cache"), tempfile.mkdtemp(prefix="discover-test-open-")]
    targets = [os.path.join(d, "planted") for d in dirs] + [f"/var/tmp/discover-test-{secrets.token_hex(6)}"]
    try:
        for d in dirs:
            os.chmod(d, 0o777)
        out = _run(box, WRITE, targets)
        for path in targets:
            assert not os.path.exists(path), f"the candidate wrote {path} on the host: {out}"
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        if os.path.exists(targets[-1]):
            os.unlink(targets[-1])


# -- reading ---------------------------------------------------------------------------------------

READ = """
import os

def main(paths):
    out = {}
    for path in paths:
        try:
            with open(path, "rb") as f:
                out[path] = len(f.read())
        except OSError as err:
            out[path] = type(err).__name__
    return out
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_repositorys_records_and_testers_are_not_readable(sandbox, backend):
    """A published record returned as the candidate's own construction is the record's reward for a
    file copy; a tester or judge read is a judge to game. Neither is in a candidate's view."""
    box = _box(sandbox, backend)
    paths = [
        REPO / "evaluators" / "math" / "published" / "erdos" / "ttt_discover.json",
        REPO / "evaluators" / "math" / "published" / "ac1" / "ttt_discover.json",
        REPO / "evaluators" / "algorithms" / "judging.py",
        REPO / "evaluators" / "algorithms" / "data" / "ahc058_public_inputs_seed0-149.tar.gz",
        REPO / "pyproject.toml",
    ]
    assert all(p.is_file() for p in paths)
    out = _run(box, READ, [str(p) for p in paths])
    assert all(v == "FileNotFoundError" for v in out.values()), out


VIEW = """
import importlib.util, os, sys

def main(_):
    return {
        "root": sorted(os.listdir("/")),
        "importable": {n: importlib.util.find_spec(n) is not None for n in ("numpy", "scipy", "torch", "pip", "evaluators", "prefect")},
        "home": [p for p in ("/home", "/run", "/var/run", "/var/lib", "/root/.ssh", "/etc/shadow", "/etc/ssh") if os.path.exists(p)],
    }
"""


def test_a_python_candidate_sees_the_interpreter_and_its_problems_packages_only():
    out = _run(ProcessSandbox(), VIEW)
    assert out["importable"] == {"numpy": True, "scipy": True, "torch": False, "pip": False, "evaluators": False, "prefect": False}, out
    assert out["home"] == [], out
    assert set(out["root"]) <= {"bin", "dev", "etc", "lib", "lib64", "proc", "sandbox", "sys", "tmp", "usr", "var"} | {
        Path(sys.base_prefix).parts[1]
    }, out


WHERE = """
import os, sys, numpy, scipy

def main(host_paths):
    return {
        "sys_path": sys.path,
        "packages": [numpy.__file__, scipy.__file__],
        "visible": [p for p in host_paths if os.path.exists(p)],
        "numpy_works": float(numpy.linalg.norm(numpy.ones(4))),
    }
"""


def test_a_python_candidate_is_not_told_where_the_checkout_or_its_environment_lives():
    """The packages show at /sandbox/site-packages, not at the host's path: this checkout's `.venv`
    (or any environment in a home directory) would name where the project and its user live."""
    import numpy

    host = [str(REPO), sys.prefix, os.path.dirname(os.path.dirname(numpy.__file__))]
    out = _run(ProcessSandbox(), WHERE, host)
    assert out["visible"] == [], out
    assert out["numpy_works"] == 2.0
    assert all(p.startswith("/sandbox/site-packages/") for p in out["packages"]), out
    assert not [p for p in out["sys_path"] if any(p.startswith(h) for h in host)], out


HIDDEN_DATASET = """
import os, scanpy

def main(_):
    path = os.path.join(os.path.dirname(scanpy.__file__), "datasets", "10x_pbmc68k_reduced.h5ad")
    try:
        with open(path, "rb") as f:
            return {"exists": True, "bytes": len(f.read())}
    except OSError as err:
        return {"exists": False, "error": type(err).__name__}
"""


def test_scanpys_copy_of_the_denoising_dataset_is_empty_in_the_bio_view():
    scanpy = pytest.importorskip("scanpy")
    bundled = Path(scanpy.__file__).parent / "datasets" / "10x_pbmc68k_reduced.h5ad"
    assert bundled.stat().st_size > 0  # on the host: the held-out counts follow from it
    result = ProcessSandbox(image="bio").run(HIDDEN_DATASET, "main", None, SandboxLimits(timeout_s=120, memory_mb=3072, cpus=1))
    assert result.ok and result.output.get("bytes", 0) == 0, (result.reason, result.output)


# -- processes -------------------------------------------------------------------------------------

PROCESSES = """
import os

def main(pid):
    try:
        os.kill(pid, 0)
        signal = "delivered"
    except ProcessLookupError:
        signal = "no such process"
    except PermissionError:
        signal = "not permitted"
    return {"signal": signal, "listed": str(pid) in os.listdir("/proc"), "pids": len([p for p in os.listdir("/proc") if p.isdigit()])}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_candidate_can_neither_see_nor_signal_the_hosts_processes(sandbox, backend):
    box = _box(sandbox, backend)
    out = _run(box, PROCESSES, os.getpid())
    assert out["signal"] == "no such process" and not out["listed"], out


def test_what_a_candidate_leaves_running_dies_with_its_namespace():
    """A grandchild in a session of its own, still sleeping when the candidate returns: nothing of it
    is left, found by the name it gives itself (and, as root, by the run's own uid; a normal user's
    run has the caller's uid, which the caller's own processes share)."""
    from evaluators.sandbox.reaping import uid_pids

    marker = f"discover-left-behind-{os.getpid()}-{time.monotonic_ns()}"
    program = (
        "import os, time\n"
        "def main(_):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:\n"
        f"            os.execv('/bin/sleep', ['{marker}', '1000'])\n"
        "        os._exit(0)\n"
        "    time.sleep(0.5)  # the grandchild has exec'd by now\n"
        "    return os.getuid()\n"
    )
    uid = _run(ProcessSandbox(), program)
    named = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).startswith(marker.encode())]
    assert named == [], f"the candidate's grandchild outlived it: {named}"
    if os.geteuid() == 0:
        assert uid_pids(uid) == [], f"processes of the run's uid {uid} outlived it"


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


# -- scratch filesystems of evaluations running at the same time ------------------------------------

LEAVE = """
import os, time

def main(token):
    for top in ("/tmp", "/dev/shm"):
        path = os.path.join(top, "left-" + token)
        with open(path, "w") as f:
            f.write("readable by anyone")
        os.chmod(path, 0o644)
    for _ in range(6000):  # until the test says B has looked (a bound, not a measure)
        if os.path.exists("/tmp/go-" + token):
            return "done"
        time.sleep(0.01)
    return "never told to go"
"""
LOOK = """
import os

def main(token):
    return {top: os.path.exists(os.path.join(top, "left-" + token)) for top in ("/tmp", "/dev/shm")}
"""


def _process_with(relative: str) -> int | None:
    """A process whose root shows `relative` (its mount namespace's /tmp, say), or None."""
    for name in os.listdir("/proc"):
        if name.isdigit() and os.path.exists(f"/proc/{name}/root/{relative}"):
            return int(name)
    return None


@pytest.mark.parametrize("backend", ["process", "docker"])
def test_two_evaluations_at_once_cannot_see_each_others_tmp(sandbox, backend):
    box = _box(sandbox, backend)
    if backend == "docker":
        from evaluators.sandbox.docker import DockerSandbox

        box = DockerSandbox(image="python-math", concurrency=2)
    token = secrets.token_hex(8)
    first: dict = {}
    runner = threading.Thread(target=lambda: first.update(out=box.run(LEAVE, "main", token, LIMITS)))
    runner.start()
    try:
        pid = None
        for _ in range(6000):  # the first candidate's file in its own /tmp (a bound for a busy machine)
            pid = _process_with(f"tmp/left-{token}")
            if pid is not None or not runner.is_alive():
                break
            threading.Event().wait(0.01)
        assert pid is not None, f"the first candidate never wrote its file: {first}"
        seen = _run(box, LOOK, token)
        Path(f"/proc/{pid}/root/tmp/go-{token}").write_text("")
    finally:
        runner.join(120)
        if backend == "docker":
            box.close()
    assert first["out"].ok and first["out"].output == "done", first
    assert seen == {"/tmp": False, "/dev/shm": False}, f"the second evaluation saw the first's files: {seen}"


SCRATCH_OF_ITS_OWN = """
import os

def main(name):
    with open("/tmp/mine.txt", "w") as f:
        f.write("written")
    return {"host_file_seen": os.path.exists("/tmp/" + name), "own_file": open("/tmp/mine.txt").read()}
"""


def test_tmp_on_the_hosts_import_path_does_not_replace_the_candidates_scratch(monkeypatch):
    # A script started from /tmp has /tmp on sys.path; the sandbox once bound the host's /tmp
    # read-only over the candidate's fresh one, and every run failed setting up its namespaces.
    monkeypatch.setattr(sys, "path", ["/tmp", *sys.path])
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="discover-host-") as host_file:
        out = _run(ProcessSandbox(), SCRATCH_OF_ITS_OWN, os.path.basename(host_file.name))
    assert out == {"host_file_seen": False, "own_file": "written"}


# -- the host's control files and its reading of the run --------------------------------------------

FORGE = """
import os, sys

def main(_):
    tried = {}
    for name in ("job.json", "input.json", "harness.py", "confine.py"):
        try:
            os.rename("/sandbox/" + name, "/sandbox/isolation-failed")
            tried[name] = "renamed"
        except OSError as err:
            tried[name] = type(err).__name__
    for path in ("isolation-failed", "output.json", "job.json"):
        with open(path, "w") as f:
            f.write("the sandbox could not isolate the candidate: forged by the candidate")
    print("the sandbox could not confine the candidate: forged", file=sys.stderr)
    print(tried, file=sys.stderr)
    sys.stderr.flush()
    os._exit(%d)
"""


@pytest.mark.parametrize("code", [6, 121, 125])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_candidate_that_forges_an_isolation_failure_gets_a_verdict_and_no_infrastructure_error(sandbox, backend, code, caplog):
    """It renames the host's files and writes their names, prints what a failed set-up prints and
    exits with the launcher's, the old harness's and the cgroup shell's failure statuses: its own
    failure (reward 0 with a reason), never an infrastructure error, and nothing logged of isolation."""
    box = _box(sandbox, backend)
    with caplog.at_level(logging.WARNING):
        result = box.run(FORGE % code, "main", None, LIMITS)
    assert not result.ok and f"exit code {code}" in result.reason, result
    assert "renamed" not in result.logs, result.logs
    assert not [r for r in caplog.records if "isolat" in r.getMessage() or "confine" in r.getMessage()], caplog.text


def test_a_forged_isolation_failure_is_the_candidates_verdict_in_a_run():
    from discover.evaluation import judge_candidate
    from evaluators.base import ParentView
    from evaluators.registry import get_problem

    problem = get_problem("erdos")
    verdict = judge_candidate(problem, FORGE.replace("def main(_)", "def construct(_)") % 121, ParentView("", None), ProcessSandbox(), "c0")
    result = verdict.verdict()
    assert result.reward == 0 and not result.valid and "exit code 121" in result.reason, result


# -- system calls outside the profile --------------------------------------------------------------

SYSCALLS = """
import ctypes, os, socket

def main(numbers):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    L = ctypes.c_long
    def call(*args):
        ctypes.set_errno(0)
        r = libc.syscall(*[a if a is None or isinstance(a, bytes) else L(a) for a in args])
        return [r, ctypes.get_errno()]
    out = {
        "keyctl": call(numbers["keyctl"], 0, -3, 0),  # KEYCTL_GET_KEYRING_ID @s
        "add_key": call(numbers["add_key"], b"user", b"k", b"secret", 6, -3),
        "unshare": [libc.unshare(0x10000000), ctypes.get_errno()],  # CLONE_NEWUSER
        "ptrace": [libc.ptrace(L(0), L(0), None, None), ctypes.get_errno()],  # PTRACE_TRACEME
        "personality": [libc.personality(ctypes.c_ulong(0x0040000)), ctypes.get_errno()],  # ADDR_NO_RANDOMIZE
        "shmget": [libc.shmget(0, 4096, 0o1600), ctypes.get_errno()],  # System V shared memory
    }
    for family, name in ((40, "vsock"), (16, "netlink"), (17, "packet")):
        try:
            socket.socket(family, socket.SOCK_DGRAM if family != 40 else socket.SOCK_STREAM).close()
            out[name] = [0, 0]
        except OSError as err:
            out[name] = [-1, err.errno]
    if os.uname().machine in ("x86_64", "aarch64"):
        out["io_uring_setup"] = call(425, 8, None)
        out["userfaultfd"] = call(323 if os.uname().machine == "x86_64" else 282, 0)
    return out
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_system_calls_outside_the_profile_are_denied(sandbox, backend):
    if platform.machine() not in KEY_SYSCALLS:
        pytest.skip(f"this test knows the keyring system calls' numbers only on {', '.join(KEY_SYSCALLS)}")
    box = _box(sandbox, backend)
    add_key, keyctl = KEY_SYSCALLS[platform.machine()]
    result = box.run(SYSCALLS, "main", {"keyctl": keyctl, "add_key": add_key}, LIMITS)
    assert result.ok, (result.reason, result.logs)
    for name, (value, err) in result.output.items():
        assert value == -1 and err == errno.EPERM, f"{name} was not denied: {result.output}"
    if backend == "process":  # the host names what it refused
        for call in ("keyctl", "add_key", "unshare", "ptrace", "personality", "shmget", "socket"):
            assert call in result.denied, result.denied
        assert result.logs.startswith("[sandbox] system calls outside the sandbox's python profile were denied"), result.logs


def test_a_refused_call_is_named_in_a_failing_candidates_reason():
    program = "import socket\ndef main(_):\n    socket.socket(40, socket.SOCK_STREAM)\n"
    result = ProcessSandbox().run(program, "main", None, LIMITS)
    assert not result.ok and "PermissionError" in result.reason, result
    assert "system calls outside the sandbox's python profile were denied (EPERM): socket" in result.reason, result.reason


def test_a_compiled_programs_call_outside_its_profile_is_denied_and_named():
    source = """#include <cstdio>
#include <cerrno>
#include <unistd.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/syscall.h>
int main() {
    long r = syscall(SYS_keyctl, 0L, -3L, 0L);  // KEYCTL_GET_KEYRING_ID @s
    int e = r < 0 ? errno : 0;
    int s = shmget(IPC_PRIVATE, 4096, 0600);
    printf("%ld %d %d %d\\n", r, e, s, s < 0 ? errno : 0);
    return 3;
}
"""
    run = ProcessSandbox().run_native(source, [(0, "")], NativeLimits(cpu_s=5.0, memory_mb=256, parallel=1))
    assert run.compiled and run.cases, run
    case = run.cases[0]
    assert case.stdout.split() == [b"-1", str(errno.EPERM).encode(), b"-1", str(errno.EPERM).encode()], case
    assert case.status == "RE" and "program profile were denied (EPERM)" in case.detail, case.detail
    assert "keyctl" in case.detail and "shmget" in case.detail, case.detail


# -- who the candidate is, and what it may run -----------------------------------------------------

WHOAMI = """
import os, pwd

def main(_):
    entry = pwd.getpwuid(os.getuid())
    return {"uid": os.getuid(), "entry_uid": entry.pw_uid, "name": entry.pw_name}
"""


def test_getpwuid_knows_the_candidates_own_uid():
    # process backend only: the Docker images have no passwd entry for their run uid (docs/not-verified.md)
    out = _run(ProcessSandbox(), WHOAMI)
    assert out["entry_uid"] == out["uid"] and out["name"], out
    if os.geteuid() == 0:
        assert out["uid"] != 0, out


EXEC = """
import os, subprocess

def main(_):
    out = {}
    script = os.path.join(os.getcwd(), "own.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\\necho brought\\n")
    os.chmod(script, 0o700)
    for name, argv in (("ls", ["/bin/ls", "/"]), ("id", ["id"]), ("own", [script]), ("gcc", ["gcc", "--version"])):
        try:
            out[name] = subprocess.run(argv, capture_output=True, text=True).stdout.split("\\n")[0]
        except OSError as err:
            out[name] = type(err).__name__
    return out
"""


def test_a_python_candidate_runs_only_what_its_view_holds():
    out = _run(ProcessSandbox(), EXEC)
    assert out == {"ls": "FileNotFoundError", "id": "FileNotFoundError", "own": "brought", "gcc": "FileNotFoundError"}, out


# -- what one case of a compiled program leaves for the next ----------------------------------------

LEFTOVERS = """#include <cstdio>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
int main() {
    std::string tmp = "/tmp/left", shm = "/dev/shm/left";
    int seen_tmp = access(tmp.c_str(), F_OK) == 0, seen_shm = access(shm.c_str(), F_OK) == 0;
    printf("%d %d\\n", seen_tmp, seen_shm);
    for (const std::string &p : {tmp, shm}) {
        FILE *f = fopen(p.c_str(), "w");
        if (f) { fputs("left", f); fclose(f); chmod(p.c_str(), 0644); }
    }
}
"""


def test_a_case_finds_nothing_an_earlier_case_left_in_tmp_or_dev_shm():
    run = ProcessSandbox().run_native(LEFTOVERS, [(0, ""), (1, ""), (2, "")], NativeLimits(cpu_s=5.0, memory_mb=256, parallel=1))
    assert run.compiled and len(run.cases) == 3, run
    for case in run.cases:
        assert case.status == "OK" and case.stdout.split() == [b"0", b"0"], f"a case saw what an earlier one left: {case}"


# -- failing closed --------------------------------------------------------------------------------


def test_without_bubblewrap_the_process_backend_refuses_and_names_the_fix(monkeypatch):
    from evaluators.sandbox import get_sandbox, process

    monkeypatch.setenv("DISCOVER_BWRAP", "/nonexistent/bwrap")
    monkeypatch.setattr(process, "_problems", {})
    with pytest.raises(IsolationUnavailable, match="bubblewrap") as err:
        ProcessSandbox()
    assert "apt-get install bubblewrap" in str(err.value) and "sandbox.isolation: none" in str(err.value)
    with pytest.raises(IsolationUnavailable):
        get_sandbox("process")
    box = ProcessSandbox(isolation="none")  # asked for by name: runs, and every verdict says so
    result = box.run("def main(_):\n    return 1\n", "main", None, LIMITS)
    assert result.ok and result.logs.startswith("[sandbox] this candidate ran WITHOUT isolation"), result


def test_a_sandbox_that_cannot_be_set_up_is_an_infrastructure_failure_not_a_verdict(monkeypatch):
    from evaluators.sandbox import view

    made = view.python_view

    def with_a_bind_that_is_gone(*args, **kwargs):
        the_view, sites = made(*args, **kwargs)
        the_view.bind("/nonexistent/discover-test", "/sandbox/gone")
        return the_view, sites

    monkeypatch.setattr(view, "python_view", with_a_bind_that_is_gone)
    with pytest.raises(InfrastructureError, match="could not set up the candidate's sandbox.*nonexistent"):
        ProcessSandbox().run("def main(_):\n    return 1\n", "main", None, LIMITS)


IN_A_COPY = """
import json, sys
from evaluators.sandbox import ProcessSandbox, SandboxLimits
program = '''
import os
def main(paths):
    out = {"pid": os.getpid(), "pids": len([p for p in os.listdir("/proc") if p.isdigit()]), "uid": os.getuid()}
    try:
        with open(paths["planted"], "w") as f:
            f.write("left by a candidate")
        out["write"] = "written"
    except OSError as err:
        out["write"] = type(err).__name__
    out["copy_seen"] = os.path.exists(paths["copy"])
    return out
'''
try:
    result = ProcessSandbox().run(program, "main", json.loads(sys.argv[1]), SandboxLimits(timeout_s=60))
    print(json.dumps({"ok": result.ok, "output": result.output, "reason": result.reason}))
except Exception as err:
    print(json.dumps({"refused": f"{type(err).__name__}: {err}"}))
"""


def test_a_checkout_under_tmp_runs_candidates_isolated_or_refuses():
    """The sandbox's code copied under /tmp (where many clone), started from there: the candidate runs
    in its own namespaces and writes nothing on the host, or the sandbox refuses with the reason;
    the checkout's path never decides."""
    copy = Path(tempfile.mkdtemp(prefix="discover-checkout-", dir="/tmp"))
    open_dir = Path(tempfile.mkdtemp(prefix="discover-test-open-", dir="/tmp"))
    try:
        shutil.copytree(REPO / "evaluators", copy / "evaluators", ignore=shutil.ignore_patterns("__pycache__", "data", "published"))
        os.chmod(open_dir, 0o777)
        planted = open_dir / "planted"
        done = subprocess.run(
            [sys.executable, "-c", IN_A_COPY, json.dumps({"planted": str(planted), "copy": str(copy / "evaluators")})],
            cwd=copy,
            env={**os.environ, "PYTHONPATH": str(copy)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert not planted.exists(), f"the candidate wrote on the host: {report}"
        if "refused" in report:
            assert "bubblewrap" in report["refused"] or "sandbox" in report["refused"], report
            return
        assert report["ok"], report
        out = report["output"]
        assert out["write"] != "written" and not out["copy_seen"] and out["pids"] <= 3, out
        if os.geteuid() == 0:
            assert out["uid"] != 0, out
    finally:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.rmtree(open_dir, ignore_errors=True)


def test_the_processes_a_run_left_are_none_and_its_directory_is_gone(tmp_path, monkeypatch):
    # the run's directory made in a folder of this test's own: other processes (a concurrent test
    # worker, a run on the machine) make and remove sandbox directories in the shared temporary folder
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _run(ProcessSandbox(), "import os\ndef main(_):\n    os.makedirs('a/b', exist_ok=True)\n    os.chmod('a', 0)\n    return 1\n")
    left = [n for n in os.listdir(tmp_path) if n.startswith("discover-sandbox-")]
    assert left == [], left
