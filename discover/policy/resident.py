"""The base model of a policy, loaded once per process and kept resident.

Every `trainer.LoRATrainer.load` wraps a structural copy of the cached base model that shares the
frozen weights with a LoRA adapter of its own, so a training step in a long-lived worker never
reads the weights from disk again.
"""

from __future__ import annotations

import copy
import threading

import torch

from discover.policy.model_files import resolve_model_path

__all__ = ["BASE_CACHE", "as_base", "load_base", "loads", "resolve_model_path", "share_weights_copy"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# (resolved path, dtype name, devices) -> (tokenizer, clean base model). The cached base model is
# never wrapped itself: every load wraps a structural copy that shares the frozen weights.
BASE_CACHE: dict[tuple[str, str, str], tuple[object, torch.nn.Module]] = {}
_BASE_LOCK = threading.Lock()
_LOADS = [0]  # base models read from disk by this process


def loads() -> int:
    """How many base models this process has read from disk (a resident worker: one for the run)."""
    return _LOADS[0]


def load_base(path: str, dtype: str, devices: list[torch.device]):
    key = (path, dtype, ",".join(str(d) for d in devices))
    with _BASE_LOCK:
        if key in BASE_CACHE:
            return BASE_CACHE[key]
        from transformers import AutoModelForCausalLM, AutoTokenizer

        kwargs = {}
        if len(devices) > 1:  # layers split across the trainer's GPUs (accelerate's device map)
            kwargs["device_map"] = "auto"
            kwargs["max_memory"] = {d.index: torch.cuda.get_device_properties(d.index).total_memory * 0.85 for d in devices}
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype], **kwargs)
        except Exception as err:  # transformers raises OSError/ValueError/HF hub errors; re-raise as one type
            raise RuntimeError(
                f"could not load model {path!r}: {str(err).rstrip('.')}. Pass a local model directory as model.name, or "
                f"pre-download it into the Hugging Face cache (and set HF_HUB_OFFLINE=1 to use it offline)."
            ) from err
        if len(devices) == 1:
            model.to(devices[0])
        BASE_CACHE[key] = as_base(tokenizer, model)
        _LOADS[0] += 1
        return tokenizer, model


def as_base(tokenizer, model: torch.nn.Module):
    """(tokenizer, model) made a frozen base for adapters: evaluation mode, no gradients, a pad token."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model


def share_weights_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the module tree that shares (does not copy) every parameter and buffer."""
    memo = {id(t): t for t in model.parameters()}
    memo.update({id(t): t for t in model.buffers()})
    return copy.deepcopy(model, memo)
