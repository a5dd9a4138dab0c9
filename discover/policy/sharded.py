"""Data-parallel training over W ranks with FSDP2 (docs/cluster.md): what each rank of the resident
trainer group (discover/policy/trainer_group.py) does with the model and Adam's state.

* Each rank holds the base model with the LoRA adapter, shards every decoder layer and then the
  root, `trainer.LogprobForward` (`fully_shard`), and runs Adam over its shards of the LoRA parameters.
* The rollouts are shared out deterministically (`share_rollouts`: longest first, each to the rank
  with the fewest tokens so far); each rank accumulates gradients over its micro-batches
  (`trainer.accumulate_gradients` with `distributed=True`, which keeps the ranks' collectives in
  step, centres the KL term over every rank's tokens and reduces the statistics over the ranks).
* Normalisation: the loss is a SUM over the batch's tokens (docs/method.md §2), while FSDP averages
  gradients over the ranks by default. The reduction here is a plain sum instead (gradient divide
  factor 1, sum-only collectives), so the reduced gradient is the sum of the ranks' sums: one
  process's gradient. Nothing is multiplied by W.
* Rank 0 gathers the full adapter and Adam's state (`DTensor.full_tensor`, `full_optimizer_state`)
  in `LoRATrainer.save`'s format (the adapter folder and `optimizer.pt` keyed by parameter index),
  and a one-process state loads into the shards (`load_full_optimizer_state`), so a run can move
  between one process and W ranks at any checkpoint.
"""

from __future__ import annotations

import torch

from discover.policy.base import Completion


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
