"""The sampling seam of a policy backend: a streaming decode engine (docs/architecture.md, "A policy backend").

A backend's sampler is the two-phase completion of `two_phase.py` (the same for every backend: the
thinking budget, the forced phrase, the answer phase) run on the backend's `DecodeEngine`, which
only continues token prompts until EOS, a stop marker, or a token limit, returning the sampled
tokens with their sampler log-probabilities. Implementations: `hf_decode.HFDecodeEngine`
(transformers, batched with a KV cache) and `vllm_backend.VLLMDecodeEngine` (vLLM's running batch).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal, Protocol

StopReason = Literal["eos", "marker", "length"]


@dataclass(frozen=True)
class PhaseRequest:
    """Continue `prompt_ids` for at most `max_tokens` (>= 1) new tokens."""

    prompt_ids: list[int]
    max_tokens: int
    stop_token_ids: tuple[int, ...] = ()  # the thinking marker's token, when it is one (EOS always stops)
    stop_strings: tuple[str, ...] = ()  # the thinking marker, matched in the decoded text


@dataclass
class PhaseOutput:
    """One continuation: its tokens (ending with the stop token, if any) and their log-probs."""

    token_ids: list[int]
    logprobs: list[float]
    stop: str  # a StopReason: "eos", "marker" or "length"


class DecodeEngine(Protocol):
    """A streaming sampler: queue continuations, collect them as they finish, drop what is left.

    Log-probabilities are under the distribution the engine samples from,
    `log_softmax(logits / temperature)`. The same submissions (keys, requests, temperatures,
    seeds) in the same order must give the same tokens: runs are reproducible from their seed.
    """

    max_context: int | None  # hard limit on prompt + completion (learned positions), None: none

    def submit(self, key: Hashable, request: PhaseRequest, temperature: float, seed: int) -> None:
        """Queue one continuation, sampled at `temperature` and deterministic in `seed`."""
        ...

    def poll(self) -> list[tuple[Hashable, PhaseOutput]]:
        """Wait until at least one queued continuation is finished and return those (by key); [] when none is queued."""
        ...

    def cancel(self) -> None:
        """Drop every queued or running continuation (a consumer stopped early), so the next call starts clean."""
        ...
