"""Policy backend names and where each backend lives; a new backend adds one line here.

A backend is a sampler over the shared LoRA trainer (docs/architecture.md, "A policy backend"):
its factory takes `(model_config, adapter_dir, seed)` and returns a `discover.policy.base.Policy`.
This module imports nothing, so the configuration can take `model.backend`'s allowed values from
it; discover/policy/registry.py imports a backend only when `load_policy` builds one.
"""

from __future__ import annotations

# name -> "module:factory"
BACKENDS: dict[str, str] = {
    "transformers": "discover.policy.transformers_backend:load",
    "vllm": "discover.policy.vllm_backend:load",
}

# the default of `model.backend` (discover/config.py takes it from here)
DEFAULT_BACKEND = "transformers"
