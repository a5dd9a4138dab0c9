"""One stored result per evaluated candidate: RUN_DIR/steps/NNNN/candidates/<key>.json.

A step's evaluation writes each candidate's result here the moment it comes back from wherever it
ran, so a step killed in the middle of its evaluation resumes with the unfinished candidates only.
The key (discover/evaluation.py) already holds the run id, the step, the candidate's content hash
and the evaluator's source; a file is written once, atomically, and never changes. The result is
a record dataclass (`EvalResult`) stored as JSON by storage/tables.py, so what comes back from the
store is the same whether it was stored a moment ago or before a resume.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Generic, TypeVar

from storage.atomic import atomic_write_json
from storage.tables import record_from_json, record_to_json

_KEY = re.compile(r"^[0-9a-f]{16,128}$")
R = TypeVar("R")


class CandidateStore(Generic[R]):
    def __init__(self, folder: Path, record: type[R]) -> None:
        self.folder = Path(folder)
        self.record = record

    def _path(self, key: str) -> Path:
        if not _KEY.match(key):
            raise ValueError(f"not a candidate key: {key!r}")
        return self.folder / f"{key}.json"

    def get(self, key: str) -> R | None:
        """The stored result of `key`, or None when it has not finished."""
        path = self._path(key)
        if not path.is_file():
            return None
        return record_from_json(json.loads(path.read_text()), self.record, path)

    def put(self, key: str, result: R) -> None:
        atomic_write_json(self._path(key), record_to_json(result))

    def keys(self) -> set[str]:
        if not self.folder.is_dir():
            return set()
        return {p.stem for p in self.folder.glob("*.json")}
