"""Candidates of evaluations that run at the same time on one machine, under the process backend
(issues 27 and 36): one evaluation's program must not reach another's compiled binary or files, and
every run and case runs under a CPU quota of its cgroup (core pinning alone can be undone).

Each evaluation has its own sandbox (bubblewrap: its own view, scratch filesystems and PID
namespace) and, as root, its own uid, so two evaluations have no directory to meet in. The test
finds the first evaluation's files on the host and hands their paths to the second as its input,
while the first is still running (it waits until the test writes a file into its own /tmp through
/proc/<pid>/root): no timing is involved. The CPU quota is read from the host side, from the cgroups
the sandbox made (a candidate's view has no cgroup file system).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from evaluators.sandbox import ProcessSandbox
from evaluators.sandbox.cgroups import available
from evaluators.sandbox.native import NativeLimits, NativeRun

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler (g++) on this machine")

LIMITS = NativeLimits(cpu_s=40.0, memory_mb=256, parallel=1, deadline_s=300.0)
WAIT = 5000  # polls of 10 ms: how long the first program waits to be told to finish, a bound for a busy machine
WAIT_PY = 25000  # the same for a Python candidate, whose neighbour (a second Python run) took over 50 s beside two CPU hogs

# The first evaluation: stays alive until the test writes /tmp/go into its own scratch filesystem.
WAITS_CPP = """#include <cstdio>
#include <unistd.h>
int main() {
    for (int i = 0; i < %(wait)d && access("/tmp/go", F_OK) != 0; i++) usleep(10000);
    puts(access("/tmp/go", F_OK) == 0 ? "told" : "never told");
}
"""
# The second: tries to read, run and enter each path of its input (the first's binary and directories).
TRIES_CPP = """#include <cstdio>
#include <fcntl.h>
#include <unistd.h>
#include <iostream>
#include <string>
int main() {
    std::string path;
    while (std::cin >> path) {
        int fd = open(path.c_str(), O_RDONLY);
        int exec_ok = access(path.c_str(), X_OK) == 0, enter_ok = access(path.c_str(), R_OK | X_OK) == 0;
        printf("%s read=%d exec=%d enter=%d\\n", path.c_str(), fd >= 0, exec_ok, enter_ok);
        if (fd >= 0) close(fd);
    }
}
"""
WAITS_PY = """
import os, time

def main(_):
    for _ in range(%(wait)d):
        if os.path.exists("/tmp/go"):
            return "told"
        time.sleep(0.01)
    return "never told"
"""
TRIES_PY = """
import os

def main(paths):
    out = {}
    for path in paths:
        try:
            out[path] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path, "rb").read(10).decode("latin-1")
        except OSError as err:
            out[path] = type(err).__name__
    return out
"""


def _root_with_cgroups() -> ProcessSandbox:
    if os.geteuid() != 0:
        pytest.skip("evaluations are told apart by uid only when the tests run as root")
    layout, why = available()
    if layout is None:
        pytest.skip(f"no cgroup for the process backend here: {why}")
    return ProcessSandbox()


def _alongside(run_first, find_first, run_second):
    """Run `run_first()` in a thread; once `find_first()` gives (pid, host paths of its files), run
    `run_second(paths)`, then tell the first to finish (/tmp/go in its own scratch filesystem)."""
    results: dict = {}
    thread = threading.Thread(target=lambda: results.update(first=run_first()))
    thread.start()
    try:
        found = None
        for _ in range(6000):  # a bound for a busy machine, not a measure
            found = find_first()
            if found is not None or not thread.is_alive():
                break
            time.sleep(0.01)
        assert found is not None, f"the first evaluation was never seen running: {results}"
        pid, paths = found
        second = run_second(paths)
        Path(f"/proc/{pid}/root/tmp/go").write_text("")
    finally:
        thread.join(300)
    return results["first"], second, paths


def _process_running(path: str) -> int | None:
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.readlink(f"/proc/{name}/exe") == path:
                return int(name)
        except OSError:
            continue
    return None


def _stdout(run: NativeRun) -> str:
    assert run.compiled, run.compile_log
    assert len(run.cases) == 1, run.error
    case = run.cases[0]
    assert case.status == "OK", (case.status, case.detail, case.stderr)
    return case.stdout.decode()


def _ours() -> set[int]:
    """The pids of this process's descendants (the sandboxes it started, not other workers')."""
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_a_program_cannot_reach_the_binary_of_another_evaluation_running_at_the_same_time(made_here: list[str]) -> None:
    box = _root_with_cgroups()

    def find():
        for parent in [d for d in list(made_here) if os.path.basename(d).startswith("discover-native-")]:
            binary = os.path.join(parent, "w", "bin", "main")
            pid = _process_running(binary)
            if pid is not None and pid in _ours():
                work = os.path.dirname(os.path.dirname(binary))
                return pid, [binary, os.path.dirname(binary), work, os.path.join(work, "io", "input")]
        return None

    first, second, paths = _alongside(
        lambda: box.run_native(WAITS_CPP % {"wait": WAIT}, [(0, "1\n")], LIMITS),
        find,
        lambda paths: box.run_native(TRIES_CPP, [(0, "\n".join(paths) + "\n")], LIMITS),
    )
    assert _stdout(first).strip() == "told", first  # the first was alive while the second tried
    tried = _stdout(second)
    for path in paths:
        assert f"{path} read=0 exec=0 enter=0" in tried, f"the second reached the first's files: {tried}"


def test_a_python_candidate_cannot_reach_the_files_of_another_evaluation_running_at_the_same_time(made_here: list[str]) -> None:
    from evaluators.sandbox.base import SandboxLimits

    box = _root_with_cgroups()
    limits = SandboxLimits(timeout_s=400, memory_mb=512, cpus=1)  # above WAIT_PY's 250 s: never told is an answer, not a timeout

    def find():
        for run_dir in [d for d in list(made_here) if os.path.basename(d).startswith("discover-sandbox-")]:
            for pid in _ours():
                if os.path.exists(f"/proc/{pid}/root/sandbox/harness.py"):
                    return pid, [os.path.join(run_dir, "work"), run_dir, os.path.join(run_dir, "output.json")]
        return None

    first, second, paths = _alongside(
        lambda: box.run(WAITS_PY % {"wait": WAIT_PY}, "main", None, limits), find, lambda paths: box.run(TRIES_PY, "main", paths, limits)
    )
    assert first.ok and first.output == "told", (first.reason, first.logs)
    assert second.ok, (second.reason, second.logs)
    assert second.output == dict.fromkeys(paths, "FileNotFoundError"), f"the second reached the first's files: {second.output}"


def _quota_files(directory: str) -> list[str]:
    out = []
    for name in ("cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            out.append(f"{name}={Path(path).read_text().strip()}")
    return out


def _quotas_made(monkeypatch) -> list[list[float | None]]:
    """The CPU quotas of every cgroup the sandbox makes from now on, read back from the kernel's
    files right after the sandbox set them (one list of quotas, in CPUs, per cgroup)."""
    from evaluators.sandbox import cgroups

    made: list[list[float | None]] = []
    limit = cgroups.RunCgroup._limit

    def and_read_back(self, *args):
        limit(self, *args)
        made.append(_quotas("\n".join(line for d in self.dirs.values() for line in _quota_files(d))))

    monkeypatch.setattr(cgroups.RunCgroup, "_limit", and_read_back)
    return made


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


def test_each_case_of_a_compiled_program_runs_under_a_cpu_quota_of_one_cpu(monkeypatch) -> None:
    box = _root_with_cgroups()
    _cpu_quota_or_skip()
    made = _quotas_made(monkeypatch)
    run = box.run_native("int main() { return 0; }\n", [(0, ""), (1, "")], NativeLimits(cpu_s=5.0, memory_mb=256, parallel=1))
    assert run.compiled and [c.status for c in run.cases] == ["OK", "OK"], run
    assert len(made) == 3 and all(q and set(q) == {1.0} for q in made), f"a case's or the compiler's cgroup has no quota of one CPU: {made}"


def test_a_python_candidate_runs_under_the_cpu_quota_of_its_limits(monkeypatch) -> None:
    from evaluators.sandbox.base import SandboxLimits

    box = _root_with_cgroups()
    _cpu_quota_or_skip()
    made = _quotas_made(monkeypatch)
    result = box.run("def main(_):\n    return 1\n", "main", None, SandboxLimits(timeout_s=30, memory_mb=512, cpus=2))
    assert result.ok, (result.reason, result.logs)
    assert made and set(made[0]) == {2.0}, f"the candidate's cgroup has no quota of its two CPUs: {made}"


def test_where_the_cpu_controller_is_not_enabled_the_sandbox_says_runs_get_no_cpu_quota(tmp_path) -> None:
    from evaluators.sandbox.cgroups import Layout, cpu_quota_missing

    (tmp_path / "cgroup.subtree_control").write_text("memory pids\n")
    why = cpu_quota_missing(Layout(2, {"unified": str(tmp_path)}))
    assert "cpu controller is not enabled" in why and "DISCOVER_CGROUP_PARENT" in why, why
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")
    assert cpu_quota_missing(Layout(2, {"unified": str(tmp_path)})) == ""
    assert "no cgroup v1 cpu hierarchy" in cpu_quota_missing(Layout(1, {"memory": "/m", "pids": "/p"}))
    assert cpu_quota_missing(Layout(1, {"memory": "/m", "pids": "/p", "cpu": "/c"})) == ""


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
