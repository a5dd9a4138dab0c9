"""The `bio` image carries what candidates may import at the host's locked versions, so a candidate
scores the same under both sandbox backends."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from evaluators.sandbox import docker_unavailable

REPO = Path(__file__).resolve().parents[1]
ALLOWED = ("numpy", "scipy", "sklearn", "scanpy", "graphtools", "scprep", "magic", "anndata", "pandas")


def _pins() -> dict[str, str]:
    text = (REPO / "images" / "bio" / "requirements.txt").read_text()
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", text, flags=re.M))


def _locked() -> dict[str, set[str]]:
    locked: dict[str, set[str]] = {}
    for package in tomllib.loads((REPO / "uv.lock").read_text())["package"]:
        locked.setdefault(package["name"], set()).add(package.get("version", ""))
    return locked


def test_the_images_pins_are_the_lock_files_versions() -> None:
    pins, locked = _pins(), _locked()
    stale = {name: (version, sorted(locked.get(name, ()))) for name, version in pins.items() if version not in locked.get(name, ())}
    assert not stale, f"images/bio/requirements.txt differs from uv.lock (run images/bio/lock.sh): {stale}"
    wanted = [line.strip() for line in (REPO / "images" / "bio" / "requirements.in").read_text().splitlines()]
    assert {w for w in wanted if w and not w.startswith("#")} <= set(pins)


def test_the_bio_extra_and_the_image_list_the_same_libraries() -> None:
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["bio"]
    names = {re.split(r"[<>=!~ ]", spec, maxsplit=1)[0] for spec in extra}
    wanted = [line.strip() for line in (REPO / "images" / "bio" / "requirements.in").read_text().splitlines()]
    assert names <= {w for w in wanted if w and not w.startswith("#")}


@pytest.mark.skipif(bool(docker_unavailable("bio")), reason=f"bio image not testable here: {docker_unavailable('bio')}")
def test_a_candidate_in_the_container_imports_every_allowed_library_at_the_hosts_versions() -> None:
    import importlib.metadata as md

    from evaluators.sandbox.base import SandboxLimits
    from evaluators.sandbox.docker import DockerSandbox

    program = (
        "import importlib.metadata as md\nimport "
        + ", ".join(ALLOWED)
        + "\n"
        + (
            "def versions(_):\n    return {d: md.version(d) for d in ('numpy', 'scipy', 'scikit-learn', 'scanpy', "
            "'graphtools', 'scprep', 'magic-impute', 'anndata', 'pandas')}\n"
        )
    )
    with DockerSandbox(image="bio", concurrency=1) as box:
        run = box.run(program, "versions", None, SandboxLimits(timeout_s=300, memory_mb=3072, cpus=1))
    assert run.ok, run.reason + run.logs[-2000:]
    assert run.output == {name: md.version(name) for name in run.output}
