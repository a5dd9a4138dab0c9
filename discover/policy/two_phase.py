"""The two-phase completion of SPEC §4, the same for every policy backend.

A backend supplies a `PhaseEngine`: something that continues token prompts until EOS, a stop
marker, or a token limit, returning the sampled tokens with their sampler log-probabilities.
This module decides everything else, once for all backends:

* Phase 1 (only with `think_end`): sample from the prompt until the model closes its thinking
  (the marker), ends the sequence (EOS), or prompt + thinking reaches `thinking_budget`.
* When the budget ran out, the forced text (`ChatFormat.forced_text`: the out-of-thinking phrase
  *and* what closes the thinking block in the model's chat format, SPEC §5a) is appended as
  tokens with loss_mask 0 and sampler log-prob 0.0; `forced` is set.
* Phase 2 (the answer; the only phase without `think_end`): continue from prompt + everything so
  far until EOS, `max_answer_tokens`, or the context (`finish_reason` "length" for the last two).
* EOS inside phase 1 ends the completion with an empty answer (there was no final message).
* The EOS token is kept as the last completion token (loss_mask 1: stopping is an action);
  `text` and `answer` never contain it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from discover.policy.base import Completion, GenerationSettings
from discover.policy.chat_format import ChatFormat


@dataclass(frozen=True)
class PhaseRequest:
    """Continue `prompt_ids` `n` times, each for at most `max_tokens` (>= 1) new tokens."""

    prompt_ids: list[int]
    max_tokens: int
    n: int = 1
    stop_token_ids: tuple[int, ...] = ()  # the thinking marker's token, when it is one (EOS always stops)
    stop_strings: tuple[str, ...] = ()  # the thinking marker, matched in the decoded text


@dataclass
class PhaseOutput:
    """One continuation: its tokens (ending with the stop token, if any) and their log-probs."""

    token_ids: list[int]
    logprobs: list[float]
    stop: str  # "eos", "marker" or "length"


class PhaseEngine(Protocol):
    """What a backend implements for `sample_two_phase`."""

    max_context: int | None  # hard limit on prompt + completion (learned positions), None: none

    def generate(self, requests: list[PhaseRequest], temperature: float, seed: int) -> list[list[PhaseOutput]]:
        """`request.n` continuations per request, sampled at `temperature`, deterministic in `seed`."""
        ...


@dataclass(frozen=True)
class Marker:
    """How an engine recognises the end of the thinking: the marker's text appearing in the decoded
    completion, and (a fast exact path) its token id when the marker is a single token."""

    text: str
    token_ids: tuple[int, ...] = ()
    strings: tuple[str, ...] = ()

    @classmethod
    def of(cls, think_end: str, encode: Callable[[str], list[int]]) -> "Marker":
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


def check_prompts(prompts: list[list[int]], settings: GenerationSettings, context: int) -> None:
    """Every prompt must leave room in the thinking budget and the context (a clear error otherwise)."""
    for ids in prompts:
        if settings.think_end is not None and len(ids) > settings.thinking_budget:
            raise ValueError(
                f"the prompt has {len(ids)} tokens, more than the thinking budget of "
                f"{settings.thinking_budget} tokens; shorten the prompt or raise sampling.thinking_budget"
            )
        if len(ids) >= context:
            raise ValueError(
                f"the prompt has {len(ids)} tokens, which leaves no room in the context of "
                f"{context} tokens; shorten the prompt or raise sampling.context_tokens"
            )


def sample_two_phase(
    engine: PhaseEngine,
    prompts: list[list[int]],
    k: int,
    settings: GenerationSettings,
    seed: int,
    chat_format: ChatFormat,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    eos_ids: set[int],
) -> list[list[Completion]]:
    """`k` completions per prompt (SPEC §4), with per-token sampler log-probs and loss masks."""
    if settings.temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {settings.temperature}")
    context = settings.context_tokens
    if engine.max_context is not None:
        context = min(context, int(engine.max_context))
    check_prompts(prompts, settings, context)
    drafts = [[_Draft(list(p)) for _ in range(k)] for p in prompts]
    seeds = np.random.SeedSequence(int(seed) & (2**63 - 1)).generate_state(2, dtype=np.uint64)
    answering: list[_Draft] = [d for group in drafts for d in group]
    if settings.think_end is not None:
        answering = _thinking_phase(engine, drafts, settings, context, int(seeds[0]), chat_format, encode)
    _answer_phase(engine, answering, settings, context, int(seeds[1]))
    return [[_complete(d, settings, decode, eos_ids) for d in group] for group in drafts]


def _thinking_phase(
    engine: PhaseEngine,
    drafts: list[list[_Draft]],
    settings: GenerationSettings,
    context: int,
    seed: int,
    chat_format: ChatFormat,
    encode: Callable[[str], list[int]],
) -> list[_Draft]:
    """Phase 1 for every draft; returns the drafts that go on to the answer phase."""
    assert settings.think_end is not None
    marker = Marker.of(settings.think_end, encode)
    forced_ids = encode(chat_format.forced_text(settings.forced_phrase, settings.think_end))
    limit = min(settings.thinking_budget, context)
    runnable = [i for i, group in enumerate(drafts) if limit - len(group[0].prompt) > 0]
    requests = [
        PhaseRequest(
            drafts[i][0].prompt, limit - len(drafts[i][0].prompt), n=len(drafts[i]),
            stop_token_ids=marker.token_ids, stop_strings=marker.strings,
        )
        for i in runnable
    ]
    outputs = engine.generate(requests, settings.temperature, seed) if requests else []
    for i, outs in zip(runnable, outputs, strict=True):
        for d, out in zip(drafts[i], outs, strict=True):
            d.add(out)
            if out.stop == "eos":
                d.answer_start = None
            elif out.stop == "marker":
                d.closed_by_marker = True
    answering = []
    for group in drafts:
        for d in group:
            if d.answer_start is None:
                continue  # EOS while thinking: no final message
            if not d.closed_by_marker:  # SPEC §4: the thinking budget ran out; force the answer
                take = forced_ids[: max(0, context - d.used())]
                d.tokens += take
                d.logps += [0.0] * len(take)
                d.mask += [0] * len(take)
                d.forced = True
            answering.append(d)
    return answering


def _answer_phase(engine: PhaseEngine, drafts: list[_Draft], settings: GenerationSettings, context: int, seed: int) -> None:
    """Phase 2: each draft continues from everything so far, up to the answer and context limits."""
    runnable = []
    for d in drafts:
        d.answer_start = len(d.tokens)
        if min(settings.max_answer_tokens, context - d.used()) <= 0:
            d.finish = "length"
        else:
            runnable.append(d)
    if not runnable:
        return
    requests, owners = _answer_requests(runnable, settings, context)
    outputs = engine.generate(requests, settings.temperature, seed)
    for owner, outs in zip(owners, outputs, strict=True):
        for d, out in zip(owner, outs, strict=True):
            d.add(out)
            d.finish = "stop" if out.stop == "eos" else "length"


def _answer_requests(
    drafts: list[_Draft], settings: GenerationSettings, context: int
) -> tuple[list[PhaseRequest], list[list[_Draft]]]:
    """One request per distinct prefix: drafts that have produced nothing yet share their prompt's."""
    requests, owners = [], []
    fresh: dict[tuple[int, ...], list[_Draft]] = {}
    for d in drafts:
        if not d.tokens:
            fresh.setdefault(tuple(d.prompt), []).append(d)
            continue
        prefix = d.prompt + d.tokens
        requests.append(PhaseRequest(prefix, min(settings.max_answer_tokens, context - len(prefix))))
        owners.append([d])
    for prompt, group in fresh.items():
        room = min(settings.max_answer_tokens, context - len(prompt))
        requests.append(PhaseRequest(list(prompt), room, n=len(group)))
        owners.append(group)
    return requests, owners


def _complete(d: _Draft, settings: GenerationSettings, decode: Callable[[list[int]], str], eos_ids: set[int]) -> Completion:
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
