"""Policy backends: one protocol (`base.Policy`), one factory chosen by `model.backend`."""

from __future__ import annotations

from pathlib import Path

from discover.config import ModelConfig
from discover.policy.base import Completion, GenerationSettings, Policy, TrainBatch

__all__ = ["Completion", "GenerationSettings", "Policy", "TrainBatch", "load_policy"]


def load_policy(model: ModelConfig, adapter_dir: Path | None = None, seed: int = 0) -> Policy:
    """The policy of `model.backend` with the adapter in `adapter_dir` (None: a new one from `seed`)."""
    if model.backend == "transformers":
        from discover.policy.transformers_backend import TransformersPolicy

        return TransformersPolicy.load(model, adapter_dir, seed=seed)
    raise ValueError(f"unknown model.backend {model.backend!r}; choose 'transformers'")
