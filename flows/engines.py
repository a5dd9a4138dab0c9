"""Where a run's candidates are evaluated (`evaluation.runner`), through Prefect's task runners.

- `local`: Prefect's ThreadPoolTaskRunner, `sandbox.concurrency` candidates at once in the flow's
  own process.
- `dask` (prefect-dask): the Dask scheduler at `evaluation.address`, or a LocalCluster started for
  the run on 127.0.0.1 with no dashboard (`evaluation.workers` processes of `sandbox.concurrency`
  threads) and closed when the run ends. A candidate asks for the Dask worker resources `CPU`,
  `MEMORY` (bytes) and `GPU`; a worker declares what it has (`dask worker ... --resources
  "CPU=32 MEMORY=128e9 GPU=1"`) and runs a candidate only while it has them free.
- `ray` (prefect-ray, the `ray` extra): the Ray cluster at `evaluation.address`, or a Ray instance
  started for the run on 127.0.0.1 without its dashboard; a candidate asks for `num_cpus`,
  `memory` and `num_gpus`, and Ray gives a GPU task its own device (CUDA_VISIBLE_DEVICES).

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
from discover.evaluation import Resources
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
    """A candidate's needs as Ray task options."""
    return {"num_cpus": resources.cpus, "memory": resources.memory_mb * MB, "num_gpus": resources.gpus}


def resource_request(runner: str, resources: Resources) -> AbstractContextManager[Any]:
    """Around `task.submit(...)`: the engine's resource request for one candidate."""
    if runner == "dask":
        import dask

        return dask.annotate(resources=dask_resources(resources))
    if runner == "ray":
        from prefect_ray.context import remote_options

        return remote_options(**ray_options(resources))
    return nullcontext()


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
    elif e.runner == "ray":
        with _ray(config, resources):
            from prefect_ray import RayTaskRunner

            yield lambda: RayTaskRunner()  # finds the Ray instance this run initialised
    else:  # the configuration's Literal makes this unreachable
        raise ValueError(f"unknown evaluation.runner {e.runner!r}")


@contextmanager
def _dask(config: RunConfig, resources: Resources) -> Iterator[str]:
    """The scheduler address: the configured one (checked), or a local cluster's for the run."""
    try:
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
    cluster = distributed.LocalCluster(
        n_workers=config.evaluation.workers,
        threads_per_worker=threads,
        processes=True,
        host="127.0.0.1",  # loopback only: nothing outside this machine reaches the scheduler or its workers
        dashboard_address=None,  # no dashboard (an open port that shows and can cancel work)
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


@contextmanager
def _ray(config: RunConfig, resources: Resources) -> Iterator[None]:
    """Ray initialised for the run: the configured cluster (checked) or a local instance."""
    try:
        import ray
    except ImportError:
        raise ValueError("evaluation.runner 'ray' needs the `ray` extra: pip install 'ttt-discover[ray]'") from None
    address = config.evaluation.address
    if ray.is_initialized():
        raise ValueError("Ray is already initialised in this process; a run starts its own connection")
    if address is None:
        for attempt in (1, 2, 3):  # Ray gives a new node 30 s to register: a busy machine can miss it
            try:
                ray.init(
                    num_cpus=max(resources.cpus, config.evaluation.workers * config.sandbox.concurrency * resources.cpus),
                    include_dashboard=False,  # no dashboard port
                    _node_ip_address="127.0.0.1",  # loopback only
                    namespace="prefect",
                    log_to_driver=False,
                )
                break
            except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception for this
                ray.shutdown()
                if attempt == 3 or "timed out during startup" not in str(err):
                    raise
                log.warning("the local Ray instance did not start in time (attempt %d of 3); starting it again", attempt)
    else:
        ray.init(address=address, namespace="prefect", log_to_driver=False)
    try:
        wanted = {"CPU": resources.cpus, "memory": resources.memory_mb * MB, "GPU": resources.gpus}
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        if not any(_fits(n, {k: v for k, v in wanted.items() if v}) for n in nodes):
            raise ValueError(
                f"no node of the Ray cluster at {address or 'local'} offers what one candidate needs ({wanted}); "
                "add nodes with `ray start --address HEAD:6379 --num-gpus N` (docs/operations.md, Evaluation on a cluster)"
            )
        log.info("evaluation on Ray (%s): %d nodes", address or "local instance", len(nodes))
        yield
    finally:
        ray.shutdown()
