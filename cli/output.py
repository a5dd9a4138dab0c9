"""What every `discover` command shares: failing with one line on stderr."""

from __future__ import annotations

from typing import NoReturn

import typer


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `error: MESSAGE` in red on stderr and exit with `code` (2: a usage error)."""
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code)
