"""Problem commands of `discover`: evaluate a candidate, verify a construction, plot it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer

from cli.app import SANDBOXES, app, fail


def _load_problem(problem: str, **options):
    from evaluators.registry import get_problem

    try:
        return get_problem(problem, **options)
    except KeyError as err:
        fail(str(err.args[0]))
    except ValueError as err:  # bad problem options, e.g. a tolerance for a problem without one
        fail(str(err))


@app.command()
def evaluate(
    problem: str = typer.Argument(..., help="problem id"),
    file: Path = typer.Argument(..., help="a candidate program (or, for data problems, the answer text)"),
    as_json: bool = typer.Option(False, "--json", help="print reward and reason as JSON"),
    sandbox: str = typer.Option("auto", "--sandbox", help="process, docker or auto"),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=0.001, help="seconds; overrides the problem's time limit"),
    memory_mb: Optional[int] = typer.Option(None, "--memory-mb", min=16, help="MB; overrides the problem's memory limit"),
) -> None:
    """Score one candidate program in the sandbox."""
    from evaluators.base import EvalResult
    from evaluators.sandbox import sandbox_for

    if sandbox not in SANDBOXES:
        fail(f"--sandbox must be one of {', '.join(SANDBOXES)}, got {sandbox!r}")
    if not file.is_file():
        fail(f"no such file: {file}")
    p = _load_problem(problem).with_limits(timeout_s=timeout, memory_mb=memory_mb)
    try:
        box = sandbox_for(p, sandbox)
    except ValueError as err:
        fail(str(err))
    text = file.read_text()
    candidate = p.parse(text) or text if p.needs_sandbox else p.parse(text)
    if candidate is None:
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
        fail(f"problem {problem!r} has no plot")
    result = p.plot(_read_construction(file), str(out))
    if not result.valid:
        fail(f"invalid construction, nothing drawn: {result.reason}", code=1)
    typer.echo(f"wrote {out}")


def _read_construction(file: Path):
    if not file.is_file():
        fail(f"no such file: {file}")
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        fail(f"{file} is not valid JSON: {err}")


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


