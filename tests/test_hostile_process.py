"""Hostile programs against the process backend (issue 21): its bound on a candidate's whole process
tree (a cgroup), the CPU of children a program never waits for, what a run leaves behind, private
run directories, and the project's own source kept off the candidate's import path.

Tests of the tree bound need a cgroup the backend can make here; they skip with the reason where
there is none (a normal user without a delegated cgroup). Tests of leftovers need root (the run's
own uid). Memory tests stay small: a 256 MiB limit, children of 100 MiB.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest

from evaluators.sandbox import ProcessSandbox, SandboxLimits, UnboundedProcessTree
from evaluators.sandbox import process as process_module
from evaluators.sandbox.native import NativeLimits
from tests.sandbox_backends import alive

LIMITS = SandboxLimits(timeout_s=60.0, memory_mb=512, cpus=1, max_output_bytes=100_000)
LAYOUT, NO_CGROUP = process_module.tree_bound()
needs_cgroup = pytest.mark.skipif(LAYOUT is None, reason=f"no cgroup for the process backend here: {NO_CGROUP}")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs get their own uid only when we are root")


def bounded() -> ProcessSandbox:
    return ProcessSandbox(allow_unbounded_process_tree=False)


def run(program: str, **limits):
    return bounded().run(program, "construct", None, SandboxLimits(**{**LIMITS.__dict__, **limits}))


SCRATCH_DIRS = ("/tmp", "/var/tmp", "/run/lock", "/dev/shm", "/dev/mqueue")  # the host's places anyone may write


def owned_ipc(uid: int) -> list[str]:
    """The host's System V IPC objects that `uid` created or owns."""
    found = []
    for kind in ("shm", "msg", "sem"):
        with open(f"/proc/sysvipc/{kind}") as f:
            header = f.readline().split()
            for line in f:
                row = dict(zip(header, line.split(), strict=False))
                if str(uid) in (row.get("uid"), row.get("cuid")):
                    found.append(f"{kind} {line.split()[1]}")
    return found


def _owned_in_scratch(uid: int) -> list[str]:
    found = []
    for top in SCRATCH_DIRS:
        try:
            found += [e.path for e in os.scandir(top) if e.stat(follow_symlinks=False).st_uid == uid]
        except OSError:
            continue
    return found


# -- the whole tree's memory -----------------------------------------------------------------------

# Each child holds its 100 MiB until all four have said (through a pipe) that they hold theirs, so
# they certainly hold them at once however slowly a loaded machine runs them; a child killed before
# it says so closes its end, and the parent stops waiting once every child has said so or died.
FORKS_4_X_100_MB = """
import os
def construct(parent):
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    kids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            os.close(go_w)
            block = bytearray(100 * 2**20)  # each child is far under RLIMIT_AS
            for i in range(0, len(block), 4096):
                block[i] = 1
            os.write(ready_w, b"1")
            os.close(ready_w)
            os.read(go_r, 1)  # until the parent closes go_w
            os._exit(0)
        kids.append(pid)
    os.close(ready_w)
    held = sum(len(os.read(ready_r, 1)) for _ in range(4))
    os.close(go_w)
    for pid in kids:
        os.waitpid(pid, 0)
    return 'all four children held 100 MiB at once' if held == 4 else f'only {held} children held 100 MiB'
"""


@needs_cgroup
def test_children_each_under_the_limit_cannot_take_more_than_the_limit_together():
    bystander = subprocess.Popen(["sleep", "600"])  # a process of the machine, not of the run
    try:
        result = run(FORKS_4_X_100_MB, memory_mb=256)
        assert not result.ok
        assert "memory limit (256 MB) exceeded by the process tree" in result.reason
        assert alive(bystander.pid) and alive(os.getpid())  # the kill stayed inside the run
    finally:
        bystander.kill()
        bystander.wait()


@needs_cgroup
def test_the_same_children_fit_under_a_larger_limit():
    result = run(FORKS_4_X_100_MB, memory_mb=1024)
    assert result.ok, result.reason
    assert result.output == "all four children held 100 MiB at once"


@needs_cgroup
def test_the_run_cgroup_is_removed(monkeypatch):
    from evaluators.sandbox import cgroups

    made: list[list[str]] = []
    limit = cgroups.RunCgroup._limit
    monkeypatch.setattr(cgroups.RunCgroup, "_limit", lambda self, *a: (made.append(list(self.dirs.values())), limit(self, *a))[1])
    program = "def construct(parent):\n    return open('/proc/self/cgroup').read()\n"
    result = run(program)
    assert result.ok, result.reason
    # in a cgroup namespace made inside the run's cgroup, that cgroup is the candidate's root
    assert all(line.endswith(":/") for line in result.output.splitlines()), result.output
    assert len(made) == 1 and made[0], made
    assert not any(os.path.exists(d) for d in made[0]), made


# -- refusing, or warning once, where no cgroup can be made ---------------------------------------


def test_without_a_cgroup_it_refuses_unless_allowed(monkeypatch, caplog):
    monkeypatch.setattr(process_module, "tree_bound", lambda: (None, "no cgroup filesystem is mounted"))
    monkeypatch.setattr(process_module, "_warned", process_module.threading.Event())
    with pytest.raises(UnboundedProcessTree) as err:
        ProcessSandbox(allow_unbounded_process_tree=False)
    message = str(err.value)
    assert "\n" not in message and "sandbox.backend: docker" in message
    assert "sandbox.allow_unbounded_process_tree: true" in message
    with caplog.at_level(logging.WARNING, logger=process_module.__name__):
        boxes = [ProcessSandbox(allow_unbounded_process_tree=True) for _ in range(3)]
    assert len([r for r in caplog.records if "bounded only per process" in r.getMessage()]) == 1
    result = boxes[0].run("def construct(parent):\n    return 7\n", "construct", None, LIMITS)
    assert result.ok and result.output == 7


def test_preflight_names_the_fix(monkeypatch):
    from discover.config import RunConfig
    from discover.preflight import PreflightError, preflight

    monkeypatch.setattr(process_module, "tree_bound", lambda: (None, "no cgroup filesystem is mounted"))
    monkeypatch.delenv(process_module.ALLOW_ENV, raising=False)
    config = RunConfig(problem="erdos", sandbox={"backend": "process"})
    with pytest.raises(PreflightError, match="allow_unbounded_process_tree"):
        preflight(config)
    preflight(RunConfig(problem="erdos", sandbox={"backend": "process", "allow_unbounded_process_tree": True}))


# -- the project's source is not on the candidate's path ------------------------------------------


def test_candidate_cannot_import_the_project_but_can_import_numpy():
    program = (
        "import sys, importlib.util\n"
        "def construct(parent):\n"
        "    import numpy, scipy\n"
        "    return [importlib.util.find_spec(m) is not None for m in ('evaluators', 'discover', 'flows')] + [sys.path]\n"
    )
    result = run(program)
    assert result.ok, result.reason
    *found, path = result.output
    assert found == [False, False, False]
    repo = os.path.realpath(Path(__file__).resolve().parents[1])
    assert repo not in [os.path.realpath(p) for p in path]


# -- leftovers and private directories ------------------------------------------------------------

LEAVES_THINGS = """
import ctypes, ctypes.util, os
def construct(parent):
    uid = os.getuid()
    made = []
    for top in ('/tmp', '/var/tmp', '/run/lock', '/dev/shm'):
        try:
            with open(f'{top}/procsb-leftover-{uid}', 'w') as f:
                f.write('x')
            os.makedirs(f'{top}/procsb-dir-{uid}/inner')
            made.append(top)
        except OSError:
            pass
    libc = ctypes.CDLL(None, use_errno=True)
    ipc = [libc.shmget(0, 4096, 0o1600), libc.msgget(0, 0o1600), libc.semget(0, 1, 0o1600)]  # IPC_PRIVATE | IPC_CREAT
    rt = ctypes.CDLL(ctypes.util.find_library('rt') or None, use_errno=True)
    queue = rt.mq_open(f'/procsb-{uid}'.encode(), os.O_CREAT | os.O_RDWR, 0o600, None)
    mq_errno = ctypes.get_errno() if queue == -1 else 0
    mode = oct(os.stat('/tmp/procsb-leftover-%d' % uid).st_mode & 0o777) if '/tmp' in made else None
    return {'uid': uid, 'made': made, 'ipc': ipc, 'mq': queue, 'mq_errno': mq_errno, 'tmp_mode': mode,
            'cwd_mode': oct(os.stat('.').st_mode & 0o777), 'cwd_uid': os.stat('.').st_uid}
"""


@needs_root
def test_files_and_ipc_objects_of_the_run_are_gone_afterwards():
    result = run(LEAVES_THINGS)
    assert result.ok, result.reason
    out = result.output
    uid = out["uid"]
    assert uid != 0 and "/tmp" in out["made"]  # it did leave files behind, in its own scratch filesystems
    assert out["ipc"] == [-1, -1, -1]  # System V IPC is outside every profile (EPERM)
    assert _owned_in_scratch(uid) == []
    assert owned_ipc(uid) == []
    assert out["mq"] == -1 and out["mq_errno"] != 0  # no POSIX message queue could be made at all


@needs_root
def test_the_run_directory_and_new_files_are_private():
    out = run(LEAVES_THINGS).output
    assert out["cwd_mode"] == "0o777" and out["cwd_uid"] == 0  # a tmpfs of its own sandbox, on no disk of the host
    assert out["tmp_mode"] == "0o600"  # umask 077: other runs' uids cannot read what it writes


# -- compiled programs ----------------------------------------------------------------------------


def native(source: str, **limits):
    defaults = {"cpu_s": 2.0, "memory_mb": 256, "parallel": 1}
    run = bounded().run_native(source, [(0, "")], NativeLimits(**{**defaults, **limits}))
    assert run.compiled, run.compile_log
    (case,) = run.cases
    return case


UNWAITED_WORKERS = r"""
#include <cstdio>
#include <ctime>
#include <unistd.h>
int main() {
    for (int i = 0; i < 2; i++)
        if (fork() == 0) { volatile unsigned long x = 0; for (;;) x++; }  // never waited for
    clock_t t = clock();
    while ((double)(clock() - t) / CLOCKS_PER_SEC < 0.4) {}  // 0.4 s of its own CPU
    puts("done");
    return 0;
}
"""


@needs_cgroup
def test_cpu_of_children_it_never_waits_for_is_recorded():
    case = native(UNWAITED_WORKERS)
    # its own rusage says about 0.4 s; its two workers shared its one core all along
    assert case.cpu_s >= 0.8, (case.status, case.detail, case.cpu_s)


# As FORKS_4_X_100_MB: each child holds its 100 MiB until all four have said they hold theirs.
FORKS_IN_CPP = r"""
#include <cstdio>
#include <cstdlib>
#include <sys/wait.h>
#include <unistd.h>
int main() {
    int ready[2], go[2];
    if (pipe(ready) != 0 || pipe(go) != 0) return 2;
    for (int i = 0; i < 4; i++)
        if (fork() == 0) {
            close(go[1]);
            volatile char *p = (volatile char *)malloc(100 << 20);  // volatile: not optimised away
            for (int j = 0; j < (100 << 20); j += 4096) p[j] = 1;
            if (write(ready[1], "1", 1) != 1) return 3;
            close(ready[1]);
            char c;
            if (read(go[0], &c, 1) < 0) return 4;  // until the parent closes go[1]
            return p[4096] - 1;
        }
    close(ready[1]);
    char c;
    int held = 0;
    while (held < 4 && read(ready[0], &c, 1) == 1) held++;
    close(go[1]);
    while (wait(nullptr) > 0) {}
    printf("held %d x 100 MiB\n", held);
    return 0;
}
"""


@needs_cgroup
def test_a_compiled_programs_children_share_one_memory_limit():
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        case = native(FORKS_IN_CPP, memory_mb=192, cpu_s=5.0)
        assert case.status == "MLE", (case.status, case.detail)
        assert "out-of-memory killer" in case.detail
        assert alive(bystander.pid)
    finally:
        bystander.kill()
        bystander.wait()


LEAVES_THINGS_CPP = r"""
#include <cstdio>
#include <fcntl.h>
#include <mqueue.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>
int main() {
    char path[128];
    snprintf(path, sizeof path, "/run/lock/procsb-%d", (int)getuid());
    FILE *f = fopen(path, "w");
    int shm = shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600);
    mqd_t q = mq_open("/procsb-native", O_CREAT | O_RDWR, 0600, nullptr);
    struct stat st; stat(".", &st);
    printf("%d %d %d %d %o %d\n", (int)getuid(), f != nullptr, shm, (int)(q != (mqd_t)-1), st.st_mode & 0777, (int)st.st_uid);
    return 0;
}
"""


@needs_root
def test_a_compiled_program_leaves_nothing_and_runs_in_a_private_directory():
    case = native(LEAVES_THINGS_CPP)
    uid, wrote, shm, queue, mode, owner = case.stdout.decode().split()
    assert int(uid) != 0 and wrote == "0" and int(shm) == -1  # no /run/lock in its view, System V IPC denied
    assert queue == "0"  # no POSIX message queue could be made
    assert mode == "777" and int(owner) == 0  # its own tmpfs (scratch of its sandbox, not the host's disk)
    assert _owned_in_scratch(int(uid)) == [] and owned_ipc(int(uid)) == []
