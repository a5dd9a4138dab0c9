"""Generation replicas: R Ray actors, each holding one decode engine, behind the step's `Sampler` seam
(docs/cluster.md, "Generation replicas").

With `cluster.generation_replicas: R` (R > 1) the step's `generate` samples through a `ReplicaSampler`:
prompts are rendered and the two-phase completion (`two_phase.stream_two_phase`) is driven here,
in the step's process, exactly as for one engine, while the continuations are decoded by the
replicas (`ReplicaDecodeEngine`, an `engine.DecodeEngine`).

- **The actors** (`GenerationReplica`) are named `generate-<i>` in the Ray namespace `ttt-<run id>`,
  so a flow that restarts re-attaches to them (`ensure_replicas`); one whose specification
  (`ReplicaSpec`: the model section, the tensor-parallel size, the device, the code version of this
  module's closure) changed is killed and created again. On a cluster given by `cluster.address`
  they are detached (they outlive a flow process that dies, and are ended when the run finishes);
  on a Ray instance started for the run they end with it.
- **The engine.** On CPU (or with `model.backend: transformers`) a replica holds the transformers
  engine `hf_decode.HFDecodeEngine` on the step's adapter; with `model.backend: vllm` on GPUs,
  `vllm_backend.VLLMDecodeEngine` over `cluster.tensor_parallel_size` GPUs.
- **Spreading.** The vLLM engine seeds every request on its own, so submissions go to the replica
  of their group (prompt index i → replica i mod R: every continuation of one prompt meets its
  prefix cache) and the replicas decode in parallel. The transformers engine seeds each request
  too, but its logits move in the last bits with the rows decoded together (the oldest
  `model.decode_batch_size` queued continuations), which can change a sampled token; so its batches are
  formed here exactly as one engine forms them and each batch is decoded whole by one replica
  (round robin): the rollouts are those of the single-process path, bit for bit, and replicas add
  no parallelism inside a batch.
- **The adapter** of each step travels by path (shared storage) with its content hash
  (`storage.atomic.content_hash`); a replica checks the hash before loading and, on a mismatch
  (a copy not yet visible on its machine), waits and checks again `ADAPTER_CHECKS` times, then
  raises an error that names both hashes.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Hashable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from discover.config import ModelConfig, SamplingConfig
from discover.policy.base import Completion, Policy
from discover.policy.engine import PhaseOutput, PhaseRequest
from discover.policy.ray_driver import connected_ray
from storage.atomic import content_hash

if TYPE_CHECKING:
    from discover.run import Run

__all__ = [
    "GenerationReplica",
    "ReplicaDecodeEngine",
    "ReplicaSampler",
    "ReplicaSpec",
    "ensure_replicas",
    "generation_policy",
    "namespace",
    "replica_name",
]

log = logging.getLogger("discover")

ADAPTER_CHECKS = 5  # a replica checks an adapter's hash this many times before it gives up
ADAPTER_WAIT_S = 2.0  # seconds between two checks
Item = tuple[Hashable, PhaseRequest, float, int]  # a submission: key, request, temperature, seed


def namespace(run: Run) -> str:
    """The Ray namespace of a run's actors: its id (discover/run.py), so two runs never share one."""
    return f"ttt-{run.run_id}"


REPLICA_PREFIX = "generate-"


def replica_name(i: int) -> str:
    return f"{REPLICA_PREFIX}{i}"


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
    """Everything that fixes what a replica loads; a replica whose spec differs is created again."""

    model: dict[str, Any]
    tensor_parallel_size: int
    gpus: float  # Ray's GPU request of one replica (0 on CPU)
    share_gpus: bool
    resources: dict[str, float]  # custom Ray resources of one replica (cluster.replica_resources)
    code_version: str

    @classmethod
    def of(cls, run: Run) -> ReplicaSpec:
        from discover.code_version import module_closure, source_digest

        c, model = run.config.cluster, run.config.model
        gpus = 0.0 if model.device == "cpu" else (0.5 if c.share_gpus else float(c.tensor_parallel_size))
        return cls(
            model=model.model_dump(mode="json"),
            tensor_parallel_size=c.tensor_parallel_size,
            gpus=gpus,
            share_gpus=c.share_gpus,
            resources=dict(c.replica_resources),
            code_version=source_digest(module_closure(__name__)),
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------------------------------------
# The actor (runs on a node of the Ray cluster)


class GenerationReplica:
    """One decode engine with the step's adapter; made a Ray actor by `ensure_replicas`."""

    def __init__(self, spec: dict[str, Any]):
        self._spec = spec
        model = ModelConfig(**spec["model"])
        if spec["gpus"]:  # Ray shows the actor its own GPUs as cuda:0 .. cuda:tp-1
            tp = int(spec["tensor_parallel_size"])
            update: dict[str, Any] = {"device": "cuda:0"}
            if model.backend == "vllm":
                update["generation_devices"] = list(range(tp))
            model = model.model_copy(update=update)
        self.model = model
        self.loaded: tuple[str, str] | None = None  # (adapter path, its hash)
        self.engine: Any = None
        self.info: dict[str, Any] = {}
        self._sampler: Any = None

    def spec(self) -> dict[str, Any]:
        return self._spec

    def load(self, adapter_dir: str, sha256: str, context_tokens: int) -> dict[str, Any]:
        """The step's adapter, once its content hash is `sha256`; what the driver needs to know of the engine."""
        if self.loaded == (adapter_dir, sha256):
            return self.info
        for check in range(1, ADAPTER_CHECKS + 1):
            found = content_hash(Path(adapter_dir)) if Path(adapter_dir).exists() else None
            if found == sha256:
                break
            if check == ADAPTER_CHECKS:
                raise RuntimeError(
                    f"the adapter {adapter_dir} on this replica's machine has sha256 {found or '(missing)'}, not {sha256} as "
                    f"the step's process wrote it, after {ADAPTER_CHECKS} checks {ADAPTER_WAIT_S:.0f} s apart; the run "
                    "directory must be on storage every node shares, at the same path (docs/cluster.md)"
                )
            time.sleep(ADAPTER_WAIT_S)
        from discover.policy import load_policy

        policy = load_policy(self.model, Path(adapter_dir))
        if self.model.backend == "vllm":
            from discover.policy import vllm_engine
            from discover.policy.vllm_backend import VLLMDecodeEngine, eos_ids

            sampler = policy.sampler
            held = vllm_engine.engine(sampler.engine_spec(context_tokens))  # type: ignore[attr-defined]
            lora = sampler.lora_request()  # type: ignore[attr-defined]
            if lora is not None:
                vllm_engine.use_adapter(held, lora.lora_int_id)
            self.engine = VLLMDecodeEngine(held.llm, lora)
            self.info = {"mode": "stream", "eos_ids": sorted(eos_ids(sampler.path)), "max_context": None}  # type: ignore[attr-defined]
        else:
            from discover.policy.hf_decode import HFDecodeEngine

            sampler = policy.sampler
            hf: Any = sampler  # a TransformersSampler
            trainer = hf.trainer
            trainer.model.eval()
            eos = hf.eos_ids()
            self.engine = HFDecodeEngine(
                trainer.model, hf.tokenizer, trainer.device, eos, hf._max_positions(), self.model.decode_batch_size
            )
            self.info = {"mode": "batch", "eos_ids": sorted(eos), "max_context": self.engine.max_context}
        self._sampler = sampler
        self.loaded = (adapter_dir, sha256)
        return self.info

    def submit(self, items: list[Item]) -> None:
        for key, request, temperature, seed in items:
            self.engine.submit(key, request, temperature, seed)

    def poll(self) -> list[tuple[Hashable, PhaseOutput]]:
        return self.engine.poll()

    def decode_batch(self, items: list[Item]) -> list[tuple[Hashable, PhaseOutput]]:
        """One batch of the transformers engine, decoded whole (its queue holds nothing else)."""
        self.engine.cancel()
        self.submit(items)
        return self.engine.poll()

    def cancel(self) -> None:
        if self.engine is not None:
            self.engine.cancel()

    def release(self) -> None:
        """Generation of the step is over: with shared GPUs, vLLM sleeps until the next one."""
        if self._spec["share_gpus"] and self.model.backend == "vllm":
            from discover.policy import vllm_engine

            vllm_engine.sleep_if_held()


# ------------------------------------------------------------------------------------------------
# The driver's side (the step's process)


def _ray() -> Any:
    return connected_ray("cluster.generation_replicas > 1")


def ensure_replicas(run: Run) -> list[Any]:
    """The run's R replica actors: re-attached by name, or created (again, where the spec changed)."""
    ray = _ray()
    c = run.config.cluster
    spec = ReplicaSpec.of(run).as_dict()
    ns, detached = namespace(run), c.address is not None
    from discover.policy.run_workers import named_actors

    for name in named_actors(ray, ns, REPLICA_PREFIX):  # replicas of a larger R before: not needed now
        if int(name.removeprefix(REPLICA_PREFIX)) >= c.generation_replicas:
            ray.kill(ray.get_actor(name, namespace=ns), no_restart=True)
            log.info("generation replica %s/%s ended: the run has %d replicas now", ns, name, c.generation_replicas)
    actors = []
    for i in range(c.generation_replicas):
        name = replica_name(i)
        try:
            actor = ray.get_actor(name, namespace=ns)
        except ValueError:
            actor = None
        if actor is not None:
            try:
                current = ray.get(actor.spec.remote())
            except ray.exceptions.RayActorError as err:  # dead or unreachable (its node lost): replaced below
                log.warning("generation replica %s/%s is lost (%s); creating it again", ns, name, type(err).__name__)
                current = None
            if current == spec:
                actors.append(actor)
                continue
            if current is not None:
                log.info("generation replica %s/%s: its specification changed; creating it again", ns, name)
            ray.kill(actor, no_restart=True)
            _wait_gone(ray, name, ns)
        options: dict[str, Any] = {
            "name": name,
            "namespace": ns,
            "num_cpus": 1,
            "num_gpus": spec["gpus"],
            "max_restarts": 0,  # a lost replica is an error of the generate task, retried by Prefect (flows/tasks.py)
            "max_task_retries": 0,
            "resources": spec["resources"] or None,
        }
        if detached:
            options["lifetime"] = "detached"
        actors.append(ray.remote(GenerationReplica).options(**options).remote(spec))
        log.info("generation replica %s/%s created (%s GPUs)", ns, name, spec["gpus"] or "no")
    return actors


def _wait_gone(ray: Any, name: str, ns: str, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            ray.get_actor(name, namespace=ns)
        except ValueError:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the generation replica {ns}/{name} was killed but its name is still taken after {timeout:.0f} s")


def group_of(key: Hashable) -> int:
    """The prompt index of a two-phase key, (phase, (prompt index, index among its k))."""
    return int(key[1][0])  # type: ignore[index]


class ReplicaDecodeEngine:
    """`engine.DecodeEngine` over R replica actors (see the module: "Spreading")."""

    def __init__(self, actors: list[Any], mode: str, max_context: int | None, batch_size: int):
        self.ray = _ray()
        self.actors, self.mode, self.max_context = actors, mode, max_context
        self.batch_size = batch_size  # batch mode: model.decode_batch_size, as one engine batches
        self._queue: list[Item] = []  # batch mode: the one engine's queue
        self._outbox: dict[int, list[Item]] = {}  # stream mode: submissions not yet sent, by replica
        self._pending: dict[int, int] = {}  # stream mode: continuations a replica still owes
        self._polls: dict[Any, int] = {}  # stream mode: outstanding poll calls -> replica
        self._batches = itertools.count()

    def submit(self, key: Hashable, request: PhaseRequest, temperature: float, seed: int) -> None:
        item = (key, request, float(temperature), int(seed))
        if self.mode == "batch":
            self._queue.append(item)
        else:
            r = group_of(key) % len(self.actors)
            self._outbox.setdefault(r, []).append(item)
            self._pending[r] = self._pending.get(r, 0) + 1

    def poll(self) -> list[tuple[Hashable, PhaseOutput]]:
        if self.mode == "batch":
            if not self._queue:
                return []
            size = self.batch_size
            batch, self._queue = self._queue[:size], self._queue[size:]
            actor = self.actors[next(self._batches) % len(self.actors)]
            return self.ray.get(actor.decode_batch.remote(batch))
        for r, items in self._outbox.items():
            if items:
                self.actors[r].submit.remote(items)  # before its poll: an actor runs one caller's calls in order
        self._outbox = {}
        waiting = set(self._polls.values())
        for r, owed in self._pending.items():
            if owed and r not in waiting:
                self._polls[self.actors[r].poll.remote()] = r
        if not self._polls:
            return []
        ready, _ = self.ray.wait(list(self._polls), num_returns=1)
        done: list[tuple[Hashable, PhaseOutput]] = []
        for ref in ready:
            r = self._polls.pop(ref)
            out = self.ray.get(ref)
            self._pending[r] -= len(out)
            done += out
        return done

    def cancel(self) -> None:
        self._queue, self._outbox, self._pending = [], {}, {}
        if self._polls:
            self.ray.wait(list(self._polls), num_returns=len(self._polls))  # let running polls end before the cancel
            self._polls = {}
        self.ray.get([a.cancel.remote() for a in self.actors])


class ReplicaSampler:
    """`base.Sampler` whose decoding runs on the run's replicas; prompts rendered with the model's tokenizer here."""

    def __init__(self, run: Run, adapter_dir: Path):
        from transformers import AutoTokenizer

        from discover.policy.resident import resolve_model_path

        self.run, self.adapter_dir = run, Path(adapter_dir)
        self.model_config = run.config.model
        self.tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(self.model_config.name))
        self.actors: list[Any] = []

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def sample_stream(
        self, prompts: list[str], n: int, sampling: SamplingConfig, seed: int, skip: frozenset[tuple[int, int]] = frozenset()
    ) -> Iterator[tuple[int, int, Completion]]:
        """`base.Sampler.sample_stream` on the replicas (none for the keys in `skip`)."""
        from discover.policy.chat_format import chat_format_for
        from discover.policy.two_phase import stream_two_phase

        ray = _ray()
        self.actors = ensure_replicas(self.run)
        sha = content_hash(self.adapter_dir)
        infos = ray.get([a.load.remote(str(self.adapter_dir.resolve()), sha, sampling.context_tokens) for a in self.actors])
        info = infos[0]
        fmt = chat_format_for(self.tokenizer, sampling.think_end)
        kwargs = self.model_config.chat_template_kwargs
        rendered = [fmt.render(self.tokenizer, p, thinking=sampling.think_end is not None, **kwargs) for p in prompts]
        engine = ReplicaDecodeEngine(self.actors, info["mode"], info["max_context"], self.model_config.decode_batch_size)
        eos = set(info["eos_ids"])
        stream = stream_two_phase(engine, rendered, n, sampling, seed, fmt, encode=self.encode, decode=self.decode, eos_ids=eos, skip=skip)
        return self._released_after(stream)

    def _released_after(self, stream: Iterator[tuple[int, int, Completion]]) -> Iterator[tuple[int, int, Completion]]:
        try:
            yield from stream
        finally:  # the step's generation is over (or abandoned): with shared GPUs vLLM sleeps until the next
            ray = _ray()
            try:
                ray.get([a.release.remote() for a in self.actors])
            except ray.exceptions.RayActorError as err:  # a replica lost: the step's error is the one that matters
                log.warning("a generation replica could not be released (%s)", type(err).__name__)

    def while_training(self) -> AbstractContextManager[None]:
        """The replicas are other processes: nothing here to hand back."""
        return nullcontext()


def generation_policy(run: Run, adapter_dir: Path) -> Policy:
    """The policy `generate` samples from: `load_policy` in this process (one replica), or a
    `ReplicaSampler` over the run's replicas with the trainer loaded here only if something asks."""
    from discover.policy import load_policy

    config = run.config
    if config.cluster.generation_replicas == 1:
        return load_policy(config.model, adapter_dir)
    return Policy(ReplicaSampler(run, adapter_dir), lambda: load_policy(config.model, adapter_dir).trainer)
