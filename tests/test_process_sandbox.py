"""The process sandbox: values come back as JSON, failures have reasons, nothing is left behind."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from evaluators.sandbox import ProcessSandbox, SandboxLimits, get_sandbox
from tests.sandbox_backends import alive, without_isolation

# Generous: the programs here are meant to succeed unless a test sets its own limit.
LIMITS = SandboxLimits(timeout_s=120.0, memory_mb=1024, cpus=1, max_output_bytes=100_000)


def run(program: str, argument=None, isolated: bool = True, **limits):
    """`isolated=False`: sandbox.isolation none (sandbox_backends.without_isolation), for tests of
    the layer underneath (the process group, the cgroup) that find the candidate's processes by
    their host pids."""
    box = ProcessSandbox() if isolated else without_isolation(ProcessSandbox())
    return box.run(program, "construct", argument, SandboxLimits(**{**LIMITS.__dict__, **limits}))


def _live_pids_in_group(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not zombies (zombies may wait for an absent reaper)."""
    live = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(entry.name))
    return live


def _wait_dead(pid: int, seconds: float = 60.0) -> bool:
    """Whether `pid` is gone, polled for up to `seconds` (generous: a killed process exits once
    it is scheduled, later on a loaded machine)."""
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


def _pid_from_logs(logs: str) -> int:
    return int(next(line for line in logs.splitlines() if line.startswith("PID ")).split()[1])


def test_good_program_returns_its_value():
    program = "import numpy as np\ndef construct(parent):\n    return {'x': np.arange(3) / 2, 'p': parent, 's': np.float64(1.5)}\n"
    result = run(program, argument=[1, 2])
    assert result.ok, result.reason
    assert result.output == {"x": [0.0, 0.5, 1.0], "p": [1, 2], "s": 1.5}
    assert result.duration_s > 0


def test_scipy_is_importable_and_nan_comes_back_as_data():
    program = "import math, scipy.optimize\ndef construct(parent):\n    return [math.nan, math.inf]\n"
    result = run(program)
    assert result.ok, result.reason
    assert result.output[0] != result.output[0] and result.output[1] == float("inf")


def test_syntax_error_is_reported():
    result = run("def construct(parent)\n    return 1\n")
    assert not result.ok
    assert "SyntaxError" in result.reason and result.reason.startswith("exit code 1")


def test_exception_is_reported_with_its_last_line():
    result = run("def construct(parent):\n    raise ValueError('boom')\n")
    assert not result.ok and result.reason == "exit code 1: ValueError: boom"
    assert "Traceback" in result.logs


def test_missing_entry_point():
    result = run("def solve(parent):\n    return 1\n")
    assert not result.ok and result.reason == "program defines no function `construct`"


def test_non_json_return_value_is_rejected():
    result = run("def construct(parent):\n    return object()\n")
    assert not result.ok and "not JSON data" in result.reason


def test_infinite_loop_is_killed_at_the_timeout_with_its_children():
    program = (
        "import os, subprocess\n"
        "def construct(parent):\n"
        "    child = subprocess.Popen(['sleep', '1000'])\n"
        "    print('PID', os.getpid(), flush=True)\n"
        "    print('CHILD', child.pid, flush=True)\n"
        "    while True:\n"
        "        pass\n"
    )
    start = time.monotonic()
    result = run(program, isolated=False, timeout_s=10.0)  # long enough for the child to start on a loaded machine
    assert time.monotonic() - start < 240  # stopped by the limit, not by the program's own end
    assert not result.ok and result.reason == "timeout after 10 s"
    pgid = _pid_from_logs(result.logs)
    child = int(next(line for line in result.logs.splitlines() if line.startswith("CHILD ")).split()[1])
    assert _wait_dead(child)
    assert _live_pids_in_group(pgid) == []


def test_background_child_is_killed_after_a_normal_return():
    program = "import subprocess\ndef construct(parent):\n    return subprocess.Popen(['sleep', '1000']).pid\n"
    result = run(program, isolated=False)
    assert result.ok, result.reason
    assert _wait_dead(result.output)


def test_child_that_left_the_process_group_is_killed_with_the_runs_cgroup():
    program = "import subprocess\ndef construct(parent):\n    return subprocess.Popen(['sleep', '1000'], start_new_session=True).pid\n"
    result = run(program, isolated=False)
    assert result.ok, result.reason
    assert _wait_dead(result.output)


def test_memory_bomb_is_stopped():
    result = run("def construct(parent):\n    return len(bytearray(4 * 2**30))\n", memory_mb=256)
    assert not result.ok and "memory" in result.reason.lower()


def test_numpy_memory_bomb_is_stopped():
    program = "import numpy as np\ndef construct(parent):\n    return float(np.ones(2**29).sum())\n"
    result = run(program, memory_mb=256)
    assert not result.ok and "memory" in result.reason.lower()


def test_parent_environment_secrets_are_not_inherited(monkeypatch):
    monkeypatch.setenv("DISCOVER_TEST_SECRET", "x")
    program = (
        "import os\n"
        "def construct(parent):\n"
        "    return [os.environ.get('DISCOVER_TEST_SECRET'), os.environ['HOME'] == os.getcwd(),\n"
        "            os.environ['OMP_NUM_THREADS']]\n"
    )
    result = run(program, cpus=3)
    assert result.ok, result.reason
    assert result.output == [None, True, "3"]


def test_stdout_flood_is_capped():
    program = (
        "import sys\n"
        "def construct(parent):\n"
        "    chunk = 'x' * 2**20\n"
        "    for _ in range(50):\n"
        "        sys.stdout.write(chunk)\n"
        "    print('the end', file=sys.stderr)\n"
        "    return 1\n"
    )
    result = run(program, max_output_bytes=10_000)
    assert result.ok and result.output == 1
    assert len(result.logs) <= 10_000
    assert result.logs.rstrip().endswith("the end")


def test_oversized_return_value_is_rejected():
    result = run("def construct(parent):\n    return 'x' * 200_000\n", max_output_bytes=100_000)
    assert not result.ok and "too large" in result.reason


def test_temp_dir_is_removed(made_here):
    # The candidate leaves an unreadable tree in its working directory; the host's run
    # directory goes all the same (its value travels through a descriptor, not that directory).
    # The directories this run made are recorded (other workers' evaluations make theirs in /tmp too).
    made = made_here
    program = "import os\ndef construct(parent):\n    os.makedirs('a/b')\n    os.chmod('a', 0)\n    return 1\n"
    result = run(program)
    assert result.ok and result.output == 1, result.reason
    ours = [p for p in made if Path(p).name.startswith("discover-sandbox-")]
    assert ours and not [p for p in ours if Path(p).exists()], ours


def test_get_sandbox():
    from evaluators.sandbox import docker_unavailable

    assert get_sandbox("process").name == "process"
    if docker_unavailable("python-math"):  # auto falls back with a warning; docker refuses
        with pytest.warns(RuntimeWarning, match="process backend"):
            assert get_sandbox("auto").name == "process"
        with pytest.raises(ValueError, match="docker"):
            get_sandbox("docker")
    else:
        assert get_sandbox("auto").name == "docker"
        assert get_sandbox("docker") is get_sandbox("auto")  # one warm pool per image
    with pytest.raises(ValueError, match="unknown"):
        get_sandbox("vm")
