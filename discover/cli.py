"""The `discover` command: run, resume, status, report, evaluate, verify, plot."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Test-time training to discover, on your own machines.")

SANDBOXES = ("auto", "process", "docker")


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


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code)


@app.command()
def run(
    config: Path = typer.Argument(..., help="YAML run configuration"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="override the configuration's run_dir"),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="show Prefect's own log lines"),
) -> None:
    """Start a discovery run (resumes it if RUN_DIR already holds the same configuration)."""
    from discover.config import ConfigError, dump_config, load_config

    _setup_logging(verbose)
    try:
        cfg = load_config(config, {"run_dir": str(run_dir)} if run_dir else None)
    except ConfigError as err:
        _fail(str(err))
    _run_flow(str(cfg.run_dir), dump_config(cfg))


@app.command()
def resume(
    run_dir: Path = typer.Argument(..., help="a run directory written by `discover run`"),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="show Prefect's own log lines"),
) -> None:
    """Resume a run from its first unfinished step and task."""
    _setup_logging(verbose)
    if not (run_dir / "config.yaml").is_file():
        _fail(f"{run_dir} is not a run directory (no config.yaml); start one with `discover run CONFIG`")
    _run_flow(str(run_dir), None)


def _run_flow(run_dir: str, config_yaml: str | None) -> None:
    from discover.steps import RunDirError
    from flows.run_flow import discovery_run

    try:
        result = discovery_run(run_dir=run_dir, config_yaml=config_yaml)
    except (RunDirError, ValueError) as err:  # a run directory or problem option that cannot work
        _fail(str(err))
    typer.echo(f"best state {result['best_state']}: reward {result['best_reward']:.6f}  (run directory: {run_dir})")
    typer.echo(f"summary: discover status {run_dir}")


@app.command()
def status(run_dir: Path = typer.Argument(..., help="a run directory")) -> None:
    """A table per step: best and mean reward, valid fraction, beta, time per task."""
    from rich.console import Console
    from rich.table import Table

    from discover.status import step_summaries

    try:
        rows, config = step_summaries(run_dir)
    except FileNotFoundError as err:
        _fail(str(err))
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
    out: Optional[Path] = typer.Option(None, "--out", help="folder for report.md and its pictures (default RUN_DIR/report)"),
) -> None:
    """Write the run's report: Markdown with the reward distribution by step, the step table, the best states."""
    from discover.report import write_report

    try:
        path = write_report(run_dir, out)
    except FileNotFoundError as err:
        _fail(str(err))
    typer.echo(str(path))


def _load_problem(problem: str, **options):
    from evaluators.registry import get_problem

    try:
        return get_problem(problem, **options)
    except KeyError as err:
        _fail(str(err.args[0]))
    except ValueError as err:  # bad problem options, e.g. a tolerance for a problem without one
        _fail(str(err))


@app.command()
def evaluate(
    problem: str = typer.Argument(..., help="problem id"),
    file: Path = typer.Argument(..., help="a candidate program (or, for data problems, the answer text)"),
    as_json: bool = typer.Option(False, "--json", help="print reward and reason as JSON"),
    sandbox: str = typer.Option("auto", "--sandbox", help="process, docker or auto"),
) -> None:
    """Score one candidate program in the sandbox."""
    if sandbox not in SANDBOXES:
        _fail(f"--sandbox must be one of {', '.join(SANDBOXES)}, got {sandbox!r}")
    if not file.is_file():
        _fail(f"no such file: {file}")
    p = _load_problem(problem)
    from evaluators.sandbox import sandbox_for

    try:
        box = sandbox_for(p, sandbox)
    except ValueError as err:
        _fail(str(err))
    text = file.read_text()
    candidate = p.parse(text) or text if p.needs_sandbox else p.parse(text)
    if candidate is None:
        from evaluators.base import EvalResult

        result = EvalResult.invalid("no candidate found in the file")
    else:
        result = p.evaluate(candidate, None, box)
    _print_result(problem, result, as_json)


_CONSTRUCTION_HELP = (
    "a construction as JSON: a list of numbers or an object with `values` (erdos, ac1, ac2); "
    "a list of [x, y, r] or an object with `circles_xyr` (circles-N)"
)


@app.command()
def verify(
    problem: str = typer.Argument(..., help="problem id"),
    file: Path = typer.Argument(..., help=_CONSTRUCTION_HELP),
    as_json: bool = typer.Option(False, "--json", help="print a machine-readable result"),
    tolerance: Optional[float] = typer.Option(None, "--tolerance", help="circle packing: slack on each constraint (default 0)"),
) -> None:
    """Certify a construction given as data (no code runs)."""
    p = _load_problem(problem, **({} if tolerance is None else {"tolerance": tolerance}))
    _print_result(problem, p.verify(_read_construction(file)), as_json)


@app.command()
def plot(
    problem: str = typer.Argument(..., help="problem id (erdos, ac1, ac2, circles-26, circles-32)"),
    file: Path = typer.Argument(..., help=_CONSTRUCTION_HELP),
    out: Path = typer.Option(..., "-o", "--out", help="the PNG file to write"),
    tolerance: Optional[float] = typer.Option(None, "--tolerance", help="circle packing: slack on each constraint (default 0)"),
) -> None:
    """Draw a construction: the step function with its autocorrelation/autoconvolution, or the circles."""
    p = _load_problem(problem, **({} if tolerance is None else {"tolerance": tolerance}))
    if not p.can_plot:
        _fail(f"problem {problem!r} has no plot")
    result = p.plot(_read_construction(file), str(out))
    if not result.valid:
        _fail(f"invalid construction, nothing drawn: {result.reason}", code=1)
    typer.echo(f"wrote {out}")


def _read_construction(file: Path):
    if not file.is_file():
        _fail(f"no such file: {file}")
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        _fail(f"{file} is not valid JSON: {err}")


def _print_result(problem: str, result, as_json: bool) -> None:
    def clean(x):
        return x if not isinstance(x, float) or math.isfinite(x) else None

    out = {
        "problem": problem,
        "valid": result.valid,
        "reward": clean(result.reward),
        "bound": clean(result.metrics.get("bound")),
        "reason": result.reason,
        "metrics": {k: clean(v) for k, v in result.metrics.items()},
    }
    if as_json:
        typer.echo(json.dumps(out))
    elif result.valid:
        bound = f", bound {out['bound']:.9g}" if out["bound"] is not None else ""
        if "tolerance" in result.metrics:
            bound += f", tolerance {result.metrics['tolerance']:g}"
        typer.echo(f"valid: reward {result.reward:.9g}{bound}")
    else:
        typer.echo(f"invalid: {result.reason}")
    if not result.valid:
        raise typer.Exit(1)


@app.command("config-doc")
def config_doc() -> None:
    """Print the configuration reference (docs/configuration.md) generated from the code."""
    from discover.config import reference_markdown

    typer.echo(reference_markdown(), nl=False)


if __name__ == "__main__":
    app()
