"""One stored record per finished rollout of a step being generated: RUN_DIR/steps/NNNN/generated/GGGG-KKKKK.json.

`generate` (discover/steps.py) writes each rollout here the moment the sampler finishes it, so a
generate killed midway (SIGKILL, a lost worker, a preempted machine) resumes with the missing
(group, index) keys only. Each file is written once, atomically (storage/atomic.py: a temporary
name, fsync, rename), so a kill leaves either the whole record or a `.tmp` file that is never
read. Each record carries the digest of the inputs it was generated from (`inputs`): a record of
other inputs is not reused. The step's output file replaces the folder once it is written.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any, Generic, TypeVar

from storage.atomic import atomic_write_json
from storage.tables import record_from_json, record_to_json

log = logging.getLogger("discover")

_NAME = re.compile(r"^(\d{4,})-(\d{5,})$")
R = TypeVar("R")


class RolloutParts(Generic[R]):
    """The finished rollouts of one step, keyed (group, index); `record` is the record class (`Rollout`)."""

    def __init__(self, folder: Path, record: type[R]) -> None:
        self.folder = Path(folder)
        self.record = record

    def _path(self, group: int, index: int) -> Path:
        return self.folder / f"{group:04d}-{index:05d}.json"

    def put(self, group: int, index: int, rollout: R, inputs: str) -> None:
        """Store one finished rollout generated from the inputs whose digest is `inputs`."""
        atomic_write_json(self._path(group, index), {"inputs": inputs, "rollout": record_to_json(rollout)})

    def load(self, inputs: str) -> dict[tuple[int, int], R]:
        """Every stored rollout generated from `inputs`, by (group, index); records of other inputs
        (an earlier code version, a step recomputed) are left out, with a warning."""
        found: dict[tuple[int, int], R] = {}
        stale = 0
        for path in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []:
            m = _NAME.match(path.stem)
            if m is None:
                continue
            data: dict[str, Any] = json.loads(path.read_text())
            if data.get("inputs") != inputs:
                stale += 1
                continue
            found[(int(m.group(1)), int(m.group(2)))] = record_from_json(data["rollout"], self.record, path)
        if stale:
            log.warning("%s: %d stored rollouts were generated from other inputs; they are generated again", self.folder, stale)
        return found

    def remove(self) -> None:
        """Drop the folder (the step's output file holds every rollout once it is written)."""
        shutil.rmtree(self.folder, ignore_errors=True)
