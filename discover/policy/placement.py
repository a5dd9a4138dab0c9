"""Where generation and training run: one GPU shared, or separate GPUs (`model.*_devices`).

Indices are CUDA device indices as this process sees them (after its own CUDA_VISIBLE_DEVICES).
vLLM's engine runs in processes of its own, which see only the generation devices: they are
started with CUDA_VISIBLE_DEVICES set to those devices' physical ids (`visible_devices_for`).
"""

from __future__ import annotations

import os

import torch

from discover.config import ModelConfig

SHARED_GPU_FRACTION = 0.45  # vLLM's share of a GPU it shares with the trainer (docs/real-models.md: memory arithmetic)
OWN_GPU_FRACTION = 0.90  # vLLM's share of a GPU of its own
# vLLM's share of a GPU it shares with the trainer when only one copy of the weights is there at a
# time (model.sleep_while_training and model.offload_while_generating): while vLLM generates, the
# trainer holds only its CUDA context; the rest (about 8 GB of an 80 GB GPU) is headroom for that
# context, the allocator's fragmentation and vLLM's own non-KV memory outside its budget. Not yet
# measured on a GPU: benchmarks/gpu_check.py reports the KV-cache size it gives.
ONE_COPY_GPU_FRACTION = 0.85


def pick_device(spec: str) -> torch.device:
    """'auto': cuda if available, else cpu; anything else is passed to torch.device."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def _cuda_index(spec: str) -> int | None:
    dev = pick_device(spec)
    if dev.type != "cuda":
        return None
    return dev.index if dev.index is not None else 0


def generation_devices(model: ModelConfig) -> list[int]:
    """The CUDA devices vLLM generates on (tensor parallel over them)."""
    if model.generation_devices:
        return list(model.generation_devices)
    index = _cuda_index(model.device)
    if index is None:
        raise RuntimeError(
            "the vllm backend needs a CUDA GPU and none is visible here; run on a GPU worker, or set model.backend: transformers"
        )
    return [index]


def training_devices(model: ModelConfig) -> list[torch.device]:
    """The trainer's devices: one (the usual case) or several (layers split across them)."""
    if model.training_devices:
        return [torch.device(f"cuda:{i}") for i in model.training_devices]
    return [pick_device(model.device)]


def shares_gpu(model: ModelConfig) -> bool:
    """True when vLLM and the trainer use (at least) one GPU in common."""
    train = {d.index if d.index is not None else 0 for d in training_devices(model) if d.type == "cuda"}
    return bool(train & set(generation_devices(model)))


def generation_memory_fraction(model: ModelConfig) -> float:
    """vLLM's `gpu_memory_utilization`: the configured one, else by whether the GPU is shared."""
    if model.generation_memory_fraction is not None:
        return float(model.generation_memory_fraction)
    if not shares_gpu(model):
        return OWN_GPU_FRACTION
    return ONE_COPY_GPU_FRACTION if one_copy_on_gpu(model) else SHARED_GPU_FRACTION


def one_copy_on_gpu(model: ModelConfig) -> bool:
    """True when vLLM sleeps while the trainer trains and the trainer's weights leave while vLLM generates."""
    return bool(model.sleep_while_training and model.offload_while_generating)


def visible_devices_for(indices: list[int]) -> str:
    """CUDA_VISIBLE_DEVICES for a child process that should see exactly `indices` of ours."""
    current = os.environ.get("CUDA_VISIBLE_DEVICES")
    if current is None or not current.strip():
        return ",".join(str(i) for i in indices)
    ours = [d.strip() for d in current.split(",") if d.strip()]
    missing = [i for i in indices if i >= len(ours)]
    if missing:
        raise ValueError(
            f"CUDA device(s) {missing} do not exist here: CUDA_VISIBLE_DEVICES={current!r} shows {len(ours)}; "
            f"fix model.generation_devices / model.training_devices"
        )
    return ",".join(ours[i] for i in indices)
