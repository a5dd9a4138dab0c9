"""Shared fixtures: the published constructions, the tiny model, and one Prefect server for the
whole test session (every test that runs a flow, in this process or in a `discover` subprocess,
uses it, so no test pays for, or waits on, a temporary server of its own). Under pytest-xdist
(`make test` runs the suite on several workers) the server and the models are made once for all
workers (tests/shared.py)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from tests import shared

REPO = Path(__file__).resolve().parents[1]
# Where no cgroup can be made (a normal user without a delegated cgroup), let the process backend run
# with rlimits alone so the suite still runs; tests of the tree bound (tests/test_hostile_process.py)
# ask for it explicitly and skip with the reason where there is none.
os.environ.setdefault("DISCOVER_ALLOW_UNBOUNDED_PROCESS_TREE", "1")
# One intra-op thread per test process (before torch is imported): `make test` runs more xdist workers
# than there are cores, and torch's default of a thread per core, each spinning at its barriers, made
# a test's in-process training steps 3-10 times slower beside two CPU hogs (1 thread: 1.5-3 times).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Every Ray of the suite is on the loopback, without Ray's token authentication. Set for the whole session,
# before any ray.init: the first ray.init of a process fixes its authentication mode (a local instance
# turns token mode on and leaves RAY_AUTH_MODE=token set), so a driver that joined the loopback cluster
# after a local run served its actors' owner RPCs with token checks the cluster never sends, and the GCS,
# unable to reach the owner, cancelled the actors before they ran (docs/cluster.md, "One kind of Ray per process").
os.environ["RAY_AUTH_MODE"] = "disabled"
SERVER_STARTUP_TIMEOUT_S = 900  # generous: on a loaded 2-core machine a first start takes minutes
# A Prefect server on SQLite waits this long for the database's write lock (Prefect's default, 10 s,
# ran out on the loaded 2-core machine: "database is locked"; docs/operations.md)
SQLITE_BUSY_TIMEOUT_S = "120"

# A discovery run in a fresh process (`python -c RUN_SCRIPT CONFIG.yaml`, with `cli_env`): it prints
# the problem, the best state and its reward.
RUN_SCRIPT = textwrap.dedent(
    """
    import sys
    from discover.config import load_config
    from flows.run_flow import discovery_run

    cfg = load_config(sys.argv[1])
    result = discovery_run(config=cfg)
    print(cfg.problem, result["best_state"], result["best_reward"], flush=True)
    """
)


@pytest.fixture
def made_here(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The temporary directories this process makes during the test, in order: the evaluations of
    other pytest workers make theirs in the same /tmp, and must not be taken for the first one."""
    made, mkdtemp = [], tempfile.mkdtemp

    def recorded(*args, **kwargs):
        made.append(mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recorded)
    return made


@pytest.fixture
def published() -> Path:
    """The published constructions, vendored in the repository: `<problem>/<file>.json`."""
    return REPO / "evaluators" / "math" / "published"


def pytest_configure(config: pytest.Config) -> None:
    """The controlling process (the only one without pytest-xdist) makes the folder its workers share.
    With `DISCOVER_TEST_CPU_LOG` set, each test's wall and CPU time is logged (tests/cpu_accounting.py)."""
    from tests import cpu_accounting

    cpu_accounting.register(config)
    if not hasattr(config, "workerinput"):
        shared.begin()
        _interrupts_reach_the_workers()
    else:
        _own_session()


def _own_session() -> None:
    """Each xdist worker in a session of its own: Linux's scheduler (autogroup, on by default) shares
    the CPUs between sessions, not processes, so the workers of one session, however many, got a
    single session's share beside other work: 0.65 of a CPU for three spinning workers beside two
    hogs of their own sessions (1.2 in three sessions), on this project's 2-core machines. Without a
    controlling terminal to lose (workers have none) nothing else changes: a worker still ends when
    its controller's channel closes."""
    try:
        os.setsid()
    except OSError:
        pass  # already a session or group leader: its own scheduling group already


def _interrupts_reach_the_workers() -> None:
    """Ctrl-C reaches the workers as before they had sessions of their own (a terminal interrupts its
    foreground process group only): the controller passes SIGINT on to each worker, then stops."""
    previous = signal.getsignal(signal.SIGINT)

    def forward(signum: int, frame: object) -> None:
        import psutil
        from execnet.gateway_io import popen_bootstrapline  # the command line of every xdist worker

        for child in psutil.Process().children():
            try:
                if child.cmdline()[-1:] == [popen_bootstrapline]:
                    child.send_signal(signal.SIGINT)
            except psutil.Error:
                pass
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, forward)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Once every worker is done: the shared servers stopped, the shared folder removed."""
    if not hasattr(config, "workerinput"):
        shared.end()


# Under pytest-xdist the longest tests start first, so that none of them is the last to end: the
# loopback Ray cluster's (one group: one worker starts the cluster and runs them all), then these
# files (minutes each, most of it waiting on servers, restarts and subprocesses), then the other
# integration tests. Local Ray instances need no group: several start side by side on one machine.
RUN_FIRST = (
    "test_prefect_server.py",
    "test_resident_ranks.py",
    "test_resume_generate.py",
    "test_sharded_training.py",
    "test_gpu_rehearsal.py",
    "test_one_writer.py",
    "test_resume.py",
    "test_hostile_trimul.py",
    "test_hostile_denoising.py",
    "test_denoising_sandbox.py",
    "test_distributed_evaluation.py",
    "test_real_model.py",
    "test_trimul_compile.py",
    "test_ahc_runs.py",
    "test_docker_sandbox.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("xdist_group"):
            return 0
        name = item.path.name
        if name in RUN_FIRST:
            return 1 + RUN_FIRST.index(name)
        return len(RUN_FIRST) + (1 if item.get_closest_marker("slow") else 2)

    items.sort(key=rank)  # stable: a file's tests keep their order


CLI_SETS = ("PREFECT_LOGGING_LEVEL", "PREFECT_SERVER_ANALYTICS_ENABLED")  # cli/app.py `_setup_logging`


@pytest.fixture(autouse=True)
def _project_loggers_restored():
    """Each test starts with the project's loggers and the CLI's Prefect defaults as before it: the
    CLI, run in-process by some tests, gives `discover` (and a problem's progress logger) a handler
    of their own and stops them propagating, which would hide their records from a later test's
    caplog on the same worker, and sets Prefect's logging level in os.environ, after which Prefect
    builds its settings anew without the session server's URL (a temporary server was started)."""
    import logging

    def ours() -> dict[str, tuple]:
        # a copy first (taken at once, under the GIL): another thread (Prefect's) may add a logger meanwhile
        names = [n for n in list(logging.root.manager.loggerDict) if n.split(".")[0] in ("discover", "evaluators", "flows", "cli")]
        loggers = [logging.getLogger(n) for n in names]
        return {lg.name: (list(lg.handlers), lg.level, lg.propagate) for lg in loggers}

    saved = ours()
    env = {k: os.environ.get(k) for k in CLI_SETS}
    yield
    for key, value in env.items():  # the CLI's defaults for Prefect, which would outlive the test in os.environ
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    for name in ours():
        lg = logging.getLogger(name)
        handlers, level, propagate = saved.get(name, ([], logging.NOTSET, True))
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate


@pytest.fixture(scope="session")
def tiny_model_cache() -> Path:
    """A DISCOVER_CACHE holding the tiny model, built once per test session for all its workers
    (never the user's cache)."""
    from discover.policy.tiny_model import TINY_MODEL_NAME, build_tiny_model

    def build(folder: Path) -> dict:
        build_tiny_model(folder / "models" / TINY_MODEL_NAME)
        return {"cache": str(folder)}

    cache = Path(shared.once("tiny-model-cache", build)["cache"])
    os.environ["DISCOVER_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def long_context_tiny_model() -> Path:
    """The tiny model built with 8,192 positions instead of 2,048: the contexts of TriMul (about
    5,000 tokens) and denoising (about 3,700) do not fit the embedded build."""
    from unittest import mock

    from discover.policy import tiny_model

    def build(folder: Path) -> dict:
        with mock.patch.object(tiny_model, "N_POSITIONS", 8192):
            tiny_model.build_tiny_model(folder / "tiny-gpt2-8k")
        return {"path": str(folder / "tiny-gpt2-8k")}

    return Path(shared.once("long-context-tiny-model", build)["path"])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server a test starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_prefect_server(home: Path, port: int | None = None, database: str | None = None) -> dict:
    """A real Prefect server on loopback (SQLite in `home`, or the `database` URL: tests/postgres.py;
    on `port`, else a free one), in a session of its own: its API URL and process group, once it answers."""
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false")
    env.update(PREFECT_SERVER_DATABASE_TIMEOUT=SQLITE_BUSY_TIMEOUT_S)
    from flows.recovery import SERVER_ORDERING

    env[SERVER_ORDERING[0]] = SERVER_ORDERING[1]  # as docs/operations.md starts one: automations on time after a restart
    if database is not None:
        env.update(PREFECT_API_DATABASE_CONNECTION_URL=database)
    prefect = Path(sys.executable).parent / "prefect"
    with open(home / "server.log", "a") as log:
        proc = subprocess.Popen(
            [str(prefect), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    api = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + SERVER_STARTUP_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the Prefect server exited with {proc.returncode}: {(home / 'server.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{api}/health", timeout=10) as response:
                if response.status == 200:
                    return {"api": api, "pgid": proc.pid, "log": str(home / "server.log")}
        except OSError:
            pass
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the Prefect server did not answer within {SERVER_STARTUP_TIMEOUT_S} s")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def prefect_server() -> str:
    """The API URL of one real Prefect server on loopback for the whole test session, shared by its
    workers (SQLite in a temporary PREFECT_HOME), started by the first that needs it and stopped when
    the session ends (tests/shared.py)."""
    return shared.once("prefect-server", start_prefect_server)["api"]


@pytest.fixture(scope="session")
def prefect_api(prefect_server: str):
    """Prefect's API for flows run inside the test process: the session's server, in the settings
    and in the environment (Prefect's background threads, its log worker among them, read the
    environment: without it they start a temporary server of their own). Prefect's global settings,
    made when it was imported, are made again from the environment: its log worker's thread reads
    them, not the test's, and started a temporary server in each xdist worker that ran for the rest
    of the session."""
    from prefect.context import refresh_global_settings_context
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    before = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = prefect_server
    refresh_global_settings_context()
    try:
        with temporary_settings({PREFECT_API_URL: prefect_server}):
            yield prefect_server
            # Send the session's last flow-run logs while the server still answers (it stops next),
            # instead of at interpreter exit, where they would fail with "Error logging to API".
            APILogWorker.drain_all(timeout=60)
    finally:
        if before is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = before
        refresh_global_settings_context()


@pytest.fixture
def cli_env(tmp_path: Path, prefect_server: str, tiny_model_cache: Path) -> dict[str, str]:
    """The environment of a `discover` subprocess: the session's Prefect server and tiny model."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DISCOVER_"))}
    env.update(
        PREFECT_API_URL=prefect_server,
        PREFECT_HOME=str(tmp_path / "prefect-home"),  # the client's own files, never the user's
        PREFECT_LOGGING_LEVEL="WARNING",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DISCOVER_CACHE=str(tiny_model_cache),
    )
    return env


def tiny_toy_config(run_dir: Path, **overrides: object) -> dict:
    """A toy run small enough for an integration test: the tiny model, 2 groups of 4 rollouts."""
    config = {
        "problem": "toy",
        "run_dir": str(run_dir),
        "steps": 2,
        "groups": 2,
        "rollouts_per_group": 4,
        "model": {"name": "tiny", "lora_rank": 4, "device": "cpu"},
        "train": {"learning_rate": 0.01},
        "sampling": {"context_tokens": 512, "thinking_budget": 512, "max_answer_tokens": 8},
    }
    config.update(overrides)
    return config


def archive_records(path: Path) -> tuple[list[dict], int]:
    """The states of an archive file as plain dicts, in order, and its T."""
    import dataclasses

    from discover.run import load_archive

    archive = load_archive(path)
    return [dataclasses.asdict(s) for s in archive.states.values()], archive.total_expansions


@pytest.fixture(scope="module")  # stopped when tests/test_ray_cluster.py ends: an idle cluster still burns CPU
def ray_cluster(tiny_model_cache: Path, prefect_server: str):
    """One Ray cluster of three nodes on the loopback (a head and two workers, 2 CPUs each) for the
    tests of a module (tests/ray_cluster.py; one xdist group, so one worker runs them all in a row);
    skipped where Ray (the `ray` extra) is missing. Module-scoped: stopped as soon as they are done,
    for its idle nodes (GCS, raylets, agents) take several percent of a CPU each.

    Its processes get the tiny model's cache, the session's Prefect server and one torch thread
    (fault injection goes to a test's own workers, through its connection's runtime_env: on
    PYTHONPATH here, it would slow every Ray process's start-up past Ray's 30 s window)."""
    pytest.importorskip("ray", reason="Ray is the `ray` extra (`make setup` installs it; pip install 'ttt-discover[ray]')")
    from tests.ray_cluster import LoopbackRayCluster

    # a short folder: Ray's socket paths under it must fit AF_UNIX's 107 bytes, which pytest-xdist's
    # per-worker temporary folders (/tmp/pytest-of-USER/pytest-N/popen-gwN/...) leave no room for
    root = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    # RAY_AUTH_MODE (as for this process, above): whatever a local instance started elsewhere on the
    # machine left in ~/.ray/auth_token, the nodes and this process's drivers agree
    env = {
        "DISCOVER_CACHE": str(tiny_model_cache),
        "PREFECT_API_URL": prefect_server,
        "OMP_NUM_THREADS": "1",
        "RAY_AUTH_MODE": "disabled",
        "RAY_worker_register_timeout_seconds": "300",
    }  # a worker of a busy 2-core machine can take more than Ray's 60 s to register
    cluster = LoopbackRayCluster(root / "tmp", workers=2, cpus=2, env=env)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
