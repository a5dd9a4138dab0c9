"""Policy backend names and where each backend lives. A new backend adds one line here.

A backend is a sampler over the shared LoRA trainer (docs/architecture.md, "A policy backend"):
its factory takes `(model_config, adapter_dir, seed)` and returns a `base.Policy`. Nothing here
imports a backend (torch, transformers, vLLM) until `load_policy` builds one.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from discover.config import ModelConfig
    from discover.policy.base import Policy

# name -> "module:factory"; the first is the default of `model.backend`
_BACKENDS: dict[str, str] = {
    "transformers": "discover.policy.transformers_backend:load",
    "vllm": "discover.policy.vllm_backend:load",
}


def backend_names() -> list[str]:
    """The names `model.backend` accepts, in registry order."""
    return list(_BACKENDS)


def allowed_backends_message() -> str:
    """The error of an unknown `model.backend`, in pydantic's Literal style: "Input should be 'a' or 'b'"."""
    names = [repr(n) for n in backend_names()]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return f"Input should be {listed}"


def backend_factory(name: str) -> Callable[[ModelConfig, Path | None, int], Policy]:
    """The factory of backend `name` (imported now); a clear error for unknown names."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown model.backend {name!r}: {allowed_backends_message()}")
    module_name, factory = _BACKENDS[name].split(":")
    return getattr(import_module(module_name), factory)


def load_policy(model: ModelConfig, adapter_dir: Path | None = None, seed: int = 0) -> Policy:
    """The policy of `model.backend` with the adapter in `adapter_dir` (None: a new one from `seed`).

    Every backend keeps its heavy parts resident in the worker process (the trainer's base model,
    vLLM's engine), so calling this every task costs an adapter load, not a model load.
    """
    return backend_factory(model.backend)(model, adapter_dir, seed)
