"""Sandbox backends that run untrusted candidate programs (DESIGN.md, "sandbox/")."""

from __future__ import annotations

from evaluators.sandbox.base import Sandbox, SandboxLimits, SandboxResult
from evaluators.sandbox.process import ProcessSandbox

__all__ = ["ProcessSandbox", "Sandbox", "SandboxLimits", "SandboxResult", "get_sandbox"]


def get_sandbox(backend: str) -> Sandbox:
    """The sandbox for `backend`: "process", "auto" (process for now) or "docker" (not yet)."""
    if backend in ("process", "auto"):
        return ProcessSandbox()
    if backend == "docker":
        raise ValueError(
            "the docker sandbox backend is not available yet; use sandbox backend 'process'"
        )
    raise ValueError(f"unknown sandbox backend {backend!r}; choose 'process', 'docker' or 'auto'")
