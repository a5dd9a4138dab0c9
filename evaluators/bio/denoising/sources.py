"""The denoising programs of programs/: the MAGIC seed and the ALRA baseline, as candidate sources
(the problem's seed) and as trusted code run in this process (the report's baselines)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

PROGRAMS = Path(__file__).with_name("programs")  # the MAGIC seed and the ALRA baseline, as candidates
CANDIDATE_ENTRY = "magic_denoise"  # what every candidate defines (the released code's name)
# docs/method.md §5d "The split's seed": the random_state every candidate is called with, fixed and
# unrelated to the split's seed (which is keyed with the counts and never leaves the host).
CANDIDATE_RANDOM_STATE = 0


def program(name: str) -> str:
    """The source of a program in programs/ ("magic" or "alra")."""
    return (PROGRAMS / f"{name}.py").read_text(encoding="utf-8")


def run_program(name: str, split: Any) -> Any:
    """Run one of programs/ (our own, trusted code) in this process on the train half of `split`."""
    spec = importlib.util.spec_from_file_location(f"denoising_{name}", PROGRAMS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, CANDIDATE_ENTRY)(split.train.copy(), random_state=CANDIDATE_RANDOM_STATE)
