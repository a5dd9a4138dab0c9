"""The `discover` command: `run`, `resume`, `status`, `report`, `config-doc` here; the problem commands
(`evaluate`, `judge`, `verify`, `plot`) live in cli/problems.py and the server operations (`setup`,
`crashed`, `schedule`) in cli/operations.py. An entry point over discover/ and flows/, not part of the learning core."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from cli import operations, problems
from cli.output import fail

if TYPE_CHECKING:
    from discover.run import Run

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Test-time training to discover, on your own machines.")


def _setup_logging(verbose: bool) -> None:
    # Prefect's own INFO lines (one per task run) drown the progress lines; show them with -v.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if verbose else "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    log = logging.getLogger("discover")
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False


@app.command()
def run(
    config: Path = typer.Argument(..., help="YAML run configuration"),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="override the configuration's run_dir"),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="show Prefect's own log lines"),
) -> None:
    """Start a discovery run (resumes it if RUN_DIR already holds the same configuration)."""
    from discover import steps
    from discover.config import ConfigError, load_config
    from discover.run import RunDirError

    _setup_logging(verbose)
    try:
        cfg = load_config(config, {"run_dir": str(run_dir)} if run_dir else None)
        steps.create_run(cfg)  # pre-flight (a new run) and the run directory, before Prefect starts
    except (ConfigError, RunDirError, ValueError) as err:  # PreflightError is a ValueError
        fail(str(err))
    _run_flow(str(cfg.run_dir))


@app.command()
def resume(
    run_dir: Path = typer.Argument(..., help="a run directory written by `discover run`"),
    redo_from: int | None = typer.Option(
        None,
        "--redo-from",
        metavar="STEP",
        help="recompute from STEP on: the outputs of STEP and later steps move to RUN_DIR/discarded/<time>/ first",
    ),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="show Prefect's own log lines"),
) -> None:
    """Resume a run from its first unfinished step and task; a finished task never runs again."""
    _setup_logging(verbose)
    run = _open_run(run_dir)
    if redo_from is not None:
        from discover.run import RunDirError
        from storage.lease import RunBusy, acquire, this_process

        try:
            with acquire(run.root, this_process(command=f"discover resume --redo-from {redo_from}")):  # nobody else writes meanwhile
                moved = run.redo_from(redo_from)
        except (RunDirError, RunBusy) as err:
            fail(str(err))
        typer.echo(f"recomputing {run_dir} from step {redo_from}; its earlier outputs are in {moved}", err=True)
    _run_flow(str(run_dir))


def _open_run(run_dir: Path) -> Run:
    """The run in `run_dir`, or a one-line error saying what is wrong with the directory."""
    from discover.config import ConfigError
    from discover.run import Run, RunDirError
    from storage.manifest import ManifestError, read_manifest

    try:
        run = Run.open(run_dir)
        read_manifest(run.layout.manifest)  # a damaged record of finished tasks: said here, in one line
        return run
    except (RunDirError, ConfigError, ManifestError) as err:
        fail(str(err))


def _run_flow(run_dir: str) -> None:
    """Run (or resume) the run already in `run_dir` as a flow, on the Prefect API."""
    from cli.prefect_api import ensure_prefect_api
    from discover.run import RunDirError
    from flows.run_flow import discovery_run
    from flows.writer import RunCancelled
    from storage.atomic import DiskFull
    from storage.lease import RunBusy

    try:
        ensure_prefect_api()  # Prefect's temporary server, unless PREFECT_API_URL names one
    except (RuntimeError, ValueError) as err:
        fail(f"{err} Set PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS higher, or PREFECT_API_URL to a running Prefect server.")
    one_line = (RunDirError, RunBusy, RunCancelled, DiskFull)
    quiet = _OneLineFailures(one_line)
    loggers = [logging.getLogger(name) for name in ("prefect.task_runs", "prefect.flow_runs")]
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        with _run_settings():
            result = discovery_run(run_dir=run_dir)
    except (ValueError, *one_line) as err:  # a run that cannot work as asked, another writer, a cancel, a full disk
        fail(str(err))
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)
    typer.echo(f"best state {result['best_state']}: reward {result['best_reward']:.6f}  (run directory: {run_dir})")
    typer.echo(f"summary: discover status {run_dir}")


class _OneLineFailures(logging.Filter):
    """Prefect logs a failed task or flow run with its traceback; for the failures the CLI ends on in
    one line of its own (a full disk, a run directory that cannot work as asked, another writer, a
    cancel) the traceback only buries that line: it is dropped, Prefect's message kept."""

    def __init__(self, kinds: tuple[type[BaseException], ...]):
        super().__init__()
        self.kinds = kinds

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], self.kinds):
            record.exc_info, record.exc_text = None, None
        return True


def _run_settings():
    """Prefect's settings for a flow run started here, unless the environment sets them: heartbeats
    every HEARTBEAT_S, as the discovery pools' runs send them and the silence automation of `discover
    setup` assumes (Prefect's default, 180 s, got a healthy CLI run marked CRASHED after 120 s), and
    the client's retries that carry a run through a server restart (flows/server_api.py)."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.recovery import HEARTBEAT_S
    from flows.server_api import run_settings

    wanted = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: HEARTBEAT_S, **run_settings()}
    return temporary_settings({setting: value for setting, value in wanted.items() if setting.name not in os.environ})


@app.command()
def status(run_dir: Path = typer.Argument(..., help="a run directory")) -> None:
    """A table per step: best and mean reward, valid fraction, beta, time per task."""
    from rich.console import Console
    from rich.table import Table

    from discover.status import step_summaries

    run = _open_run(run_dir)
    rows, config = step_summaries(run), run.config
    typer.echo(f"{run_dir}: problem {config.problem}, {len(rows)}/{config.steps} steps started")
    table = Table()
    for col in ("step", "best", "mean", "valid", "beta (min–max)", "select", "generate", "evaluate", "archive", "train"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(*r)
    Console(width=None if sys.stdout.isatty() else 160).print(table)


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="a run directory"),
    out: Path | None = typer.Option(None, "--out", help="folder for report.md and its pictures (default RUN_DIR/report)"),
) -> None:
    """Write the run's report: Markdown with the reward distribution by step, the step table, the best states."""
    from discover.report import write_report

    typer.echo(str(write_report(_open_run(run_dir), out)))


@app.command("config-doc")
def config_doc() -> None:
    """Print the configuration reference (docs/configuration.md) generated from the code."""
    from discover.config import reference_markdown

    typer.echo(reference_markdown(), nl=False)


# The problem commands and the server operations are plain functions in their own modules; they are
# registered here, in the order `discover --help` lists them.
for _command in (
    problems.evaluate,
    problems.judge,
    problems.verify,
    problems.plot,
    operations.setup,
    operations.crashed,
    operations.schedule,
):
    app.command()(_command)
