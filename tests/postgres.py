"""A throwaway PostgreSQL server for a test: Debian's package (`make test-services` installs it), a
new cluster in the test's temporary folder, trust authentication, listening on 127.0.0.1 only.

PostgreSQL refuses to run as root: as root the cluster belongs to the package's `postgres` user. In
CI (the environment variable CI set), where `make test` installed it, a missing server fails the
test; elsewhere it skips, naming the package.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import free_port

START_TIMEOUT_S = 120


def _bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _as_owner(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@contextmanager
def postgres_database(name: str = "prefect") -> Iterator[str]:
    """Start a cluster in a new temporary folder, create database `name`; yield its SQLAlchemy URL
    for asyncpg (Prefect's driver), then stop the server and remove the folder. (Not under pytest's
    tmp_path: as root that is a private folder the `postgres` user cannot enter.)"""
    bin_dir = _bin()
    if bin_dir is None:
        why = "PostgreSQL's server is not installed (apt-get install postgresql; `make test-services`)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}, in CI")
        pytest.skip(why)
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.fail("running as root needs runuser to start PostgreSQL as its own user")
    folder = Path(tempfile.mkdtemp(prefix="discover-postgres-"))
    data = folder / "pgdata"
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
        folder.chmod(0o755)
    try:
        yield from _serve(bin_dir, folder, data, name)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _serve(bin_dir: Path, folder: Path, data: Path, name: str) -> Iterator[str]:
    log = folder / "postgres.log"
    subprocess.run(_as_owner([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]), check=True, capture_output=True)
    port = free_port()
    ctl = _as_owner([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", str(START_TIMEOUT_S)])
    options = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={folder} -c max_connections=200"
    subprocess.run([*ctl, "-o", options, "start"], check=True, capture_output=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            created = subprocess.run(
                [str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", name], capture_output=True, text=True
            )
            if created.returncode == 0:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"PostgreSQL did not take a database: {created.stderr}\n{log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/{name}"
    finally:
        subprocess.run([*ctl, "-m", "fast", "stop"], capture_output=True)
