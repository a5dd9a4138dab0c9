"""Install the sandbox's tools: bubblewrap (the process backend) and, with --gvisor, gVisor's runsc
registered as a Docker runtime (sandbox.isolation: gvisor). Idempotent; docs/sandbox.md says why.

    python images/sandbox_tools.py [--gvisor]

bubblewrap and runsc come from Debian's packages (apt-get, as root); without root or apt-get it
says what to install and exits with 1. --gvisor also writes the `runsc` runtime (with
--network=none) into /etc/docker/daemon.json and reloads dockerd (SIGHUP) when the engine does not
list it yet: `make test` asks for this only in CI (the environment variable CI set), since it changes
the machine's Docker configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

DAEMON_JSON = Path("/etc/docker/daemon.json")
RUNTIME = {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}


def _say(message: str) -> None:
    print(f"[sandbox-tools] {message}", flush=True)


def apt_install(package: str, binary: str, found: bool = False) -> bool:
    """`binary` is on PATH (or `found`), or `package` was installed with apt-get; False (and why) otherwise."""
    if found or shutil.which(binary) or os.path.exists(f"/usr/bin/{binary}"):
        return True
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        _say(f"{binary} is missing: install the package {package} (apt-get install {package}, as root)")
        return False
    _say(f"installing {package} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(["apt-get", "install", "-y", "-qq", package], env=env, check=False)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        done = subprocess.run(["apt-get", "install", "-y", "-qq", package], env=env, check=False)
    return done.returncode == 0


def docker_runtimes() -> dict | None:
    try:
        out = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True, timeout=60, check=True)
        return json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def register_runsc() -> bool:
    """gVisor's runtime in Docker's daemon.json and the daemon reloaded, unless it is there already."""
    runtimes = docker_runtimes()
    if runtimes is None:
        _say("no Docker engine answers: gVisor's runtime not registered")
        return False
    if "runsc" in runtimes:
        return True
    if os.geteuid() != 0:
        _say("registering runsc with Docker needs root (docs/sandbox.md, gVisor)")
        return False
    config = json.loads(DAEMON_JSON.read_text()) if DAEMON_JSON.exists() else {}
    config.setdefault("runtimes", {})["runsc"] = RUNTIME
    DAEMON_JSON.parent.mkdir(parents=True, exist_ok=True)
    DAEMON_JSON.write_text(json.dumps(config, indent=4) + "\n")
    pids = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True, check=False).stdout.split()
    if not pids:
        _say("dockerd's pid not found: reload it to pick up the runsc runtime")
        return False
    for pid in pids:
        os.kill(int(pid), signal.SIGHUP)
    for _ in range(60):
        if "runsc" in (docker_runtimes() or {}):
            _say("registered gVisor's runsc with Docker")
            return True
        time.sleep(1)
    _say("dockerd did not list runsc after the reload")
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gvisor", action="store_true", help="also install runsc and register it with Docker")
    args = parser.parse_args()
    ok = apt_install("bubblewrap", "bwrap")
    if args.gvisor:
        ok = apt_install("runsc", "runsc") and register_runsc() and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
