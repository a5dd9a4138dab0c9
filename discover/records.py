"""The records a step writes, each declared once; storage/tables.py derives their Parquet schemas.

- `State` (discover/archive.py): a row of `archive/NNNN.parquet`;
- `Rollout`: a row of `steps/NNNN/rollouts.parquet`, a sampler `Completion` with its group;
- `Evaluation`: a row of `steps/NNNN/evaluations.parquet`, the verdict on one rollout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from discover.archive import Child
from discover.policy.base import Completion
from evaluators.base import EvalResult

_INT32 = {"arrow": pa.int32()}


@dataclass(kw_only=True)
class Rollout(Completion):
    """One rollout: what the sampler produced (SPEC §1.2), and the group and parent it belongs to."""

    group: int = field(metadata=_INT32)
    index: int = field(metadata=_INT32)  # k within the group
    parent_id: str

    @classmethod
    def of(cls, completion: Completion, group: int, index: int, parent_id: str) -> "Rollout":
        return cls(**dataclasses.asdict(completion), group=group, index=index, parent_id=parent_id)

    def completion(self) -> Completion:
        return Completion(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Completion)})


@dataclass
class Evaluation:
    """The verdict on one rollout (SPEC §1.3); an invalid one has reward 0 and a reason."""

    group: int = field(metadata=_INT32)
    index: int = field(metadata=_INT32)
    child_id: str
    parent_id: str
    reward: float
    valid: bool
    reason: str  # empty when valid
    code: str  # the parsed candidate ("" when none was found)
    construction: Any = field(default=None, metadata={"json": True})
    metrics: dict[str, Any] = field(default_factory=dict, metadata={"json": True})
    logs: str = ""  # tail of the candidate's output: the child's observation
    seconds: float = 0.0

    @classmethod
    def of(cls, rollout: Rollout, step: int, result: EvalResult, code: str, seconds: float) -> "Evaluation":
        return cls(
            group=rollout.group,
            index=rollout.index,
            child_id=child_id(step, rollout.group, rollout.index),
            parent_id=rollout.parent_id,
            reward=float(result.reward) if result.valid else 0.0,
            valid=bool(result.valid),
            reason=result.reason,
            code=code,
            construction=result.construction,
            metrics=dict(result.metrics),
            logs=result.observation,
            seconds=seconds,
        )

    def child(self, step: int, key: str = "") -> Child:
        """The archive's view of this evaluation (SPEC §1.4); `key` is the problem's archive_key."""
        return Child(
            id=self.child_id, parent_id=self.parent_id, step=step, reward=self.reward, valid=self.valid,
            code=self.code, construction=self.construction, observation=self.logs, key=key,
        )


def child_id(step: int, group: int, index: int) -> str:
    """The id of the state a rollout would become: unique in a run, sortable by step."""
    return f"s{step:04d}-g{group:02d}-r{index:03d}"
