"""Problem commands of `discover`: evaluate a candidate, verify a construction, plot it, judge one
contest output. Plain functions, registered as commands by cli/app.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

from cli.output import fail
from evaluators.sandbox import BACKENDS, ISOLATIONS


def _load_problem(problem: str, **options):
    from evaluators.registry import get_problem

    try:
        return get_problem(problem, **options)
    except KeyError as err:
        fail(str(err.args[0]))
    except ValueError as err:  # bad problem options, e.g. a tolerance for a problem without one
        fail(str(err))


def evaluate(
    problem: str = typer.Argument(..., help="problem id"),
    file: Path = typer.Argument(..., help="a candidate program (or, for data problems, the answer text)"),
    as_json: bool = typer.Option(False, "--json", help="print reward and reason as JSON"),
    sandbox: str = typer.Option("auto", "--sandbox", help=f"the sandbox backend: {', '.join(BACKENDS)}"),
    timeout: float | None = typer.Option(None, "--timeout", min=0.001, help="seconds; overrides the problem's time limit"),
    memory_mb: int | None = typer.Option(None, "--memory-mb", min=16, help="MB; overrides the problem's memory limit"),
    cases: str | None = typer.Option(None, "--cases", help="problems with test cases: the cases to run, e.g. 0-9 or 0,5,7-9 (default all)"),
    keep_going: bool = typer.Option(False, "--keep-going", help="problems with test cases: run every case even after one fails"),
    isolation: str = typer.Option(
        "standard", "--isolation", help=f"the sandbox's isolation: {', '.join(ISOLATIONS)} ('none': trusted programs only; docs/sandbox.md)"
    ),
) -> None:
    """Score one candidate program in the sandbox (with a progress line per step of a long evaluation, e.g. per case, on stderr)."""
    from evaluators.base import EvalResult
    from evaluators.sandbox import sandbox_for

    if sandbox not in BACKENDS:
        fail(f"--sandbox must be one of {', '.join(BACKENDS)}, got {sandbox!r}")
    if isolation not in ISOLATIONS:
        fail(f"--isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    if not file.is_file():
        fail(f"no such file: {file}")
    p = _load_problem(problem).with_limits(timeout_s=timeout, memory_mb=memory_mb)
    if cases is not None or keep_going:
        if not p.has_cases:
            fail(f"--cases and --keep-going apply to problems with test cases; problem {problem!r} has none")
        try:
            p = p.with_cases(cases, stop_at_first_failure=not keep_going)
        except ValueError as err:  # a bad selection, e.g. a case that does not exist
            fail(str(err))
    try:
        box = sandbox_for(p, sandbox, isolation=isolation)
    except ValueError as err:
        fail(str(err))
    if p.progress_logger:
        _show_progress(p.progress_logger)
    text = file.read_text()
    candidate = p.parse(text) or text if p.needs_sandbox else p.parse(text)
    if candidate is None:
        result = EvalResult.invalid("no candidate found in the file")
    else:
        from evaluators.sandbox.base import BackendRefused, InfrastructureError
        from evaluators.sandbox.native import SessionError

        try:
            result = p.evaluate(candidate, None, box)
        except (SessionError, InfrastructureError) as err:  # the sandbox cannot work here: not the candidate's fault
            fail(f"the {box.name} sandbox cannot evaluate {problem}: {err}")
        except BackendRefused as err:  # the problem will not run candidates in this backend (denoising: process)
            fail(str(err))
    _print_result(problem, p, result, as_json)


def judge(
    problem: str = typer.Argument(..., help="problem id (one with an output judge, such as a contest problem)"),
    input: str = typer.Argument(..., help="an input file, or the number of one of the problem's test cases"),
    output: Path = typer.Argument(..., help="the program's output for that input"),
    as_json: bool = typer.Option(False, "--json", help="print valid, score and reason as JSON"),
) -> None:
    """Judge one output of a contest program for one input, as the contest's judge would (no program runs)."""
    p = _load_problem(problem)
    if not p.can_judge:
        fail(f"problem {problem!r} has no output judge; `discover judge` applies to problems that judge one output for one input")
    if Path(input).is_file():
        input_text = Path(input).read_text()
    elif input.isdigit() and p.has_cases:
        try:
            input_text = p.case_input(int(input))
        except KeyError as err:
            fail(f"no such input file: {input}, and {err.args[0]}")
    else:
        fail(f"no such input file: {input}" + (" (or give the number of a test case)" if p.has_cases else ""))
    if not output.is_file():
        fail(f"no such file: {output}")
    try:
        verdict = p.judge(input_text, output.read_bytes())
    except ValueError as err:  # the input is not one of this contest's
        fail(f"{input}: {err}")
    if as_json:
        typer.echo(json.dumps({"problem": problem, **verdict.as_dict()}))
    elif verdict.valid:
        extra = ", ".join(f"{k} {v}" for k, v in verdict.details.items())
        typer.echo(f"valid: score {verdict.score}" + (f" ({extra})" if extra else ""))
    else:
        typer.echo(f"invalid: {verdict.reason}")
    if not verdict.valid:
        raise typer.Exit(1)


def _show_progress(logger: str) -> None:
    """The progress lines a problem logs to `logger` (its `progress_logger`, e.g. one per finished case), on stderr."""
    import logging
    import sys

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    log = logging.getLogger(logger)
    log.handlers[:] = [handler]
    log.setLevel(logging.DEBUG)
    log.propagate = False


_CONSTRUCTION_HELP = (
    "a construction as JSON: a list of numbers or an object with `values` (erdos, ac1, ac2); "
    "a list of [x, y, r] or an object with `circles_xyr` (circles-N)"
)


def verify(
    problem: str = typer.Argument(..., help="problem id"),
    file: Path = typer.Argument(..., help=_CONSTRUCTION_HELP),
    as_json: bool = typer.Option(False, "--json", help="print a machine-readable result"),
    tolerance: float | None = typer.Option(None, "--tolerance", help="circle packing: slack on each constraint (default 0)"),
) -> None:
    """Certify a construction given as data (no code runs)."""
    p = _load_problem(problem, **({} if tolerance is None else {"tolerance": tolerance}))
    _print_result(problem, p, p.verify(_read_construction(file)), as_json)


def plot(
    problem: str = typer.Argument(..., help="problem id (erdos, ac1, ac2, circles-26, circles-32)"),
    file: Path = typer.Argument(..., help=_CONSTRUCTION_HELP),
    out: Path = typer.Option(..., "-o", "--out", help="the PNG file to write"),
    tolerance: float | None = typer.Option(None, "--tolerance", help="circle packing: slack on each constraint (default 0)"),
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


def _is_table(value) -> bool:
    """A metric that is a table (a list of rows, e.g. the AtCoder problems' per-case results)."""
    return isinstance(value, list) and bool(value) and all(isinstance(r, dict) for r in value)


def _print_result(name: str, problem, result, as_json: bool) -> None:
    """The verdict: its reward, the problem's summary metrics (`summary_metrics`), its reason, and
    its other metrics; a table-valued metric is printed as a table (text) or kept at the top level
    under its name (JSON)."""

    def clean(x):
        return x if not isinstance(x, float) or math.isfinite(x) else None

    summary = {k: clean(v) for k, v in problem.summary_metrics(result).items()}
    tables = {k: v for k, v in result.metrics.items() if _is_table(v)}
    out = {
        "problem": name,
        "valid": result.valid,
        "reward": clean(result.reward),
        **summary,
        "reason": result.reason,
        "metrics": {k: clean(v) for k, v in result.metrics.items() if k not in tables},
        **tables,
    }
    if as_json:
        typer.echo(json.dumps(out))
    else:
        from evaluators.markdown import markdown_table

        for rows in tables.values():
            typer.echo(markdown_table(rows), nl=False)
        figures = ", ".join(f"{k} {v:.9g}" if isinstance(v, float) else f"{k} {v}" for k, v in summary.items())
        if result.valid:
            typer.echo(f"valid: reward {result.reward:.9g}" + (f", {figures}" if figures else ""))
        else:
            typer.echo(f"invalid: {result.reason}" + (f" ({figures})" if figures else ""))
    if not result.valid:
        raise typer.Exit(1)
