"""The backend-neutral two-phase completion (docs/method.md §4) on a scripted engine: exact tokens, masks, limits."""

from __future__ import annotations

import pytest

from discover.config import SamplingConfig
from discover.policy.chat_format import ChatFormat
from discover.policy.engine import PhaseOutput, PhaseRequest
from discover.policy.two_phase import sample_two_phase, stream_two_phase

EOS = 0
MARK = 9  # the one-token thinking marker "</think>"
VOCAB = {EOS: "<eos>", MARK: "</think>", 1: "a", 2: "b", 3: "c", 4: "!", 5: "\n"}
PHRASE = "!"


def encode(text: str) -> list[int]:
    out, i = [], 0
    inverse = sorted(((v, k) for k, v in VOCAB.items()), key=lambda vk: -len(vk[0]))
    while i < len(text):
        for s, k in inverse:
            if text.startswith(s, i):
                out.append(k)
                i += len(s)
                break
        else:
            raise ValueError(text[i:])
    return out


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


class Scripted:
    """An engine that replays token scripts: each poll answers everything submitted since the last
    one, with the next call's scripts in submission order, stopping like an engine would."""

    max_context = None

    def __init__(self, *calls: list[list[int]]):
        self.calls = list(calls)
        self.queue: list = []
        self.requests: list[list[PhaseRequest]] = []  # per poll, in submission order
        self.seeds: list[int] = []

    def submit(self, key, request, temperature, seed):
        self.queue.append((key, request))
        self.seeds.append(seed)

    def cancel(self):
        self.queue = []

    def poll(self):
        if not self.queue:
            return []
        batch, self.queue = self.queue, []
        self.requests.append([r for _, r in batch])
        scripts = iter(self.calls.pop(0))
        out = []
        for key, r in batch:
            script, toks, stop = next(scripts), [], "length"
            for t in script:
                toks.append(t)
                if t == EOS:
                    stop = "eos"
                    break
                if t in r.stop_token_ids:
                    stop = "marker"
                    break
                if len(toks) >= r.max_tokens:
                    break
            out.append((key, PhaseOutput(toks, [-0.5] * len(toks), stop)))
        return out


def settings(**kw) -> SamplingConfig:
    base = dict(context_tokens=40, thinking_budget=10, max_answer_tokens=6, think_end="</think>")
    base.update(kw)
    return SamplingConfig.model_construct(**base)  # unvalidated: budgets below the config's floor of 16 tokens


def run(engine, prompts, k, s):
    return sample_two_phase(engine, prompts, k, s, 0, ChatFormat("plain"), encode, decode, eos_ids={EOS}, forced_phrase=PHRASE)


def test_marker_eos_and_budget_in_one_group():
    prompt = [1, 2, 3, 1]  # 4 tokens: 6 thinking tokens before the budget of 10
    engine = Scripted(
        [[1, 2, MARK], [1, 1, EOS], [1, 2, 3, 1, 2, 3, 1, 2]],  # phase 1: marker, EOS, runs out
        [[3, 3, EOS], [2, 2, 2, 2, 2, 2, 2, 2]],  # phase 2 for the marker and the forced one
    )
    closed, eos, forced = run(engine, [prompt], 3, settings())[0]
    assert [r.max_tokens for r in engine.requests[0]] == [6, 6, 6]
    assert all(r.stop_token_ids == (MARK,) and r.stop_strings == ("</think>",) for r in engine.requests[0])
    assert len(set(engine.seeds)) == len(engine.seeds)  # every phase of every completion has its own seed

    assert not closed.forced and closed.finish_reason == "stop"
    assert closed.completion_ids == [1, 2, MARK, 3, 3, EOS] and closed.loss_mask == [1] * 6
    assert closed.text == "ab</think>cc" and closed.answer == "cc"

    assert eos.completion_ids == [1, 1, EOS] and eos.answer == "" and eos.text == "aa" and eos.finish_reason == "stop"

    phrase = encode(PHRASE + "</think>")  # plain format: the phrase, then the marker closes the thinking
    assert forced.forced and forced.finish_reason == "length"
    assert forced.completion_ids == [1, 2, 3, 1, 2, 3] + phrase + [2] * 6
    assert forced.loss_mask == [1] * 6 + [0] * len(phrase) + [1] * 6
    assert forced.sampler_logprobs[6 : 6 + len(phrase)] == [0.0] * len(phrase)
    assert forced.answer == "bbbbbb"
    # phase 2 continues from prompt + thinking (+ forced tokens), within the answer limit
    second = engine.requests[1]
    assert [r.prompt_ids for r in second] == [prompt + [1, 2, MARK], prompt + [1, 2, 3, 1, 2, 3] + phrase]
    assert [r.max_tokens for r in second] == [6, 6] and all(not r.stop_token_ids for r in second)


def test_context_limits_forced_phrase_and_answer():
    prompt = [1] * 8
    s = settings(context_tokens=11, thinking_budget=10, max_answer_tokens=100)
    engine = Scripted([[2, 2, 2]], [[3, 3, 3, 3]])
    (c,) = run(engine, [prompt], 1, s)[0]
    phrase = encode(PHRASE + "</think>")
    # 8 prompt + 2 thinking = the budget; 1 token of context left: only part of the forced text fits
    assert len(phrase) == 2 and c.completion_ids == [2, 2] + phrase[:1] and c.forced and c.finish_reason == "length"
    assert len(engine.requests) == 1  # no room for an answer: phase 2 is not even asked


def test_prompt_at_the_budget_is_forced_at_once_and_prompt_over_it_is_an_error():
    s = settings(context_tokens=30, thinking_budget=5)
    engine = Scripted([[4, EOS]])
    (c,) = run(engine, [[1] * 5], 1, s)[0]
    assert c.forced and c.loss_mask[: len(encode(PHRASE + "</think>"))] == [0, 0]
    assert c.completion_ids[-1] == EOS and c.answer == "!" and c.finish_reason == "stop"
    with pytest.raises(ValueError, match=r"is 6 tokens, more than sampling.thinking_budget \(5\) leaves room for"):
        run(Scripted(), [[1] * 6], 1, s)
    with pytest.raises(ValueError, match=r"is 30 tokens, more than sampling.context_tokens \(30\) leaves room for"):
        run(Scripted(), [[1] * 30], 1, settings(context_tokens=30, thinking_budget=30))


def test_without_thinking_there_is_one_phase():
    s = settings(think_end=None, max_answer_tokens=3)
    engine = Scripted([[1, 2, 3, 4], [EOS]])
    a, b = run(engine, [[5, 5]], 2, s)[0]
    (c,) = run(Scripted([[2, 2]]), [[5]], 1, s)[0]
    assert len(engine.requests) == 1 and [r.max_tokens for r in engine.requests[0]] == [3, 3]
    assert a.completion_ids == [1, 2, 3] and a.finish_reason == "length" and a.answer == a.text == "abc"
    assert b.completion_ids == [EOS] and b.text == "" and b.finish_reason == "stop"
    assert c.answer == "bb"


def test_an_answer_prefix_is_prompt_the_model_continues_and_the_answer_begins_with_it():
    s = settings(think_end=None, max_answer_tokens=3, answer_prefix="a\n")
    engine = Scripted([[2, 3, EOS]])
    (c,) = run(engine, [[5, 5]], 1, s)[0]
    assert engine.requests[0][0].prompt_ids == [5, 5, 1, 5]  # the prefix's tokens end the prompt
    assert c.prompt_ids == [5, 5, 1, 5] and c.completion_ids == [2, 3, EOS] and c.loss_mask == [1, 1, 1]
    assert c.answer == c.text == "a\nbc"  # what the evaluator parses starts with the prefix


def test_an_answer_prefix_needs_no_thinking():
    with pytest.raises(ValueError, match="answer_prefix .* needs sampling.think_end: null"):
        SamplingConfig(answer_prefix="```python\n", think_end="</think>")
    assert SamplingConfig(answer_prefix="```python\n").answer_prefix == "```python\n"


class Staggered:
    """An engine whose continuations finish in a given order, one per poll (as a running batch does)."""

    max_context = None

    def __init__(self, order, outputs):
        self.order, self.outputs, self.queue, self.seeds = order, outputs, [], []

    def submit(self, key, request, temperature, seed):
        self.queue.append(key)
        self.seeds.append(seed)

    def cancel(self):
        self.queue = []

    def poll(self):
        for key in self.order:
            if key in self.queue:
                self.queue.remove(key)
                return [(key, self.outputs[key])]
        return []


def test_answers_start_while_others_still_think_and_completions_stream_out():
    order = [("think", (0, 1)), ("answer", (0, 1)), ("think", (0, 0)), ("answer", (0, 0))]
    outputs = {
        ("think", (0, 1)): PhaseOutput([1] * 6, [-0.5] * 6, "length"),  # ran out: forced, then answers
        ("answer", (0, 1)): PhaseOutput([3, EOS], [-0.5] * 2, "eos"),
        ("think", (0, 0)): PhaseOutput([2, MARK], [-0.5] * 2, "marker"),
        ("answer", (0, 0)): PhaseOutput([3, 3, EOS], [-0.5] * 3, "eos"),
    }
    engine = Staggered(order, outputs)
    stream = stream_two_phase(engine, [[1, 2, 3, 1]], 2, settings(), 5, ChatFormat("plain"), encode, decode, {EOS}, forced_phrase=PHRASE)
    i, j, first = next(stream)
    assert (i, j) == (0, 1) and first.forced and first.answer == "c"
    assert ("think", (0, 0)) in engine.queue  # the other completion was still thinking: no barrier
    ((_, _, second),) = list(stream)
    assert second.answer == "cc" and not second.forced
    again = Staggered(order, outputs)
    list(stream_two_phase(again, [[1, 2, 3, 1]], 2, settings(), 5, ChatFormat("plain"), encode, decode, {EOS}, forced_phrase=PHRASE))
    assert again.seeds == engine.seeds and len(set(engine.seeds)) == 4  # one seed per phase, from the call's seed


def test_a_consumer_that_stops_early_cancels_the_rest():
    class Cancellable(Scripted):
        cancelled = False

        def cancel(self):
            self.cancelled = True
            self.queue = []

    engine = Cancellable([[1, EOS], [1, 2]])
    stream = stream_two_phase(engine, [[1, 2, 3, 1]], 2, settings(), 0, ChatFormat("plain"), encode, decode, {EOS}, forced_phrase=PHRASE)
    next(stream)
    stream.close()
    assert engine.cancelled and engine.queue == []


def test_think_tags_format_closes_the_thinking():
    """docs/method.md §5a: with think_end '</think>' the forced text of a Qwen3-style model ends with '</think>\\n\\n'."""
    fmt = ChatFormat("think-tags")
    text = fmt.forced_text("... out of thinking tokens.\n\n", "</think>")
    assert text.endswith("</think>\n\n") and text.startswith("... out of thinking tokens.")
