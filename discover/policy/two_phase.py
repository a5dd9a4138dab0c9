"""The two-phase completion of docs/method.md §4, the same for every policy backend.

A backend supplies a `DecodeEngine` (`engine.py`): something that continues token prompts until
EOS, a stop marker, or a token limit, returning the sampled tokens with their sampler
log-probabilities. This module decides everything else, once for all backends:

* Phase 1 (only with `think_end`): sample from the prompt until the model closes its thinking
  (the marker), ends the sequence (EOS), or prompt + thinking reaches `thinking_budget`.
* When the budget ran out, the forced text (`ChatFormat.forced_text`: the out-of-thinking phrase
  *and* what closes the thinking block in the model's chat format, docs/method.md §5a) is appended as
  tokens with loss_mask 0 and sampler log-prob 0.0; `forced` is set.
* Phase 2 (the answer; the only phase without `think_end`): continue from prompt + everything so
  far until EOS, `max_answer_tokens`, or the context (`finish_reason` "length" for the last two).
* EOS inside phase 1 ends the completion with an empty answer (there was no final message).
* `sampling.answer_prefix` (only without thinking) is appended to the prompt's tokens, so the model
  continues it and is never trained on it; `text` and `answer` begin with it.
* The EOS token is kept as the last completion token (loss_mask 1: stopping is an action);
  `text` and `answer` never contain it.

Completions are streamed (`stream_two_phase`): each one is yielded as soon as it is finished, and
a completion's answer phase is submitted as soon as its own thinking ends, so an engine that runs
requests continuously (vLLM) has no barrier between the phases and evaluation can start early.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from discover.config import SamplingConfig
from discover.policy.base import Completion
from discover.policy.chat_format import FORCED_PHRASE, ChatFormat
from discover.policy.engine import DecodeEngine, PhaseOutput, PhaseRequest

__all__ = ["Marker", "check_prompts", "prompt_problem", "sample_two_phase", "stream_two_phase"]

Key = tuple[int, int]  # (prompt index, index among its k)


@dataclass(frozen=True)
class Marker:
    """How an engine recognises the end of the thinking: the marker's text appearing in the decoded
    completion, and (a fast exact path) its token id when the marker is a single token."""

    text: str
    token_ids: tuple[int, ...] = ()
    strings: tuple[str, ...] = ()

    @classmethod
    def of(cls, think_end: str, encode: Callable[[str], list[int]]) -> Marker:
        ids = encode(think_end)
        return cls(think_end, token_ids=(ids[0],) if len(ids) == 1 else (), strings=(think_end,))


@dataclass
class _Draft:
    """One completion while its phases run."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    forced: bool = False
    answer_start: int | None = 0  # index of the first answer token; None: no answer (EOS while thinking)
    closed_by_marker: bool = False
    finish: str = "stop"

    def add(self, out: PhaseOutput) -> None:
        self.tokens += out.token_ids
        self.logps += [float(x) for x in out.logprobs]
        self.mask += [1] * len(out.token_ids)

    def used(self) -> int:
        return len(self.prompt) + len(self.tokens)


def prompt_problem(length: int, settings: SamplingConfig, context: int, what: str = "the prompt") -> str:
    """Why a prompt of `length` tokens (the rendered context and `answer_prefix`) leaves no room to
    think and answer, or "" when it does: with a thinking phase it may fill at most the thinking
    budget (which counts the prompt and the thinking), and it must leave at least one token of the
    context (`context`: sampling.context_tokens, or the model's positions where fewer). The one rule
    of the generator (`check_prompts`) and of the pre-flight (discover/preflight.py)."""
    if settings.think_end is not None and length > settings.thinking_budget:
        return (
            f"{what} is {length} tokens, more than sampling.thinking_budget ({settings.thinking_budget}) leaves room for "
            f"(the budget counts the prompt and the thinking); raise sampling.thinking_budget (and sampling.context_tokens "
            f"with it) or shorten the prompt"
        )
    if length >= context:
        if context < settings.context_tokens:
            return (
                f"{what} is {length} tokens, more than the model's context of {context} positions leaves room for "
                f"(sampling.context_tokens is {settings.context_tokens}); use a model with a longer context or shorten the prompt"
            )
        return (
            f"{what} is {length} tokens, more than sampling.context_tokens ({context}) leaves room for (at most "
            f"{context - 1}, so that one token can be generated); raise sampling.context_tokens or shorten the prompt"
        )
    return ""


def check_prompts(prompts: list[list[int]], settings: SamplingConfig, context: int) -> None:
    """Every prompt must leave room in the thinking budget and the context (a clear error otherwise)."""
    for ids in prompts:
        why = prompt_problem(len(ids), settings, context)
        if why:
            raise ValueError(why)


def stream_two_phase(
    engine: DecodeEngine,
    prompts: list[list[int]],
    k: int,
    settings: SamplingConfig,
    seed: int,
    chat_format: ChatFormat,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    eos_ids: set[int],
    forced_phrase: str = FORCED_PHRASE,
    skip: frozenset[Key] = frozenset(),
) -> Iterator[tuple[int, int, Completion]]:
    """`k` completions per prompt (docs/method.md §4) as (prompt index, index among its k, completion), each
    as soon as it is finished; deterministic in `seed` for a deterministic engine. `forced_phrase`
    is Table 9's (tests shorten it).

    The keys in `skip` are not generated (a resumed `generate` has them stored already); every other
    key keeps the seeds it has in the full batch (drawn from `seed` for all keys in order), so with an
    engine that samples each request from its own seed the completions are those of the full batch."""
    if settings.temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {settings.temperature}")
    context = settings.context_tokens
    if engine.max_context is not None:
        context = min(context, int(engine.max_context))
    if settings.answer_prefix:  # the answer's first words, as prompt: conditioned on, never trained on
        prefix = encode(settings.answer_prefix)
        prompts = [list(p) + prefix for p in prompts]
    check_prompts(prompts, settings, context)
    run = _TwoPhase(engine, prompts, k, settings, seed, context, chat_format, encode, decode, eos_ids, forced_phrase)
    return run.stream(skip)


class _TwoPhase:
    """The state of one `stream_two_phase` call: a draft per completion, keyed (prompt, index)."""

    def __init__(
        self,
        engine: DecodeEngine,
        prompts: list[list[int]],
        k: int,
        settings: SamplingConfig,
        seed: int,
        context: int,
        chat_format: ChatFormat,
        encode: Callable[[str], list[int]],
        decode: Callable[[list[int]], str],
        eos_ids: set[int],
        forced_phrase: str,
    ):
        self.engine, self.settings, self.context, self.decode, self.eos_ids = engine, settings, context, decode, eos_ids
        self.keys: list[Key] = [(i, j) for i in range(len(prompts)) for j in range(k)]
        self.drafts = {key: _Draft(list(prompts[key[0]])) for key in self.keys}
        state = np.random.SeedSequence(int(seed) & (2**63 - 1)).generate_state(2 * len(self.keys), dtype=np.uint64)
        self.seeds = {key: (int(state[2 * n]) >> 2, int(state[2 * n + 1]) >> 2) for n, key in enumerate(self.keys)}
        self.marker: Marker | None = None
        self.forced_ids: list[int] = []
        if settings.think_end is not None:
            self.marker = Marker.of(settings.think_end, encode)
            self.forced_ids = encode(chat_format.forced_text(forced_phrase, settings.think_end))

    def stream(self, skip: frozenset[Key] = frozenset()) -> Iterator[tuple[int, int, Completion]]:
        try:
            for key in self.keys:
                if key not in skip:
                    yield from self._start(key)
            while finished := self.engine.poll():
                for tagged, out in finished:
                    phase, key = cast(tuple[str, Key], tagged)  # the keys submitted below
                    yield from self._finished(phase, key, out)
        finally:  # a consumer that stops early leaves nothing running in the engine
            self.engine.cancel()

    def _done(self, key: Key) -> Iterator[tuple[int, int, Completion]]:
        yield key[0], key[1], _complete(self.drafts[key], self.settings, self.decode, self.eos_ids)

    def _start(self, key: Key) -> Iterator[tuple[int, int, Completion]]:
        d, limit = self.drafts[key], min(self.settings.thinking_budget, self.context)
        if self.marker is None:
            yield from self._answer(key)
        elif limit - len(d.prompt) > 0:  # phase 1: think until the marker, EOS or the budget
            request = PhaseRequest(d.prompt, limit - len(d.prompt), self.marker.token_ids, self.marker.strings)
            self.engine.submit(("think", key), request, self.settings.temperature, self.seeds[key][0])
        else:  # the prompt fills the thinking budget: force at once
            self._force(key)
            yield from self._answer(key)

    def _finished(self, phase: str, key: Key, out: PhaseOutput) -> Iterator[tuple[int, int, Completion]]:
        d = self.drafts[key]
        d.add(out)
        if phase == "answer":
            d.finish = "stop" if out.stop == "eos" else "length"
            yield from self._done(key)
        elif out.stop == "eos":  # EOS while thinking: no final message
            d.answer_start = None
            yield from self._done(key)
        else:
            if out.stop == "marker":
                d.closed_by_marker = True
            else:
                self._force(key)
            yield from self._answer(key)

    def _force(self, key: Key) -> None:
        """docs/method.md §4: the thinking budget ran out; append the forced text (loss_mask 0) as far as it fits."""
        d = self.drafts[key]
        take = self.forced_ids[: max(0, self.context - d.used())]
        d.tokens += take
        d.logps += [0.0] * len(take)
        d.mask += [0] * len(take)
        d.forced = True

    def _answer(self, key: Key) -> Iterator[tuple[int, int, Completion]]:
        """Phase 2 from everything so far; the completion at once if there is no room left for it."""
        d = self.drafts[key]
        d.answer_start = len(d.tokens)
        room = min(self.settings.answer_tokens, self.context - d.used())
        if room <= 0:
            d.finish = "length"
            yield from self._done(key)
        else:
            request = PhaseRequest(d.prompt + d.tokens, room)
            self.engine.submit(("answer", key), request, self.settings.temperature, self.seeds[key][1])


def sample_two_phase(
    engine: DecodeEngine, prompts: list[list[int]], k: int, settings: SamplingConfig, seed: int, *args, **kwargs
) -> list[list[Completion]]:
    """All completions of `stream_two_phase`, as `k` per prompt in order."""
    out: list[list[Completion | None]] = [[None] * k for _ in prompts]
    for i, j, completion in stream_two_phase(engine, prompts, k, settings, seed, *args, **kwargs):
        out[i][j] = completion
    return out  # type: ignore[return-value]


def _complete(d: _Draft, settings: SamplingConfig, decode: Callable[[list[int]], str], eos_ids: set[int]) -> Completion:
    body = d.tokens
    if body and d.mask[-1] == 1 and body[-1] in eos_ids and d.finish == "stop":
        body = body[:-1]
    text = decode(body)
    if d.answer_start is None and settings.think_end is not None:
        answer = ""  # ended (EOS) inside the thinking phase: no final message
    elif settings.think_end is None:
        answer = text
    elif d.forced:
        answer = decode(body[d.answer_start :])
    else:  # the model closed its thinking itself: the answer is what follows the marker
        answer = text.split(settings.think_end, 1)[1] if settings.think_end in text else decode(body[d.answer_start :])
    if settings.answer_prefix:  # only without thinking (config): the prefix opens the answer
        text, answer = settings.answer_prefix + text, settings.answer_prefix + answer
    return Completion(
        prompt_ids=list(d.prompt),
        completion_ids=list(d.tokens),
        sampler_logprobs=list(d.logps),
        loss_mask=list(d.mask),
        text=text,
        answer=answer,
        forced=d.forced,
        finish_reason=d.finish,
    )
