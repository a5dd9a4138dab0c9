"""The floors of docs/architecture.md hold: `lint-imports` (import-linter, configured in
pyproject.toml) finds no import that runs up a floor (cli -> flows -> discover -> evaluators ->
storage) and no modules or sibling packages that import each other, function-level imports
included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_imports_only_go_down_and_never_in_a_cycle() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "2 kept, 0 broken" in proc.stdout


def test_reading_a_configuration_does_not_import_torch() -> None:
    """`discover status`, `discover setup` and the evaluation workers read a run's configuration and
    never train: torch's import (about a second of CPU per process) is paid only where it is used."""
    code = (
        "import sys, discover.config, discover.evaluation, cli.app; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
