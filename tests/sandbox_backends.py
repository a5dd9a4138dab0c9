"""What several sandbox test modules share: a sandbox of either backend, and whether a process lives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evaluators.sandbox import ProcessSandbox, docker_unavailable


def either_backend(backend: str, image: str) -> Iterator:
    """The process sandbox, or a Docker sandbox of `image` (closed afterwards); the test skips with
    the reason when Docker cannot run it. Use inside a fixture: `yield from either_backend(...)`."""
    if backend == "process":
        yield ProcessSandbox()
        return
    why = docker_unavailable(image)
    if why:
        pytest.skip(f"docker backend not testable here: {why}")
    from evaluators.sandbox.docker import DockerSandbox

    box = DockerSandbox(image=image, concurrency=1)
    yield box
    box.close()


def sandboxes_by_backend(image: str) -> Iterator:
    """A function backend name -> sandbox (process, or Docker with `image`), each made once on first
    use and closed afterwards. Use inside a module fixture: `yield from sandboxes_by_backend(...)`."""
    made: dict[str, object] = {}

    def get(backend: str):
        if backend not in made:
            if backend == "process":
                made[backend] = ProcessSandbox()
            else:
                from evaluators.sandbox.docker import DockerSandbox

                made[backend] = DockerSandbox(image=image, concurrency=1)
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
    """The process sandbox `box` with its namespaces, Landlock and seccomp off: the layer underneath
    (uids, cgroups, permissions, clean-up by uid), all that a kernel without them leaves. For tests
    of that layer that look at a candidate's processes by their host pids, let it run host binaries
    (`sleep`) or meet another candidate in a shared directory, none of which isolation allows."""
    box.isolation = {"namespaces": False, "landlock": False, "seccomp": None}
    return box
