"""Data-parallel training over W ranks on one machine with FSDP2 (docs/cluster.md): `ShardedTrainer`,
the `base.Trainer` that `cluster.trainer_world_size` > 1 puts behind the step's policy.

* Every `train_step` spawns W processes (`torch.multiprocessing`, start method spawn) that join one
  process group on the loopback (127.0.0.1, a free port): gloo on CPU, nccl on CUDA with one GPU a
  rank. Each rank loads the base model with the adapter of the step's checkpoint (the same files a
  one-process step reads), shards every decoder layer and then the root, `trainer.LogprobForward`
  (`fully_shard`), and builds Adam over its shards of the LoRA parameters.
* The rollouts are shared out deterministically (`share_rollouts`: longest first, each to the rank
  with the fewest tokens so far); each rank accumulates gradients over its micro-batches
  (`trainer.accumulate_gradients` with `distributed=True`, which keeps the ranks' collectives in
  step, centres the KL term over every rank's tokens and reduces the statistics over the ranks).
* Normalisation: the loss is a SUM over the batch's tokens (docs/method.md §2), while FSDP averages
  gradients over the ranks by default. The reduction here is a plain sum instead (gradient divide
  factor 1, sum-only collectives), so the reduced gradient is the sum of the ranks' sums: one
  process's gradient. Nothing is multiplied by W.
* Rank 0 gathers the full adapter and Adam's state (`DTensor.full_tensor`) and writes them in
  `LoRATrainer.save`'s format (the adapter folder and `optimizer.pt` keyed by parameter index), so
  a run can move between one process and W ranks at any checkpoint.

* Across machines (`cluster.trainer_placement: ray`, discover/policy/ray_ranks.py): the same
  `_rank_main` runs in W Ray actors of a placement group, meeting at rank 0's node; the adapter and
  Adam's state travel through Ray's object store. Not built: ranks that keep the model resident
  between steps (both ways load it every step).
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from discover.config import ModelConfig, TrainConfig
from discover.policy.base import Completion, Policy, TrainBatch
from discover.policy.placement import pick_device
from storage.atomic import atomic_dir, atomic_path

if TYPE_CHECKING:  # torch.distributed and the trainer are imported in the ranks and on first use
    from discover.policy.trainer import LoRATrainer


def rank_devices(model: ModelConfig, world_size: int) -> list[torch.device]:
    """The device of each rank: CPU for every rank on CPU; on CUDA one GPU a rank,
    `model.training_devices` when set (one a rank), else cuda:0 .. cuda:W-1."""
    if model.training_devices is not None:
        if len(model.training_devices) != world_size:
            raise ValueError(
                f"model.training_devices lists {len(model.training_devices)} GPU(s) but cluster.trainer_world_size is "
                f"{world_size}: list one GPU a rank, or leave model.training_devices null to use cuda:0 .. cuda:{world_size - 1}"
            )
        indices = list(model.training_devices)
    elif pick_device(model.device).type == "cpu":
        return [torch.device("cpu")] * world_size
    else:
        indices = list(range(world_size))
    visible = torch.cuda.device_count()
    if max(indices) >= visible:
        raise ValueError(
            f"cluster.trainer_world_size {world_size} needs one GPU a rank (CUDA devices {indices}) but {visible} "
            f"{'is' if visible == 1 else 'are'} visible here: lower cluster.trainer_world_size to at most {visible}, "
            "or make more GPUs visible (CUDA_VISIBLE_DEVICES)"
        )
    return [torch.device(f"cuda:{i}") for i in indices]


def share_rollouts(completions: list[Completion], world_size: int) -> list[list[int]]:
    """The indices of each rank's rollouts: longest first (ties: lower index first), each to the rank
    with the fewest tokens so far (ties: the lower rank); each rank's list in index order. Deterministic."""
    lengths = [len(c.prompt_ids) + len(c.completion_ids) for c in completions]
    loads = [0] * world_size
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(completions)), key=lambda i: (-lengths[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        shares[rank].append(i)
        loads[rank] += lengths[i]
    return [sorted(s) for s in shares]


def decoder_layers(lm: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a transformers CausalLM (the classes it names in `_no_split_modules`)."""
    names = set(getattr(lm, "_no_split_modules", None) or [])
    layers = [m for m in lm.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"no decoder layers found in {type(lm).__name__} (it names none in _no_split_modules): sharded training "
            "needs a transformers CausalLM with decoder layers; set cluster.trainer_world_size: 1"
        )
    return layers


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 over `model` (a peft model): every decoder layer, then the root, a `LogprobForward` of the
    model (its forward is the whole log-prob pass, so the embeddings and output layer are gathered
    for it). Gradients are SUMMED over the ranks (divide factor 1, sum-only collectives): the loss is
    a sum over the batch's tokens, and the sum of the ranks' gradients is the one-process gradient."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    from discover.policy.trainer import LogprobForward, causal_lm

    for layer in decoder_layers(causal_lm(model)):
        fully_shard(layer)
    root = LogprobForward(model)
    fully_shard(root)
    for m in root.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # a sum, not FSDP's default mean over the ranks
            m.set_force_sum_reduction_for_comms(True)  # ReduceOp.SUM (gloo has no pre-multiplied sum)
    return root


def _full(t):
    """A DTensor gathered in full (a collective: every rank calls it in the same order); others as they are."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def full_optimizer_state(opt: torch.optim.Optimizer) -> dict:
    """Adam's state dict with every sharded tensor gathered: `LoRATrainer.save`'s format."""
    sd = opt.state_dict()
    state = {i: {k: _full(v) for k, v in sd["state"][i].items()} for i in sorted(sd["state"])}
    return {"state": state, "param_groups": sd["param_groups"]}


def load_full_optimizer_state(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], sd: dict) -> None:
    """Load a one-process Adam state (`LoRATrainer.save`'s format) into `opt` over the sharded `params`:
    each rank keeps its shard of every full tensor (no communication)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    saved = [i for g in sd["param_groups"] for i in g["params"]]
    if len(saved) != len(params):
        raise ValueError(
            f"the optimizer state has {len(saved)} parameters but the adapter has {len(params)}: "
            "it belongs to another adapter (rank or target modules); start from a checkpoint whose optimizer.pt matches"
        )
    state = {}
    for i, st in sd["state"].items():
        p = params[int(i)]
        state[i] = {
            k: distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
            if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and k != "step" and v.shape == p.shape
            else v
            for k, v in st.items()
        }
    opt.load_state_dict({"state": state, "param_groups": sd["param_groups"]})


@dataclass
class _Job:
    """What every rank needs for one step (pickled to the spawned processes)."""

    model: ModelConfig
    adapter_dir: Path | None
    seed: int
    optimizer_state: Path | None
    completions: list[Completion]
    advantages: list[float]
    shares: list[list[int]]
    train: TrainConfig
    temperature: float
    out_dir: Path
    master: str  # rank 0's HOST:PORT, where the ranks meet (the loopback here; its node's address on Ray)
    devices: list[str]
    threads: int


def _rank_main(rank: int, job: _Job) -> None:
    """One rank of a sharded step (a spawned process); rank 0 writes adapter/, optimizer.pt and stats.json."""
    import torch.distributed as dist

    from discover.policy.trainer import LoRATrainer, accumulate_gradients

    world = len(job.devices)
    device = torch.device(job.devices[rank])
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(job.threads)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://{job.master}",
        rank=rank,
        world_size=world,
        device_id=device if cuda else None,
    )
    try:
        config = job.model.model_copy(update={"device": str(device), "training_devices": None})
        trainer = LoRATrainer.load(config, job.adapter_dir, seed=job.seed, devices=[device])
        root = shard(trainer.model)
        params = trainer.lora_parameters()
        train = job.train
        b1, b2 = train.adam_betas
        opt = torch.optim.Adam(params, lr=train.learning_rate, betas=(b1, b2), eps=train.adam_eps, fused=cuda or None)
        if job.optimizer_state is not None:
            load_full_optimizer_state(opt, params, torch.load(job.optimizer_state, map_location=device, weights_only=True))
            for g in opt.param_groups:
                g.update(lr=train.learning_rate, betas=tuple(train.adam_betas), eps=train.adam_eps)
        mine = job.shares[rank]
        opt.zero_grad(set_to_none=True)
        trainer.model.train()  # gradient checkpointing is active in training mode; dropout is off
        try:
            stats = accumulate_gradients(
                trainer.model,
                [job.completions[i] for i in mine],
                [job.advantages[i] for i in mine],
                kl_coef=train.kl_coef,
                temperature=job.temperature,
                micro_batch_tokens=config.micro_batch_tokens,
                pad_id=trainer._pad_id(),
                ratio_cap=train.importance_ratio_cap,
                kl_center=train.kl_center,
                forward=root,
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
        adapter = {name: _full(p.detach()).cpu() for name, p in trainer.model.named_parameters() if p.requires_grad}
        optimizer = full_optimizer_state(opt)
        if rank == 0:
            trainer.model.save_pretrained(str(job.out_dir / "adapter"), safe_serialization=True, state_dict=adapter)
            torch.save(optimizer, job.out_dir / "optimizer.pt")
            (job.out_dir / "stats.json").write_text(json.dumps(stats))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ShardedTrainer:
    """`base.Trainer` over `world_size` data-parallel ranks (FSDP2) on this machine.

    It holds the adapter as files: the checkpoint's it was built from (None: a new one from `seed`,
    the same on every rank), then the one its last step wrote; Adam's state likewise (as a
    `LoRATrainer` keeps it in memory between steps). `sequence_logprobs` runs in this process on a
    `LoRATrainer` of the current adapter (loaded on first use).
    """

    def __init__(self, model: ModelConfig, adapter_dir: Path | None, world_size: int, seed: int = 0):
        if world_size < 1:
            raise ValueError(f"cluster.trainer_world_size must be >= 1, got {world_size}")
        self.model_config = model
        self.world_size = world_size
        self.seed = seed
        self.devices = self._rank_devices()
        self._adapter = Path(adapter_dir) if adapter_dir is not None else None
        self._optimizer: Path | None = None
        self._local: LoRATrainer | None = None
        self._steps = 0
        self._work = Path(tempfile.mkdtemp(prefix="discover-sharded-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._work), True)

    def _local_trainer(self) -> LoRATrainer:
        from discover.policy.trainer import LoRATrainer

        if self._local is None:
            self._local = LoRATrainer.load(self.model_config, self._adapter, seed=self.seed)
        return self._local

    def sequence_logprobs(self, completions: list[Completion], with_adapter: bool = True, *, temperature: float) -> list[torch.Tensor]:
        """`LoRATrainer.sequence_logprobs` of the current adapter, in this process."""
        return self._local_trainer().sequence_logprobs(completions, with_adapter=with_adapter, temperature=temperature)

    def train_step(
        self, batch: TrainBatch, train: TrainConfig, *, temperature: float, optimizer_state: Path | None = None
    ) -> dict[str, float]:
        """One Adam step over the ranks; equal (to rounding) to `LoRATrainer.train_step` on the whole batch."""
        if len(batch.advantages) != len(batch.completions):
            raise ValueError(f"{len(batch.completions)} completions but {len(batch.advantages)} advantages")
        state = Path(optimizer_state) if optimizer_state is not None and Path(optimizer_state).is_file() else self._optimizer
        out = self._work / f"step-{self._steps}"
        out.mkdir()
        self._steps += 1
        job = _Job(
            model=self.model_config,
            adapter_dir=self._adapter,
            seed=self.seed,
            optimizer_state=state,
            completions=list(batch.completions),
            advantages=[float(a) for a in batch.advantages],
            shares=share_rollouts(list(batch.completions), self.world_size),
            train=train,
            temperature=float(temperature),
            out_dir=out,
            master=f"127.0.0.1:{free_port()}",
            devices=[str(d) for d in self.devices],
            threads=max(1, torch.get_num_threads() // self.world_size),
        )
        self._launch(job)
        stats = json.loads((out / "stats.json").read_text())
        self._adapter, self._optimizer, self._local = out / "adapter", out / "optimizer.pt", None
        return stats

    def _rank_devices(self) -> list[torch.device]:
        """Each rank's device (`rank_devices`: GPUs of this machine)."""
        return rank_devices(self.model_config, self.world_size)

    def _launch(self, job: _Job) -> None:
        """Run the step's ranks: W processes spawned on this machine, rank 0 writing to `job.out_dir`."""
        import torch.multiprocessing as mp

        mp.spawn(_rank_main, args=(job,), nprocs=self.world_size, join=True)

    def save(self, adapter_dir: Path, optimizer_path: Path | None = None) -> None:
        """Write the adapter (and Adam's state) atomically, in `LoRATrainer.save`'s format."""
        if self._adapter is None or self._optimizer is None:  # nothing trained here yet: as a LoRATrainer saves
            self._local_trainer().save(adapter_dir, optimizer_path)
            return
        adapter = self._adapter
        with atomic_dir(Path(adapter_dir)) as tmp:
            shutil.copytree(adapter, tmp, dirs_exist_ok=True)
        if optimizer_path is not None:
            with atomic_path(Path(optimizer_path)) as tmp_opt:
                shutil.copyfile(self._optimizer, tmp_opt)


def sharded_policy(policy: Policy, trainer: ShardedTrainer) -> Policy:
    """`policy`'s sampler with a sharded trainer: what a step trains with when `cluster.trainer_world_size`
    > 1 (the sampler still makes room while training)."""
    return Policy(policy.sampler, lambda: trainer)
