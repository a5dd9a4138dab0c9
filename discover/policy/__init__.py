"""Policy backends: one protocol (`base.Policy`), one factory chosen by `model.backend`."""

from __future__ import annotations

from pathlib import Path

from discover.config import ModelConfig
from discover.policy.base import Completion, GenerationSettings, Policy, TrainBatch

__all__ = ["Completion", "GenerationSettings", "Policy", "TrainBatch", "load_policy"]


def load_policy(model: ModelConfig, adapter_dir: Path | None = None, seed: int = 0) -> Policy:
    """The policy of `model.backend` with the adapter in `adapter_dir` (None: a new one from `seed`).

    Both backends keep their heavy parts resident in the worker process (the base model of the
    trainer; vLLM's engine), so calling this every task costs an adapter load, not a model load.
    """
    if model.backend == "transformers":
        from discover.policy.transformers_backend import TransformersPolicy

        return TransformersPolicy.load(model, adapter_dir, seed=seed)
    if model.backend == "vllm":
        from discover.policy.vllm_backend import VLLMPolicy

        return VLLMPolicy(model, adapter_dir, seed=seed)  # the engine and the trainer load on first use
    raise ValueError(f"unknown model.backend {model.backend!r}; choose 'transformers' or 'vllm'")
