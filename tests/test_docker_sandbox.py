"""The docker backend: same verdicts as the process backend, nothing left behind (issue 4)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from evaluators.math.erdos import ErdosProblem
from evaluators.sandbox import ProcessSandbox, SandboxLimits, docker_unavailable

REPO = Path(__file__).resolve().parents[1]
WHY = docker_unavailable("python-math")
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"docker backend not testable here: {WHY}")
# Generous: these programs are meant to succeed, and a loaded machine must not turn them into timeouts.
LIMITS = SandboxLimits(timeout_s=60.0, memory_mb=512, cpus=1, max_output_bytes=100_000)
# How long the engine may take to remove containers (and their processes to go) on a loaded machine;
# a condition is polled, so this only bounds a failure.
GONE_WITHIN_S = 120


def _wait_until(condition, timeout: float = GONE_WITHIN_S) -> None:
    """Poll `condition` until it holds or `timeout` seconds pass; the caller asserts it afterwards."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.25)


def _docker(image: str = "python-math", concurrency: int = 2):
    from evaluators.sandbox.docker import DockerSandbox

    return DockerSandbox(image=image, concurrency=concurrency)


def _all() -> list:
    from evaluators.sandbox.docker import sandbox_containers

    return sandbox_containers()


def _ours() -> list:
    """This test process's containers: another process's sandbox (a concurrent test session, a
    run on the same engine) starts and stops containers of its own while these tests count."""
    from evaluators.sandbox.docker import OWNER_LABEL, _owner

    owner = _owner()
    return [c for c in _all() if c.labels.get(OWNER_LABEL) == owner]


def _run_uid_pids(containers: set[str] | None = None) -> list[int]:
    """Live host processes running as the containers' candidate or keeper uid in `containers` (by
    id; default: this test process's containers now), read from each process's cgroup, which names
    its container: another process's containers (a concurrent test worker, a run on the same
    machine) run the same uids."""
    from evaluators.sandbox.docker import KEEPER_UID, RUN_UID

    ours = {c.id for c in _ours()} if containers is None else containers
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue
        uid = int(status.split("Uid:", 1)[1].split()[0])
        state = status.split("State:", 1)[1].split()[0]
        if uid in (RUN_UID, KEEPER_UID) and state != "Z" and any(cid in cgroup for cid in ours):
            found.append(int(entry.name))
    return found


CANDIDATES = {
    "good": "import numpy as np\ndef construct(p):\n    return (np.arange(20) % 2 * 0.5 + 0.25).tolist()\n",
    "parent": "def construct(p):\n    return p\n",
    "raises": "def construct(p):\n    raise ValueError('nope')\n",
    "syntax": "def construct(p)\n    return 1\n",
    "no entry": "def other(p):\n    return 1\n",
    "not json": "def construct(p):\n    return object()\n",
    "nan": "def construct(p):\n    return [float('nan'), 0.5]\n",
    "out of range": "def construct(p):\n    return [2.0, 0.5]\n",
    "exit": "import sys\ndef construct(p):\n    sys.exit(0)\n",
    "timeout": "import time\ndef construct(p):\n    time.sleep(1000)\n",
    "memory": "def construct(p):\n    return bytearray(3 * 2**30)\n",
    "prints": "def construct(p):\n    print('hello')\n    return [0.5] * 8\n",
}


def test_verdicts_agree_with_the_process_backend():
    problem = ErdosProblem(timeout_s=20.0, memory_mb=512, cpus=1)  # only "timeout" is meant to reach it
    parent = type("Parent", (), {"construction": [0.4] * 30, "code": ""})()
    box = _docker()
    try:
        for name, program in CANDIDATES.items():
            a = problem.evaluate(program, parent, ProcessSandbox())
            b = problem.evaluate(program, parent, box)
            assert (a.valid, a.reward, a.construction) == (b.valid, b.reward, b.construction), name
            if a.valid:
                assert a.observation == b.observation, name
            if not a.valid:  # both give a reason of the same kind
                assert a.reason.split(":")[0].split(" ")[0] == b.reason.split(":")[0].split(" ")[0], (name, a.reason, b.reason)
    finally:
        box.close()


def test_raw_results_agree():
    box = _docker()
    try:
        for name in ("good", "parent", "no entry", "not json", "prints"):
            a = ProcessSandbox().run(CANDIDATES[name], "construct", [1, 2.5, None], LIMITS)
            b = box.run(CANDIDATES[name], "construct", [1, 2.5, None], LIMITS)
            assert (a.ok, a.output, a.reason, a.logs) == (b.ok, b.output, b.reason, b.logs), name
    finally:
        box.close()


def test_warm_pool_reuses_containers_and_close_removes_them():
    before = {c.id for c in _ours()}
    box = _docker(concurrency=2)
    for _ in range(5):
        assert box.run(CANDIDATES["good"], "construct", None, LIMITS).ok
    mine = {c.id for c in _ours()} - before
    assert len(mine) == 1  # sequential runs share one warm container
    box.close()
    _wait_until(lambda: not {c.id for c in _ours()} - before)
    assert {c.id for c in _ours()} - before == set()


def test_containers_go_when_the_host_process_is_killed():
    """SIGKILL the owner: its attach socket closes, the keeper sees EOF, auto_remove cleans up."""
    script = textwrap.dedent(
        """
        import os, signal, sys
        sys.path.insert(0, %r)
        from evaluators.sandbox.docker import DockerSandbox
        from evaluators.sandbox.base import SandboxLimits
        box = DockerSandbox(image="python-math", concurrency=2)
        assert box.run("def construct(p):\\n    return 1\\n", "construct", None, SandboxLimits(timeout_s=60)).ok
        print("READY", os.getpid(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
        % str(REPO)
    )
    # Generous: the first container start on a loaded machine.
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert "READY" in done.stdout, done.stderr
    pid = done.stdout.split()[1]

    def left() -> list:
        return [c for c in _all() if c.labels.get("discover.sandbox.owner", "").split(":")[1:2] == [pid]]

    _wait_until(lambda: not left())
    assert not left(), "containers of a killed owner were not removed"


def test_reap_orphans_removes_containers_of_dead_owners():
    import socket

    import docker

    from evaluators.sandbox.docker import LABEL, OWNER_LABEL, image_ref, reap_orphans

    client = docker.from_env()
    c = client.containers.create(
        image_ref("python-math"),
        ["sleep", "600"],
        network_mode="none",
        labels={LABEL: "1", OWNER_LABEL: f"{socket.gethostname()}:999999999:1"},
    )
    try:
        assert reap_orphans(client) >= 1
        assert c.id not in {x.id for x in _all()}
    finally:
        try:
            c.remove(force=True)
        except docker.errors.NotFound:
            pass


def test_cpp20_image_compiles_and_runs_cpp():
    why = docker_unavailable("cpp20")
    if why:
        pytest.skip(why)
    program = textwrap.dedent(
        """
        import subprocess
        SRC = r'''
        #include <iostream>
        #include <ranges>
        #include <vector>
        int main() { std::vector<int> v{3, 1, 2}; int s = 0; for (int x : v | std::views::take(2)) s += x; std::cout << s; }
        '''
        def construct(parent):
            open("a.cpp", "w").write(SRC)
            subprocess.run(["compile-cpp20", "a.cpp", "a.out"], check=True)
            return int(subprocess.run(["./a.out"], capture_output=True, text=True, timeout=5).stdout)
        """
    )
    from evaluators.sandbox.docker import DockerSandbox

    with DockerSandbox(image="cpp20", concurrency=1) as box:
        result = box.run(program, "construct", None, SandboxLimits(timeout_s=60, memory_mb=1024, cpus=1))
    assert result.ok, (result.reason, result.logs)
    assert result.output == 4


EVALUATIONS = 200  # 50 of each kind of program (1,000 in earlier versions: the same verdict, 5x the time)


@pytest.mark.slow
def test_many_evaluations_leave_no_container_and_no_process():
    """200 evaluations at the configured concurrency, counted before and after: a leak of one
    container or process per evaluation (or per program kind, every fourth) shows as dozens."""
    from discover.config import SandboxConfig

    concurrency = SandboxConfig().concurrency
    containers_before = len(_ours())
    procs_before = len(_run_uid_pids())
    box = _docker(concurrency=concurrency)
    programs = [
        CANDIDATES["good"],
        "import subprocess\ndef construct(p):\n    subprocess.Popen(['sleep', '300'], start_new_session=True)\n    return [0.5]\n",
        CANDIDATES["raises"],
        "import os\ndef construct(p):\n    open('/tmp/junk-%d' % os.getpid(), 'w').write('x' * 1000)\n    return [0.25]\n",
    ]
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda i: box.run(programs[i % 4], "construct", None, LIMITS), range(EVALUATIONS)))
    elapsed = time.monotonic() - start
    assert sum(r.ok for r in results) == EVALUATIONS * 3 // 4, {r.reason for r in results if not r.ok}
    assert len(_ours()) - containers_before <= concurrency  # the warm pool, nothing more
    _wait_until(lambda: len(_run_uid_pids()) - procs_before <= 2 * concurrency)  # the last runs' leftovers, killed
    assert len(_run_uid_pids()) - procs_before <= 2 * concurrency  # keepers (+ init) only
    pool = {c.id for c in _ours()}
    box.close()
    _wait_until(lambda: len(_ours()) == containers_before and len(_run_uid_pids(pool)) == 0)
    containers_after, procs_after = len(_ours()), len(_run_uid_pids(pool))
    print(
        f"\n{EVALUATIONS} evaluations at concurrency {concurrency}: {elapsed:.1f} s; "
        f"containers {containers_before} -> {containers_after}; candidate/keeper processes {procs_before} -> {procs_after}"
    )
    assert containers_after == containers_before
    assert procs_after == 0  # nothing of the closed pool's containers runs on


RUNNER_PROBE = textwrap.dedent(
    """
    import os
    def construct(parent):
        runner, seen = os.getppid(), {}
        for what, name, mode in (("memory", "mem", "rb"), ("report stream", "fd/1", "wb"), ("environment", "environ", "rb")):
            try:
                open(f"/proc/{runner}/{name}", mode).close()
                seen[what] = "opened"
            except OSError as err:
                seen[what] = type(err).__name__
        return {"runner_uid": os.stat(f"/proc/{runner}/mem").st_uid, "my_uid": os.getuid(), "seen": seen}
    """
)


def test_a_candidate_cannot_open_its_runners_memory_or_report_stream():
    """The runner runs as the candidate's uid (under runc, where gVisor's own kernel is not there to
    refuse): made non-dumpable, its /proc entries belong to root, so the candidate can neither read
    nor write its memory (to forge its report or skip its sweep) nor write to its report's stream."""
    box = _docker(concurrency=1)
    try:
        result = box.run(RUNNER_PROBE, "construct", None, LIMITS)
    finally:
        box.close()
    assert result.ok, (result.reason, result.logs)
    out = result.output
    # non-dumpable: its /proc entries (all but the directory itself, which shows its uid) are root's
    assert out["my_uid"] != 0 and out["runner_uid"] == 0
    assert out["seen"] == {"memory": "PermissionError", "report stream": "PermissionError", "environment": "PermissionError"}, out
