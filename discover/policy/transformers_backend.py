"""The transformers policy backend: sampling on the trainer's own peft model (CPU or GPU).

* Sampling is the two-phase completion of `two_phase.py` on `hf_decode.HFDecodeEngine`, run on
  the model the shared `trainer.LoRATrainer` trains (the step's adapter, no copy); the prompt is
  rendered and the thinking closed in the model's chat format (`chat_format.py`).
* Log-probabilities are under the temperature-scaled distribution, `log_softmax(logits / temperature)`,
  the distribution the sampler drew from (docs/method.md §2, §4).
* Training and saving are the `LoRATrainer`'s (docs/architecture.md, "A policy backend").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from discover.config import ModelConfig, SamplingConfig
from discover.policy.base import Completion, Policy
from discover.policy.chat_format import ChatFormat, chat_format_for
from discover.policy.hf_decode import HFDecodeEngine
from discover.policy.trainer import LoRATrainer
from discover.policy.two_phase import stream_two_phase

__all__ = ["TransformersSampler", "load"]


def load(model: ModelConfig, adapter_dir: Path | None = None, seed: int = 0) -> Policy:
    """The policy of the resident base model with the adapter of `adapter_dir` (None: a new one from `seed`)."""
    trainer = LoRATrainer.load(model, adapter_dir, seed=seed)
    return Policy(TransformersSampler(trainer), lambda: trainer)


class TransformersSampler:
    """`base.Sampler` on transformers: the trainer's peft model decoded by `HFDecodeEngine`."""

    def __init__(self, trainer: LoRATrainer):
        self.trainer = trainer
        self.tokenizer = trainer.tokenizer
        self.model_config = trainer.model_config

    # ------------------------------------------------------------------ prompts

    def chat_format(self, think_end: str | None = None) -> ChatFormat:
        return chat_format_for(self.tokenizer, think_end)

    def render_prompt(self, text: str, think_end: str | None = None) -> list[int]:
        """Token ids of the prompt: the model's chat template (user turn + generation prompt), if it has one."""
        return self.chat_format(think_end).render(
            self.tokenizer, text, thinking=think_end is not None, **self.model_config.chat_template_kwargs
        )

    def eos_ids(self) -> set[int]:
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        eos = getattr(getattr(self.trainer.model, "generation_config", None), "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
        return ids

    def _max_positions(self) -> int | None:
        # only models with learned absolute positions have a hard limit
        return getattr(self.trainer.model.get_base_model().config, "n_positions", None)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    # ------------------------------------------------------------------ sampling

    def sample_stream(
        self, prompts: list[str], n: int, sampling: SamplingConfig, seed: int, skip: frozenset[tuple[int, int]] = frozenset()
    ) -> Iterator[tuple[int, int, Completion]]:
        """`n` completions per prompt as (prompt index, index among its n, completion), as they
        finish; identical tokens for the same seed (docs/method.md §4); none for the keys in `skip`."""
        fmt = self.chat_format(sampling.think_end)
        rendered = [self.render_prompt(p, sampling.think_end) for p in prompts]
        model = self.trainer.model
        model.eval()
        engine = HFDecodeEngine(
            model, self.tokenizer, self.trainer.device, self.eos_ids(), self._max_positions(), self.model_config.decode_batch_size
        )
        return stream_two_phase(
            engine, rendered, n, sampling, seed, fmt, encode=self.encode, decode=self.decode, eos_ids=self.eos_ids(), skip=skip
        )

    def while_training(self) -> AbstractContextManager[None]:
        """Nothing to hand back: sampling and training share one model."""
        return nullcontext()
