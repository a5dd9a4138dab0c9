"""Start-up of a run on a busy machine: Prefect's temporary server gets a generous, configurable
wait with progress lines, and a configured server is used as it is; the configuration is checked
(pre-flight) once per start, before anything is written."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from cli import prefect_api
from tests.conftest import tiny_toy_config


def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset Prefect's start-up setting for one test (ensure_prefect_api writes it; undone after)."""
    monkeypatch.setenv(prefect_api.TIMEOUT_ENV, "1")
    monkeypatch.delenv(prefect_api.TIMEOUT_ENV)


def _starts_of_this_thread(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """The waits Prefect's temporary server is started with (nothing started) by this test's thread:
    Prefect's background services (its log worker, say) also start one where no API is set, as the
    tests below set up, in threads of their own."""
    waits: list[float | None] = []
    caller = threading.get_ident()

    def start(self, timeout=None) -> None:
        if threading.get_ident() == caller:
            waits.append(timeout)

    monkeypatch.setattr("prefect.server.api.server.SubprocessASGIServer.start", start)
    return waits


def test_the_default_wait_is_generous_and_the_users_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    _unset(monkeypatch)
    assert prefect_api.startup_timeout() == prefect_api.DEFAULT_STARTUP_TIMEOUT_S >= 300  # Prefect's own: 20 s
    monkeypatch.setenv(prefect_api.TIMEOUT_ENV, "45")
    assert prefect_api.startup_timeout() == 45
    monkeypatch.setenv(prefect_api.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=prefect_api.TIMEOUT_ENV):
        prefect_api.startup_timeout()


def test_a_slow_start_shows_progress_lines_until_it_is_done() -> None:
    release = threading.Event()
    ticks: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            ticks.append(record.getMessage())
            if len(ticks) >= 3:
                release.set()  # the server "answers" after three progress lines

    handler, log = Collect(), logging.getLogger("discover")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)  # as the CLI sets it
    try:
        prefect_api.with_progress(lambda: release.wait(timeout=600), "the server", every_s=0.01)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert len(ticks) >= 3 and all("the server: still starting after" in t for t in ticks)


def test_a_configured_server_is_used_and_nothing_is_started(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    _unset(monkeypatch)
    started = _starts_of_this_thread(monkeypatch)
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        assert prefect_api.ensure_prefect_api() == "http://127.0.0.1:4200/api"
    assert started == []


def test_without_a_server_the_temporary_one_is_started_with_the_generous_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    _unset(monkeypatch)
    waits = _starts_of_this_thread(monkeypatch)
    with temporary_settings({PREFECT_API_URL: None}):
        prefect_api.ensure_prefect_api()
    assert waits == [prefect_api.DEFAULT_STARTUP_TIMEOUT_S]


@pytest.fixture
def preflights(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each pre-flight of a run, by its run_dir (discover.steps.create_run is the one caller)."""
    from discover import steps

    calls: list[str] = []
    monkeypatch.setattr(steps, "preflight", lambda config: calls.append(str(config.run_dir)))
    return calls


def test_discover_run_preflights_once_and_creates_the_run_before_prefect_starts(
    tmp_path: Path, preflights: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml
    from typer.testing import CliRunner

    from cli import app as cli_app

    flows: list[str] = []
    monkeypatch.setattr(cli_app, "_run_flow", flows.append)  # no Prefect: what the flow is given
    monkeypatch.setattr(cli_app, "_setup_logging", lambda verbose: None)  # leave the session's logging as it is
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny_toy_config(tmp_path / "run")))
    result = CliRunner().invoke(cli_app.app, ["run", str(tmp_path / "c.yaml")])
    assert result.exit_code == 0, result.output
    assert preflights == [str(tmp_path / "run")] and flows == [str(tmp_path / "run")]
    assert (tmp_path / "run" / "config.yaml").is_file()
    again = CliRunner().invoke(cli_app.app, ["run", str(tmp_path / "c.yaml")])  # the same run: resumed
    assert again.exit_code == 0 and len(preflights) == 1 and len(flows) == 2
    (tmp_path / "c2.yaml").write_text(yaml.safe_dump(tiny_toy_config(tmp_path / "run", seed=99)))
    clash = CliRunner().invoke(cli_app.app, ["run", str(tmp_path / "c2.yaml")])
    assert clash.exit_code == 2 and len(flows) == 2


def test_a_flow_given_a_configuration_creates_the_run_and_resume_does_not_preflight(tmp_path: Path, preflights: list[str]) -> None:
    from discover.config import parse_config
    from discover.run import RunDirError
    from flows.run_flow import _run_dir

    config = parse_config(tiny_toy_config(tmp_path / "elsewhere"))
    assert _run_dir(str(tmp_path / "run"), config, None) == str(tmp_path / "run")  # run_dir overrides
    assert preflights == [str(tmp_path / "run")] and (tmp_path / "run" / "config.yaml").is_file()
    assert _run_dir(str(tmp_path / "run"), None, None) == str(tmp_path / "run")  # resume
    assert len(preflights) == 1
    with pytest.raises(RunDirError, match="another configuration"):
        _run_dir(str(tmp_path / "run"), parse_config(tiny_toy_config(tmp_path / "run", seed=99)), None)
    with pytest.raises(ValueError, match="once"):
        _run_dir(None, config, str(tmp_path / "c.yaml"))
    with pytest.raises(ValueError, match="resume"):
        _run_dir(None, None, None)


KILLED_WITH_A_SERVER = """
import subprocess, sys, time
from cli import prefect_api
from prefect.server.api.server import SubprocessASGIServer

def start(self, timeout=None):  # stands in for Prefect's start: a long-lived child as its server
    self.server_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])

SubprocessASGIServer.start = start
prefect_api.ensure_prefect_api()
print(SubprocessASGIServer().server_process.pid, flush=True)
time.sleep(3600)
"""


def test_the_temporary_server_ends_when_the_command_is_killed(tmp_path: Path) -> None:
    """Prefect stops its temporary server at exit, which a SIGKILLed `discover run` never reaches."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    command = subprocess.Popen([sys.executable, "-c", KILLED_WITH_A_SERVER], env=env, stdout=subprocess.PIPE, text=True)
    try:
        server = psutil.Process(int(command.stdout.readline()))
        assert server.is_running() and server.ppid() == command.pid
        command.send_signal(signal.SIGKILL)
        command.wait()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.is_running() and server.status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.2)
        assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE, "the server outlived the killed command"
    finally:
        command.kill()
        for child in psutil.Process().children(recursive=True):
            if child.pid != command.pid and "3600" in " ".join(child.cmdline()):
                child.kill()
