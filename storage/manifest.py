"""The run manifest: which task of which step finished, its output and how long it took; every
time a task really ran (`executions`); and each recomputation asked for (`redos`).

Storage knows no task names: discover/run.py owns them (`TASKS`) and the rules around them.

    {"tasks": {"<step>/<task>": {"step", "task", "output": {"path", "sha256"}, "started", "finished"}},
     "initial": {"<name>": {"path", "sha256"}},          (what the run started from, once written)
     "executions": [{"step", "task", "finished"}, ...],
     "redos": [{"from_step", "at", "note"}, ...]}      (absent until the first redo)
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from storage.atomic import atomic_write_json

_lock = threading.Lock()


class ManifestError(ValueError):
    """The manifest cannot be read (damaged outside the project: its writes are atomic); one line."""


def read_manifest(path: Path) -> dict[str, Any]:
    if not Path(path).is_file():
        return {"tasks": {}, "executions": []}
    try:
        manifest = json.loads(Path(path).read_bytes().decode("utf-8"))
        if not isinstance(manifest, dict) or not isinstance(manifest.get("tasks"), dict):
            raise ValueError("it holds no table of tasks")
        return manifest
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ManifestError(
            f"{path} is damaged ({err}): it is the run's record of its finished tasks, so the run cannot go on from it; "
            "put back a copy (a backup, or the same file of a copy of the run directory), "
            "or start the run again in a new directory"
        ) from None


def record_task(path: Path, step: int, task: str, ref: dict[str, str], started: float, finished: float, executed: bool = True) -> None:
    """Mark `task` of `step` finished (atomic read-modify-write; tasks of a run run one at a time).

    `executions` lists the times a task really ran; a result that came from a cache is recorded as
    finished with `executed=False` and adds no execution."""
    with _lock:
        manifest = read_manifest(path)
        entry = {"step": step, "task": task, "output": ref, "started": started, "finished": finished}
        manifest["tasks"][f"{step}/{task}"] = entry
        if executed:
            manifest["executions"].append({"step": step, "task": task, "finished": finished})
        atomic_write_json(path, manifest)


def record_initial(path: Path, refs: dict[str, dict[str, str]]) -> None:
    """Record what the run started from (its initial archive and adapter), the first time only: they
    are written once, and later tasks check them against this record."""
    with _lock:
        manifest = read_manifest(path)
        if manifest.get("initial"):
            return
        manifest["initial"] = refs
        atomic_write_json(path, manifest)


def forget_steps(path: Path, first: int, note: str = "") -> None:
    """Forget the finished tasks of `first` and every later step (the executions stay) and record
    the redo in `redos`, whose length is the redo epoch."""
    with _lock:
        manifest = read_manifest(path)
        manifest["tasks"] = {k: v for k, v in manifest["tasks"].items() if int(v["step"]) < first}
        manifest.setdefault("redos", []).append({"from_step": first, "at": time.time(), "note": note})
        atomic_write_json(path, manifest)


def redo_epoch(path: Path) -> int:
    """How many times the run's steps were recomputed on purpose (0 for a manifest without redos)."""
    return len(read_manifest(path).get("redos", []))


def task_entry(path: Path, step: int, task: str) -> dict[str, Any] | None:
    return read_manifest(path)["tasks"].get(f"{step}/{task}")
