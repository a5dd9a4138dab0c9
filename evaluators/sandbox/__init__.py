"""Sandbox backends that run untrusted candidate programs (docs/architecture.md, "Where new work plugs in")."""

from __future__ import annotations

import threading
import warnings
from typing import Any

from evaluators.sandbox.base import Sandbox, SandboxLimits, SandboxResult
from evaluators.sandbox.process import ISOLATIONS, IsolationUnavailable, ProcessSandbox, UnboundedProcessTree

__all__ = [
    "BACKENDS",
    "ISOLATIONS",
    "IsolationUnavailable",
    "ProcessSandbox",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "UnboundedProcessTree",
    "get_sandbox",
    "sandbox_for",
]

# The sandbox backends by name (the configuration's sandbox.backend and the CLI's --sandbox): "auto"
# is docker when an engine answers and the image exists, else process.
BACKENDS = ("auto", "process", "docker")
DEFAULT_IMAGE = "python-math"
_docker_boxes: dict[tuple, Any] = {}  # one warm pool per (image, concurrency, gpu) per process
_docker_lock = threading.Lock()


def sandbox_for(
    problem: Any, backend: str, concurrency: int = 2, allow_unbounded_process_tree: bool | None = None, isolation: str = "standard"
) -> Sandbox | None:
    """The sandbox a problem's candidates run in: its image, its GPU need; None if it needs none.

    The one place that builds a problem's sandbox: the run's evaluate task, re-evaluation and the
    CLI all call it, so a problem is never scored in another image than its own (under the process
    backend: never with other packages in view than its image's).
    `allow_unbounded_process_tree` is the configuration's switch (None: the environment variable
    DISCOVER_ALLOW_UNBOUNDED_PROCESS_TREE); see ProcessSandbox. `isolation` is sandbox.isolation.
    """
    if not problem.needs_sandbox:
        return None
    return get_sandbox(
        backend,
        image=problem.image,
        concurrency=concurrency,
        gpu=problem.needs_gpu,
        allow_unbounded_process_tree=allow_unbounded_process_tree,
        isolation=isolation,
    )


def docker_unavailable(image: str = DEFAULT_IMAGE) -> str:
    """Why the docker backend cannot run `image` here, or "" when it can."""
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the Docker SDK for Python (package `docker`) is not installed"
    from evaluators.sandbox.docker import engine_answers, image_exists, image_ref

    if not engine_answers():
        return "no Docker engine answers"
    if not image_exists(image):
        return f"the image {image_ref(image)} is missing (build it with `make images`)"
    return ""


def get_sandbox(
    backend: str,
    image: str | None = None,
    concurrency: int = 2,
    gpu: bool = False,
    allow_unbounded_process_tree: bool | None = None,
    isolation: str = "standard",
) -> Sandbox:
    """The sandbox for `backend`: "process", "docker" or "auto".

    "auto" is docker when an engine answers and `image` (default python-math) exists, else the
    process backend with a warning saying so. Docker sandboxes are pooled: the same arguments give
    the same warm pool for the life of the process. The process backend raises
    UnboundedProcessTree (a ValueError: one line naming the fix) where it cannot bound a
    candidate's process tree and `allow_unbounded_process_tree` is not set, and
    IsolationUnavailable where it cannot isolate candidates. `isolation` (sandbox.isolation):
    "standard" (bubblewrap, or Docker's runc), "gvisor" (runsc in both) or "none" (the process
    backend without isolation, for trusted programs; Docker refuses it).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if isolation not in ISOLATIONS:
        raise ValueError(f"unknown sandbox isolation {isolation!r}; choose one of {', '.join(ISOLATIONS)}")
    image = image or DEFAULT_IMAGE
    if backend == "process" or (backend == "auto" and isolation == "none"):
        return ProcessSandbox(allow_unbounded_process_tree, isolation=isolation, image=image)
    key = (image, max(1, int(concurrency)), bool(gpu), isolation)
    with _docker_lock:
        if key in _docker_boxes:
            return _docker_boxes[key]
        why = docker_unavailable(image)
        if why:
            if backend == "docker":
                raise ValueError(f"the docker sandbox backend cannot run here: {why}")
            warnings.warn(
                f"sandbox 'auto': {why}; using the process backend (its isolation, and what it needs "
                "from the kernel and the user: docs/sandbox.md, 'Process')",
                RuntimeWarning,
                stacklevel=2,
            )
            return ProcessSandbox(allow_unbounded_process_tree, isolation=isolation, image=image)
        if isolation == "none":
            raise ValueError("sandbox.isolation 'none' applies to the process backend only; Docker always isolates its containers")
        from evaluators.sandbox.docker import DockerSandbox

        box = DockerSandbox(image=image, concurrency=key[1], gpu=gpu, gvisor=isolation == "gvisor")
        _docker_boxes[key] = box
        return box
