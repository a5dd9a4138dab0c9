"""Building the policy backend that `model.backend` names (the names: discover/backends.py).

Nothing here imports a backend (torch, transformers, vLLM) until `load_policy` builds one.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

from discover.backends import BACKENDS

if TYPE_CHECKING:
    from discover.config import ModelConfig
    from discover.policy.base import Policy


def backend_names() -> list[str]:
    """The names `model.backend` accepts, in registry order."""
    return list(BACKENDS)


def backend_factory(name: str) -> Callable[[ModelConfig, Path | None, int], Policy]:
    """The factory of backend `name` (imported now); a clear error for unknown names."""
    if name not in BACKENDS:
        raise ValueError(f"unknown model.backend {name!r}; choose one of {', '.join(BACKENDS)}")
    module_name, factory = BACKENDS[name].split(":")
    return getattr(import_module(module_name), factory)


def load_policy(model: ModelConfig, adapter_dir: Path | None = None, seed: int = 0) -> Policy:
    """The policy of `model.backend` with the adapter in `adapter_dir` (None: a new one from `seed`).

    Every backend keeps its heavy parts resident in the worker process (the trainer's base model,
    vLLM's engine), so calling this every task costs an adapter load, not a model load.
    """
    return backend_factory(model.backend)(model, adapter_dir, seed)
