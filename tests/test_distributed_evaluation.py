"""Evaluation on a cluster (flows/engines.py) and per-candidate resume (discover/evaluation.py).

- a two-step run whose candidates run on a local Dask cluster on loopback gets the archive, the
  rollouts, the evaluations and the trained adapter of the local runner, with overlap or without;
  so does a local Ray instance, where Ray is installed (the optional `ray` extra);
- the cluster listens on loopback only, with no dashboard;
- a run killed in the middle of a step's evaluation resumes and evaluates only the candidates that
  had not finished (counted), with the same final archive;
- one Dask worker killed during evaluation: its candidates run elsewhere and the run completes.

Evaluations are counted by tests/faults/sitecustomize.py (DISCOVER_EVAL_LOG), in whichever process
runs them: the flow's own, or a Dask worker's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from discover.run import Run
from tests.conftest import archive_records, tiny_toy_config

pytestmark = pytest.mark.slow

FAULTS = Path(__file__).parent / "faults"
SEED = 5  # any run seed: with the lenient toy every rollout is a candidate


def _config(run_dir: Path, **evaluation: object) -> dict:
    # lenient: every answer of the random tiny model is a candidate, so each step has several
    return tiny_toy_config(run_dir, seed=SEED, evaluation=evaluation, problem_options={"lenient": True})


def _run_in_process(run_dir: Path, **evaluation: object) -> Path:
    from flows.run_flow import discovery_run

    discovery_run(config=_config(run_dir, **evaluation))
    return run_dir


def _table(path: Path, drop: tuple[str, ...] = ()) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in drop} for row in pq.read_table(path).to_pylist()]


def _log(path: Path) -> list[tuple[int, str, int]]:
    if not path.is_file():
        return []
    return [(int(s), key, int(pid)) for s, key, pid in (line.split() for line in path.read_text().splitlines())]


def _stored(run_dir: Path, step: int) -> set[str]:
    return {p.stem for p in (run_dir / "steps" / f"{step:04d}" / "candidates").glob("*.json")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, tiny_model_cache: Path, prefect_api: str) -> Path:
    """The local runner without overlap: generate everything, then evaluate in threads."""
    return _run_in_process(tmp_path_factory.mktemp("reference") / "run", runner="local", overlap=False)


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Processes started from here on (Dask workers, CLIs) log each evaluation they run."""
    log = tmp_path / "evaluations.log"
    monkeypatch.setenv("DISCOVER_EVAL_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FAULTS), os.environ.get("PYTHONPATH")])))
    return log


def _assert_same_run(run_dir: Path, reference: Path, exact: bool = True) -> None:
    """The same archive and evaluations; with `exact` (runs in this same process), also the same
    rollouts, token for token with their log-probabilities, and the same trained adapter.

    A run in a fresh process (the CLI) is compared without `exact`: the tiny model's CPU kernels
    can differ in the last bits of a log-probability between a fresh process and this one after
    the tests before it, which moves the adapter's bytes though not the archive.
    """
    assert archive_records(run_dir / "archive" / "0002.parquet") == archive_records(reference / "archive" / "0002.parquet")
    for step in (0, 1):
        d, r = run_dir / "steps" / f"{step:04d}", reference / "steps" / f"{step:04d}"
        assert _table(d / "evaluations.parquet", drop=("seconds",)) == _table(r / "evaluations.parquet", drop=("seconds",))
        if exact:
            assert _table(d / "rollouts.parquet") == _table(r / "rollouts.parquet")
    if exact:
        adapter = Path("checkpoints/0002/adapter/adapter_model.safetensors")  # the same training batches, twice
        assert (run_dir / adapter).read_bytes() == (reference / adapter).read_bytes()


def test_a_local_dask_cluster_and_overlap_give_the_archive_of_the_local_runner(
    tmp_path: Path, reference: Path, counted: Path, prefect_api: str
) -> None:
    overlapped = _run_in_process(tmp_path / "overlap", runner="local", overlap=True)
    _assert_same_run(overlapped, reference)

    on_dask = _run_in_process(tmp_path / "dask", runner="dask", workers=2, overlap=True)
    _assert_same_run(on_dask, reference)
    evaluated = _log(counted)
    # every distinct candidate ran once, on the cluster's workers, never in this process
    for step in (0, 1):
        keys = [key for s, key, _ in evaluated if s == step]
        assert sorted(keys) == sorted(_stored(on_dask, step)) and keys
    assert os.getpid() not in {pid for _, _, pid in evaluated}


def test_a_local_ray_instance_gives_the_archive_of_the_local_runner(
    tmp_path: Path, reference: Path, counted: Path, prefect_api: str
) -> None:
    """Ray is the optional engine (the `ray` extra, not installed by `make test`)."""
    pytest.importorskip("ray", reason="Ray is the `ray` extra: pip install 'ttt-discover[ray]'")
    on_ray = _run_in_process(tmp_path / "ray", runner="ray", workers=2, overlap=True)
    _assert_same_run(on_ray, reference)
    evaluated = _log(counted)
    for step in (0, 1):
        assert sorted(key for s, key, _ in evaluated if s == step) == sorted(_stored(on_ray, step))
    assert evaluated and os.getpid() not in {pid for _, _, pid in evaluated}


def test_the_local_cluster_listens_on_loopback_only(tmp_path: Path) -> None:
    import psutil

    from discover.config import parse_config
    from flows.engines import evaluation_engine

    run = Run.create(parse_config(_config(tmp_path / "run", runner="dask", workers=2)))
    with evaluation_engine(run):
        procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
        sockets = [c.laddr for p in procs for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert len(sockets) >= 3  # a scheduler and two workers at least
    assert all(addr.ip in ("127.0.0.1", "::1") for addr in sockets), sockets


def test_an_existing_dask_cluster_must_offer_what_a_candidate_needs(tmp_path: Path) -> None:
    from distributed import LocalCluster

    from discover.config import parse_config
    from flows.engines import evaluation_engine

    def engine(address: str):  # a run of its own per cluster: a run's evaluation section is the one it was created with
        run_dir = tmp_path / f"run-{address.rsplit(':', 1)[-1]}"
        return evaluation_engine(Run.create(parse_config(_config(run_dir, runner="dask", address=address))))

    common = {
        "n_workers": 1,
        "threads_per_worker": 1,
        "processes": False,
        "protocol": "tcp",
        "host": "127.0.0.1",
        "dashboard_address": None,
    }
    with LocalCluster(**common) as bare:  # workers that declare no resources would never run a candidate
        with pytest.raises(ValueError, match=r'no worker of the Dask cluster .* --resources "CPU=2 MEMORY=1073741824"'):
            with engine(bare.scheduler_address):
                pass
    with LocalCluster(**common, resources={"CPU": 4, "MEMORY": 8e9}) as able:
        with engine(able.scheduler_address) as task_runner:
            assert task_runner().address == able.scheduler_address


def _cli(args: list[str], env: dict[str, str], log: Path, wait: bool = True, **extra: str):
    """A `discover` subprocess on the session's server, logging the evaluations it runs to `log`."""
    faults = os.pathsep.join(filter(None, [str(FAULTS), env.get("PYTHONPATH")]))
    env = dict(env, PYTHONPATH=faults, DISCOVER_EVAL_LOG=str(log), **extra)
    cmd = [sys.executable, "-m", "cli", *args]
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, start_new_session=True)


def test_a_run_killed_mid_evaluation_evaluates_only_the_unfinished_candidates(
    tmp_path: Path, reference: Path, cli_env: dict[str, str]
) -> None:
    run_dir = tmp_path / "run"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(_config(run_dir, runner="local", overlap=True)))
    killed = _cli(["run", str(tmp_path / "c.yaml")], cli_env, tmp_path / "killed.log", DISCOVER_CRASH_AT="candidate:1:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    before = _stored(run_dir, 1)
    assert len(before) == 3 and not (run_dir / "steps" / "0001" / "evaluations.parquet").exists()

    resumed_log = tmp_path / "resumed.log"
    resumed = _cli(["resume", str(run_dir)], cli_env, resumed_log)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = [key for step, key, _ in _log(resumed_log) if step == 1]
    assert sorted(again) == sorted(_stored(run_dir, 1) - before)  # the unfinished ones, each once
    assert not {key for step, key, _ in _log(resumed_log) if step == 0}  # step 0 had finished
    _assert_same_run(run_dir, reference, exact=False)


def test_a_killed_dask_worker_loses_no_candidate(tmp_path: Path, reference: Path, cli_env: dict[str, str]) -> None:
    counted = tmp_path / "evaluations.log"  # written by the CLI's Dask workers
    run_dir = tmp_path / "run"
    config = _config(run_dir, runner="dask", workers=2, overlap=True)
    config["problem_options"]["eval_delay_s"] = 2.0  # each candidate takes 2 s: a kill lands mid-evaluation
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    proc = _cli(["run", str(tmp_path / "c.yaml")], cli_env, counted, wait=False)
    try:
        deadline = time.monotonic() + 400
        while not _log(counted) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        first = _log(counted)
        assert first, f"no candidate was evaluated: {proc.stdout.read() if proc.poll() is not None else 'timeout'}"
        victim = first[0][2]
        os.kill(victim, signal.SIGKILL)  # a worker process, with a candidate in flight on its other thread
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    evaluated = _log(counted)
    survivors = {pid for _, _, pid in evaluated} - {victim}
    assert survivors, evaluated
    for step in (0, 1):
        assert {key for s, key, _ in evaluated if s == step} == _stored(run_dir, step)
    _assert_same_run(run_dir, reference, exact=False)
