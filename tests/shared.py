"""What the processes of one test session share when pytest-xdist runs it on several workers: one
Prefect server, one tiny-model cache, built by the first worker that needs them.

The controlling process (the only one without xdist) makes a folder for the session and names it
in DISCOVER_TEST_SHARED before any worker starts (`begin`); a worker that needs a thing takes that
thing's lock in the folder, makes it if no record of it is there (`once`) and writes the record;
every other worker reads the record. Servers are recorded with their process group, which the
controlling process ends when the session ends (`end`), after every worker is done with them.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHARED_ENV = "DISCOVER_TEST_SHARED"


def begin() -> Path:
    """The session's shared folder, made and named in the environment (the controlling process)."""
    root = Path(tempfile.mkdtemp(prefix="discover-tests-"))
    os.environ[SHARED_ENV] = str(root)
    return root


def root() -> Path:
    return Path(os.environ[SHARED_ENV])


def once(name: str, make: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """The record of `name`: `make(folder)`'s, called by the first process of the session that asks
    (with the folder `name` in the shared folder), read from disk by the others."""
    record = root() / f"{name}.json"
    with open(root() / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # waits while another worker makes it
        if record.is_file():
            return json.loads(record.read_text())
        folder = root() / name
        folder.mkdir(exist_ok=True)
        data = make(folder)
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, record)
        return data


def end() -> None:
    """Stop every server a worker recorded (its process group: SIGTERM, then SIGKILL after 30 s) and
    remove the shared folder."""
    folder = Path(os.environ.get(SHARED_ENV, ""))
    if not folder.is_dir():
        return
    groups = []
    for record in folder.glob("*.json"):
        pgid = json.loads(record.read_text()).get("pgid")
        if pgid:
            groups.append(pgid)
            _signal(pgid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while groups and time.monotonic() < deadline:
        groups = [g for g in groups if _alive(g)]
        time.sleep(0.2)
    for pgid in groups:
        _signal(pgid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)


def _signal(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
