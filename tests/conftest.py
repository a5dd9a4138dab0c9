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
