"""Operator commands of `discover` around the Prefect server: `setup`, `crashed` and `schedule`
(registered by cli/app.py)."""

from __future__ import annotations

from pathlib import Path

import typer


def setup(
    file: Path = typer.Option(Path("prefect.yaml"), "--file", help="the prefect.yaml whose pools to create"),
    silence: int = typer.Option(
        120, "--silence", min=45, help="seconds without a heartbeat after which a running flow run counts as crashed (heartbeats: 30 s)"
    ),
) -> None:
    """Create the work pools, GPU concurrency limits and recovery automations of prefect.yaml (idempotent)."""
    from flows.operations import setup as setup_pools

    raise typer.Exit(setup_pools(file, silence_s=silence))


def crashed(flow_run_id: str = typer.Argument(..., help="the flow run whose worker died")) -> None:
    """Mark a flow run whose worker died as CRASHED, so `prefect flow-run retry` can take it."""
    from flows.operations import mark_crashed

    typer.echo(mark_crashed(flow_run_id))


def schedule(
    run_dir: Path = typer.Argument(..., help="the run whose best states to re-evaluate"),
    pool: str = typer.Option(..., "--pool", help="the work pool to re-evaluate on (prefect.yaml definitions.work_pools), e.g. gpu-h100"),
    cron: str = typer.Option(..., "--cron", help='when, as a cron expression: "0 3 * * *" is nightly at 03:00'),
    top_k: int = typer.Option(5, "--top-k", min=1, help="how many of the best states"),
    timezone: str = typer.Option("UTC", "--timezone", help="the cron's time zone"),
    file: Path = typer.Option(Path("prefect.yaml"), "--file", help="the prefect.yaml that declares the pool"),
) -> None:
    """Re-evaluate a run's best states on a pool on a schedule: creates or updates the deployment reevaluate/RUN-POOL."""
    from cli.output import fail
    from discover.run import Run, RunDirError
    from flows.schedules import main_message, schedule_reevaluation

    try:
        run = Run.open(run_dir)
        scheduled = schedule_reevaluation(run, pool, cron, top_k=top_k, timezone=timezone, prefect_yaml=file)
    except (RunDirError, ValueError) as err:
        fail(str(err))
    except Exception as err:  # noqa: BLE001 - the server's answer, in one line
        fail(f"{type(err).__name__}: {err} (is the Prefect server up, PREFECT_API_URL set, and the pool created by `discover setup`?)")
    typer.echo(main_message(scheduled, run))
