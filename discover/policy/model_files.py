"""Where the files of the model that `model.name` names are, without importing torch.

`resolve_model_path` is what the backends load from (building an embedded model, or converting a
GGUF file, on first use). `files_without_weights` is what a check may read before any weights
load (discover/preflight.py: the tokenizer and config.json), or None where that would mean
converting or downloading a model.
"""

from __future__ import annotations

from pathlib import Path

from discover.config import EMBEDDED_MODEL

__all__ = ["files_without_weights", "resolve_model_path"]


def resolve_model_path(name: str) -> str:
    """'tiny' / 'tiny-qwen3' -> the embedded model's directory; a packaged GGUF model ('smollm2-135m')
    or a local .gguf file -> its converted folder (discover/policy/gguf_models.py); a local dir ->
    itself; else the hub id."""
    if name == EMBEDDED_MODEL:
        from discover.policy.tiny_model import tiny_model_path

        return str(tiny_model_path())
    if name == "tiny-qwen3":
        from discover.policy.qwen3_model import tiny_qwen3_path

        return str(tiny_qwen3_path())
    from discover.policy.gguf_models import converted_model_dir, gguf_file_of

    gguf = gguf_file_of(name)
    if gguf is not None:
        return str(converted_model_dir(gguf))
    p = Path(name).expanduser()
    if p.is_dir():
        return str(p)
    return name


def files_without_weights(name: str) -> str | None:
    """Where the tokenizer and config.json of `model.name` can be read without loading, converting
    or downloading weights: an embedded model's directory (built on first use, as a run builds it:
    seconds, a few MB), a converted GGUF model's folder, a local directory, or a hub id whose files
    are in the local Hugging Face cache. None for a GGUF model not converted yet (converting
    de-quantises its weights) and for a hub id not downloaded (no network is used).

    Raises `gguf_models.ModelUnavailable` for a GGUF model that is not installed here.
    """
    if name in (EMBEDDED_MODEL, "tiny-qwen3"):
        return resolve_model_path(name)
    from discover.policy.gguf_models import converted_name, gguf_file_of
    from discover.policy.tiny_model import cached_model_path

    gguf = gguf_file_of(name)
    if gguf is not None:
        folder = cached_model_path(converted_name(gguf))
        return None if folder is None else str(folder)
    p = Path(name).expanduser()
    if p.is_dir():
        return str(p)
    from huggingface_hub import try_to_load_from_cache

    return name if isinstance(try_to_load_from_cache(name, "config.json"), str) else None
