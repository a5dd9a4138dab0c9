"""The process backend's isolation tests as a normal user (`make test` runs this after the suite).

The suite runs as root in CI, where bubblewrap makes no user namespace and each run gets an
unprivileged uid of its own; a normal user's sandbox is another code path (a user namespace that
maps that user; the candidate runs as the caller's uid; cgroups only where they are delegated).
Run as root, this script runs the isolation tests again as the user USER (made when missing):

1. the checkout's tracked files copied to BASE/checkout, owned by the user (as a user's own clone
   is), and a virtual environment BASE/venv made from uv.lock with Debian's /usr/bin/python3
   (readable by every user, unlike a root-only interpreter such as pyenv's under /root), root's,
   readable by the user;
2. cgroups delegated to the user, as an administrator would: cgroup v2 where the unified hierarchy
   has the memory and pids controllers (a directory the user owns, named by DISCOVER_CGROUP_PARENT),
   else a directory the user owns in each cgroup v1 hierarchy (memory, pids, cpu, cpuacct) under
   ours, which the tests' process joins before it drops to the user;
3. pytest as the user on TESTS (the process backend's cases: Docker's socket is root's), and it
   fails when any test failed or was skipped.

Run as a normal user, the suite already ran as one: nothing to do.

    python tests/as_normal_user.py [--keep]
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
USER = "discover-ci"
BASE = Path("/opt/discover-normal-user")
SYSTEM_PYTHON = "/usr/bin/python3"
TESTS = ["tests/test_os_isolation.py", "tests/test_syscall_flood.py", "tests/test_starved_cases.py", "tests/test_compiled_launcher.py"]
SELECT = "not docker and not gvisor"  # the Docker engine's socket is root's: those cases ran as root
EXTRAS = ["--extra", "dev", "--extra", "bio"]  # bio: the denoising view's scanpy
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")


def say(text: str) -> None:
    print(f"[normal user] {text}", flush=True)


def ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True)
        return pwd.getpwnam(USER)


def copy_checkout(user: pwd.struct_passwd) -> Path:
    checkout = BASE / "checkout"
    if checkout.exists():
        shutil.rmtree(checkout)
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source, target = REPO / name, checkout / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(checkout)], check=True)
    return checkout


def make_venv(checkout: Path) -> Path:
    venv = BASE / "venv"
    uv = REPO / ".cache" / "tools" / "bin" / "uv"
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv), "UV_LINK_MODE": "hardlink", "UV_COMPILE_BYTECODE": "1"}
    env.pop("VIRTUAL_ENV", None)
    subprocess.run([str(uv), "sync", "--frozen", "--python", SYSTEM_PYTHON, *EXTRAS], cwd=checkout, env=env, check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(venv)], check=True)
    return venv


def _own_cgroup(controller: str) -> str | None:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if controller in names.split(",") or (controller == "" and names == ""):
                return path
    return None


def _mount(fstype: str, controller: str) -> str | None:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if rest and rest[0] == fstype and (fstype == "cgroup2" or controller in rest[2].split(",")):
                return fields[4] if fields[3] == "/" else None
    return None


def _chown_tree(path: Path, user: pwd.struct_passwd) -> None:
    for item in [path, *path.iterdir()]:
        os.chown(item, user.pw_uid, user.pw_gid)


def delegate_cgroups(user: pwd.struct_passwd) -> tuple[dict[str, str], list[Path]]:
    """(environment for the tests, cgroup.procs files the tests' process joins)."""
    unified = _mount("cgroup2", "")
    own = _own_cgroup("")
    if unified and own is not None:
        parent = Path(unified) / own.lstrip("/")
        controllers = (parent / "cgroup.controllers").read_text().split() if (parent / "cgroup.controllers").exists() else []
        if "memory" in controllers and "pids" in controllers:
            group = parent / "discover-normal-user"
            group.mkdir(exist_ok=True)
            _chown_tree(group, user)
            say(f"cgroup v2 delegated: {group}")
            return {"DISCOVER_CGROUP_PARENT": str(group)}, [group / "cgroup.procs"]
    joins = []
    for controller in V1_CONTROLLERS:
        mount, own = _mount("cgroup", controller), _own_cgroup(controller)
        if mount is None or own is None:
            continue
        group = Path(mount) / own.lstrip("/") / "discover-normal-user"
        group.mkdir(exist_ok=True)
        _chown_tree(group, user)
        joins.append(group / "cgroup.procs")
    say("cgroup v1 delegated: " + ", ".join(str(j.parent) for j in joins))
    return {}, joins


def run_tests(checkout: Path, venv: Path, user: pwd.struct_passwd, env_extra: dict[str, str], joins: list[Path]) -> int:
    work = BASE / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    os.chown(work, user.pw_uid, user.pw_gid)
    junit = work / "junit.xml"
    env = {
        "PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(work),
        "TMPDIR": str(work),
        "LANG": "C.UTF-8",
        "CI": os.environ.get("CI", ""),
        "PYTHONDONTWRITEBYTECODE": "1",
        **env_extra,
    }

    def join() -> None:  # in the child, after it dropped to the user: it moves itself into the groups
        for procs in joins:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

    argv = [f"{venv}/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-k", SELECT, f"--junitxml={junit}", *TESTS]
    say(f"as {USER} (uid {user.pw_uid}): {' '.join(argv[1:])}")
    rc = subprocess.run(argv, cwd=checkout, env=env, user=user.pw_uid, group=user.pw_gid, extra_groups=[], preexec_fn=join).returncode
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    skipped = int(suite.get("skipped", 0)) if suite is not None else 0
    if rc == 0 and skipped:
        say(f"{skipped} test(s) skipped as a normal user: a mechanism the isolation needs is missing")
        return 1
    return rc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help=f"keep {BASE} afterwards")
    args = parser.parse_args()
    if os.geteuid() != 0:
        say("not root: the suite already ran as a normal user")
        return 0
    if not Path(SYSTEM_PYTHON).exists():
        say(f"{SYSTEM_PYTHON} is missing: install Debian's python3 (apt-get install python3)")
        return 1
    user = ensure_user()
    BASE.mkdir(parents=True, exist_ok=True)
    os.chmod(BASE, 0o755)
    checkout = copy_checkout(user)
    venv = make_venv(checkout)
    env_extra, joins = delegate_cgroups(user)
    try:
        return run_tests(checkout, venv, user, env_extra, joins)
    finally:
        for procs in joins:
            try:
                procs.parent.rmdir()  # empty once the tests' processes are gone
            except OSError:
                pass
        if not args.keep:
            shutil.rmtree(BASE / "checkout", ignore_errors=True)
            shutil.rmtree(BASE / "work", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
