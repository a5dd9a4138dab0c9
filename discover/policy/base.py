"""What a policy backend returns when it samples, and what it needs to train."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Protocol

from discover.records import Completion


@dataclass(frozen=True)
class GenerationSettings:
    """Token budgets of the two-phase completion (SPEC §4)."""

    context_tokens: int = 32768  # prompt + thinking + answer may never exceed this
    thinking_budget: int = 26000  # prompt + thinking may use at most this many tokens
    max_answer_tokens: int = 6768  # answer tokens after the thinking phase
    temperature: float = 1.0
    think_end: str | None = None  # marker that ends the thinking; None: no thinking phase
    # Table 9's phrase; the chat format appends what closes the thinking (SPEC §5a, chat_format.py)
    forced_phrase: str = "\n\n... okay, I am out of thinking tokens. I need to send my final message now.\n\n"


@dataclass
class TrainBatch:
    """Everything one optimizer step needs, per rollout (SPEC §2)."""

    completions: list[Completion]
    advantages: list[float]  # one sequence-level advantage A_n per completion
    stats: dict[str, float] = field(default_factory=dict)


class Policy(Protocol):
    """What every policy backend does (DESIGN.md, "A policy backend"); chosen by `model.backend`.

    A backend is built by `discover.policy.load_policy(model_config, adapter_dir, seed)`: the base
    model (which a backend may keep resident in its worker process) with the LoRA adapter read from
    `adapter_dir`, or a freshly initialised one from `seed` when `adapter_dir` is None.
    A backend subclasses this protocol to inherit the defaults (`sample_stream`).
    """

    def sample(
        self, contexts: list[str], k: int, settings: GenerationSettings, seed: int
    ) -> list[list[Completion]]:
        """`k` completions per context (SPEC §1.2, §4) with per-token sampler log-probs."""
        ...

    def sample_stream(
        self, contexts: list[str], k: int, settings: GenerationSettings, seed: int
    ) -> Iterator[tuple[int, int, Completion]]:
        """The completions of `sample(...)` as (context index, index among its k, completion), each
        yielded as soon as it is finished, so that its evaluation can start while the others are
        generated. The same completions as `sample` with the same arguments, in any order.
        This default yields them once `sample` has returned them all; a backend that finishes
        completions one by one overrides it."""
        for i, completions in enumerate(self.sample(contexts, k, settings, seed)):
            for j, completion in enumerate(completions):
                yield i, j, completion

    def sequence_logprobs(
        self, completions: list[Completion], with_adapter: bool = True, temperature: float | None = None
    ) -> list[Any]:
        """Per-token log-probs (one tensor per completion) of each completion given its prompt under the
        current policy (the base model when `with_adapter` is False); used to re-score re-attached ones."""
        ...

    def train_step(
        self, batch: TrainBatch, train: Any, temperature: float = 1.0, optimizer_state: Path | None = None
    ) -> dict[str, float]:
        """One optimizer step of the adapter on `batch` (SPEC §2); returns the step's statistics."""
        ...

    def save(self, adapter_dir: Path, optimizer_path: Path | None = None) -> None:
        """Write the adapter (and optimizer state) atomically."""
        ...
