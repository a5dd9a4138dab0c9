"""Checks on problem options that a problem's `preflight` shares (docs/architecture.md, "Problem
hooks"): files the problem reads only when a run starts, checked before anything is written."""

from __future__ import annotations

from pathlib import Path


def missing_file(option: str, path: str | None) -> list[str]:
    """[] when `path` is unset or names a file; else one sentence naming the option and the fix."""
    if not path or Path(path).expanduser().is_file():
        return []
    return [f"problem_options.{option} {path!r} does not exist (relative paths are taken from {Path.cwd()})"]
