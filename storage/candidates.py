"""One stored result per evaluated candidate: RUN_DIR/steps/NNNN/candidates/<key>.json.

A step's evaluation writes each candidate's result here the moment it comes back from wherever it
ran, so a step killed in the middle of its evaluation resumes with the unfinished candidates only.
The key (discover/evaluation.py) already holds the run id, the step, the candidate's content hash
and the evaluator's source; a file is written once, atomically, and never changes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from storage.atomic import atomic_write_json

_KEY = re.compile(r"^[0-9a-f]{16,128}$")


class CandidateStore:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def _path(self, key: str) -> Path:
        if not _KEY.match(key):
            raise ValueError(f"not a candidate key: {key!r}")
        return self.folder / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored result of `key`, or None when it has not finished."""
        path = self._path(key)
        if not path.is_file():
            return None
        return json.loads(path.read_text())

    def put(self, key: str, result: dict[str, Any]) -> None:
        atomic_write_json(self._path(key), result)

    def keys(self) -> set[str]:
        if not self.folder.is_dir():
            return set()
        return {p.stem for p in self.folder.glob("*.json")}
