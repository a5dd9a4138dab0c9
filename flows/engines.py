"""Where a run's candidates are evaluated (`evaluation.runner`), through Prefect's task runners.

- `local`: Prefect's ThreadPoolTaskRunner, `sandbox.concurrency` candidates at once in the flow's
  own process.
- `dask` (prefect-dask): the Dask scheduler at `evaluation.address`, or a LocalCluster started for
  the run on 127.0.0.1 with no dashboard (`evaluation.workers` processes of `sandbox.concurrency`
  threads) and closed when the run ends. A candidate asks for the Dask worker resources `CPU`,
  `MEMORY` (bytes) and `GPU`; a worker declares what it has (`dask worker ... --resources
  "CPU=32 MEMORY=128e9 GPU=1"`) and runs a candidate only while it has them free.
- `ray` (prefect-ray, the `ray` extra): the Ray cluster at `evaluation.address`, or a Ray instance
  started for the run on 127.0.0.1 without its dashboard (`start_local_ray`: tried again on a busy
  machine, a failed try's processes ended); a candidate asks for `num_cpus`,
  `memory` and `num_gpus`, and Ray gives a GPU task its own device (CUDA_VISIBLE_DEVICES). Ray never
  retries a candidate itself (`max_retries=0`): Prefect's `evaluation.retries` alone decide. The run
  connects to Ray once (`ray_connection`), for its candidates and its generation replicas
  (`cluster.generation_replicas`, docs/cluster.md) alike.

A cluster's workers run the candidate task (flows/evaluation.py: `evaluate_candidate`) with the problem's
sandbox on their own machine: the project and the evaluator images must be installed there
(docs/operations.md, "Evaluation on a cluster"). A run starts its engine once; each step's flow
gets a task runner on it (`task_runner()`), so a local cluster is not started again every step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from discover.config import RunConfig
from discover.evaluation import NoNodeFits, Resources
from discover.policy.ray_driver import loopback_host
from discover.run import Run

log = logging.getLogger("discover")

TaskRunnerFactory = Callable[[], Any]
MB = 1024 * 1024


def dask_resources(resources: Resources) -> dict[str, float]:
    """A candidate's needs as Dask worker resources (abstract names the workers declare)."""
    request = {"CPU": float(resources.cpus), "MEMORY": float(resources.memory_mb * MB)}
    if resources.gpus:
        request["GPU"] = float(resources.gpus)
    return request


def ray_options(resources: Resources) -> dict[str, Any]:
    """A candidate's needs as Ray task options. Ray's own retries of a task whose worker died are
    off (`max_retries=0`): Prefect retries the candidate (`evaluation.retries`), so it never runs
    more often than that allows."""
    return {"num_cpus": resources.cpus, "memory": resources.memory_mb * MB, "num_gpus": resources.gpus, "max_retries": 0}


def resource_request(runner: str, resources: Resources) -> AbstractContextManager[Any]:
    """Around `task.submit(...)`: the engine's resource request for one candidate."""
    if runner == "dask":
        import dask

        return dask.annotate(resources=dask_resources(resources))
    if runner == "ray":
        from prefect_ray.context import remote_options

        return remote_options(**ray_options(resources))
    return nullcontext()


def unplaceable(runner: str, resources: Resources) -> Callable[[], str | None]:
    """For a step's evaluation (`StepEvaluation.collect`): a check that says why the engine cannot start
    one more candidate now, or None. On Ray: no live node has what a candidate asks in all, or the
    cluster has not that much free (held by the run's replicas and ranks, or other work). Local
    threads always can; a Dask cluster is not checked (its scheduler queues the work)."""
    if runner != "ray":
        return lambda: None
    wanted = {k: v for k, v in ray_wanted(resources).items() if v}

    def check() -> str | None:
        import ray

        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        free = ray.available_resources()
        some_node_fits = any(_fits(n, wanted) for n in nodes)
        if some_node_fits and _fits(free, wanted):
            return None
        shown = {k: _amount(k, free.get(k, 0.0)) for k in wanted}
        totals = [{k: _amount(k, n.get(k, 0.0)) for k in wanted} for n in nodes]
        why = (
            f"the Ray cluster cannot start one: a candidate asks { ({k: _amount(k, v) for k, v in wanted.items()}) }, the "
            f"cluster has {shown} free, its {len(nodes)} live nodes {totals} in all (the run's replicas and ranks hold "
            f"theirs); add a node (`ray start --address {_head_address(ray)} --num-cpus N`) or lower the problem's limits"
        )
        return why if some_node_fits else NoNodeFits(why)

    return check


def ray_wanted(resources: Resources) -> dict[str, float]:
    """A candidate's Ray resources, named as `ray.nodes()` and `ray.available_resources()` name them."""
    return {"CPU": float(resources.cpus), "memory": float(resources.memory_mb * MB), "GPU": float(resources.gpus)}


def _amount(name: str, value: float) -> str:
    return f"{value / MB / 1024:.1f} GiB" if name == "memory" else f"{value:g}"


def _fits(offered: dict[str, float], wanted: dict[str, float]) -> bool:
    return all(offered.get(name, 0) >= amount for name, amount in wanted.items())


@contextmanager
def evaluation_engine(run: Run) -> Iterator[TaskRunnerFactory]:
    """Start (or connect to) the run's engine; yield a factory of each step's task runner."""
    config = run.config
    e = config.evaluation
    resources = Resources.of(run.problem())
    if e.runner == "local":
        from prefect.task_runners import ThreadPoolTaskRunner

        yield lambda: ThreadPoolTaskRunner(max_workers=config.sandbox.concurrency)
    elif e.runner == "dask":
        with _dask(config, resources) as address:
            from prefect_dask import DaskTaskRunner

            yield lambda: DaskTaskRunner(address=address)
    elif e.runner == "ray":  # the run's flow holds the connection (`ray_connection`)
        import ray
        from prefect_ray import RayTaskRunner

        if not ray.is_initialized():
            raise RuntimeError("evaluation.runner 'ray': open the run's `ray_connection` before its evaluation engine")
        yield lambda: RayTaskRunner()  # finds the Ray instance this run initialised
    else:  # the configuration's Literal makes this unreachable
        raise ValueError(f"unknown evaluation.runner {e.runner!r}")


@contextmanager
def _dask(config: RunConfig, resources: Resources) -> Iterator[str]:
    """The scheduler address: the configured one (checked), or a local cluster's for the run."""
    try:
        import dask
        import distributed
    except ImportError:
        raise ValueError("evaluation.runner 'dask' needs the packages prefect-dask and distributed") from None
    wanted = dask_resources(resources)
    address = config.evaluation.address
    if address is not None:
        with distributed.Client(address, timeout="60s") as client:
            client.wait_for_workers(1, timeout=300)
            workers = client.scheduler_info(n_workers=-1)["workers"]
            if not any(_fits(w.get("resources") or {}, wanted) for w in workers.values()):
                raise ValueError(
                    f"no worker of the Dask cluster at {address} offers the resources one candidate needs "
                    f'({_dask_flag(wanted)}); start workers with `dask worker {address} --resources "{_dask_flag(wanted)}"` '
                    "or more (docs/operations.md, Evaluation on a cluster)"
                )
        log.info("evaluation on the Dask cluster at %s (%d workers)", address, len(workers))
        yield address
        return
    if resources.gpus:
        raise ValueError(
            "a local Dask cluster has no GPU workers; give evaluation.address of a cluster whose GPU workers declare "
            "GPU=1, or use evaluation.runner 'ray' (it gives each GPU task its own device) or 'local'"
        )
    threads = config.sandbox.concurrency
    offered = {name: amount * threads for name, amount in wanted.items()}
    # No dashboard and no HTTP pages at all (an open port that shows, and can cancel, work): Dask's
    # scheduler serves its info pages and metrics on 8787 even without a dashboard (two runs on a
    # machine then clash), so its and the workers' routes are emptied and its port is a free one.
    with dask.config.set({"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}):
        cluster = distributed.LocalCluster(
            n_workers=config.evaluation.workers,
            threads_per_worker=threads,
            processes=True,
            host="127.0.0.1",  # loopback only: nothing outside this machine reaches the scheduler or its workers
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
            resources=offered,
        )
    with cluster:
        log.info(
            "evaluation on a local Dask cluster at %s: %d workers of %d threads",
            cluster.scheduler_address,
            config.evaluation.workers,
            threads,
        )
        yield cluster.scheduler_address


def _dask_flag(resources: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.0f}" for k, v in resources.items())


def needs_ray(config: RunConfig) -> bool:
    """Whether a run connects to Ray: its candidates, its generation replicas or its trainer ranks run there."""
    c = config.cluster
    return config.evaluation.runner == "ray" or c.generation_replicas > 1 or c.trainer_world_size > 1


def ray_address(config: RunConfig) -> str | None:
    """The one Ray cluster of a run (the configuration checks that the two addresses agree); None: a local instance."""
    if config.cluster.address is not None:
        return config.cluster.address
    return config.evaluation.address if config.evaluation.runner == "ray" else None


@contextmanager
def ray_connection(run: Run) -> Iterator[bool]:
    """Ray initialised for the run when it needs it (`needs_ray`): the configured cluster (checked),
    or a local instance on the loopback; shut down when the run's flow ends. Yields whether it is."""
    config = run.config
    if not needs_ray(config):
        yield False
        return
    try:
        import ray
    except ImportError:
        raise ValueError(
            "evaluation.runner 'ray', cluster.generation_replicas > 1 and cluster.trainer_world_size > 1 need the "
            "`ray` extra: pip install 'ttt-discover[ray]'"
        ) from None
    if ray.is_initialized():
        raise ValueError("Ray is already initialised in this process; a run starts its own connection")
    resources = Resources.of(run.problem())
    evaluating = config.evaluation.runner == "ray"
    address = ray_address(config)
    if address is None:
        cpus = max(resources.cpus, config.evaluation.workers * config.sandbox.concurrency * resources.cpus) if evaluating else 0
        cpus += config.cluster.generation_replicas if config.cluster.generation_replicas > 1 else 0
        cpus += config.cluster.trainer_world_size if config.cluster.trainer_world_size > 1 else 0
        start_local_ray(ray, max(cpus, 1))
    else:
        loopback = loopback_host(address)
        extra = {"_node_ip_address": loopback} if loopback else {}
        ray.init(address=address, namespace="prefect", log_to_driver=False, **extra)
    try:
        watching = watch_head(address, f"discover resume {run.root}") if address is not None else nullcontext()
        with watching:
            yield from _connected(ray, address, resources if evaluating else None)
    finally:
        ray.shutdown()


RAY_START_TIMEOUT_S = 300.0  # how long a run tries to start its local Ray instance (DISCOVER_RAY_START_TIMEOUT_S)
RAY_NODE_WAIT_S = 30  # Ray's own wait for a new node to register with its GCS (ray/_private/node.py, fixed in Ray 2.60)
RAY_NICENESS_ENV = "RAY_worker_niceness"  # Ray's setting of its workers' niceness (its default is 15)


def start_local_ray(ray: Any, cpus: int, timeout_s: float | None = None, namespace: str = "prefect") -> None:
    """A Ray instance for this run on the loopback, without its dashboard. Ray waits `RAY_NODE_WAIT_S`
    for the new node's raylet to register and then gives up; a busy machine can miss that, so the
    start is tried again until `timeout_s` has passed, and every process a failed try started (GCS,
    raylet, API server, monitor, agents) is ended before the next: none of them is left running.

    Its workers (trainer ranks, generation replicas, candidate evaluations and the sandboxed programs
    they start) run at niceness 0, as the run itself does: Ray starts them at 15 by default, which
    beside any other work on the machine leaves them a few percent of a CPU (two trainer ranks beside
    two CPU hogs took 25 times as long, and a candidate's wall clock ran out while it waited).
    `RAY_worker_niceness` in the environment still decides where it is set."""
    import os
    import time

    timeout_s = float(os.environ.get("DISCOVER_RAY_START_TIMEOUT_S", RAY_START_TIMEOUT_S)) if timeout_s is None else timeout_s
    started = time.monotonic()
    for attempt in range(1, 1000):
        before = _descendants()
        try:
            ray.init(
                num_cpus=cpus,
                include_dashboard=False,  # no dashboard: only the API server's minimal modules, on a port of its own
                _node_ip_address="127.0.0.1",  # loopback only
                namespace=namespace,
                log_to_driver=False,
                _system_config={} if RAY_NICENESS_ENV in os.environ else {"worker_niceness": 0},
            )
            return
        except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception for this
            ray.shutdown()
            ended = _end_new_descendants(before)
            spent = time.monotonic() - started
            if "timed out during startup" not in str(err):
                raise
            load = os.getloadavg()[0]
            if spent + RAY_NODE_WAIT_S > timeout_s:
                raise RuntimeError(
                    f"the local Ray instance did not start: its raylet did not register with its GCS within Ray's "
                    f"{RAY_NODE_WAIT_S} s in {attempt} tries over {spent:.0f} s (load average {load:.1f} on {os.cpu_count()} "
                    f"CPUs; the {ended} processes the tries started were ended). Run it on a less busy machine, give it "
                    "longer with DISCOVER_RAY_START_TIMEOUT_S, or start a Ray head yourself (`ray start --head`) and set "
                    "cluster.address"
                ) from None
            log.warning(
                "the local Ray instance did not start within Ray's %d s (try %d, load average %.1f on %d CPUs); ended the "
                "%d processes it started and starting it again (%.0f s of %.0f s spent)",
                RAY_NODE_WAIT_S,
                attempt,
                load,
                os.cpu_count(),
                ended,
                spent,
                timeout_s,
            )
    raise AssertionError("unreachable")


def _descendants() -> set[tuple[int, float]]:
    """(pid, start time) of every process below this one."""
    import psutil

    out = set()
    for child in psutil.Process().children(recursive=True):
        try:
            out.add((child.pid, child.create_time()))
        except psutil.Error:
            pass
    return out


def _end_new_descendants(before: set[tuple[int, float]], grace_s: float = 10.0) -> int:
    """End (SIGTERM, then SIGKILL after `grace_s`) Ray's processes below this one that are not in `before`; how many."""
    import psutil

    new = []
    for pid, created in _descendants() - before:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created and "ray" in " ".join(proc.cmdline()):
                new.append(proc)
        except psutil.Error:
            pass
    for proc in new:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(new, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return len(new)


def _head_address(ray: Any) -> str:
    """The address a node joins the connected Ray cluster at (its GCS: host:port), for messages."""
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # noqa: BLE001  (not connected: the documented placeholder)
        return "HEAD:6379"


def _connected(ray: Any, address: str | None, resources: Resources | None) -> Iterator[bool]:
    """The checks of a new connection (one node offers what a candidate evaluated on Ray needs), then the run."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if resources is not None:
        wanted = ray_wanted(resources)
        if not any(_fits(n, {k: v for k, v in wanted.items() if v}) for n in nodes):
            raise ValueError(
                f"no node of the Ray cluster at {address or 'local'} offers what one candidate needs ({wanted}); "
                f"add nodes with `ray start --address {_head_address(ray)} --num-gpus N` (docs/operations.md, Evaluation on a cluster)"
            )
    log.info("Ray (%s): %d nodes", address or "local instance", len(nodes))
    yield True


HEAD_CHECK_S = 5.0  # how often the flow checks that the cluster's head answers
HEAD_MISSES = 2  # checks in a row without an answer before the head is reported lost


@contextmanager
def watch_head(address: str, resume: str, every: float = HEAD_CHECK_S) -> Iterator[None]:
    """While the run is connected to the cluster at `address`: a thread that connects to the head's port
    every `every` seconds and, when it does not answer `HEAD_MISSES` times in a row, says so at ERROR in
    the run's log with the command that resumes the run. Ray itself ends the process about 60 s after
    its head is lost (its own words only); this says what happened first."""
    import socket
    import threading

    host, port = address.removeprefix("ray://").rsplit(":", 1)
    stop = threading.Event()

    def watch() -> None:
        misses = 0
        while not stop.wait(every):
            try:
                with socket.create_connection((host, int(port)), timeout=every):
                    misses = 0
                    continue
            except OSError as err:
                misses += 1
                if misses == HEAD_MISSES:
                    log.error(
                        "the Ray cluster's head at %s does not answer (%s): the run stops when Ray gives up on it (about "
                        "60 s). Nothing finished is lost: start the head again (`ray start --head`, then the nodes with "
                        "`ray start --address %s`) and resume with: %s",
                        address,
                        err.strerror or type(err).__name__,
                        address.removeprefix("ray://"),
                        resume,
                    )

    thread = threading.Thread(target=watch, name="ray-head-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
