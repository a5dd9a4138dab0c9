"""The records a run writes, each declared once; storage/tables.py derives their Parquet schemas.

- `EvalResult` (evaluators/base.py): the verdict on one candidate, with the validity rule inside;
  the candidate store keeps it as it comes back from wherever it ran;
- `Evaluation`: a row of `steps/NNNN/evaluations.parquet`: an `EvalResult` and the rollout it
  judged (group, index, parent, the parsed candidate);
- `State`: a row of `archive/NNNN.parquet`, built from a valid `Evaluation` (`State.child`);
- `Rollout`: a row of `steps/NNNN/rollouts.parquet`, a sampler `Completion` with its group;
- `Reevaluation`: a row of `reevaluations/<when>[-<GPU>]-<pool>.parquet`: an `EvalResult` of a
  state scored again, with one column per metric and the GPU it was judged on.

Each carries `SCHEMA_VERSION`; a file written by an older version reads with the new fields at
their defaults (storage/tables.py). Bump the version when a field is added, renamed or dropped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from evaluators.base import EvalResult

_INT32 = {"arrow": pa.int32()}


@dataclass
class Completion:
    """One rollout as the sampler produced it (docs/method.md §1 step 2, §4).

    `completion_ids` are every token after the prompt, in order: generated tokens and, when the
    thinking budget ran out, the forced text (the phrase and what closes the thinking block in the
    model's chat format, `chat_format.py`). `loss_mask[i]` is 1 for a token the policy
    generated and 0 for a forced one; only generated tokens carry loss (docs/method.md §2).
    `sampler_logprobs[i]` is the sampler's log-probability of token i (0.0 for forced tokens).
    """

    prompt_ids: list[int] = field(metadata={"arrow": pa.list_(pa.int32())})
    completion_ids: list[int] = field(metadata={"arrow": pa.list_(pa.int32())})
    sampler_logprobs: list[float] = field(metadata={"arrow": pa.list_(pa.float32())})
    loss_mask: list[int] = field(metadata={"arrow": pa.list_(pa.int8())})
    text: str  # the whole completion decoded: thinking, forced text, answer
    answer: str  # the final answer part only (what the candidate is parsed from)
    forced: bool = False  # True when the thinking budget ran out and the phrase was appended
    finish_reason: str = "stop"  # "stop" (end of sequence) or "length" (context exhausted)


@dataclass(kw_only=True)
class Rollout(Completion):
    """One rollout: what the sampler produced (docs/method.md §1.2), and the group and parent it belongs to."""

    SCHEMA_VERSION: ClassVar[int] = 1

    group: int = field(metadata=_INT32)
    index: int = field(metadata=_INT32)  # k within the group
    parent_id: str

    @classmethod
    def of(cls, completion: Completion, group: int, index: int, parent_id: str) -> Rollout:
        return cls(**dataclasses.asdict(completion), group=group, index=index, parent_id=parent_id)

    def completion(self) -> Completion:
        return Completion(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Completion)})


@dataclass(frozen=True, kw_only=True)
class Evaluation(EvalResult):
    """The verdict on one rollout (docs/method.md §1.3): its `EvalResult` and where it came from.

    Version 2: the candidate's output is `observation` (version 1 wrote it as `logs`) and the
    verdict's fields come first.
    """

    SCHEMA_VERSION: ClassVar[int] = 2

    group: int = field(metadata=_INT32)
    index: int = field(metadata=_INT32)
    child_id: str
    parent_id: str
    code: str  # the parsed candidate ("" when none was found)

    @classmethod
    def of(cls, rollout: Rollout, step: int, result: EvalResult, code: str) -> Evaluation:
        return cls(
            **result.verdict_fields(),
            group=rollout.group,
            index=rollout.index,
            child_id=child_id(step, rollout.group, rollout.index),
            parent_id=rollout.parent_id,
            code=code,
        )


@dataclass
class State:
    """One state s in the archive H (docs/method.md §3); a row of the archive's Parquet table."""

    SCHEMA_VERSION: ClassVar[int] = 1

    id: str = field(metadata={"column": "state_id"})
    parent_id: str | None
    step: int = field(metadata=_INT32)  # training step that created it; -1 for seeds
    reward: float
    code: str
    construction: Any = field(default=None, metadata={"json": True})  # JSON-able plain data
    observation: str = ""  # tail of the program's output, shown to the model
    lineage: tuple[str, ...] = ()  # ancestor ids, root first, parent last; () for seeds
    is_seed: bool = False
    best_child_reward: float | None = None  # m(s); None until s is expanded
    visits: int = 0  # n(s)
    key: str = ""  # the problem's archive_key: equal for duplicate states; "" when unknown
    parent_reward: float | None = None  # R(parent) when s was inserted, shown as "before -> after"; None for seeds

    @classmethod
    def seed(cls, index: int, code: str, result: EvalResult, key: str) -> State:
        """Seed `index` of the run (docs/method.md §1): an invalid seed enters with reward 0."""
        return cls(
            id=f"seed-{index}",
            parent_id=None,
            step=-1,
            reward=result.reward,
            code=code,
            construction=result.construction,
            observation=result.observation,
            is_seed=True,
            key=key,
        )

    @classmethod
    def child(cls, evaluation: Evaluation, step: int, lineage: tuple[str, ...], key: str, parent_reward: float | None) -> State:
        """The state a valid evaluation becomes when the archive takes it (docs/method.md §1.4)."""
        return cls(
            id=evaluation.child_id,
            parent_id=evaluation.parent_id,
            step=step,
            reward=evaluation.reward,
            code=evaluation.code,
            construction=evaluation.construction,
            observation=evaluation.observation,
            lineage=lineage,
            key=key,
            parent_reward=parent_reward,
        )


@dataclass(frozen=True, kw_only=True)
class Reevaluation(EvalResult):
    """One state of a run scored again, e.g. on another GPU type (discover/reevaluation.py).

    Version 2 adds the GPU as the device reports it (`gpu_memory_mib`, `gpu_driver`) beside the
    pool's declared type (`declared_gpu`); a version 1 file reads with those empty.
    """

    SCHEMA_VERSION: ClassVar[int] = 2

    # a kernel's runtime per benchmark shape and their geometric mean: one column each, so nights
    # and GPU types compare side by side
    metrics: dict[str, Any] = field(default_factory=dict, metadata={"expand": True})
    state_id: str
    step: int = field(metadata=_INT32)
    archived_reward: float
    pool: str
    host: str
    # the model of the GPU the row was judged on, as the device reports it; "none" when the machine
    # has no GPU; for a problem that needs none, why it is unused (version 1 wrote "" there)
    gpu: str
    gpu_memory_mib: int = 0  # that GPU's total memory; 0 when not reported or no GPU was used
    gpu_driver: str = ""  # the NVIDIA driver's version; "" when not reported or no GPU was used
    declared_gpu: str = ""  # the pool's declared GPU type (DISCOVER_GPU_TYPE); "" when it declares none


def child_id(step: int, group: int, index: int) -> str:
    """The id of the state a rollout would become: unique in a run, sortable by step."""
    return f"s{step:04d}-g{group:02d}-r{index:03d}"
