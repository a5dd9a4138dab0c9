"""The operating system is the boundary (issue 27): what a candidate cannot do whatever it writes, in
both backends where it applies. The process backend isolates each candidate with namespaces, a
read-only view of the host, fresh scratch filesystems, Landlock and seccomp
(evaluators/sandbox/isolation.py); Docker with its container (no network, its own PID, IPC and
mount namespaces, its default seccomp profile).

Process-backend tests need root and a kernel that offers the mechanism; elsewhere they skip with the
reason (ProcessSandbox.isolation_missing). Nothing here depends on timing: where two runs must
overlap, the test finds the first one's file through /proc/<pid>/root before it starts the second.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import secrets
import shutil
import socket
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from evaluators.sandbox import ProcessSandbox, SandboxLimits
from evaluators.sandbox.native import NativeLimits
from tests.sandbox_backends import sandboxes_by_backend

LIMITS = SandboxLimits(timeout_s=60.0, memory_mb=512, cpus=1, max_output_bytes=100_000)
BACKENDS = ["process", "docker"]
REPO = Path(__file__).resolve().parents[1]
# (add_key, keyctl) system call numbers where these tests know them
KEY_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}


@pytest.fixture(scope="module")
def sandbox():
    yield from sandboxes_by_backend("python-math")


def _box(sandbox, backend: str, *needs: str):
    if backend == "process":
        if os.geteuid() != 0:
            pytest.skip("the process backend isolates candidates with namespaces only when it runs as root")
        box = ProcessSandbox()
        missing = {name: why for name, why in box.isolation_missing.items() if name in needs}
        if missing:
            pytest.skip(f"this kernel does not offer it: {missing}")
        return box
    from evaluators.sandbox import docker_unavailable

    why = docker_unavailable("python-math")
    if why:
        pytest.skip(f"docker backend not testable here: {why}")
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
    box = _box(sandbox, backend, "namespaces")
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
    box = _box(sandbox, backend, "namespaces")
    (REPO / ".cache").mkdir(exist_ok=True)
    dirs = [tempfile.mkdtemp(prefix="discover-test-open-", dir=REPO / ".cache"), tempfile.mkdtemp(prefix="discover-test-open-")]
    try:
        for d in dirs:
            os.chmod(d, 0o777)
        targets = [os.path.join(d, "planted") for d in dirs] + [f"/var/tmp/discover-test-{secrets.token_hex(6)}"]
        out = _run(box, WRITE, targets)
        for path in targets:
            assert not os.path.exists(path), f"the candidate wrote {path} on the host: {out}"
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        if os.path.exists(targets[-1]):
            os.unlink(targets[-1])


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
    box = _box(sandbox, backend, "namespaces")
    out = _run(box, PROCESSES, os.getpid())
    assert out["signal"] == "no such process" and not out["listed"], out


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


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_evaluations_at_once_cannot_see_each_others_tmp(sandbox, backend):
    box = _box(sandbox, backend, "namespaces")
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
    box = _box(None, "process", "namespaces")
    monkeypatch.setattr(sys, "path", ["/tmp", *sys.path])
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="discover-host-") as host_file:
        out = _run(box, SCRATCH_OF_ITS_OWN, os.path.basename(host_file.name))
    assert out == {"host_file_seen": False, "own_file": "written"}


# -- kernel keys and other system calls ------------------------------------------------------------

SYSCALLS = """
import ctypes, os

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
    }
    if numbers.get("more"):
        out["ptrace"] = [libc.ptrace(L(0), L(0), None, None), ctypes.get_errno()]  # PTRACE_TRACEME
        out["personality"] = [libc.personality(ctypes.c_ulong(0x0040000)), ctypes.get_errno()]  # ADDR_NO_RANDOMIZE
        out["io_uring_setup"] = call(425, 8, None) if os.uname().machine in ("x86_64", "aarch64") else [-1, 1]
    return out
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_keyrings_and_namespaces_are_out_of_a_candidates_reach(sandbox, backend):
    if platform.machine() not in KEY_SYSCALLS:
        pytest.skip(f"this test knows the keyring system calls' numbers only on {', '.join(KEY_SYSCALLS)}")
    box = _box(sandbox, backend, "seccomp")
    add_key, keyctl = KEY_SYSCALLS[platform.machine()]
    out = _run(box, SYSCALLS, {"keyctl": keyctl, "add_key": add_key, "more": backend == "process"})
    for name, (result, err) in out.items():
        assert result == -1 and err == errno.EPERM, f"{name} was not denied: {out}"


def test_a_compiled_programs_keyctl_is_denied():
    box = _box(None, "process", "seccomp")
    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler (g++)")
    source = """#include <cstdio>
#include <cerrno>
#include <unistd.h>
#include <sys/syscall.h>
int main() {
    long r = syscall(SYS_keyctl, 0L, -3L, 0L);  // KEYCTL_GET_KEYRING_ID @s
    printf("%ld %d\\n", r, r < 0 ? errno : 0);
}
"""
    run = box.run_native(source, [(0, "")], NativeLimits(cpu_s=5.0, memory_mb=256, parallel=1))
    assert run.compiled and run.cases and run.cases[0].status == "OK", run
    assert run.cases[0].stdout.split() == [b"-1", str(errno.EPERM).encode()], run.cases[0]


# -- who the candidate is, and what it may run -----------------------------------------------------

WHOAMI = """
import os, pwd

def main(_):
    entry = pwd.getpwuid(os.getuid())
    return {"uid": os.getuid(), "entry_uid": entry.pw_uid, "name": entry.pw_name}
"""


def test_getpwuid_knows_the_candidates_own_uid():
    # process backend only: the Docker images have no passwd entry for their run uid (docs/not-verified.md)
    box = _box(None, "process", "namespaces")
    out = _run(box, WHOAMI)
    assert out["entry_uid"] == out["uid"] and out["name"], out


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
            out[name] = err.strerror
    return out
"""


def test_a_python_candidate_executes_only_its_own_files_the_interpreter_and_the_toolchain():
    box = _box(None, "process", "landlock")
    out = _run(box, EXEC)
    assert out["ls"] == "Permission denied" and out["id"] == "Permission denied", out
    assert out["own"] == "brought", out
    if shutil.which("gcc"):
        assert out["gcc"].startswith("gcc"), out


# -- what one case of a compiled program leaves for the next ----------------------------------------

LEFTOVERS = """#include <cstdio>
#include <string>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>
int main() {
    std::string tmp = "%(tmp)s/left", shm = "%(shm)s/left";
    int seen_tmp = access(tmp.c_str(), F_OK) == 0, seen_shm = access(shm.c_str(), F_OK) == 0;
    int seen_sysv = shmget(%(key)d, 0, 0) >= 0;
    printf("%%d %%d %%d\\n", seen_tmp, seen_shm, seen_sysv);
    for (const std::string &p : {tmp, shm}) {
        FILE *f = fopen(p.c_str(), "w");
        if (f) { fputs("left", f); fclose(f); chmod(p.c_str(), 0644); }
    }
    int id = shmget(%(key)d, 4096, IPC_CREAT | 0666);
    struct shmid_ds ds;
    if (id >= 0 && shmctl(id, IPC_STAT, &ds) == 0) {  // handed to another owner: a clean-up by uid misses it
        ds.shm_perm.uid = 0;
        shmctl(id, IPC_SET, &ds);
    }
}
"""


def test_a_case_finds_nothing_an_earlier_case_left_in_tmp_dev_shm_or_system_v_ipc():
    box = _box(None, "process", "namespaces")
    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler (g++)")
    key = 0x5EED0000 + secrets.randbelow(1 << 16)
    # world-writable directories of the host (like /tmp/.X11-unix): a clean-up by uid misses what is in them
    dirs = [tempfile.mkdtemp(prefix="discover-test-sticky-", dir=top) for top in ("/tmp", "/dev/shm")]
    try:
        for d in dirs:
            os.chmod(d, 0o1777)
        source = LEFTOVERS % {"tmp": dirs[0], "shm": dirs[1], "key": key}
        run = box.run_native(source, [(0, ""), (1, ""), (2, "")], NativeLimits(cpu_s=5.0, memory_mb=256, parallel=1))
        assert run.compiled and len(run.cases) == 3, run
        for case in run.cases:
            assert case.status == "OK" and case.stdout.split() == [b"0", b"0", b"0"], f"a case saw what an earlier one left: {case}"
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        libc = ctypes.CDLL(None, use_errno=True)
        ident = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(0), ctypes.c_int(0))
        if ident >= 0:
            libc.shmctl(ident, 0, None)  # IPC_RMID: what the old code let through


# -- what the sandbox says when isolation is missing or fails ---------------------------------------


def test_a_mechanism_the_kernel_lacks_is_said_once_and_runs_go_on_without_it(monkeypatch, caplog):
    from evaluators.sandbox import isolation, process

    if os.geteuid() != 0:
        pytest.skip("needs root (the namespaces)")
    monkeypatch.setattr(process, "_isolation", None)  # found again, with libseccomp "missing"
    monkeypatch.setattr(process._warned_isolation, "is_set", lambda: False)

    def no_libseccomp():
        raise OSError("libseccomp.so.2: cannot open shared object file")

    monkeypatch.setattr(isolation, "seccomp_filter", no_libseccomp)
    with caplog.at_level("WARNING", logger=process.__name__):
        box = ProcessSandbox()
    assert "libseccomp.so.2" in box.isolation_missing.get("seccomp", ""), box.isolation_missing
    assert any("without seccomp" in r.getMessage() for r in caplog.records), caplog.text
    out = _run(box, PROCESSES, os.getpid())  # still in its own namespaces
    assert out["signal"] == "no such process", out


def test_isolation_that_fails_is_an_infrastructure_failure_not_a_verdict(monkeypatch):
    box = _box(None, "process", "namespaces")
    spec = box._isolation_spec

    def with_a_bind_that_is_gone(*args):
        made = spec(*args)
        made["binds"].append(["/nonexistent/discover-test", False])
        return made

    monkeypatch.setattr(box, "_isolation_spec", with_a_bind_that_is_gone)
    with pytest.raises(RuntimeError, match="could not isolate the candidate"):
        box.run("def main(_):\n    return 1\n", "main", None, LIMITS)


def test_what_a_candidate_leaves_running_dies_with_its_namespace():
    """A grandchild in a session of its own, still sleeping when the candidate returns (a guard: the
    clean-up by uid ended it before namespaces too)."""
    from evaluators.sandbox.reaping import uid_pids

    box = _box(None, "process", "namespaces")
    program = (
        "import os, time\n"
        "def main(_):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(1000)\n"
        "        os._exit(0)\n"
        "    return os.getuid()\n"
    )
    uid = _run(box, program)
    assert uid_pids(uid) == [], f"processes of the run's uid {uid} outlived it"
