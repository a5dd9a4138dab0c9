"""Hostile candidate programs, run on both sandbox backends (issue 4, Must show 1).

Every program here tries to cheat or to hurt the host. Each must end with reward 0 or its honest
reward (the verifier on the host re-scores what came back), the test process must survive, and
no process may outlive the run. Under Docker the host is untouched by every one of them; the
process backend is held to the time, memory, process-count and output limits (and, when we run
as root as CI does, to its dropped uid: no root-only files, no signals to our processes).
Docker cases skip with the reason when no engine answers or the image is missing
(`make images` builds it).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from evaluators.math.erdos import ErdosProblem
from evaluators.sandbox import ProcessSandbox, docker_unavailable
from tests.sandbox_backends import without_isolation

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 4.0
# A program that would run 1000 s must be stopped by the limit; the bound leaves room for start-up
# on a loaded machine and is still far below what the program would take on its own.
ROOM_S = 240
KILLED_WITHIN_S = TIMEOUT_S + ROOM_S
PROBLEM = ErdosProblem(timeout_s=TIMEOUT_S, memory_mb=512, cpus=1)
# How long killed processes may take to be gone after a run on a loaded machine (a condition is
# polled: this only bounds a failure).
GONE_WITHIN_S = 60
HONEST = [0.5] * 20
HONEST_REWARD = PROBLEM.verify(HONEST).reward
RETURN_HONEST = f"    return {HONEST!r}\n"


@pytest.fixture(scope="module", params=["process", "docker"])
def sandbox(request):
    if request.param == "process":
        yield ProcessSandbox()
        return
    why = docker_unavailable("python-math")
    if why:
        pytest.skip(f"docker backend not testable here: {why}")
    from evaluators.sandbox.docker import DockerSandbox

    box = DockerSandbox(image="python-math", concurrency=1)
    yield box
    box.close()


def _marker_pids(marker: str) -> list[int]:
    """Live processes on the host (containers' included) whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def _evaluate(sandbox, program: str, honest: float = HONEST_REWARD, problem: ErdosProblem = PROBLEM):
    """Run through the real problem; the reward must be 0 or `honest` (what it returned, re-scored)."""
    start = time.monotonic()
    result = problem.evaluate(program, None, sandbox)
    elapsed = time.monotonic() - start
    assert elapsed < problem.limits.timeout_s + ROOM_S, f"the run took {elapsed:.1f} s"
    assert result.reward in (0.0, pytest.approx(honest)), (result.reward, result.reason)
    assert os.getppid() > 1  # the test process and its parent are alive
    return result


def _strict(sandbox) -> bool:
    """Host isolation is promised under Docker, and for the process backend only as root."""
    return sandbox.name == "docker" or os.geteuid() == 0


# The network test's program must reach its end however the network answers: where outbound traffic
# is dropped each connection waits out its own 1 s timeout and a name lookup its bound below, so it
# gets its own wall-clock limit, generous for a loaded machine (PROBLEM's 4 s bounds programs that
# are meant to be stopped).
NETWORK_TIMEOUT_S = 60.0
NETWORK_PROBLEM = ErdosProblem(timeout_s=NETWORK_TIMEOUT_S, memory_mb=512, cpus=1)
RESOLVE_WITHIN_S = 5  # getaddrinfo has no timeout of its own: the program waits this long, no more


def test_network_access_fails(sandbox):
    # Connections to IP literals (a public host, the Docker daemon's TCP port on the default bridge),
    # then a name lookup in a thread the program stops waiting for, then a connection to what the name
    # resolved to, if anything. Every attempt prints its outcome; "NET DONE" shows the program ran to
    # its end rather than being stopped by the time limit.
    program = (
        "import socket, threading\n"
        "def connect(host):\n"
        "    try:\n"
        "        socket.create_connection(host, timeout=1).close()\n"
        "        print('NET OPEN', host, flush=True)\n"
        "    except OSError as e:\n"
        "        print('NET CLOSED', host, e, flush=True)\n"
        "def construct(parent):\n"
        "    for host in [('1.1.1.1', 80), ('172.17.0.1', 2375)]:\n"
        "        connect(host)\n"
        "    found = []\n"
        "    def resolve():\n"
        "        try:\n"
        "            found.append(socket.getaddrinfo('deb.debian.org', 80, proto=socket.IPPROTO_TCP)[0][4][:2])\n"
        "        except OSError as e:\n"
        "            found.append(e)\n"
        "    lookup = threading.Thread(target=resolve, daemon=True)\n"
        "    lookup.start()\n"
        f"    lookup.join({RESOLVE_WITHIN_S})\n"
        "    if not found:\n"
        "        print('DNS UNANSWERED', flush=True)\n"
        "    elif isinstance(found[0], tuple):\n"
        "        print('DNS RESOLVED', found[0], flush=True)\n"
        "        connect(found[0])\n"
        "    else:\n"
        "        print('DNS FAILED', found[0], flush=True)\n"
        "    print('NET DONE', flush=True)\n" + RETURN_HONEST
    )
    result = _evaluate(sandbox, program, problem=NETWORK_PROBLEM)
    # The program returned its honest value: trying the network neither crashed the run nor let it
    # run past its limit (a timeout here would score 0 for the wrong reason).
    assert result.valid and result.reward == pytest.approx(HONEST_REWARD), (result.reason, result.observation)
    assert "NET DONE" in result.observation, result.observation
    if sandbox.name == "docker":
        # No network at all: no connection opens and no name resolves.
        assert "NET OPEN" not in result.observation and result.observation.count("NET CLOSED") == 2, result.observation
        assert "DNS RESOLVED" not in result.observation, result.observation


def test_host_files_and_environment_secrets_stay_hidden(sandbox, tmp_path, monkeypatch):
    secret = "s3cr3t-" + os.urandom(8).hex()
    monkeypatch.setenv("DISCOVER_TEST_SECRET", secret)
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    program = (
        "import os, glob\n"
        "def construct(parent):\n"
        "    seen = [repr(dict(os.environ))]\n"
        f"    for path in [{str(secret_file)!r}, '/proc/1/environ', '/proc/%d/environ' % os.getppid(),\n"
        "                 '/root/.bash_history', '/etc/shadow'] + glob.glob('/proc/*/environ'):\n"
        "        try:\n"
        "            seen.append(open(path, 'rb').read().decode('latin-1'))\n"
        "        except OSError as e:\n"
        "            pass\n"
        "    print('\\n'.join(seen), flush=True)\n" + RETURN_HONEST
    )
    result = _evaluate(sandbox, program)
    assert "DISCOVER_TEST_SECRET" not in result.observation  # the environment is never inherited
    if _strict(sandbox):
        assert secret not in result.observation


def test_writing_outside_the_scratch_space_fails(sandbox, tmp_path):
    target = tmp_path / "planted.txt"
    repo_file = REPO / "evaluators" / "sandbox" / "planted.txt"
    program = (
        "def construct(parent):\n"
        f"    for path in [{str(target)!r}, {str(repo_file)!r}, '/etc/planted', '/usr/lib/planted']:\n"
        "        try:\n"
        "            open(path, 'w').write('x')\n"
        "            print('WROTE', path)\n"
        "        except OSError as e:\n"
        "            print('DENIED', path, e)\n" + RETURN_HONEST
    )
    try:
        result = _evaluate(sandbox, program)
        assert result.reward == pytest.approx(HONEST_REWARD)
        if _strict(sandbox):
            assert not target.exists() and not repo_file.exists()
            assert "WROTE" not in result.observation
    finally:
        repo_file.unlink(missing_ok=True)


def test_fork_bomb_is_contained(sandbox):
    marker = "fb" + os.urandom(4).hex()  # the bomb's process name (comm), inherited by every fork
    program = (
        "import ctypes, os, time\n"
        "def construct(parent):\n"
        f"    ctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)  # PR_SET_NAME\n"
        "    while True:\n"
        "        try:\n"
        "            os.fork()\n"
        "        except OSError:\n"
        "            time.sleep(0.01)\n"
    )
    result = _evaluate(sandbox, program)
    assert result.reward == 0.0
    deadline = time.monotonic() + GONE_WITHIN_S
    while _named_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _named_pids(marker) == []


def _named_pids(name: str) -> list[int]:
    """Live processes on the host (containers' included) whose process name is `name`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == name:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def test_memory_bomb_is_stopped(sandbox):
    program = "def construct(parent):\n    blocks = []\n    while True:\n        blocks.append(bytearray(50 * 2**20))\n"
    result = _evaluate(sandbox, program)
    assert result.reward == 0.0
    assert "memory" in result.reason.lower() or "killed" in result.reason.lower(), result.reason


def test_numpy_memory_bomb_is_stopped(sandbox):
    program = "import numpy as np\ndef construct(parent):\n    return np.ones((40000, 40000)).tolist()\n"
    result = _evaluate(sandbox, program)
    assert result.reward == 0.0


def test_infinite_loop_times_out(sandbox):
    result = _evaluate(sandbox, "def construct(parent):\n    while True:\n        pass\n")
    assert result.reward == 0.0 and "timeout" in result.reason


def test_stdout_flood_is_capped(sandbox):
    program = "import sys\ndef construct(parent):\n    for _ in range(200000):\n        sys.stdout.write('x' * 1000)\n" + RETURN_HONEST
    result = _evaluate(sandbox, program)
    assert len(result.observation) <= PROBLEM.limits.max_output_bytes


def test_sleeping_past_the_limit_is_killed(sandbox):
    start = time.monotonic()
    result = _evaluate(sandbox, "import time\ndef construct(parent):\n    time.sleep(1000)\n" + RETURN_HONEST)
    assert result.reward == 0.0 and "timeout" in result.reason
    assert time.monotonic() - start < KILLED_WITHIN_S


def test_killing_its_parent_does_not_hurt_the_host(sandbox):
    program = (
        "import os, signal\n"
        "def construct(parent):\n"
        "    for pid in [os.getppid(), 1, os.getpgid(0)]:\n"
        "        try:\n"
        "            os.kill(pid, signal.SIGKILL)\n"
        "        except OSError as e:\n"
        "            print('cannot kill', pid, e)\n"
        "    try:\n"
        "        os.kill(-1, signal.SIGKILL)\n"
        "    except OSError:\n"
        "        pass\n" + RETURN_HONEST
    )
    result = _evaluate(sandbox, program)
    assert os.getppid() > 1  # we (and our parent) are still here
    again = _evaluate(sandbox, "def construct(parent):\n" + RETURN_HONEST)
    assert again.reward == pytest.approx(HONEST_REWARD), again.reason  # the sandbox still works
    assert result.reward in (0.0, pytest.approx(HONEST_REWARD))


def test_printing_a_fake_score_earns_nothing(sandbox):
    program = (
        "import json, sys\n"
        "def construct(parent):\n"
        "    print(json.dumps({'reward': 1e9, 'valid': True, 'bound': 0.0}))\n"
        "    sys.stderr.write('reward: 1000000\\n')\n"
        "    return [1.0] * 10 + [0.0] * 10\n"
    )
    honest = PROBLEM.verify([1.0] * 10 + [0.0] * 10).reward
    result = _evaluate(sandbox, program, honest)
    assert result.reward == pytest.approx(honest) and result.metrics["bound"] == pytest.approx(1.0)


def test_tampering_with_the_verifier_or_its_inputs_changes_nothing(sandbox):
    verifier = REPO / "evaluators" / "math" / "erdos.py"
    harness = REPO / "evaluators" / "sandbox" / "harness.py"
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (verifier, harness)}
    program = (
        "import os, sys\n"
        "def construct(parent):\n"
        f"    for path in [{str(verifier)!r}, {str(harness)!r}, 'harness.py', 'input.json', 'job.json']:\n"
        "        try:\n"
        "            open(path, 'a').write('\\nREWARD = 1e9\\n')\n"
        "        except OSError as e:\n"
        "            print('cannot tamper', path, e)\n"
        "    try:\n"
        "        os.symlink('/etc/passwd', 'output.json')\n"
        "    except OSError:\n"
        "        pass\n"
        "    sys.modules['json'].dumps = lambda *a, **k: '[0.5]'\n" + RETURN_HONEST
    )
    result = _evaluate(sandbox, program)
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (verifier, harness)}
    if _strict(sandbox):
        assert after == before
    # The symlinked output.json is refused or replaced by the honest value: never /etc/passwd.
    assert result.reward in (0.0, pytest.approx(HONEST_REWARD))


def test_monkeypatching_numpy_or_the_clock_does_not_fool_the_verifier(sandbox):
    bad = [1.0] * 10 + [0.0] * 10
    program = (
        "import numpy as np, time\n"
        "np.correlate = lambda *a, **k: np.zeros(1)\n"
        "np.max = lambda *a, **k: 0.0\n"
        "time.time = lambda: 0.0\n"
        "time.monotonic = lambda: 0.0\n"
        "def construct(parent):\n"
        f"    return {bad!r}\n"
    )
    honest = PROBLEM.verify(bad).reward
    result = _evaluate(sandbox, program, honest)
    assert result.reward == pytest.approx(honest)
    assert result.metrics["bound"] > 0.4


def test_background_processes_do_not_outlive_the_run(sandbox):
    if sandbox.name == "process":  # `sleep` is a host binary, which isolation does not let it run
        sandbox = without_isolation(ProcessSandbox())  # (tests/test_os_isolation.py: the namespace's end)
    marker = str(7000 + int.from_bytes(os.urandom(2), "big")) + ".125"  # unique sleep argument
    program = (
        "import os, subprocess, sys\n"
        "def construct(parent):\n"
        f"    subprocess.Popen(['sleep', {marker!r}], start_new_session=True)\n"
        f"    subprocess.Popen(['sleep', {marker!r}], env={{}})\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:\n"
        f"            os.execvpe('sleep', ['sleep', {marker!r}], {{}})\n"
        "        os._exit(0)\n" + RETURN_HONEST
    )
    result = _evaluate(sandbox, program)
    assert result.reward == pytest.approx(HONEST_REWARD), result.reason
    deadline = time.monotonic() + GONE_WITHIN_S
    while _marker_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _marker_pids(marker) == []
