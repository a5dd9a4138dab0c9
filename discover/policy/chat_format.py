"""How a context becomes prompt tokens, and how a thinking block is closed, per model family.

docs/method.md §4 and §5a ("Forced answer"): when the thinking budget runs out, the appended phrase must
also close the model's thinking block *in the model's own chat format*, or the model keeps
thinking. Three families cover the models the method is run with:

* ``think-tags`` (Qwen3, QwQ, DeepSeek-R1 distills): the assistant turn is ``<think> ... </think>``
  then the answer; the phrase is followed by ``</think>`` and the blank line the template puts there.
* ``harmony`` (gpt-oss): thinking is the ``analysis`` channel; closing it ends that message and
  opens the ``final`` channel: ``<|end|><|start|>assistant<|channel|>final<|message|>``.
* ``template``: a chat template with no thinking block (ChatML models such as SmolLM2-Instruct,
  most instruct models before reasoning models): the prompt is the template's user turn and the
  model answers at once, so ``sampling.think_end`` must be null.
* ``plain``: a tokenizer without a chat template (the embedded tiny GPT-2, pretrained base models
  such as Gemma 3 270M): the context is encoded as it is, after the beginning-of-sequence token
  when the tokenizer adds one (Gemma's ``<bos>``), and the configured ``think_end`` marker itself
  closes the thinking.

The family is read from the tokenizer (its vocabulary and chat template); `chat_format_for`
raises a clear error when the configured ``sampling.think_end`` cannot close the family's thinking.
"""

from __future__ import annotations

from dataclasses import dataclass

HARMONY_FINAL = "<|channel|>final<|message|>"  # the marker that opens gpt-oss's final channel
HARMONY_CLOSE = "<|end|><|start|>assistant" + HARMONY_FINAL  # end the analysis message, open final
THINK_CLOSE = "</think>"
# Table 9's out-of-thinking phrase, appended when the thinking budget runs out (docs/method.md §4);
# `ChatFormat.forced_text` follows it with what closes the thinking block
FORCED_PHRASE = "\n\n... okay, I am out of thinking tokens. I need to send my final message now.\n\n"


@dataclass(frozen=True)
class ChatFormat:
    """One family's rules: rendering the prompt and closing the thinking block."""

    family: str  # "think-tags", "harmony", "template" or "plain"

    def render(self, tokenizer, text: str, thinking: bool, **template_kwargs) -> list[int]:
        """Prompt token ids: a user turn plus the generation prompt, in the tokenizer's chat template.

        `thinking` False asks templates that know the switch (Qwen3's `enable_thinking`) for an
        answer without a thinking block; other templates ignore it. `template_kwargs` go to the
        template as they are (`model.chat_template_kwargs`, e.g. gpt-oss's `reasoning_effort`).
        """
        if self.family == "plain":
            ids = [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]
            # as the tokenizer would add it (Gemma: <bos>); GPT-2-style tokenizers add none
            if getattr(tokenizer, "add_bos_token", False) and tokenizer.bos_token_id is not None:
                ids = [int(tokenizer.bos_token_id), *ids]
            return ids
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            enable_thinking=thinking,
            **template_kwargs,
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def closing_text(self, think_end: str) -> str:
        """What follows the forced phrase so that the model's thinking block is closed (docs/method.md §5a)."""
        if self.family == "harmony":
            return HARMONY_CLOSE
        if self.family == "think-tags":
            return think_end + "\n\n"  # the template writes a blank line after </think>
        return think_end

    def forced_text(self, phrase: str, think_end: str) -> str:
        """The whole forced continuation: the out-of-budget phrase, then the closing of the thinking."""
        return phrase + self.closing_text(think_end)


def detect_family(tokenizer) -> str:
    """'harmony', 'think-tags', 'template' or 'plain', from the tokenizer's vocabulary and chat template."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # several named templates: look at all of them
        template = "\n".join(str(t) for t in template.values())
    vocab = tokenizer.get_vocab()
    if "<|channel|>" in vocab and "<|message|>" in vocab and "<|start|>" in vocab:
        return "harmony"
    if not template:
        return "plain"
    if THINK_CLOSE in vocab or THINK_CLOSE in template:
        return "think-tags"
    return "template"


def chat_format_for(tokenizer, think_end: str | None) -> ChatFormat:
    """The tokenizer's chat format, checked against the configured `sampling.think_end`."""
    fmt = ChatFormat(detect_family(tokenizer))
    if think_end is None:
        return fmt
    if fmt.family == "harmony" and think_end != HARMONY_FINAL:
        raise ValueError(
            f"sampling.think_end is {think_end!r}, but this model uses the harmony chat format (gpt-oss), "
            f"whose thinking ends when the final channel opens: set sampling.think_end: {HARMONY_FINAL!r}"
        )
    if fmt.family == "template":
        raise ValueError(
            f"sampling.think_end is {think_end!r}, but this model's chat template has no thinking block (it answers "
            f"at once, e.g. ChatML instruct models such as SmolLM2): set sampling.think_end: null and budget the "
            f"answer with sampling.max_answer_tokens"
        )
    if fmt.family == "think-tags" and think_end != THINK_CLOSE:
        raise ValueError(
            f"sampling.think_end is {think_end!r}, but this model closes its thinking with {THINK_CLOSE!r} "
            f"(its chat template uses <think> tags): set sampling.think_end: {THINK_CLOSE!r}"
        )
    return fmt
