"""The resident trainer group: W rank actors that hold the model, its shards, Adam's state and their
process group for the whole run (`cluster.trainer_world_size` > 1, docs/cluster.md "Resident ranks").

- **Created once, found again.** The ranks are Ray actors named `train-<rank>` in the run's Ray
  namespace (`ttt-<run id>`, as the generation replicas). Each carries the group's specification
  (`GroupSpec`: the model and train sections, world size, placement, resources, the code version of
  this module's closure); a flow that restarts finds them by name and uses them if every rank is
  alive and has the same specification, otherwise every rank is killed and the group built again.
  On a cluster given by `cluster.address` they are detached (they outlive a flow process that dies
  and are ended when the run finishes its last step); on a Ray instance started for the run they end
  with it.
- **Placement.** `trainer_placement: ray`: a placement group of W bundles (`rank_bundle`), packed
  onto as few nodes as fit; `local`: the W actors on the node of the step's process (Ray's node
  affinity). One runtime for both: a local placement on a machine without a cluster uses the Ray
  instance the run starts on the loopback (flows/engines.py `ray_connection`).
- **Rendezvous.** Rank 0 opens torch's TCPStore on port 0 of its node (the kernel picks the port,
  nothing is probed and released); the others connect to it and every rank joins the process group
  (gloo on CPU, NCCL on CUDA) once.
- **A step** sends the rollouts and advantages (through Ray's object store, once for every rank) and
  gets back the files of the checkpoint rank 0 gathered (adapter folder, `optimizer.pt`, `stats.json`,
  `LoRATrainer.save`'s format). Between steps the ranks keep their LoRA shards and Adam's state.
- **The checkpoint stays the truth.** The ranks know the digest of the state they hold (`state_digest`
  of the checkpoint's files); before a step the driver compares it with the step's input checkpoint and,
  where they differ (a new group, a resume from an older checkpoint, `--redo-from`, a run moved from one
  process), sends that checkpoint's adapter and Adam's state, which the ranks load over the resident base
  model (no model load). So a step's result depends only on its input checkpoint, as in one process.
- **Faults.** A rank that fails or whose node dies fails the step: the others would wait in a collective
  for it, so every rank is killed at once (and the placement group removed); nothing is written to the
  checkpoint, and the `train` task's retry (flows/tasks.py) builds the group again from the last
  checkpoint. Ray's own restarts and retries are off (max_restarts=0, max_task_retries=0).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
import weakref
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from discover.config import PLACEMENT_TIMEOUT_S, ModelConfig, TrainConfig
from discover.policy.base import Completion, TrainBatch
from discover.policy.ray_driver import connected_ray
from discover.policy.sharded import _full, full_optimizer_state, load_full_optimizer_state, shard, share_rollouts
from storage.atomic import atomic_dir, atomic_path

if TYPE_CHECKING:
    from discover.policy.trainer import LoRATrainer
    from discover.run import Run

log = logging.getLogger("discover")

JOIN_TIMEOUT_S = 600.0  # how long the ranks wait for each other to join the process group
PEER_DEATH_GRACE_S = 30.0  # after a rank's failure, how long to look for a lost rank to name instead
Files = dict[str, bytes]  # a folder's files by relative path


RANK_PREFIX = "train-"


def rank_name(rank: int) -> str:
    return f"{RANK_PREFIX}{rank}"


def state_digest(files: Files) -> str:
    """sha256 over a checkpoint's training state: the adapter folder's and `optimizer.pt`'s names and bytes."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0")
        h.update(hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def read_files(root: Path, prefix: str = "") -> Files:
    """Every file under `root`, keyed by `prefix` + its path relative to `root`."""
    return {prefix + str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}


def write_files(root: Path, files: Files) -> None:
    for rel, data in files.items():
        path = Path(root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def checkpoint_state(adapter_dir: Path, optimizer: Path | None) -> Files:
    """What the ranks start a step from: the adapter folder (as `adapter/...`) and Adam's state
    (`optimizer.pt`, absent for a checkpoint that has none: Adam starts fresh)."""
    files = read_files(adapter_dir, "adapter/")
    if not files:
        raise FileNotFoundError(f"no LoRA adapter in {adapter_dir}: a sharded step starts from a checkpoint's adapter folder")
    if optimizer is not None and Path(optimizer).is_file():
        files["optimizer.pt"] = Path(optimizer).read_bytes()
    return files


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """Everything that fixes what the ranks hold; a group whose spec differs is built again."""

    model: dict[str, Any]
    train: dict[str, Any]  # Adam's hyper-parameters live in the ranks' optimizer: a change rebuilds them
    world_size: int
    placement: str
    resources: dict[str, float]  # custom Ray resources of one rank (cluster.trainer_resources)
    code_version: str

    @classmethod
    def of(cls, model: ModelConfig, train: TrainConfig, world_size: int, placement: str, resources: dict[str, float]) -> GroupSpec:
        from discover.code_version import module_closure, source_digest

        return cls(
            model=model.model_dump(mode="json"),
            train=train.model_dump(mode="json"),
            world_size=world_size,
            placement=placement,
            resources=dict(resources),
            code_version=source_digest(module_closure(__name__)),
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def rank_bundle(model: ModelConfig, resources: dict[str, float], cluster_gpus: float) -> dict[str, float]:
    """One rank's Ray resources: a CPU and, where the model trains on GPUs (model.device 'cuda:N', or
    'auto' on a cluster that has GPUs), a GPU; plus the configured custom resources."""
    device = model.device
    gpu = device.startswith("cuda") or (device == "auto" and cluster_gpus > 0)
    return {"CPU": 1.0, **({"GPU": 1.0} if gpu else {}), **resources}


# ------------------------------------------------------------------------------------------------
# The actor (one rank, on a node of the Ray cluster)


class ResidentRank:
    """One rank of the group; made a Ray actor by `TrainerGroup`. Holds, once it has joined and
    loaded a state: the LoRA model over the resident base model, sharded (FSDP2), and Adam over its
    shards."""

    def __init__(self, spec: dict[str, Any], rank: int):
        import ray

        self.spec, self.rank, self.world = spec, rank, int(spec["world_size"])
        self.train = TrainConfig(**spec["train"])
        gpus = ray.get_gpu_ids()
        self.device = torch.device("cuda:0" if gpus else "cpu")  # Ray shows the actor its own GPU as cuda:0
        self.config = ModelConfig(**spec["model"]).model_copy(update={"device": str(self.device), "training_devices": None})
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        else:
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
            torch.set_num_threads(max(1, int(cpus)))
        self.digest: str | None = None  # the state held: `state_digest` of the checkpoint it equals
        self.state_loads = 0  # checkpoint states loaded (a resident group: once, then only after a resume elsewhere)
        self._store: Any = None
        self.store_address: tuple[str, int] | None = None  # rank 0: where its TCPStore listens
        self._trainer: Any = None
        self._root: Any = None
        self._params: list[torch.nn.Parameter] = []
        self._opt: torch.optim.Optimizer | None = None

    def info(self) -> dict[str, Any]:
        """The spec, the state held, the process, how often it read the base model from disk and loaded a checkpoint's state."""
        from discover.policy import resident

        return {
            "spec": self.spec,
            "digest": self.digest,
            "pid": os.getpid(),
            "base_loads": resident.loads(),
            "state_loads": self.state_loads,
            "store": self.store_address,
        }

    def open_store(self) -> tuple[str, int]:
        """Rank 0: torch's TCPStore on a port the kernel picks, listening on this node's cluster
        address only (torch's own listener takes every interface); where the others meet it."""
        import socket

        import ray
        import torch.distributed as dist

        host = ray.util.get_node_ip_address()
        listener = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=self.world * 4)
        port = listener.getsockname()[1]
        self._store = dist.TCPStore(
            host,
            port,
            self.world,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=JOIN_TIMEOUT_S),
            master_listen_fd=listener.detach(),  # the store owns the socket from here
            use_libuv=True,
        )
        self.store_address = (host, port)
        return host, port

    def join(self, host: str, port: int) -> None:
        """Join the group's process group (every rank at once: it returns when all have joined)."""
        import torch.distributed as dist

        if self._store is None:
            self._store = dist.TCPStore(host, port, self.world, is_master=False, timeout=timedelta(seconds=JOIN_TIMEOUT_S))
        cuda = self.device.type == "cuda"
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            store=self._store,
            rank=self.rank,
            world_size=self.world,
            timeout=timedelta(seconds=JOIN_TIMEOUT_S),
            device_id=self.device if cuda else None,
        )

    def load_state(self, files: Files, digest: str) -> None:
        """Hold the checkpoint state `files` (`checkpoint_state`): its adapter over the resident base model,
        sharded, and Adam over the shards with its state (fresh where it has none)."""
        from discover.policy.trainer import LoRATrainer

        self._trainer = self._root = self._opt = None
        self._params = []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        work = Path(tempfile.mkdtemp(prefix="discover-rank-"))
        try:
            write_files(work, files)
            trainer = LoRATrainer.load(self.config, work / "adapter", devices=[self.device])
            root = shard(trainer.model)
            params = trainer.lora_parameters()
            t = self.train
            b1, b2 = t.adam_betas
            opt = torch.optim.Adam(params, lr=t.learning_rate, betas=(b1, b2), eps=t.adam_eps, fused=self.device.type == "cuda" or None)
            if (work / "optimizer.pt").is_file():
                load_full_optimizer_state(opt, params, torch.load(work / "optimizer.pt", map_location=self.device, weights_only=True))
                for g in opt.param_groups:
                    g.update(lr=t.learning_rate, betas=(b1, b2), eps=t.adam_eps)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        self._trainer, self._root, self._params, self._opt = trainer, root, params, opt
        self.digest = digest
        self.state_loads += 1

    def step(self, completions: list[Completion], advantages: list[float], mine: list[int], temperature: float) -> Files | None:
        """One optimizer step over this rank's rollouts `mine` (every rank at once); rank 0 returns the
        checkpoint's files (`adapter/...`, `optimizer.pt`, `stats.json`). The state held is then that
        checkpoint's."""
        from discover.policy.trainer import accumulate_gradients

        if self._trainer is None or self._opt is None:
            raise RuntimeError(f"trainer rank {self.rank} holds no state: load_state comes before step")
        trainer, opt, params, t = self._trainer, self._opt, self._params, self.train
        opt.zero_grad(set_to_none=True)
        trainer.model.train()  # gradient checkpointing is active in training mode; dropout is off
        try:
            stats = accumulate_gradients(
                trainer.model,
                [completions[i] for i in mine],
                [advantages[i] for i in mine],
                kl_coef=t.kl_coef,
                temperature=temperature,
                micro_batch_tokens=self.config.micro_batch_tokens,
                pad_id=trainer._pad_id(),
                ratio_cap=t.importance_ratio_cap,
                kl_center=t.kl_center,
                forward=self._root,
                distributed=True,
            )
        finally:
            trainer.model.eval()
        stats["grad_norm"] = 0.0
        if stats["tokens"] > 0:  # the same on every rank (reduced)
            norm = float(_full(torch.nn.utils.clip_grad_norm_(params, max_norm=float("inf"))))
            stats["grad_norm"] = norm if math.isfinite(norm) else float("nan")
            opt.step()
        opt.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the step's activations and gathered weights back to the allocator's pool
        adapter = {name: _full(p.detach()).cpu() for name, p in trainer.model.named_parameters() if p.requires_grad}
        optimizer = full_optimizer_state(opt)  # collectives: every rank gathers, rank 0 writes
        if self.rank != 0:
            self.digest = None  # rank 0 names the new state; the driver sets it on every rank
            return None
        work = Path(tempfile.mkdtemp(prefix="discover-rank-"))
        try:
            trainer.model.save_pretrained(str(work / "adapter"), safe_serialization=True, state_dict=adapter)
            torch.save(optimizer, work / "optimizer.pt")
            files = read_files(work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        self.digest = state_digest(files)
        files["stats.json"] = json.dumps(stats).encode()
        return files

    def hold(self, digest: str) -> None:
        """The step's checkpoint has digest `digest` (named by rank 0): this rank's state is that one."""
        self.digest = digest


# ------------------------------------------------------------------------------------------------
# The driver's side (the step's process)


def _ray() -> Any:
    return connected_ray("cluster.trainer_world_size > 1")


class RankLost(RuntimeError):
    """A rank of the group failed or was lost during a step; the group was stopped."""


_GROUPS: dict[tuple[str, str], TrainerGroup] = {}  # (namespace, Ray job id) -> the run's group in this process


def forget_groups(namespace: str) -> None:
    """This process's handles of the groups of `namespace` (its ranks were ended)."""
    for key in [k for k in _GROUPS if k[0] == namespace]:
        del _GROUPS[key]


class TrainerGroup:
    """The W resident ranks of one run (or one test), found by name in `namespace`."""

    def __init__(
        self,
        namespace: str,
        model: ModelConfig,
        world_size: int,
        placement: str = "local",
        resources: dict[str, float] | None = None,
        detached: bool = False,
    ):
        if world_size < 2:
            raise ValueError(f"a trainer group has 2 or more ranks (cluster.trainer_world_size), got {world_size}")
        self.namespace, self.model, self.world_size = namespace, model, world_size
        self.placement, self.resources, self.detached = placement, dict(resources or {}), detached
        self._actors: list[Any] = []
        self._spec: dict[str, Any] | None = None
        self._digest: str | None = None

    @classmethod
    def of_run(cls, run: Run) -> TrainerGroup:
        """The run's group, one per process and Ray connection: it holds the ranks' handles between
        steps (Ray ends an actor that is not detached once no handle of it is left)."""
        from discover.policy.replicas import namespace

        c = run.config.cluster
        key = (namespace(run), _ray().get_runtime_context().get_job_id())  # a new Ray connection: new handles
        ns, detached = namespace(run), c.address is not None
        wanted = cls(ns, run.config.model, c.trainer_world_size, c.trainer_placement, c.trainer_resources, detached)
        group = _GROUPS.get(key)
        if group is None or group._identity() != wanted._identity():
            group = _GROUPS[key] = wanted
        return group

    def _identity(self) -> tuple[Any, ...]:
        return (self.namespace, self.model, self.world_size, self.placement, self.resources, self.detached)

    # -- building and finding

    def ensure(self, train: TrainConfig) -> list[Any]:
        """The ranks for `train`: found by name (every one alive, with this spec) or built again."""
        ray = _ray()
        spec = GroupSpec.of(self.model, train, self.world_size, self.placement, self.resources).as_dict()
        if self._actors and self._spec == spec:
            return self._actors
        found: list[Any] = []
        for r in range(self.world_size):
            try:
                found.append(ray.get_actor(rank_name(r), namespace=self.namespace))
            except ValueError:
                found.append(None)
        if all(a is not None for a in found):
            try:
                infos = ray.get([a.info.remote() for a in found], timeout=60)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
                log.warning("trainer group %s: a rank is lost (%s); building the group again", self.namespace, type(err).__name__)
                infos = None
            if infos is not None and all(i["spec"] == spec for i in infos):
                digests = {i["digest"] for i in infos}
                self._actors, self._spec = found, spec
                self._digest = digests.pop() if len(digests) == 1 else None
                log.info("trainer group %s: re-attached to its %d ranks", self.namespace, self.world_size)
                return self._actors
            if infos is not None:
                log.info("trainer group %s: its specification changed; building it again", self.namespace)
        self._kill_named()
        self._actors, self._spec, self._digest = self._build(ray, spec), spec, None
        return self._actors

    def _build(self, ray: Any, spec: dict[str, Any]) -> list[Any]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

        t0 = time.time()
        bundle = rank_bundle(self.model, self.resources, ray.cluster_resources().get("GPU", 0.0))
        lifetime = {"lifetime": "detached"} if self.detached else {}
        strategies: list[Any]
        if self.placement == "ray":
            from ray.util.placement_group import placement_group

            group = placement_group([dict(bundle) for _ in range(self.world_size)], strategy="PACK", name=self._group_name(), **lifetime)
            ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
            if not ready:
                self._remove_group(ray)
                raise RuntimeError(
                    f"the Ray cluster did not offer {self.world_size} bundles of {bundle} for the trainer ranks in "
                    f"{PLACEMENT_TIMEOUT_S:.0f} s (resources free now: {ray.available_resources()}); add nodes, or lower "
                    "cluster.trainer_world_size or cluster.trainer_resources"
                )
            strategies = [PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=r) for r in range(self.world_size)]
        else:  # local: the node of this process
            node = ray.get_runtime_context().get_node_id()
            offered: dict[str, float] = next((n.get("Resources", {}) for n in ray.nodes() if n.get("NodeID") == node), {})
            short = {k: v * self.world_size for k, v in bundle.items() if offered.get(k, 0.0) < v * self.world_size}
            if short:
                raise ValueError(
                    f"cluster.trainer_placement 'local' puts the {self.world_size} ranks on this machine, which offers "
                    f"{ {k: offered.get(k, 0.0) for k in short} } of the {short} they need (one CPU, and one GPU where the model "
                    "trains on GPUs, a rank): lower cluster.trainer_world_size, or use trainer_placement 'ray' on a cluster"
                )
            strategies = [NodeAffinitySchedulingStrategy(node_id=node, soft=False)] * self.world_size
        cls = ray.remote(ResidentRank)
        actors = [
            cls.options(
                name=rank_name(r),
                namespace=self.namespace,
                num_cpus=bundle.get("CPU", 0.0),
                num_gpus=bundle.get("GPU", 0.0),
                resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")} or None,
                scheduling_strategy=strategies[r],
                max_restarts=0,
                max_task_retries=0,
                **lifetime,
            ).remote(spec, r)
            for r in range(self.world_size)
        ]
        try:
            host, port = ray.get(actors[0].open_store.remote(), timeout=PLACEMENT_TIMEOUT_S)
            self._wait([a.join.remote(host, port) for a in actors], actors, "joining the process group")
        except BaseException:
            self._stop(ray, actors)
            raise
        log.info(
            "trainer group %s: %d ranks (%s, bundles of %s) joined at %s:%d in %.1f s; they stay for the run",
            self.namespace,
            self.world_size,
            self.placement,
            bundle,
            host,
            port,
            time.time() - t0,
        )
        return actors

    # -- a step

    def train_step(
        self,
        state: Files,
        completions: list[Completion],
        advantages: list[float],
        shares: list[list[int]],
        train: TrainConfig,
        temperature: float,
    ) -> Files:
        """One step from the checkpoint state `state` (`checkpoint_state`); rank 0's files (see `ResidentRank.step`)."""
        ray = _ray()
        actors = self.ensure(train)
        digest = state_digest(state)
        if self._digest != digest:
            ref = ray.put(state)  # into the object store once, for every rank
            self._wait([a.load_state.remote(ref, digest) for a in actors], actors, "loading the checkpoint's state")
            self._digest = digest
        data = ray.put(list(completions)), ray.put([float(a) for a in advantages])
        self._digest = None  # until every rank has finished the step
        steps = [a.step.remote(data[0], data[1], shares[r], float(temperature)) for r, a in enumerate(actors)]
        results = self._wait(steps, actors, "training")
        files = results[0]
        new = state_digest({k: v for k, v in files.items() if k != "stats.json"})
        ray.get([a.hold.remote(new) for a in actors[1:]])
        self._digest = new
        return files

    def _wait(self, refs: list[Any], actors: list[Any], doing: str) -> list[Any]:
        """Every rank's result, in rank order; the first failure stops every rank and raises `RankLost`,
        naming the rank that was lost (see `_culprit`)."""
        ray = _ray()
        rank_of = {ref: r for r, ref in enumerate(refs)}
        pending, results = list(refs), {}
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    results[rank_of[ref]] = ray.get(ref)
                except Exception as err:  # noqa: BLE001 - any rank's failure fails the step, named
                    rank, cause = self._culprit(ray, rank_of, (rank_of[ref], err), pending)
                    self._stop(ray, actors)
                    raise RankLost(
                        f"trainer rank {rank} of {self.world_size} failed while {doing} ({type(cause).__name__}: "
                        f"{_first_line(cause)}); every rank was stopped and nothing of the step was written. The train task's "
                        "retry builds the group again from the last checkpoint"
                    ) from cause
        return [results[r] for r in range(len(refs))]

    @staticmethod
    def _culprit(ray: Any, rank_of: dict[Any, int], first: tuple[int, BaseException], pending: list[Any]) -> tuple[int, BaseException]:
        """The rank to name for a failed step. When a rank dies its peers' collectives fail at once
        ("Connection reset by peer"), often before Ray reports the death; so when the first failure is
        not a lost actor, the other ranks get up to `PEER_DEATH_GRACE_S` to show one. A rank that
        failed on its own leaves its peers waiting in a collective: they are stopped after the grace."""
        if isinstance(first[1], ray.exceptions.RayActorError) or not pending:
            return first
        deadline = time.monotonic() + PEER_DEATH_GRACE_S
        while pending and (left := deadline - time.monotonic()) > 0:
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as err:
                    return rank_of[ref], err
                except Exception:  # noqa: BLE001, S110 - another victim of the same loss
                    pass
        return first

    # -- ending

    def _stop(self, ray: Any, actors: list[Any]) -> None:
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001, S110 - already gone
                pass
        self._remove_group(ray)
        self._actors, self._spec, self._digest = [], None, None

    def _group_name(self) -> str:
        """The placement group's name (`trainer_placement: ray`): placement groups are named in the
        driver's namespace, so the run's namespace is part of the name."""
        return f"{self.namespace}-train-ranks"

    def _remove_group(self, ray: Any) -> None:
        """Remove the group's placement group, if it has one (with `trainer_placement: ray` now or before)."""
        from ray.util.placement_group import get_placement_group, remove_placement_group

        try:
            remove_placement_group(get_placement_group(self._group_name()))
        except ValueError:  # none by that name
            pass

    def end(self) -> int:
        """The run is over: kill the group's ranks and remove its placement group, and forget this
        process's handle of the group; how many ranks were ended."""
        for key in [k for k, g in _GROUPS.items() if g is self]:
            del _GROUPS[key]
        return self._kill_named()

    def _kill_named(self) -> int:
        """Kill the group's ranks (found by name) and remove its placement group; how many ranks were killed."""
        from discover.policy.run_workers import named_actors

        ray = _ray()
        names = named_actors(ray, self.namespace, RANK_PREFIX)  # every rank, however many the group had before
        ended = []
        for name in names:
            try:
                ended.append(ray.get_actor(name, namespace=self.namespace))
            except ValueError:
                continue
        self._stop(ray, ended)
        deadline = time.time() + 30
        while time.time() < deadline and any(_named(ray, name, self.namespace) for name in names):
            time.sleep(0.2)
        return len(ended)


def _named(ray: Any, name: str, namespace: str) -> bool:
    try:
        ray.get_actor(name, namespace=namespace)
        return True
    except ValueError:
        return False


_TRACEBACK_LINES = ("Traceback", "File ", "During handling", "The above exception", "^", "~")


def _first_line(err: BaseException) -> str:
    """The first line of Ray's cause that says what happened ("The actor died unexpectedly ...":
    whole, never cut mid-word), skipping a traceback's frames; the error's type when none."""
    after_frame = False
    for line in str(err).splitlines():
        text = line.strip()
        if after_frame and line.startswith((" ", "\t")):  # a frame's source line
            after_frame = False
            continue
        after_frame = text.startswith("File ")
        if text and not text.startswith(_TRACEBACK_LINES):
            return text
    return type(err).__name__


# ------------------------------------------------------------------------------------------------
# The step's trainer


class ShardedTrainer:
    """`base.Trainer` over the resident ranks of a `TrainerGroup` (discover/policy/trainer_group.py).

    It starts from the checkpoint adapter `adapter_dir` (and the Adam state a step is given), holds
    the files of the checkpoint its last step made, and writes them in `LoRATrainer.save`'s format.
    `sequence_logprobs` runs in this process on a `LoRATrainer` of the current adapter (loaded on
    first use: a step that only trains loads no model here).
    """

    def __init__(self, group: TrainerGroup, adapter_dir: Path):
        self.group = group
        self.model_config = group.model
        self.world_size = group.world_size
        self._adapter = Path(adapter_dir)
        self._state: Files | None = None  # the checkpoint files of the last step (`adapter/...`, `optimizer.pt`)
        self._local: LoRATrainer | None = None
        self._work = Path(tempfile.mkdtemp(prefix="discover-sharded-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._work), True)

    def _adapter_dir(self) -> Path:
        if self._state is None:
            return self._adapter
        folder = self._work / "adapter"
        if not folder.is_dir():
            write_files(self._work, {k: v for k, v in self._state.items() if k.startswith("adapter/")})
        return folder

    def _local_trainer(self) -> LoRATrainer:
        from discover.policy.trainer import LoRATrainer

        if self._local is None:
            self._local = LoRATrainer.load(self.model_config, self._adapter_dir())
        return self._local

    def sequence_logprobs(self, completions: list[Completion], with_adapter: bool = True, *, temperature: float) -> list[torch.Tensor]:
        """`LoRATrainer.sequence_logprobs` of the current adapter, in this process."""
        return self._local_trainer().sequence_logprobs(completions, with_adapter=with_adapter, temperature=temperature)

    def train_step(
        self, batch: TrainBatch, train: TrainConfig, *, temperature: float, optimizer_state: Path | None = None
    ) -> dict[str, float]:
        """One Adam step over the ranks; equal (to rounding) to `LoRATrainer.train_step` on the whole batch.
        Starts from Adam's state `optimizer_state` when that file exists, else from this trainer's own."""
        if len(batch.advantages) != len(batch.completions):
            raise ValueError(f"{len(batch.completions)} completions but {len(batch.advantages)} advantages")
        given = optimizer_state is not None and Path(optimizer_state).is_file()
        if self._state is not None and not given:
            state = self._state
        else:
            state = checkpoint_state(self._adapter_dir(), Path(optimizer_state) if given else None)  # type: ignore[arg-type]
        completions = list(batch.completions)
        shares = share_rollouts(completions, self.world_size)
        files = self.group.train_step(state, completions, list(batch.advantages), shares, train, temperature)
        stats = json.loads(files.pop("stats.json"))
        self._state, self._local = files, None
        shutil.rmtree(self._work / "adapter", ignore_errors=True)
        return stats

    def save(self, adapter_dir: Path, optimizer_path: Path | None = None) -> None:
        """Write the adapter (and Adam's state) atomically, in `LoRATrainer.save`'s format."""
        if self._state is None:  # nothing trained here yet: as a LoRATrainer saves
            self._local_trainer().save(adapter_dir, optimizer_path)
            return
        with atomic_dir(Path(adapter_dir)) as tmp:
            write_files(tmp, {k.removeprefix("adapter/"): v for k, v in self._state.items() if k.startswith("adapter/")})
        if optimizer_path is not None:
            with atomic_path(Path(optimizer_path)) as tmp_opt:
                tmp_opt.write_bytes(self._state["optimizer.pt"])
