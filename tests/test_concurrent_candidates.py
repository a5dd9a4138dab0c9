"""Candidates of evaluations that run at the same time on one machine, under the process backend
(issue 27): one evaluation's program must not reach another's compiled binary or files, and every
case runs under a CPU quota of its cgroup (core pinning alone can be undone by the program).

These hold when the tests run as root (each run gets a uid and gid of its own) and where a cgroup
can be made; elsewhere they skip with the reason. The two evaluations meet through marker files in
a shared directory, so the test does not depend on timing: program B waits until A has published
the path of its own binary and is still running, and A waits until B is done. Isolated (namespaces:
a fresh /tmp each, a read-only host) two evaluations have no directory to meet in, so those two
tests run on the layer underneath (sandbox_backends.without_isolation), what a kernel without
namespaces leaves; tests/test_os_isolation.py checks the namespaces themselves.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from evaluators.sandbox import ProcessSandbox
from evaluators.sandbox.cgroups import _mounts, available
from evaluators.sandbox.native import NativeLimits, NativeRun
from tests.sandbox_backends import without_isolation

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler (g++) on this machine")

WAIT = 5000  # polls of 10 ms (50 s, inside both limits): how long a program waits for the other, a bound for a busy machine
LIMITS = NativeLimits(cpu_s=40.0, memory_mb=256, parallel=1, deadline_s=300.0)

HEAD = """#include <cstdio>
#include <cstring>
#include <string>
#include <climits>
#include <fcntl.h>
#include <libgen.h>
#include <sys/stat.h>
#include <unistd.h>
static bool exists(const std::string &p) { return access(p.c_str(), F_OK) == 0; }
static void wait_for(const std::string &p) { for (int i = 0; i < %(wait)d && !exists(p); i++) usleep(10000); }
"""

# A publishes the path of its own binary (world-readable, in the shared directory) and stays alive
# until B says it is done.
PROGRAM_A = (
    HEAD
    + """int main() {
    std::string dir = "%(dir)s";
    char self[PATH_MAX] = {0};
    if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) { puts("no-exe"); return 0; }
    std::string part = dir + "/a.part", done = dir + "/a";
    FILE *f = fopen(part.c_str(), "w"); fputs(self, f); fclose(f);
    chmod(part.c_str(), 0644); rename(part.c_str(), done.c_str());
    wait_for(dir + "/b-done");
    printf("a-waited=%%d\\n", exists(dir + "/b-done") ? 1 : 0);
}
"""
)

# B reads A's path and tries to read and to run A's binary, to list A's directories and to read the
# case input next to it, while A is still running; it prints what worked.
PROGRAM_B = (
    HEAD
    + """int main() {
    std::string dir = "%(dir)s";
    wait_for(dir + "/a");
    char exe[PATH_MAX] = {0};
    FILE *f = fopen((dir + "/a").c_str(), "r");
    if (f) { if (!fgets(exe, sizeof exe, f)) exe[0] = 0; fclose(f); }
    bool seen = f && exe[0];
    int fd = open(exe, O_RDONLY);
    int read_ok = fd >= 0; if (fd >= 0) close(fd);
    int exec_ok = access(exe, X_OK) == 0;
    char copy[PATH_MAX]; strcpy(copy, exe);
    std::string bin = dirname(copy);
    std::string work = bin.substr(0, bin.rfind('/'));
    int list_ok = access(bin.c_str(), R_OK | X_OK) == 0 || access(work.c_str(), X_OK) == 0;
    int input_ok = open((work + "/io/input").c_str(), O_RDONLY) >= 0;
    printf("seen=%%d read=%%d exec=%%d enter=%%d input=%%d\\n", seen ? 1 : 0, read_ok, exec_ok, list_ok, input_ok);
    FILE *d = fopen((dir + "/b-done").c_str(), "w"); if (d) fclose(d);
}
"""
)


def _root_with_cgroups() -> ProcessSandbox:
    if os.geteuid() != 0:
        pytest.skip("evaluations are told apart by uid only when the tests run as root")
    layout, why = available()
    if layout is None:
        pytest.skip(f"no cgroup for the process backend here: {why}")
    return ProcessSandbox()


def _without_seccomp(box: ProcessSandbox) -> ProcessSandbox:
    """The keyring tests check the layer under seccomp (which denies a candidate every keyring
    system call, tests/test_os_isolation.py): what keeps keys apart on a kernel without it."""
    box.isolation = {**box.isolation, "seccomp": None}
    return box


def _shared_dir() -> str:
    """A directory both programs (two different uids) may write: under /tmp, 0777."""
    path = tempfile.mkdtemp(prefix="discover-test-meet-")
    os.chmod(path, 0o777)
    return path


def _run_both(box: ProcessSandbox, sources: dict[str, str]) -> dict[str, NativeRun]:
    results: dict[str, NativeRun] = {}
    errors: list[BaseException] = []

    def evaluate(name: str) -> None:
        try:
            results[name] = box.run_native(sources[name], [(0, "1\n")], LIMITS)
        except BaseException as err:  # shown by the test
            errors.append(err)

    threads = [threading.Thread(target=evaluate, args=(name,)) for name in sources]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def _stdout(run: NativeRun) -> str:
    assert run.compiled, run.compile_log
    assert len(run.cases) == 1, run.error
    case = run.cases[0]
    assert case.status == "OK", (case.status, case.detail, case.stderr)
    return case.stdout.decode()


def test_a_program_cannot_reach_the_binary_of_another_evaluation_running_at_the_same_time() -> None:
    box = without_isolation(_root_with_cgroups())  # they meet in a shared directory
    meet = _shared_dir()
    try:
        fill = {"dir": meet, "wait": WAIT}
        results = _run_both(box, {"a": PROGRAM_A % fill, "b": PROGRAM_B % fill})
        a, b = _stdout(results["a"]), _stdout(results["b"])
    finally:
        shutil.rmtree(meet, ignore_errors=True)
    assert "a-waited=1" in a, a  # A was alive while B tried
    assert "seen=1" in b, b  # B knew where A's binary was
    assert "read=0" in b and "exec=0" in b, f"B reached A's binary: {b}"
    assert "enter=0" in b and "input=0" in b, f"B reached A's directories: {b}"


def _quota_program() -> str:
    """A program that prints the CPU quota files of every cgroup it is in (cgroup v1 and v2)."""
    mounts = ", ".join(f'{{"{m}", "{r.rstrip("/")}"}}' for m, r, _ in _mounts())
    return (
        """#include <cstdio>
#include <cstring>
#include <string>
#include <fstream>
int main() {
    const char *mounts[][2] = {%s};
    std::ifstream cg("/proc/self/cgroup");
    std::string line;
    while (std::getline(cg, line)) {
        std::string path = line.substr(line.find(':', line.find(':') + 1) + 1);
        if (path.find("/discover-run-") == std::string::npos) continue;  // the run's own group only
        for (auto &m : mounts) {
            std::string root = m[1];
            if (!root.empty() && path.compare(0, root.size(), root) != 0) continue;
            for (const char *file : {"cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us"}) {
                std::string p = std::string(m[0]) + "/" + path.substr(root.size()) + "/" + file;
                std::ifstream f(p);
                std::string value;
                if (f && std::getline(f, value)) printf("%%s=%%s\\n", file, value.c_str());
            }
        }
    }
}
"""
        % mounts
    )


def _quotas(text: str) -> list[float | None]:
    """CPUs of quota of each group in the lines the quota programs print (None: no quota)."""
    found: list[float | None] = []
    for line in text.splitlines():
        name, _, value = line.partition("=")
        if name == "cpu.max":
            quota, period_text = value.split()
            found.append(None if quota == "max" else int(quota) / int(period_text))
        elif name == "cpu.cfs_period_us":  # printed after cpu.cfs_quota_us: fix the last one up
            if found and found[-1] is not None:
                found[-1] = found[-1] * 100_000 / int(value)
        elif name == "cpu.cfs_quota_us":
            found.append(None if value.strip() == "-1" else int(value) / 100_000)
    return found


def _cpu_quota_or_skip() -> None:
    layout, _ = available()
    if layout is not None and "cpu" not in layout.parents and layout.version == 1:
        pytest.skip("no cgroup v1 cpu hierarchy here: the process backend cannot set a CPU quota")
    if layout is not None and layout.version == 2:
        enabled = Path(layout.parents["unified"], "cgroup.subtree_control").read_text().split()
        if "cpu" not in enabled:
            pytest.skip("the cpu controller is not enabled for the process backend's cgroups here")


def test_each_case_of_a_compiled_program_runs_under_a_cpu_quota_of_one_cpu() -> None:
    box = _root_with_cgroups()
    _cpu_quota_or_skip()
    run = box.run_native(_quota_program(), [(0, "")], NativeLimits(cpu_s=5.0, memory_mb=256, parallel=1))
    text = _stdout(run)
    assert _quotas(text) and set(_quotas(text)) == {1.0}, f"the case's cgroup has no CPU quota of one CPU: {text!r}"


def test_a_python_candidate_runs_under_the_cpu_quota_of_its_limits() -> None:
    box = _root_with_cgroups()
    _cpu_quota_or_skip()
    from evaluators.sandbox.base import SandboxLimits

    program = """
def main(mounts):
    out = []
    for line in open("/proc/self/cgroup").read().splitlines():
        path = line.split(":", 2)[2]
        if "/discover-run-" not in path:  # the run's own group only
            continue
        for mount, root in mounts:
            if root and not path.startswith(root):
                continue
            for name in ("cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us"):
                try:
                    out.append(name + "=" + open(mount + "/" + path[len(root):] + "/" + name).read().strip())
                except OSError:
                    pass
    return "\\n".join(out)
"""
    mounts = [[m, r.rstrip("/")] for m, r, _ in _mounts()]
    result = box.run(program, "main", mounts, SandboxLimits(timeout_s=30, memory_mb=512, cpus=1))
    assert result.ok, (result.reason, result.logs)
    assert _quotas(result.output) and set(_quotas(result.output)) == {1.0}, f"the candidate's cgroup has no CPU quota: {result.output!r}"


# -- kernel keys: a uid's user keyring outlives its processes, and uids are reused ------------------

# (add_key, keyctl) system call numbers, where these tests know them
SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}

KEYS = """
import ctypes, os

def main(arg):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    L = ctypes.c_long
    def keyctl(*args):
        return libc.syscall(L(arg["keyctl"]), *[a if a is None or isinstance(a, bytes) or hasattr(a, "_type_") else L(a) for a in args])
    def read(key):
        buf = ctypes.create_string_buffer(4096)
        n = keyctl(11, key, buf, 4096)  # KEYCTL_READ
        return buf.raw[:n].decode(errors="replace") if n >= 0 else None
    out = {"uid": os.getuid()}
    if arg["do"] == "plant":  # a key in the user keyring and one in the user-session keyring
        for spec, name in ((-4, b"k-user"), (-5, b"k-usersession")):
            key = libc.syscall(L(arg["add_key"]), b"user", name, arg["secret"].encode(), L(len(arg["secret"])), L(spec))
            out[name.decode()] = key >= 0
        if arg.get("lock"):  # nobody, possessor included, may touch the user keyring any more
            out["locked"] = keyctl(5, -4, 0) == 0
    elif arg["do"] == "find":  # what an earlier run of this uid left
        for spec, name in ((-4, b"k-user"), (-5, b"k-usersession")):
            key = keyctl(10, spec, b"user", name, 0)  # KEYCTL_SEARCH
            out[name.decode()] = read(key) if key >= 0 else None
    elif arg["do"] == "session":  # which session keyring this run has
        out["id"] = keyctl(0, -3, 0)  # KEYCTL_GET_KEYRING_ID
        buf = ctypes.create_string_buffer(512)
        n = keyctl(6, -3, buf, 512)  # KEYCTL_DESCRIBE: type;uid;gid;perm;name
        out["describe"] = buf.raw[: max(n - 1, 0)].decode(errors="replace")
    return out
"""


def _keys_or_skip() -> dict:
    import platform

    if not os.path.exists("/proc/key-users"):
        pytest.skip("this kernel has no keyrings (/proc/key-users is missing)")
    machine = platform.machine()
    if machine not in SYSCALLS:
        pytest.skip(f"these tests know the keyring system calls' numbers only on {', '.join(SYSCALLS)}, not {machine}")
    add_key, keyctl = SYSCALLS[machine]
    return {"keyctl": keyctl, "add_key": add_key}


def _owns_keys(uid: int) -> bool:
    return any(line.split(":", 1)[0].strip() == str(uid) for line in Path("/proc/key-users").read_text().splitlines())


def _python(box: ProcessSandbox, program: str, argument: dict) -> dict:
    from evaluators.sandbox.base import SandboxLimits

    result = box.run(program, "main", argument, SandboxLimits(timeout_s=60, memory_mb=512, cpus=1))
    assert result.ok, (result.reason, result.logs)
    return result.output


def test_a_later_candidate_with_the_same_uid_finds_none_of_an_earlier_ones_keys(monkeypatch) -> None:
    import secrets

    from evaluators.sandbox import process, reaping

    box = _without_seccomp(_root_with_cgroups())
    numbers = _keys_or_skip()
    uid = reaping.acquire_run_uid()
    reaping.release_run_uid(uid)
    monkeypatch.setattr(process, "acquire_run_uid", lambda: uid)  # the pool hands the same uid out again
    secret = secrets.token_hex(8)
    planted = _python(box, KEYS, {**numbers, "do": "plant", "secret": secret})
    assert planted == {"uid": uid, "k-user": True, "k-usersession": True}, planted
    found = _python(box, KEYS, {**numbers, "do": "find"})
    assert found["uid"] == uid
    assert found["k-user"] is None and found["k-usersession"] is None, f"the earlier candidate's keys were still there: {found}"


def test_a_uid_whose_keyring_a_candidate_locked_is_never_handed_out_again(monkeypatch) -> None:
    import secrets

    from evaluators.sandbox import process, reaping

    box = _without_seccomp(_root_with_cgroups())
    numbers = _keys_or_skip()
    uid = reaping.acquire_run_uid()
    reaping.release_run_uid(uid)
    monkeypatch.setattr(process, "acquire_run_uid", lambda: uid)
    planted = _python(box, KEYS, {**numbers, "do": "plant", "secret": secrets.token_hex(8), "lock": True})
    assert planted.get("locked") is True, planted
    assert _owns_keys(uid)  # cleared or not, the uid still owns keyrings
    picks = iter([uid - reaping.RUN_UID_BASE, uid - reaping.RUN_UID_BASE, 7])
    monkeypatch.setattr(reaping.secrets, "randbelow", lambda _n: next(picks))
    again = reaping.acquire_run_uid()
    reaping.release_run_uid(again)
    assert again == reaping.RUN_UID_BASE + 7, "the uid with a locked keyring was handed out again"


def test_each_candidate_has_a_session_keyring_of_its_own() -> None:
    import ctypes

    box = _without_seccomp(_root_with_cgroups())
    numbers = _keys_or_skip()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ours = libc.syscall(ctypes.c_long(numbers["keyctl"]), ctypes.c_long(0), ctypes.c_long(-3), ctypes.c_long(0))
    seen = [_python(box, KEYS, {**numbers, "do": "session"}) for _ in range(2)]
    for run in seen:
        kind, owner, *_, name = run["describe"].split(";")
        assert (kind, int(owner), name) == ("keyring", run["uid"], "_ses"), f"not a session keyring of the run's own: {run}"
        assert run["id"] != ours
    assert seen[0]["id"] != seen[1]["id"]


def test_each_case_of_a_compiled_program_has_a_session_keyring_of_its_own() -> None:
    box = _without_seccomp(_root_with_cgroups())
    _keys_or_skip()
    source = """#include <cstdio>
#include <unistd.h>
#include <sys/syscall.h>
int main() {
    char buf[512] = {0};
    long n = syscall(SYS_keyctl, 6L, -3L, buf, (long)sizeof buf - 1);  // KEYCTL_DESCRIBE @s
    printf("%u %s\\n", getuid(), n >= 0 ? buf : "none");
}
"""
    run = box.run_native(source, [(0, "")], NativeLimits(cpu_s=5.0, memory_mb=256, parallel=1))
    uid, describe = _stdout(run).split()
    kind, owner, *_, name = describe.split(";")
    assert (kind, owner, name) == ("keyring", uid, "_ses"), f"not a session keyring of the program's own: {describe}"


def test_where_the_cpu_controller_is_not_enabled_the_sandbox_says_runs_get_no_cpu_quota(tmp_path) -> None:
    from evaluators.sandbox.cgroups import Layout, cpu_quota_missing

    (tmp_path / "cgroup.subtree_control").write_text("memory pids\n")
    why = cpu_quota_missing(Layout(2, {"unified": str(tmp_path)}))
    assert "cpu controller is not enabled" in why and "DISCOVER_CGROUP_PARENT" in why, why
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")
    assert cpu_quota_missing(Layout(2, {"unified": str(tmp_path)})) == ""
    assert "no cgroup v1 cpu hierarchy" in cpu_quota_missing(Layout(1, {"memory": "/m", "pids": "/p"}))
    assert cpu_quota_missing(Layout(1, {"memory": "/m", "pids": "/p", "cpu": "/c"})) == ""


def test_a_run_that_never_used_keys_leaves_its_uid_owning_none() -> None:
    """Clearing keyrings must not create them (looking a uid's keyrings up does): a plain run's
    uid owns only its session keyring, which the kernel frees after its last process."""
    import time

    box = _root_with_cgroups()
    _keys_or_skip()
    uid = _python(box, "import os\ndef main(_):\n    return os.getuid()\n", {})
    for _ in range(2000):  # the kernel's key collector runs shortly after; a bound, not a measure
        if not _owns_keys(uid):
            break
        time.sleep(0.01)
    assert not _owns_keys(uid), f"uid {uid} still owns keys after a run that used none"


def test_a_cgroup_v1_cpu_hierarchy_that_takes_no_quota_is_left_out_and_said_so(monkeypatch) -> None:
    from evaluators.sandbox import cgroups

    layout, why = available()
    if layout is None or layout.version != 1 or "cpu" not in layout.parents:
        pytest.skip(f"needs cgroup v1 with a cpu hierarchy we may use ({why or 'cgroup v' + str(layout.version)})")
    real = cgroups._try
    monkeypatch.setattr(cgroups, "_try", lambda lay: "cpu.cfs_quota_us: Permission denied" if "cpu" in lay.parents else real(lay))
    fewer, why = cgroups._probe()
    assert fewer is not None, why
    assert "cpu" not in fewer.parents and "memory" in fewer.parents and "unified" in fewer.parents
    assert "no CPU quota" in cgroups.cpu_quota_missing(fewer)


PYTHON_A = """
import os, time

def main(meet):
    part, done = os.path.join(meet, "a.part"), os.path.join(meet, "a")
    with open(part, "w") as f:
        f.write(os.getcwd())
    os.chmod(part, 0o644)
    os.replace(part, done)
    for _ in range(%(wait)d):
        if os.path.exists(os.path.join(meet, "b-done")):
            return "a-waited=1"
        time.sleep(0.01)
    return "a-waited=0"
"""

PYTHON_B = """
import os, time

def main(meet):
    for _ in range(%(wait)d):
        if os.path.exists(os.path.join(meet, "a")):
            break
        time.sleep(0.01)
    tried = {}
    try:
        where = open(os.path.join(meet, "a")).read()
    except OSError:
        where = ""
    tried["seen"] = bool(where)
    for name, attempt in (
        ("list", lambda: os.listdir(where)),
        ("program", lambda: open(os.path.join(where, "candidate.py")).read()),
        ("input", lambda: open(os.path.join(where, "input.json")).read()),
    ):
        try:
            attempt()
            tried[name] = True
        except OSError:
            tried[name] = False
    open(os.path.join(meet, "b-done"), "w").close()
    return tried
"""


def test_a_python_candidate_cannot_reach_the_files_of_another_evaluation_running_at_the_same_time() -> None:
    from evaluators.sandbox.base import SandboxLimits

    box = without_isolation(_root_with_cgroups())  # they meet in a shared directory
    meet = _shared_dir()
    results: dict = {}

    def evaluate(name: str, program: str) -> None:
        results[name] = box.run(program % {"wait": WAIT}, "main", meet, SandboxLimits(timeout_s=60, memory_mb=512, cpus=1))

    try:
        threads = [threading.Thread(target=evaluate, args=args) for args in (("a", PYTHON_A), ("b", PYTHON_B))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        shutil.rmtree(meet, ignore_errors=True)
    a, b = results["a"], results["b"]
    assert a.ok and b.ok, (a.reason, a.logs, b.reason, b.logs)
    assert a.output == "a-waited=1" and b.output["seen"], (a.output, b.output)
    assert b.output == {"seen": True, "list": False, "program": False, "input": False}, f"B reached A's files: {b.output}"
