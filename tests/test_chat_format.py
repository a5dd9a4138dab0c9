"""Chat formats (docs/method.md §4, §5a "Forced answer") on tokenizers and templates built offline."""

from __future__ import annotations

import pytest
import torch

from discover.config import ModelConfig, SamplingConfig, load_config
from discover.policy.chat_format import FORCED_PHRASE, HARMONY_CLOSE, HARMONY_FINAL, ChatFormat, chat_format_for, detect_family

PROMPT = "Improve the construction. Write the code."
# A harmony-style template (gpt-oss's message framing), written for this test.
HARMONY_TEMPLATE = (
    "{%- for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{%- endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}"
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("DISCOVER_CACHE", str(tmp_path_factory.mktemp("discover-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def qwen3_policy(cache):
    from discover.policy import transformers_backend

    return transformers_backend.load(ModelConfig(name="tiny-qwen3", lora_rank=4, device="cpu"))


@pytest.fixture(scope="module")
def gpt2_tokenizer(cache):
    from transformers import AutoTokenizer

    from discover.policy.tiny_model import tiny_model_path

    return AutoTokenizer.from_pretrained(tiny_model_path())


@pytest.fixture(scope="module")
def harmony_tokenizer(gpt2_tokenizer):
    import copy

    tok = copy.deepcopy(gpt2_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>"]})
    tok.chat_template = HARMONY_TEMPLATE
    return tok


def test_families_are_detected(qwen3_policy, gpt2_tokenizer, harmony_tokenizer):
    assert detect_family(gpt2_tokenizer) == "plain"
    assert detect_family(qwen3_policy.sampler.tokenizer) == "think-tags"
    assert detect_family(harmony_tokenizer) == "harmony"


def test_qwen3_prompt_is_rendered_with_its_template(qwen3_policy):
    tok = qwen3_policy.sampler.tokenizer
    thinking = tok.decode(qwen3_policy.sampler.render_prompt(PROMPT, "</think>"))
    assert thinking == f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    plain = tok.decode(qwen3_policy.sampler.render_prompt(PROMPT, None))  # no thinking phase: an empty block
    assert plain.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_forced_text_closes_the_thinking_per_family(gpt2_tokenizer, harmony_tokenizer, qwen3_policy):
    phrase = FORCED_PHRASE
    assert chat_format_for(qwen3_policy.sampler.tokenizer, "</think>").forced_text(phrase, "</think>") == phrase + "</think>\n\n"
    assert chat_format_for(gpt2_tokenizer, "</think>").forced_text(phrase, "</think>") == phrase + "</think>"
    harmony = chat_format_for(harmony_tokenizer, HARMONY_FINAL)
    assert harmony.forced_text(phrase, HARMONY_FINAL) == phrase + "<|end|><|start|>assistant<|channel|>final<|message|>"
    ids = harmony_tokenizer.encode(HARMONY_CLOSE, add_special_tokens=False)
    assert harmony_tokenizer.convert_ids_to_tokens(ids[:2]) == ["<|end|>", "<|start|>"]  # special tokens, not text
    rendered = harmony.render(harmony_tokenizer, PROMPT, thinking=True)
    assert harmony_tokenizer.decode(rendered) == f"<|start|>user<|message|>{PROMPT}<|end|><|start|>assistant"


def test_a_think_end_that_cannot_close_the_family_is_an_error(qwen3_policy, harmony_tokenizer):
    with pytest.raises(ValueError, match="set sampling.think_end: '</think>'"):
        chat_format_for(qwen3_policy.sampler.tokenizer, "<end-of-thinking>")
    with pytest.raises(ValueError, match="harmony"):
        chat_format_for(harmony_tokenizer, "</think>")
    assert chat_format_for(qwen3_policy.sampler.tokenizer, None) == ChatFormat("think-tags")


def test_math_configs_force_a_closed_thinking_block_on_a_qwen3_model(qwen3_policy):
    """The issue's bug: with think_end '</think>' (every math config) the forced phrase must close the block."""
    s = load_config("configs/erdos.yaml").sampling
    assert s.think_end == "</think>"
    tok = qwen3_policy.sampler.tokenizer
    prompt_len = len(qwen3_policy.sampler.render_prompt(PROMPT, s.think_end))
    think = 6
    settings = SamplingConfig(context_tokens=512, thinking_budget=prompt_len + think, max_answer_tokens=8, think_end=s.think_end)
    forced_ids = tok.encode(FORCED_PHRASE + "</think>\n\n", add_special_tokens=False)
    close = tok.convert_tokens_to_ids("</think>")
    assert close in forced_ids  # '</think>' is one token in the forced text, as the model writes it
    comps = qwen3_policy.sample([PROMPT], 8, settings, seed=4)[0]
    forced = [c for c in comps if c.forced]
    assert forced, "a random model does not close its thinking within 6 tokens"
    for c in forced:
        n_think = c.loss_mask.index(0)
        assert n_think <= think and close not in c.completion_ids[:n_think]
        assert c.completion_ids[n_think : n_think + len(forced_ids)] == forced_ids
        assert c.loss_mask[n_think : n_think + len(forced_ids)] == [0] * len(forced_ids)
        assert c.sampler_logprobs[n_think : n_think + len(forced_ids)] == [0.0] * len(forced_ids)
        assert all(m == 1 for m in c.loss_mask[n_think + len(forced_ids) :])
        assert "</think>\n\n" in c.text
        assert c.answer == tok.decode(c.completion_ids[n_think + len(forced_ids) :][: 8 if c.finish_reason == "length" else -1])
    # the learner reproduces the sampler's log-probs of the generated tokens
    for c, lp in zip(forced, qwen3_policy.sequence_logprobs(forced, temperature=1.0), strict=True):
        m = torch.tensor(c.loss_mask, dtype=torch.bool)
        assert torch.allclose(lp.detach()[m], torch.tensor(c.sampler_logprobs)[m], atol=1e-4, rtol=0)


def test_a_model_that_closes_its_thinking_answers_after_the_marker(qwen3_policy):
    tok = qwen3_policy.sampler.tokenizer
    close = tok.convert_tokens_to_ids("</think>")
    head = qwen3_policy.trainer.model.get_base_model().get_output_embeddings()
    bias = torch.zeros(head.weight.shape[0])
    bias[close] = 4.0  # make '</think>' likely: the marker path, not the forced one
    hook = head.register_forward_hook(lambda module, args, out: out + bias.to(out.dtype))
    try:
        settings = SamplingConfig(context_tokens=512, thinking_budget=400, max_answer_tokens=5, think_end="</think>")
        comps = qwen3_policy.sample([PROMPT], 8, settings, seed=0)[0]
    finally:
        hook.remove()
    closed = [c for c in comps if not c.forced and close in c.completion_ids]
    assert closed
    for c in closed:
        i = c.completion_ids.index(close)
        assert all(m == 1 for m in c.loss_mask)
        assert c.answer == c.text.split("</think>", 1)[1]
        assert len(c.completion_ids) - i - 1 <= 5  # the answer phase's own limit


class _Tokenizer:
    """The two attributes a plain prompt reads, besides encoding."""

    def __init__(self, add_bos_token: bool, bos_token_id: int | None) -> None:
        self.add_bos_token, self.bos_token_id = add_bos_token, bos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert not add_special_tokens
        return [ord(c) for c in text]


def test_a_plain_prompt_starts_with_bos_only_when_the_tokenizer_adds_one() -> None:
    plain = ChatFormat("plain")
    assert plain.render(_Tokenizer(True, 2), "ab", thinking=False) == [2, 97, 98]  # a base model such as Gemma: <bos> first
    assert plain.render(_Tokenizer(False, 2), "ab", thinking=False) == [97, 98]  # GPT-2 style: as it is
    assert plain.render(_Tokenizer(True, None), "ab", thinking=False) == [97, 98]
