"""A policy backend's two seams, `Sampler` and `Trainer`, the `Policy` combining them, and their records."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from discover.records import Completion

if TYPE_CHECKING:  # torch is imported where a backend is loaded, not where records are read
    import torch

    from discover.config import SamplingConfig, TrainConfig


@dataclass
class TrainBatch:
    """Everything one optimizer step needs, per rollout (docs/method.md §2)."""

    completions: list[Completion]
    advantages: list[float]  # one sequence-level advantage A_n per completion
    stats: dict[str, float] = field(default_factory=dict)


class Sampler(Protocol):
    """The sampling half of a policy backend (docs/architecture.md, "A policy backend").

    A sampler renders contexts in the model's chat format and runs the two-phase completion
    (`two_phase.stream_two_phase`) on its backend's `engine.DecodeEngine`, with the step's adapter.
    """

    def sample_stream(
        self, contexts: list[str], k: int, sampling: SamplingConfig, seed: int, skip: frozenset[tuple[int, int]] = frozenset()
    ) -> Iterator[tuple[int, int, Completion]]:
        """`k` completions per context (docs/method.md §4) with per-token sampler log-probs, as
        (context index, index among its k, completion), each yielded as soon as it is finished, so
        that its evaluation can start while the others are generated; deterministic in `seed`.
        The (context index, index) keys in `skip` are not generated (a resumed `generate` has them);
        the others are the completions they are in the full batch (`two_phase.stream_two_phase`)."""
        ...

    def while_training(self) -> AbstractContextManager[None]:
        """Held while the trainer trains: a sampler that shares the GPU hands memory back (vLLM sleeps)."""
        ...


class Trainer(Protocol):
    """The training half of a policy backend: one LoRA adapter on the resident base model
    (`trainer.LoRATrainer`, shared by every backend)."""

    def sequence_logprobs(self, completions: list[Completion], with_adapter: bool = True, *, temperature: float) -> list[torch.Tensor]:
        """Per-token log-probs (one tensor per completion) of each completion given its prompt under the
        current policy (the base model when `with_adapter` is False) at the sampling `temperature`
        (the configuration's `sampling.temperature`); used to re-score re-attached ones."""
        ...

    def train_step(
        self, batch: TrainBatch, train: TrainConfig, *, temperature: float, optimizer_state: Path | None = None
    ) -> dict[str, float]:
        """One optimizer step of the adapter on `batch` (docs/method.md §2) with log-probs at the sampling
        `temperature` (the configuration's `sampling.temperature`); returns the step's statistics."""
        ...

    def save(self, adapter_dir: Path, optimizer_path: Path | None = None) -> None:
        """Write the adapter (and optimizer state) atomically."""
        ...


class Policy:
    """A sampler and the LoRA trainer of one step's adapter: what steps and MIGRATE's mixed groups use.

    Built by `discover.policy.load_policy(model_config, adapter_dir, seed)` from the backend named
    by `model.backend` (`registry.py`): the base model (kept resident in the worker process) with
    the LoRA adapter read from `adapter_dir`, or a freshly initialised one from `seed` when
    `adapter_dir` is None. The trainer is loaded on first use (`load_trainer`): the vLLM backend
    generates without the transformers model until something is trained or re-scored.
    """

    def __init__(self, sampler: Sampler, load_trainer: Callable[[], Trainer]):
        self.sampler = sampler
        self._load_trainer = load_trainer
        self._trainer: Trainer | None = None

    @property
    def trainer(self) -> Trainer:
        """The trainer with this step's adapter (loaded on first use)."""
        if self._trainer is None:
            self._trainer = self._load_trainer()
        return self._trainer

    def sample_stream(
        self, contexts: list[str], k: int, sampling: SamplingConfig, seed: int, skip: frozenset[tuple[int, int]] = frozenset()
    ) -> Iterator[tuple[int, int, Completion]]:
        """`Sampler.sample_stream`: the completions as they finish (none for the keys in `skip`)."""
        return self.sampler.sample_stream(contexts, k, sampling, seed, skip)

    def sample(self, contexts: list[str], k: int, sampling: SamplingConfig, seed: int) -> list[list[Completion]]:
        """The completions of `sample_stream`, `k` per context in order."""
        out: list[list[Completion | None]] = [[None] * k for _ in contexts]
        for i, j, completion in self.sample_stream(contexts, k, sampling, seed):
            out[i][j] = completion
        return out  # type: ignore[return-value]

    def sequence_logprobs(self, completions: list[Completion], with_adapter: bool = True, *, temperature: float) -> list[torch.Tensor]:
        """`Trainer.sequence_logprobs` at the given sampling `temperature`; it depends on nothing sampled before.

        Like a training step, it runs while the sampler makes room: with vLLM sleeping while training
        and the trainer's weights offloaded while generating, both copies never share the GPU."""
        with self.sampler.while_training():
            return self.trainer.sequence_logprobs(completions, with_adapter=with_adapter, temperature=temperature)

    def train_step(
        self, batch: TrainBatch, train: TrainConfig, *, temperature: float, optimizer_state: Path | None = None
    ) -> dict[str, float]:
        """`Trainer.train_step`, while the sampler makes room (`Sampler.while_training`)."""
        with self.sampler.while_training():
            return self.trainer.train_step(batch, train, temperature=temperature, optimizer_state=optimizer_state)

    def save(self, adapter_dir: Path, optimizer_path: Path | None = None) -> None:
        """`Trainer.save`."""
        self.trainer.save(adapter_dir, optimizer_path)
