"""Policy backends: a sampler (`base.Sampler`, over an `engine.DecodeEngine`) and the shared LoRA
trainer (`base.Trainer`), combined in one `base.Policy`; `load_policy` builds the backend that
`model.backend` names in `registry.py` (docs/architecture.md, "A policy backend")."""

from __future__ import annotations

from discover.policy.base import Completion, Policy, Sampler, TrainBatch, Trainer
from discover.policy.registry import backend_names, load_policy

__all__ = ["Completion", "Policy", "Sampler", "Trainer", "TrainBatch", "backend_names", "load_policy"]
