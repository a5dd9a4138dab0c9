"""A randomly initialised model of the Qwen3 architecture, built offline at any size.

Real-architecture tests and GPU benchmarks need a model that transformers, peft *and* vLLM load
from a local directory, without a model hub: this module writes one. It has

* a byte-level BPE tokenizer trained locally on the tiny model's corpus, with Qwen3's special
  tokens (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, `<think>`, `</think>`), padded with
  unused filler tokens to exactly the model's vocabulary size (so every id the model can sample
  decodes, in transformers and in vLLM's detokenizer);
* a Qwen3-style chat template (user/assistant turns between `<|im_start|>` and `<|im_end|>`, the
  assistant's thinking between `<think>` tags, `enable_thinking=False` renders an empty block);
* random weights (seeded) in the requested dtype, saved as safetensors with the `config.json` and
  `generation_config.json` fields vLLM reads (architectures, dtype, eos ids, max positions).

Shapes: `tiny` (two layers, CPU tests; `DISCOVER_CACHE`-cached as the embedded model
'tiny-qwen3'), `small` (GPU tests), `0.6b` and `8b` (Qwen3-0.6B's and Qwen3-8B's published shapes,
for GPU benchmarks: build them on the GPU machine, never commit the weights). Command line:

    python -m discover.policy.qwen3_model OUT_DIR --shape 8b --device cuda
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

TINY_QWEN3_NAME = "tiny-qwen3-v1"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK_TOKENS = ["<think>", "</think>"]  # added, not special: they stay in decoded text, as in Qwen3
BPE_VOCAB = 1000  # learned tokens (bytes + merges + specials); the rest of the vocabulary is filler

# A Qwen3-style template written for this project (the single-user-turn rendering matches Qwen3's).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# Published shapes (Qwen3 technical report / the models' config.json); vocab 151936 as released.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=8192,
        initializer_range=0.2,
    ),
    "small": dict(  # GPU tests: head_dim 64, which every vLLM attention backend supports
        vocab_size=4096,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=16384,
        initializer_range=0.1,
    ),
    "0.6b": dict(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
    ),
    "8b": dict(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
    ),
}


def build_tokenizer(vocab_size: int):
    """The Qwen3-style tokenizer with exactly `vocab_size` ids (learned BPE, then filler tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from discover.policy.tiny_model import corpus

    pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    learned = Tokenizer(models.BPE())
    learned.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(
        vocab_size=min(BPE_VOCAB, vocab_size) - len(THINK_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    learned.train_from_iterator(corpus() + ["<think>\nLet me think.\n</think>\n\nThe answer."], trainer=trainer)
    model = json.loads(learned.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    n_learned = len(vocab)
    # Filler tokens no merge produces: never emitted by encoding, but every sampled id decodes.
    for i in range(vocab_size - n_learned - len(THINK_TOKENS)):
        vocab[f"<|unused_{i}|>"] = n_learned + i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=131072,
    )
    fast.add_tokens(THINK_TOKENS)  # ids vocab_size-2 and vocab_size-1
    fast.chat_template = CHAT_TEMPLATE
    if len(fast) != vocab_size:
        raise AssertionError(f"tokenizer has {len(fast)} ids, expected {vocab_size}")
    return fast


def qwen3_config(shape: str | dict[str, Any], tokenizer) -> Any:
    """A Qwen3Config of a named shape (or explicit fields), with the tokenizer's special ids."""
    from transformers import Qwen3Config

    fields = dict(SHAPES[shape]) if isinstance(shape, str) else dict(shape)
    fields.setdefault("rope_theta", 1_000_000.0)
    fields.setdefault("rms_norm_eps", 1e-6)
    fields.setdefault("tie_word_embeddings", False)
    fields.setdefault("max_window_layers", fields["num_hidden_layers"])
    return Qwen3Config(
        **fields,
        attention_dropout=0.0,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )


def random_qwen3(shape: str | dict[str, Any] = "tiny", seed: int = 0, device: str = "cpu", dtype: str = "bfloat16"):
    """(tokenizer, model): a Qwen3-architecture model with seeded random weights, built in memory on
    `device` (nothing written: a benchmark that only trains needs no copy on disk)."""
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    if isinstance(shape, str) and shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)} or pass the config fields")
    vocab_size = (SHAPES[shape] if isinstance(shape, str) else shape)["vocab_size"]
    tokenizer = build_tokenizer(vocab_size)
    config = qwen3_config(shape, tokenizer)
    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[dtype]
    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        with dev:
            model = Qwen3ForCausalLM._from_config(config, dtype=torch_dtype)
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=[config.eos_token_id, config.bos_token_id],  # <|im_end|>, <|endoftext|> as Qwen3
        pad_token_id=config.pad_token_id,
        do_sample=True,
        temperature=1.0,
    )
    return tokenizer, model


def build_qwen3_model(
    out_dir: Path, shape: str | dict[str, Any] = "tiny", seed: int = 0, device: str = "cpu", dtype: str = "bfloat16"
) -> Path:
    """Write tokenizer, chat template and random weights of a Qwen3-architecture model to `out_dir`."""
    tokenizer, model = random_qwen3(shape, seed=seed, device=device, dtype=dtype)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    del model
    return out_dir


def tiny_qwen3_path() -> Path:
    """The embedded 'tiny-qwen3' model (two layers, float32), built on first use into DISCOVER_CACHE."""
    from discover.policy.tiny_model import cached_model

    return cached_model(TINY_QWEN3_NAME, lambda d: build_qwen3_model(d, "tiny", seed=0, dtype="float32"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a randomly initialised Qwen3-architecture model.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where the weights are initialised ('cuda' for large shapes)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args(argv)
    path = build_qwen3_model(args.out_dir, args.shape, seed=args.seed, device=args.device, dtype=args.dtype)
    print(path)


if __name__ == "__main__":
    main()
