"""Start-up of a run on a busy machine: Prefect's temporary server gets a generous, configurable
wait with progress lines, and a configured server is used as it is."""

from __future__ import annotations

import logging
import threading

import pytest

from cli import prefect_api


def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset Prefect's start-up setting for one test (ensure_prefect_api writes it; undone after)."""
    monkeypatch.setenv(prefect_api.TIMEOUT_ENV, "1")
    monkeypatch.delenv(prefect_api.TIMEOUT_ENV)


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

    started = []
    _unset(monkeypatch)
    monkeypatch.setattr("prefect.server.api.server.SubprocessASGIServer.start", lambda self, timeout=None: started.append(1))
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        assert prefect_api.ensure_prefect_api() == "http://127.0.0.1:4200/api"
    assert started == []


def test_without_a_server_the_temporary_one_is_started_with_the_generous_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    waits = []
    _unset(monkeypatch)
    monkeypatch.setattr("prefect.server.api.server.SubprocessASGIServer.start", lambda self, timeout=None: waits.append(timeout))
    with temporary_settings({PREFECT_API_URL: None}):
        prefect_api.ensure_prefect_api()
    assert waits == [prefect_api.DEFAULT_STARTUP_TIMEOUT_S]
