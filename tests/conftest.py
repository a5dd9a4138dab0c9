"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def reference_dir() -> Path:
    """The published constructions in /work/shared/reference (a sibling of the repository)."""
    path = Path(__file__).resolve().parents[1].parent / "shared" / "reference"
    if not path.is_dir():
        pytest.skip(f"reference constructions not found at {path} (expected beside the repository)")
    return path


@pytest.fixture(scope="session")
def tiny_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DISCOVER_CACHE holding the tiny model, built once per session (never the user's cache)."""
    import os

    from discover.policy.tiny_model import TINY_MODEL_NAME, build_tiny_model

    cache = tmp_path_factory.mktemp("discover-cache")
    build_tiny_model(cache / "models" / TINY_MODEL_NAME)
    os.environ["DISCOVER_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def prefect_api():
    """Prefect's API for flows run inside the test process: one temporary server per session."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=600):
        yield PREFECT_API_URL.value()


def tiny_toy_config(run_dir: Path, **overrides: object) -> dict:
    """A toy run small enough for an integration test: the tiny model, 2 groups of 4 rollouts."""
    config = {
        "problem": "toy",
        "run_dir": str(run_dir),
        "steps": 2,
        "groups": 2,
        "rollouts_per_group": 4,
        "model": {"name": "tiny", "lora_rank": 4, "device": "cpu"},
        "train": {"learning_rate": 0.01},
        "sampling": {"context_tokens": 512, "thinking_budget": 512, "max_answer_tokens": 8},
    }
    config.update(overrides)
    return config


def archive_records(path: Path) -> tuple[list[dict], int]:
    """The states of an archive file as plain dicts, in order, and its T."""
    import dataclasses

    from discover.run import load_archive

    archive = load_archive(path)
    return [dataclasses.asdict(s) for s in archive.states.values()], archive.total_expansions
