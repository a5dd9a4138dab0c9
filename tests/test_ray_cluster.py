"""Ray on a real cluster of three nodes on the loopback (tests/conftest.py `ray_cluster`).

- a candidate whose evaluation fails for infrastructure reasons is attempted exactly
  `evaluation.retries` + 1 times (Prefect's retries), and one whose worker dies exactly once: Ray's
  own retries are off (flows/engines.py `ray_options`), so no candidate runs more often than Prefect allows;
- a toy run with two generation replicas (Ray actors, discover/policy/replicas.py), two training
  ranks (FSDP2, resident Ray actors: discover/policy/trainer_group.py) and its candidates on the cluster completes;
  its step-0 rollouts are the
  single-process run's, token for token; the adapter trained on them agrees within 1e-5
  (docs/cluster.md, "What is compared");
- a run whose trainer ranks' node is killed during `train`, and whose replicas' node is killed during
  `generate`, completes on the nodes that join instead (Prefect retries the task; nothing half-written;
  `discover status` reads every step);
- the replicas and trainer ranks of a run whose flow is SIGKILLed between steps outlive it (detached),
  and the flow that resumes the run re-attaches to the same actors instead of creating new ones: a
  5-step run reads the model from disk once per worker (2 ranks + 2 replicas) however often it resumes;
- a replica refuses an adapter whose content hash is not the one it was given, naming both;
- with an engine that seeds each request (as vLLM does), continuations go to their prompt's replica.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.conftest import tiny_toy_config
from tests.ray_cluster import HOST

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray-cluster")]  # one worker starts the cluster (tests/conftest.py)


FAULTS = Path(__file__).parent / "faults"


@pytest.fixture
def connected(ray_cluster, tmp_path: Path):
    """This process connected to the cluster; its workers log (and fail on request) every evaluation
    attempt (tests/faults/sitecustomize.py, DISCOVER_EVAL_ATTEMPTS): `connected.attempts` is the log."""
    import ray

    attempts = tmp_path / "attempts.log"
    env = {"DISCOVER_EVAL_ATTEMPTS": str(attempts), "PYTHONPATH": str(FAULTS)}
    ray.init(address=ray_cluster.address, _node_ip_address=HOST, namespace="tests", log_to_driver=False, runtime_env={"env_vars": env})
    ray_cluster.attempts = attempts
    try:
        yield ray_cluster
    finally:
        ray.shutdown()


def _job(tmp_path: Path, child_id: str):
    from discover.config import RunConfig
    from discover.evaluation import CandidateJob, Resources
    from evaluators.registry import get_problem

    config = RunConfig(**tiny_toy_config(tmp_path / "run", problem_options={"lenient": True}))
    problem = get_problem("toy", **config.problem_options)
    return CandidateJob(child_id, 0, child_id, "1234", "", None, config.model_dump_json(), Resources.of(problem))


def _attempts(cluster, child_id: str) -> int:
    log = Path(cluster.attempts)
    return sum(1 for line in log.read_text().splitlines() if line.split()[0] == child_id) if log.is_file() else 0


@pytest.mark.parametrize("mode, retries, attempts", [("raise", 2, 3), ("exit", 2, 1)])
def test_a_failing_candidate_is_attempted_as_often_as_prefect_retries_it(
    connected, tmp_path: Path, prefect_api: str, mode: str, retries: int, attempts: int
) -> None:
    from prefect import flow
    from prefect_ray import RayTaskRunner

    from flows.engines import resource_request
    from flows.evaluation import evaluate_candidate

    child = f"s0000-g00-r{tmp_path.name[-6:]}-{mode}"
    job = _job(tmp_path, child)
    fail = Path(str(connected.attempts) + ".fail")
    fail.write_text(mode)
    try:

        @flow(task_runner=RayTaskRunner())
        def one_candidate() -> bool:
            with resource_request("ray", job.resources):
                future = evaluate_candidate.with_options(retries=retries, retry_delay_seconds=0).submit(job)
            future.wait()
            return future.state.is_completed()

        completed = one_candidate()
    finally:
        fail.unlink()
    assert not completed
    assert _attempts(connected, child) == attempts


def test_a_replica_refuses_an_adapter_whose_hash_differs(connected, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from discover.policy import replicas

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    replica = (
        ray.remote(replicas.GenerationReplica)
        .options(num_cpus=1)
        .remote({"model": {"name": "tiny", "device": "cpu"}, "gpus": 0.0, "tensor_parallel_size": 1, "share_gpus": False})
    )
    with pytest.raises(ray.exceptions.RayTaskError, match=r"sha256 [0-9a-f]{64}, not 0{64}.*after 5 checks"):
        ray.get(replica.load.remote(str(adapter), "0" * 64, 512))


def _assert_adapters_close(mine: Path, theirs: Path, tolerance: float) -> None:
    """Every tensor of two checkpoints' adapters within `tolerance`, relative to the larger of theirs."""
    from safetensors.numpy import load_file

    a, b = load_file(mine / "adapter" / "adapter_model.safetensors"), load_file(theirs / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and a
    for name in a:
        scale = max(float(np.abs(b[name]).max()), 1e-12)
        assert float(np.abs(a[name] - b[name]).max()) / scale < tolerance, name


def _own_nodes_cluster(address: str) -> dict:
    """The `cluster:` section of a run whose 2 replicas and 2 ranks go to nodes with the custom resources
    `generate` and `trainer` (started by the test), leaving the other nodes to its candidates."""
    return {
        "address": address,
        "generation_replicas": 2,
        "replica_resources": {"generate": 1},
        "trainer_world_size": 2,
        "trainer_placement": "ray",
        "trainer_resources": {"trainer": 1},
    }


def _rollouts(run_dir: Path, step: int) -> list[dict]:
    return pq.read_table(run_dir / "steps" / f"{step:04d}" / "rollouts.parquet").to_pylist()


def test_a_toy_run_on_replicas_and_ranks_matches_the_single_process_run(ray_cluster, tmp_path: Path, prefect_api: str) -> None:
    from flows.run_flow import discovery_run

    def config(run_dir: Path, **overrides: object) -> dict:
        return tiny_toy_config(run_dir, steps=3, seed=5, problem_options={"lenient": True}, **overrides)

    single = tmp_path / "single"
    discovery_run(config=config(single))
    on_ray = tmp_path / "ray"
    # the replicas and the resident ranks hold a CPU each for the whole run: on nodes of their own, as
    # on a real cluster, so that the candidates (2 CPUs each) find whole nodes free
    nodes = [ray_cluster.add_node({"trainer": 2}), ray_cluster.add_node({"generate": 2})]
    try:
        discovery_run(
            config=config(
                on_ray,
                cluster=_own_nodes_cluster(ray_cluster.address),
                evaluation={"runner": "ray", "address": ray_cluster.address},
            )
        )
    finally:
        for node in nodes:
            ray_cluster.kill_node(node)
    for step in range(3):  # the run completed
        assert (on_ray / "checkpoints" / f"{step + 1:04d}" / "adapter").is_dir()
    a, b = _rollouts(on_ray, 0), _rollouts(single, 0)
    assert [r["completion_ids"] for r in a] == [r["completion_ids"] for r in b]
    for x, y in zip(a, b):
        np.testing.assert_allclose(x["sampler_logprobs"], y["sampler_logprobs"], rtol=0, atol=1e-5)
    _assert_adapters_close(on_ray / "checkpoints" / "0001", single / "checkpoints" / "0001", 1e-5)
    for step in (1, 2):
        assert len(_rollouts(on_ray, step)) == len(_rollouts(single, step))


class _SeededEngine:
    """A decode engine that seeds every request on its own, as vLLM does: its tokens depend on the
    request's seed and prompt only, plus the replica's index (so a test sees where a request went)."""

    max_context = None

    def __init__(self, replica: int = -1):
        self.replica, self.queue = replica, []

    def submit(self, key, request, temperature, seed):
        self.queue.append((key, request, seed))

    def poll(self):
        from discover.policy.engine import PhaseOutput

        done, self.queue = self.queue[:3], self.queue[3:]  # a few at a time, like a running batch
        return [(key, PhaseOutput([seed % 1000, sum(req.prompt_ids), self.replica], [0.0, 0.0, 0.0], "length")) for key, req, seed in done]

    def cancel(self):
        self.queue = []


def test_a_seeded_engine_s_continuations_go_to_their_group_s_replica(connected) -> None:
    import ray

    from discover.policy.engine import PhaseRequest
    from discover.policy.replicas import GenerationReplica, ReplicaDecodeEngine

    class Replica(GenerationReplica):
        def __init__(self, index: int):
            self.engine, self._spec = _SeededEngine(index), {}

    actors = [ray.remote(Replica).options(num_cpus=0.1).remote(i) for i in range(2)]
    engine = ReplicaDecodeEngine(actors, "stream", None, batch_size=1)  # stream mode: unused
    submitted = {("answer", (i, j)): (PhaseRequest([i, 7], 3), 1000 * i + j) for i in range(3) for j in range(4)}
    for key, (request, seed) in submitted.items():
        engine.submit(key, request, 1.0, seed)
    got = {}
    while out := engine.poll():
        got.update(dict(out))
    assert got.keys() == submitted.keys()
    for (_, (i, j)), output in got.items():
        assert output.token_ids == [(1000 * i + j) % 1000, i + 7, i % 2]  # its own seed; prompt i on replica i mod 2


def test_a_run_completes_when_the_nodes_of_its_ranks_and_replicas_are_lost(
    ray_cluster, tmp_path: Path, prefect_api: str, cli_env: dict[str, str]
) -> None:
    """The ranks (custom resource `trainer`) and the replicas (`generate`) can only go to two nodes of
    their own, whose processes hold the work when it comes (tests/faults/sitecustomize.py): a rank of
    step 0's `train`, and the replicas' fourth batch of 4 rollouts (the second of step 1's
    `generate`, the first one's rollouts stored). The test SIGKILLs each node while it holds the
    work; a node with the same resources joins after each loss (as a cluster's autoscaler replaces a
    machine), and Prefect's retry of the task places the work there (the trainer group built again
    from checkpoint 0) and generates only the missing rollouts; the retried step's checkpoint is the
    one-process run's within 1e-5."""
    import json
    import subprocess
    import sys
    import threading
    import time

    held_rank, held_decode = tmp_path / "rank.held", tmp_path / "decode.held"
    faults = {"PYTHONPATH": str(FAULTS)}
    train_node = ray_cluster.add_node({"trainer": 2}, env={**faults, "DISCOVER_HOLD_RANK": str(held_rank)})
    generate_node = ray_cluster.add_node({"generate": 2}, env={**faults, "DISCOVER_HOLD_DECODE": f"4:{held_decode}"})
    events: list[str] = []
    joined: list[int] = []

    def kill_when(held: Path, node: int, resources: dict[str, float]) -> None:
        deadline = time.time() + 900
        while not held.is_file():
            if time.time() > deadline:
                raise TimeoutError(f"nothing held {held.name}")
            time.sleep(0.2)
        ray_cluster.kill_node(node)
        trained = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if not p.name.startswith("."))
        events.append(f"killed the node holding {held.stem}, checkpoints {trained}")
        joined.append(ray_cluster.add_node(resources))

    def saboteur() -> None:
        try:
            kill_when(held_rank, train_node, {"trainer": 2})
            kill_when(held_decode, generate_node, {"generate": 2})
        except Exception as err:  # noqa: BLE001 - reported by the test's assertions
            events.append(f"saboteur failed: {err!r}")

    from flows.run_flow import discovery_run

    run_dir = tmp_path / "run"
    config = tiny_toy_config(
        run_dir,
        steps=2,
        seed=5,
        problem_options={"lenient": True},
        model={"name": "tiny", "lora_rank": 4, "device": "cpu", "decode_batch_size": 4},  # a step's 8 rollouts: 2 batches
        cluster=_own_nodes_cluster(ray_cluster.address),
    )
    thread = threading.Thread(target=saboteur, daemon=True)
    thread.start()
    try:
        discovery_run(config=config)
        thread.join(timeout=60)
    finally:
        for node in [train_node, generate_node, *joined]:
            ray_cluster.kill_node(node)
    # the uninterrupted run in one process: the retried step's checkpoint, built by a new group from
    # checkpoint 0, is the one-process step's within the tolerance of docs/cluster.md
    single = tmp_path / "single"
    discovery_run(config={**config, "run_dir": str(single), "cluster": {}})
    _assert_adapters_close(run_dir / "checkpoints" / "0001", single / "checkpoints" / "0001", 1e-5)
    # the rank during step 0's train; the replica during step 1's generate
    assert events == ["killed the node holding rank, checkpoints ['0000']", "killed the node holding decode, checkpoints ['0000', '0001']"]
    for step in (1, 2):
        assert (run_dir / "checkpoints" / f"{step:04d}" / "adapter" / "adapter_model.safetensors").is_file()
    counts = json.loads((run_dir / "steps" / "0001" / "generate.json").read_text())
    assert (counts["rollouts_reused"], counts["rollouts_generated"]) == (4, 4)  # the first batch's were kept
    assert len(_rollouts(run_dir, 1)) == 8
    leftovers = [p for p in run_dir.rglob("*") if ".tmp" in p.name or p.name.startswith(".tmp")]
    assert not leftovers, leftovers
    status = subprocess.run([sys.executable, "-m", "cli", "status", str(run_dir)], env=cli_env, capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    assert "2/2 steps" in status.stdout


def _load_log(path: Path) -> list[int]:
    """The pids of the processes that read a base model from disk, one per load (DISCOVER_LOAD_LOG)."""
    return [int(line) for line in path.read_text().split()] if path.is_file() else []


def test_a_resumed_flow_re_attaches_to_its_ranks_and_replicas_and_the_run_loads_the_model_once_each(
    ray_cluster, connected, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """Must show (resident workers): a 5-step toy run with 2 trainer ranks and 2 generation replicas on
    the cluster, `discover run` SIGKILLed (its whole process group) as step 2 starts, `discover resume`
    SIGKILLed as step 4 starts, `discover resume` again to the end. The ranks and replicas are the
    same actors (Ray actor ids) after each kill; a resumed flow loads nothing again (each rank read the
    base model once and a checkpoint's state once: Adam's state stayed in it); in the whole run the
    base model was read from disk 2 + 2 times by the workers and once by the first flow process (the
    run's new adapter, `initialise`); the finished run ended its workers."""
    import json
    import subprocess
    import sys

    import ray
    import yaml

    loads = tmp_path / "loads.log"
    env = {"PYTHONPATH": str(FAULTS), "DISCOVER_LOAD_LOG": str(loads)}
    nodes = [ray_cluster.add_node({"trainer": 2}, env=env), ray_cluster.add_node({"generate": 2}, env=env)]
    run_dir = tmp_path / "run"
    config = tiny_toy_config(
        run_dir,
        steps=5,
        seed=5,
        problem_options={"lenient": True},
        cluster=_own_nodes_cluster(connected.address),
    )
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))

    def discover(args: list[str], crash: str | None) -> int:
        extra = {"DISCOVER_CRASH_AT": crash} if crash else {}
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", *args],
            env={**cli_env, **env, **extra},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        _, err = proc.communicate(timeout=1200)
        assert proc.returncode == (-9 if crash else 0), err[-3000:]  # the crash hook's SIGKILL
        return proc.pid

    def namespace() -> str:
        return "ttt-" + json.loads((run_dir / "run.json").read_text())["run_id"]

    def workers() -> tuple[list[str], list[dict]]:
        actors = [ray.get_actor(f"generate-{i}", namespace=namespace()) for i in range(2)]
        actors += [ray.get_actor(f"train-{r}", namespace=namespace()) for r in range(2)]
        infos = ray.get([a.info.remote() for a in actors[2:]], timeout=120)
        return [a._actor_id.hex() for a in actors], infos

    try:
        first_flow = discover(["run", str(tmp_path / "run.yaml")], "select_parents:2:start")
        first, infos = workers()
        assert [(i["base_loads"], i["state_loads"]) for i in infos] == [(1, 1), (1, 1)]
        discover(["resume", str(run_dir)], "select_parents:4:start")
        again, infos = workers()
        assert again == first  # re-attached: the same four actors
        assert [(i["base_loads"], i["state_loads"]) for i in infos] == [(1, 1), (1, 1)]  # nothing loaded again
        rank_pids = sorted(i["pid"] for i in infos)
        discover(["resume", str(run_dir)], None)
        for i in range(4):
            assert (run_dir / "checkpoints" / f"{i + 1:04d}" / "adapter").is_dir()
        pids = _load_log(loads)
        assert pids.count(first_flow) == 1, pids  # initialise: the run's new adapter
        workers_loads = [p for p in pids if p != first_flow]
        assert len(workers_loads) == 4 and len(set(workers_loads)) == 4, pids  # 2 ranks + 2 replicas, once each
        assert set(rank_pids) <= set(workers_loads)
        for name in ("generate-0", "generate-1", "train-0", "train-1"):  # the finished run ended them
            with pytest.raises(ValueError):
                ray.get_actor(name, namespace=namespace())
    finally:
        for node in nodes:
            ray_cluster.kill_node(node)


def test_a_run_moved_from_two_ranks_to_one_leaves_nothing_on_the_cluster(
    ray_cluster, connected, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """Must show (nothing left behind): a 2-step toy run with two detached trainer ranks in a
    placement group on the cluster, `discover run` SIGKILLed as step 1 starts (the ranks stay, for
    the flow that resumes); rank 0's rendezvous store listens on the node's cluster address, not on
    every interface. The run is then resumed with one rank (config.yaml edited: trainer_world_size 1,
    no cluster.address): it completes, and no actor or placement group of its namespace is left."""
    import json
    import subprocess
    import sys

    import psutil
    import ray
    import yaml
    from ray.util import list_named_actors
    from ray.util.placement_group import placement_group_table

    node = ray_cluster.add_node({"trainer": 2})
    run_dir = tmp_path / "run"
    cluster = {"address": connected.address, "trainer_world_size": 2, "trainer_placement": "ray", "trainer_resources": {"trainer": 1}}
    (tmp_path / "run.yaml").write_text(
        yaml.safe_dump(tiny_toy_config(run_dir, steps=2, problem_options={"lenient": True}, cluster=cluster))
    )

    def discover(args: list[str], crash: str | None) -> subprocess.CompletedProcess:
        env = {**cli_env, "PYTHONPATH": str(FAULTS), **({"DISCOVER_CRASH_AT": crash} if crash else {})}
        done = subprocess.run(
            [sys.executable, "-m", "cli", *args], env=env, capture_output=True, text=True, timeout=1200, start_new_session=True
        )
        assert done.returncode == (-9 if crash else 0), done.stderr[-3000:]
        return done

    def left(ns: str) -> tuple[list[str], list[str]]:
        actors = [a["name"] for a in list_named_actors(all_namespaces=True) if a["namespace"] == ns]
        groups = [g["name"] for g in placement_group_table().values() if g["name"].startswith(ns) and g["state"] != "REMOVED"]
        return sorted(actors), sorted(groups)  # Ray lists them in no set order

    try:
        discover(["run", str(tmp_path / "run.yaml")], "select_parents:1:start")
        ns = "ttt-" + json.loads((run_dir / "run.json").read_text())["run_id"]
        assert left(ns) == (["train-0", "train-1"], [f"{ns}-train-ranks"])
        info = ray.get(ray.get_actor("train-0", namespace=ns).info.remote(), timeout=120)
        host, port = info["store"]
        listening = [
            c.laddr for c in psutil.Process(info["pid"]).net_connections() if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        ]
        assert host == HOST and listening and all(a.ip == HOST for a in listening), (host, listening)

        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        config["cluster"] = {
            **config["cluster"],
            "address": None,
            "trainer_world_size": 1,
            "trainer_placement": "local",
            "trainer_resources": {},
        }
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
        resumed = discover(["resume", str(run_dir)], None)
        assert "1 actors" not in resumed.stderr  # both ranks, not one
        assert left(ns) == ([], []), resumed.stderr[-3000:]
        assert not (run_dir / "cluster-workers.json").exists()
        assert (run_dir / "checkpoints" / "0002" / "adapter").is_dir()
    finally:
        ray_cluster.kill_node(node)
