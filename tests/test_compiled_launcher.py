"""The C launcher of compiled programs (evaluators/sandbox/confine.c, built by compiled_launcher.py)
confines a program as confine.py does: the same uid drop, limits, umask, working directory and
seccomp filter, the same report on the host's channel (with the listener), and on any failure a
report of why with exit 121 before any program code runs. Where it cannot be built, compiled
programs still run, under confine.py."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from evaluators.sandbox import ProcessSandbox, compiled_launcher, syscalls
from evaluators.sandbox.native import NativeLimits

CONFINE_PY = Path(compiled_launcher.__file__).with_name("confine.py")
# what the program shows of itself (shell builtins: the programs' filter refuses fork): its limits,
# umask and working directory, and a file it creates there (its owner: the ids it runs as)
SHOWS_ITSELF = "ulimit -n; ulimit -t; umask; pwd; : > created-by-{launcher}"
LIMITS = {"RLIMIT_NOFILE": (40, 50), "RLIMIT_CPU": (7, 8)}


@pytest.fixture(scope="module")
def built() -> str:
    path = compiled_launcher.binary()
    assert path is not None, "no C compiler here: the native backend needs one (make sandbox-tools names it)"
    return path


def _launch(argv: list[str], cwd: Path) -> tuple[int, str, dict, int | None]:
    """Run a launcher command line with a status channel: (exit code, stdout, report, listener fd or None)."""
    host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = child.detach()
    argv = [a.replace("{fd}", str(fd)) for a in argv]
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=[fd], text=True)
    os.close(fd)
    data, fds = b"", []
    while True:
        chunk, got, _, _ = socket.recv_fds(host, 65536, 1)
        fds += got
        if not chunk:
            break
        data += chunk
    out, _ = proc.communicate(timeout=60)
    host.close()
    for f in fds[1:]:
        os.close(f)
    return proc.returncode, out, json.loads(data) if data else {}, fds[0] if fds else None


def _specs(workdir: Path, listener: bool, limits: dict = LIMITS) -> tuple[list[str], list[str]]:
    """The same confinement as confine.py's and confine.c's command lines (the runner's encodings)."""
    root = os.geteuid() == 0
    uid = gid = 65534 if root else None
    seccomp = base64.b64encode(syscalls.bpf("program", "notify" if listener else "errno")).decode()
    spec = {"uid": uid, "gid": gid, "rlimits": {k: list(v) for k, v in limits.items()}, "chdir": str(workdir), "seccomp": seccomp}
    spec["listener"] = listener
    python = [sys.executable, "-I", "-S", str(CONFINE_PY), json.dumps(spec), "{fd}"]
    c = ["{c}", "{fd}", "-" if uid is None else str(uid), "-" if gid is None else str(gid), str(workdir), "1" if listener else "0", seccomp]
    for name, (soft, hard) in limits.items():
        c += [name, str(soft), str(hard)]
    return python, c + ["--"]


@pytest.fixture
def workdir():
    """A directory the run's uid (nobody, when we are root) can enter: pytest's own are 0700."""
    path = Path(tempfile.mkdtemp(prefix="launcher-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


def test_the_c_launcher_confines_a_program_as_the_python_one_does(built: str, tmp_path: Path, workdir: Path) -> None:
    python, c = _specs(workdir, listener=False)
    by_python = _launch(python + ["/bin/sh", "-c", SHOWS_ITSELF.format(launcher="python")], tmp_path)
    by_c = _launch([built if a == "{c}" else a for a in c] + ["/bin/sh", "-c", SHOWS_ITSELF.format(launcher="c")], tmp_path)
    assert by_python[0] == by_c[0] == 0, (by_python, by_c)
    assert by_c[2]["ok"] is True and by_c[2]["cpu_s"] >= 0
    assert by_c[1].split() == ["40", "7", "0077", str(workdir)], by_c[1]
    assert by_python[1] == by_c[1]
    ids = (65534, 65534) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    for launcher in ("python", "c"):
        made = (workdir / f"created-by-{launcher}").stat()
        assert ((made.st_uid, made.st_gid), made.st_mode & 0o777) == (ids, 0o600), launcher


def test_the_c_launcher_passes_the_filters_listener_to_the_host(built: str, tmp_path: Path, workdir: Path) -> None:
    _, c = _specs(workdir, listener=True)
    code, _, report, listener = _launch([built if a == "{c}" else a for a in c] + ["/bin/true"], tmp_path)
    assert code == 0 and report["ok"] is True
    assert listener is not None  # the host answers the refused calls on it
    os.close(listener)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"RLIMIT_MADE_UP": (1, 1)}, "unknown resource limit RLIMIT_MADE_UP"),
        ({"RLIMIT_CPU": (-5, 8)}, "bad resource limit value -5"),
    ],
)
def test_a_launcher_that_cannot_confine_says_why_and_runs_nothing(built: str, tmp_path: Path, change: dict, why: str) -> None:
    marker = tmp_path / "ran"
    _, c = _specs(tmp_path, listener=False, limits={**LIMITS, **change})
    code, _, report, _ = _launch([built if a == "{c}" else a for a in c] + ["/bin/touch", str(marker)], tmp_path)
    assert code == 121 and report == {"ok": False, "why": why}
    assert not marker.exists()


def test_a_missing_seccomp_filter_is_refused(built: str, tmp_path: Path, workdir: Path) -> None:
    _, c = _specs(workdir, listener=False)
    c[6] = ""
    marker = tmp_path / "ran"
    code, _, report, _ = _launch([built if a == "{c}" else a for a in c] + ["/bin/touch", str(marker)], tmp_path)
    assert code == 121 and report == {"ok": False, "why": "no seccomp filter was given"} and not marker.exists()


HELLO = '#include <cstdio>\nint main() { int x; if (std::scanf("%d", &x) != 1) return 1; std::printf("%d\\n", 2 * x); }\n'


@pytest.mark.parametrize("launcher", ["c", "python"])
def test_compiled_programs_run_under_either_launcher(launcher: str, monkeypatch) -> None:
    if launcher == "python":  # no C compiler for the launcher: confine.py, the same confinement
        monkeypatch.setattr(compiled_launcher, "binary", lambda: None)
    run = ProcessSandbox(isolation="standard").run_native(HELLO, [(0, "21\n"), (1, "x\n")], NativeLimits(cpu_s=2.0, memory_mb=256))
    assert run.compiled, run.compile_log
    assert [(c.status, c.stdout) for c in run.cases] == [("OK", b"42\n"), ("RE", b"")], [(c.status, c.detail) for c in run.cases]


def test_the_launcher_is_built_once_into_the_cache_and_reused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(compiled_launcher.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(compiled_launcher, "_built", {})
    first = compiled_launcher.binary()
    assert first is not None and Path(first).parent == tmp_path and os.access(first, os.X_OK)
    stamp = os.stat(first).st_mtime_ns
    monkeypatch.setattr(compiled_launcher, "_built", {})  # a new process: found in the cache, not built again
    assert compiled_launcher.binary() == first and os.stat(first).st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [Path(first).name]  # no build left half-done beside it
