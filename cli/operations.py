"""Operator commands of `discover` around the Prefect server: `setup` and `crashed` (registered
by cli/app.py)."""

from __future__ import annotations

from pathlib import Path

import typer


def setup(file: Path = typer.Option(Path("prefect.yaml"), "--file", help="the prefect.yaml whose pools to create")) -> None:
    """Create the work pools and GPU concurrency limits of prefect.yaml (idempotent)."""
    from flows.operations import setup as setup_pools

    raise typer.Exit(setup_pools(file))


def crashed(flow_run_id: str = typer.Argument(..., help="the flow run whose worker died")) -> None:
    """Mark a flow run whose worker died as CRASHED, so `prefect flow-run retry` can take it."""
    from flows.operations import mark_crashed

    typer.echo(mark_crashed(flow_run_id))
