"""The run manifest: which task of which step finished, its output and how long it took.

Storage knows no task names: discover/run.py owns them (`TASKS`) and passes them in."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from storage.atomic import atomic_write_json

_lock = threading.Lock()


def read_manifest(path: Path) -> dict[str, Any]:
    if not Path(path).is_file():
        return {"tasks": {}, "executions": []}
    return json.loads(Path(path).read_text())


def record_task(path: Path, step: int, task: str, ref: dict[str, str], started: float, finished: float) -> None:
    """Mark `task` of `step` finished (atomic read-modify-write; tasks of a run run one at a time)."""
    with _lock:
        manifest = read_manifest(path)
        entry = {"step": step, "task": task, "output": ref, "started": started, "finished": finished}
        manifest["tasks"][f"{step}/{task}"] = entry
        manifest["executions"].append({"step": step, "task": task, "finished": finished})
        atomic_write_json(path, manifest)


def finished_steps(path: Path, tasks: Sequence[str]) -> int:
    """How many leading steps have every one of `tasks` finished: the first unfinished step's number."""
    done = read_manifest(path)["tasks"]
    step = 0
    while all(f"{step}/{t}" in done for t in tasks):
        step += 1
    return step


def task_entry(path: Path, step: int, task: str) -> dict[str, Any] | None:
    return read_manifest(path)["tasks"].get(f"{step}/{task}")
