"""The `discover` command as a user runs it: verify, evaluate, and their errors."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import typer.core
import typer.main
from typer.testing import CliRunner

import cli.app
from cli.app import app
from evaluators.registry import problem_names

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def _invoke(*args: str):
    return runner.invoke(app, list(args))


@pytest.mark.parametrize("name", ["haugland_2016.json", "alphaevolve_v2.json", "ttt_discover.json"])
def test_verify_erdos_reproduces_the_published_bounds(published: Path, name: str) -> None:
    path = published / "erdos" / name
    result = _invoke("verify", "erdos", str(path), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    reported = json.loads(path.read_text())["reported_bound"]
    assert out["valid"] and abs(out["bound"] - reported) <= 1e-6
    assert out["reward"] == pytest.approx(1 / out["bound"])


@pytest.mark.parametrize(
    "construction",
    [
        "[NaN, 0.5]",
        "[Infinity, 0.5]",
        "[-0.1, 0.5]",
        "[1.5, 0.5]",
        "[]",
        json.dumps([0.5] * 1001),
        '["a", 0.5]',
        "[true, 0.5]",
        '{"values": 3}',
        '"text"',
    ],
)
def test_verify_rejects_invalid_constructions_with_a_reason(tmp_path: Path, construction: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(construction)
    result = _invoke("verify", "erdos", str(path), "--json")
    assert result.exit_code == 1
    out = json.loads(result.output)
    assert out["valid"] is False and out["reward"] == 0.0 and out["reason"]


def test_verify_reports_unreadable_input(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text("[0.5, ")
    result = _invoke("verify", "erdos", str(path))
    assert result.exit_code == 2 and "not valid JSON" in result.output
    assert "no such file" in _invoke("verify", "erdos", str(tmp_path / "absent.json")).output
    unknown = _invoke("verify", "nope", str(path))
    assert unknown.exit_code == 2 and "known problems: " + ", ".join(problem_names()) in unknown.output


def test_evaluate_scores_a_program_in_the_sandbox(tmp_path: Path) -> None:
    program = tmp_path / "candidate.py"
    program.write_text("def construct(parent):\n    return [0.5] * 50\n")
    result = _invoke("evaluate", "erdos", str(program), "--json", "--sandbox", "process")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["reward"] == pytest.approx(2.0)  # h = 1/2 gives bound 1/2


def test_evaluate_gives_reward_zero_and_the_reason_for_a_failing_program(tmp_path: Path) -> None:
    program = tmp_path / "candidate.py"
    program.write_text("def construct(parent):\n    raise RuntimeError('boom')\n")
    result = _invoke("evaluate", "erdos", str(program), "--json", "--sandbox", "process")
    out = json.loads(result.output)
    assert result.exit_code == 1 and out["reward"] == 0.0 and "boom" in out["reason"]
    assert "--sandbox must be one of" in _invoke("evaluate", "erdos", str(program), "--sandbox", "vm").output


@pytest.mark.parametrize("option", [["--cases", "0-2"], ["--keep-going"]])
def test_evaluate_refuses_case_options_for_a_problem_without_test_cases(tmp_path: Path, option: list[str]) -> None:
    program = tmp_path / "candidate.py"
    program.write_text("def construct(parent):\n    return [0.5] * 50\n")
    result = _invoke("evaluate", "erdos", str(program), "--sandbox", "process", *option)
    assert result.exit_code == 2
    assert "--cases and --keep-going apply to problems with test cases; problem 'erdos' has none" in result.output


def test_judge_refuses_a_problem_without_an_output_judge(tmp_path: Path) -> None:
    output = tmp_path / "out.txt"
    output.write_text("1\n")
    result = _invoke("judge", "erdos", "0", str(output))
    assert result.exit_code == 2 and "problem 'erdos' has no output judge" in result.output


def test_the_cli_reaches_problem_domains_only_through_the_problem_protocol() -> None:
    """No module of cli/ imports a problem domain (a package of evaluators/ other than the sandbox)."""
    evaluators = ROOT / "evaluators"
    domains = {p.parent.name for p in evaluators.glob("*/__init__.py")} - {"sandbox"}
    assert {"algorithms", "math", "toy"} <= domains
    for path in (ROOT / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            imported = {n.split(".")[1] for n in names if n.startswith("evaluators.")}
            assert not imported & domains, f"{path.name} imports the problem domain {sorted(imported & domains)}"


def test_status_of_a_folder_that_is_no_run(tmp_path: Path) -> None:
    result = _invoke("status", str(tmp_path))
    assert result.exit_code == 2 and "not a run directory" in result.output


def test_the_cli_module_docstring_names_every_command() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    commands = list(group.commands)
    assert "judge" in commands and "config-doc" in commands
    missing = [name for name in commands if f"`{name}`" not in (cli.app.__doc__ or "")]
    assert not missing, f"cli/app.py's docstring does not name the commands {missing}"


def test_a_run_started_from_the_cli_sends_heartbeats_as_often_as_the_silence_automation_assumes(tmp_path: Path, monkeypatch) -> None:
    """Prefect's default is one heartbeat per 180 s; `discover setup`'s automation marks a run CRASHED
    after 120 s without one (issue 44: every CLI run over ~2 minutes was marked so while healthy)."""
    import cli.prefect_api
    import flows.run_flow
    from flows.recovery import HEARTBEAT_S, SILENCE_S
    from flows.server_api import CLIENT_RETRIES, OUTAGE_S, retry_budget_s

    seen = {}

    def fake_run(run_dir: str) -> dict:
        from prefect.settings import get_current_settings

        seen["heartbeat_s"] = get_current_settings().flows.heartbeat_frequency
        seen["retries"] = get_current_settings().client.max_retries
        return {"best_state": "s0", "best_reward": 0.0}

    monkeypatch.delenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", raising=False)
    monkeypatch.setattr(cli.prefect_api, "ensure_prefect_api", lambda: None)
    monkeypatch.setattr(flows.run_flow, "discovery_run", fake_run)
    cli.app._run_flow(str(tmp_path))
    assert seen["heartbeat_s"] == HEARTBEAT_S and HEARTBEAT_S * 1.5 <= SILENCE_S
    assert seen["retries"] == CLIENT_RETRIES and retry_budget_s(CLIENT_RETRIES) >= OUTAGE_S  # a server restart is ridden through
    monkeypatch.setenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "45")  # the user's own setting is left as it is
    cli.app._run_flow(str(tmp_path))
    assert seen["heartbeat_s"] != HEARTBEAT_S  # Prefect's own reading of the environment applies
