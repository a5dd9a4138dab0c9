"""The ranks of a sharded training step as Ray actors (`cluster.trainer_placement: ray`, docs/cluster.md).

One step: a placement group of W bundles (one CPU, plus one GPU where the model trains on GPUs, plus
`cluster.trainer_resources`: `rank_bundle`), packed onto as few nodes as fit; one `TrainerRank` actor a bundle.
Rank 0's actor names its node's address and a free port there, where the ranks meet; each actor then
runs `sharded._rank_main` on the step's job (the same code as the ranks spawned on one machine).
The adapter and Adam's state the ranks start from travel to them through Ray's object store (the
step's machine holds them, not shared storage), and rank 0 sends back what it wrote.

Faults: a rank that fails, or whose node dies, fails the step. The other ranks would wait in a
collective for the lost one, so every rank actor is killed at once and the placement group removed;
nothing is written to the checkpoint (the step's `train` task writes it after this returns), and
the task's retry (Prefect's, flows/tasks.py) places the ranks again on the nodes that are left.
Ray's own restarts and retries are off (max_restarts=0, max_task_retries=0).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from discover.config import ModelConfig
from discover.policy.ray_driver import connected_ray
from discover.policy.sharded import ShardedTrainer, _Job, _rank_main, free_port

log = logging.getLogger("discover")

PLACEMENT_TIMEOUT_S = 600.0  # how long a step waits for the cluster to offer W bundles (a node may be joining)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


class TrainerRank:
    """One rank of a step, on the node Ray placed its bundle on."""

    def master(self) -> str:
        """HOST:PORT on this rank's node where the ranks meet (asked of rank 0)."""
        import ray

        host = ray.util.get_node_ip_address()
        return f"{host}:{free_port(host)}"

    def run(self, rank: int, job: _Job, adapter: dict[str, bytes] | None, optimizer: bytes | None) -> dict[str, bytes] | None:
        """Run rank `rank` of the step; rank 0 returns the files it wrote (adapter/, optimizer.pt, stats.json)."""
        import ray

        work = Path(tempfile.mkdtemp(prefix="discover-rank-"))
        try:
            adapter_dir = optimizer_state = None
            if adapter is not None:
                adapter_dir = work / "in" / "adapter"
                _write(adapter_dir, adapter)
            if optimizer is not None:
                optimizer_state = work / "in" / "optimizer.pt"
                optimizer_state.write_bytes(optimizer)
            out = work / "out"
            out.mkdir()
            gpus = ray.get_gpu_ids()
            device = "cuda:0" if gpus else "cpu"  # Ray shows the actor its own GPU as cuda:0
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
            local = replace(
                job,
                adapter_dir=adapter_dir,
                optimizer_state=optimizer_state,
                out_dir=out,
                devices=[device] * len(job.shares),  # one share a rank
                threads=max(1, int(cpus)),
            )
            _rank_main(rank, local)
            return _files(out) if rank == 0 else None
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _ray() -> Any:
    return connected_ray("cluster.trainer_placement 'ray'")


def rank_bundle(job: _Job, resources: dict[str, float], cluster_gpus: float) -> dict[str, float]:
    """One rank's bundle: a CPU and, where the model trains on GPUs (model.device 'cuda:N', or 'auto' on
    a cluster that has GPUs), a GPU; plus the configured custom resources."""
    device = job.model.device
    gpu = device.startswith("cuda") or (device == "auto" and cluster_gpus > 0)
    return {"CPU": 1.0, **({"GPU": 1.0} if gpu else {}), **resources}


def train_on_ray(job: _Job, world_size: int, resources: dict[str, float]) -> None:
    """Run the step's W ranks as Ray actors; write rank 0's files to `job.out_dir`. Raises when a rank
    fails or its node is lost, after killing every rank (see the module's docstring)."""
    ray = _ray()
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundle = rank_bundle(job, resources, ray.cluster_resources().get("GPU", 0.0))
    group = placement_group([dict(bundle) for _ in range(world_size)], strategy="PACK")
    actors: list[Any] = []
    try:
        ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise RuntimeError(
                f"the Ray cluster did not offer {world_size} bundles of {bundle} for the trainer ranks in "
                f"{PLACEMENT_TIMEOUT_S:.0f} s (cluster resources now: {ray.available_resources()}); add nodes, or lower "
                "cluster.trainer_world_size or cluster.trainer_resources"
            )
        cls = ray.remote(TrainerRank)
        for i in range(world_size):
            strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=i)
            actors.append(
                cls.options(
                    num_cpus=bundle.get("CPU", 0.0),
                    num_gpus=bundle.get("GPU", 0.0),
                    resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")} or None,
                    scheduling_strategy=strategy,
                    max_restarts=0,
                    max_task_retries=0,
                ).remote()
            )
        master = ray.get(actors[0].master.remote())
        adapter = _files(job.adapter_dir) if job.adapter_dir is not None and Path(job.adapter_dir).is_dir() else None
        optimizer = Path(job.optimizer_state).read_bytes() if job.optimizer_state is not None else None
        # into the object store once, for every rank (an argument passed by value is copied per call)
        shared, adapter_ref, optimizer_ref = ray.put(replace(job, master=master)), ray.put(adapter), ray.put(optimizer)
        refs = [a.run.remote(r, shared, adapter_ref, optimizer_ref) for r, a in enumerate(actors)]
        rank_of = {ref: r for r, ref in enumerate(refs)}
        log.info("training on %d Ray ranks (bundles of %s), meeting at %s", world_size, bundle, master)
        pending, results = list(refs), {}
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    results[rank_of[ref]] = ray.get(ref)
                except Exception as err:  # noqa: BLE001 - any rank's failure fails the step, named
                    raise RuntimeError(
                        f"trainer rank {rank_of[ref]} of {world_size} on Ray failed ({type(err).__name__}: {err}); the "
                        "other ranks were stopped and nothing of the step was written"
                    ) from err
        _write(Path(job.out_dir), results[0])
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        remove_placement_group(group)


class RayShardedTrainer(ShardedTrainer):
    """`sharded.ShardedTrainer` whose ranks are Ray actors (`train_on_ray`) instead of processes
    spawned here; `resources`: the custom Ray resources of each rank's bundle."""

    def __init__(self, model: ModelConfig, adapter_dir: Path | None, world_size: int, seed: int = 0, *, resources: dict[str, float]):
        self.resources = dict(resources)
        super().__init__(model, adapter_dir, world_size, seed)

    def _rank_devices(self) -> list[torch.device]:
        return []  # each actor's own: its GPU (cuda:0 as Ray shows it) or the CPU

    def _launch(self, job: _Job) -> None:
        train_on_ray(job, self.world_size, self.resources)
