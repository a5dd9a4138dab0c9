"""The embedded default model: a tiny GPT-2 with a locally trained byte-level BPE tokenizer.

Everything is built offline and deterministically from a small built-in corpus, so the whole
pipeline (sampling, training, saving adapters) runs without a model hub. The model is randomly
initialised: it produces noise, which is all the tests and the smoke runs need.

`tiny_model_path()` returns `$DISCOVER_CACHE/models/tiny-gpt2-v2` (DISCOVER_CACHE defaults to
`~/.cache/ttt-discover`), building it there on first use. The build writes into a temporary
directory beside the target and renames it into place, so a crash never leaves half a model and
concurrent builders are harmless (the first rename wins, the others discard their copy).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from storage.atomic import atomic_dir_once

TINY_MODEL_NAME = "tiny-gpt2-v2"
SPECIAL_TOKEN = "<|endoftext|>"
VOCAB_SIZE = 512
N_POSITIONS = 2048

_ENGLISH = """\
We want to find a construction that improves the best known bound for an optimisation problem.
The objective is to minimise the maximum overlap, or to maximise the minimum distance between points.
A candidate solution is a list of numbers; the verifier checks the constraints and computes the score.
Think step by step. First describe the idea, then write the code, then check the result.
The reward is higher when the bound is tighter. Try small changes to the best solution so far.
Here is the current best solution and its score. Improve it if you can.
The function must return a numpy array of floats. Do not print anything else.
Consider a step function on the interval from 0 to 1 with equal pieces.
We use gradient descent with a small learning rate and random restarts.
The answer is a single Python code block. Keep the runtime below one minute.
"""

_CODE = """\
```python
import numpy as np


def construct(n: int = 100) -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.random(n)
    for i in range(n):
        x[i] = x[i] / (1 + i)
    return x / x.sum()


def score(values):
    total = 0.0
    for k in range(len(values)):
        total += values[k] * values[k]
    return total


def solve():
    best = None
    for step in range(1000):
        candidate = construct(50 + step % 7)
        if best is None or score(candidate) < score(best):
            best = candidate
    return best
```
"""


def corpus() -> list[str]:
    """A few KB of text: English, Python snippets in markdown fences, and many digit strings."""
    lines = [_ENGLISH, _CODE]
    digits = []
    for a in range(0, 100, 3):
        digits.append(f"{a} + {a * 7 % 10} = {a + a * 7 % 10}")
        digits.append(f"x[{a}] = {a / 7:.6f}")
    digits.append(" ".join(str(i) for i in range(100)))
    digits.append("0123456789 9876543210 3.14159265358979 2.718281828 1e-6 1e9 -42 0.5")
    lines.extend(digits)
    return lines


def _build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[SPECIAL_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL_TOKEN,
        eos_token=SPECIAL_TOKEN,
        pad_token=SPECIAL_TOKEN,
        unk_token=SPECIAL_TOKEN,
        model_max_length=N_POSITIONS,
    )


def build_tiny_model(out_dir: Path, seed: int = 0) -> Path:
    """Write the tokenizer and a randomly initialised 2-layer GPT-2 into `out_dir` (deterministic)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids(SPECIAL_TOKEN)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=N_POSITIONS,
        n_embd=64,
        n_layer=2,
        n_head=4,
        # Output embeddings are tied to the inputs; at GPT-2's default 0.02 their norm caps every
        # logit near 1, so no adapter could make a token likely. 0.2 leaves room to learn.
        initializer_range=0.2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _cache_root() -> Path:
    return Path(os.environ.get("DISCOVER_CACHE") or Path.home() / ".cache" / "ttt-discover").expanduser()


def _complete(path: Path) -> bool:
    return (
        (path / "config.json").is_file()
        and (path / "tokenizer.json").is_file()
        and ((path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file())
    )


def cached_model_path(name: str) -> Path | None:
    """`$DISCOVER_CACHE/models/<name>` if it has been built, else None (nothing is built)."""
    target = _cache_root() / "models" / name
    return target if _complete(target) else None


def cached_model(name: str, build: Callable[[Path], Path]) -> Path:
    """`$DISCOVER_CACHE/models/<name>`, built by `build(dir)` on first use (atomically, safe under concurrency)."""
    target = _cache_root() / "models" / name
    if _complete(target):
        return target
    if target.exists() and not _complete(target):
        shutil.rmtree(target, ignore_errors=True)  # a leftover of something that did not rename atomically
    with atomic_dir_once(target) as tmp:
        build(tmp)
    return target


def tiny_model_path() -> Path:
    """The embedded model's directory, built on first use (atomically, safe under concurrency)."""
    return cached_model(TINY_MODEL_NAME, build_tiny_model)
