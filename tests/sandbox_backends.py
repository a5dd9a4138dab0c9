"""What several sandbox test modules share: a sandbox of either backend, and whether a process lives."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from evaluators.sandbox import ProcessSandbox, docker_unavailable


def either_backend(backend: str, image: str) -> Iterator:
    """The process sandbox, or a Docker sandbox of `image` (closed afterwards); the test skips with
    the reason when Docker cannot run it. Use inside a fixture: `yield from either_backend(...)`."""
    if backend == "process":
        yield ProcessSandbox(image=image)
        return
    why = docker_unavailable(image)
    if why:
        pytest.skip(f"docker backend not testable here: {why}")
    from evaluators.sandbox.docker import DockerSandbox

    box = DockerSandbox(image=image, concurrency=1)
    yield box
    box.close()


def unavailable_outside_ci(image: str, gvisor: bool = False) -> None:
    """Skip (with the reason) when Docker cannot run `image` here, or gVisor when asked for; in CI
    (the environment variable CI set), where both are installed, fail instead."""
    why = docker_unavailable(image)
    if not why and gvisor:
        from evaluators.sandbox.docker_engine import gvisor_missing

        why = gvisor_missing()
    if not why:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{'gVisor' if gvisor else 'docker'} backend missing in CI: {why}")
    pytest.skip(f"{'gVisor' if gvisor else 'docker'} backend not testable here: {why}")


def sandboxes_by_backend(image: str) -> Iterator:
    """A function backend name -> sandbox ("process", "docker" with `image`, or "gvisor": Docker with
    `image` under runsc), each made once on first use and closed afterwards. Use inside a module
    fixture: `yield from sandboxes_by_backend(...)`."""
    made: dict[str, object] = {}

    def get(backend: str):
        if backend not in made:
            if backend == "process":
                made[backend] = ProcessSandbox(image=image)
            else:
                from evaluators.sandbox.docker import DockerSandbox

                made[backend] = DockerSandbox(image=image, concurrency=1, gvisor=backend == "gvisor")
        return made[backend]

    yield get
    for box in made.values():
        close = getattr(box, "close", None)
        if close is not None:
            close()


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def without_isolation(box):
    """A process sandbox like `box` but with `sandbox.isolation: none` (no bubblewrap, no seccomp):
    for tests of the layer underneath (cgroups, rlimits, the process tree) that look at a
    candidate's processes by their host pids or meet another candidate in a shared directory,
    none of which the sandbox allows."""
    return ProcessSandbox(box.allow_unbounded_process_tree, isolation="none", image=box.image)
