"""The LoRA trainer every policy backend shares (`LoRATrainer`), and its step (docs/method.md §2), sized for
512 rollouts of 32k tokens.

* `LoRATrainer` wraps the resident base model (`resident.py`) with the step's adapter and does
  what `base.Trainer` names: log-probabilities, one Adam step on the LoRA parameters
  (`accumulate_gradients`, then the step), saving the adapter atomically.

* Micro-batches by token count (`packing.pack_by_tokens`), gradients accumulated over them: the
  loss is a sum over tokens, so the step equals the unsplit one.
* Rows are right-padded and attention is plain causal: a padding token comes after every real
  token of its row, so it never influences one, and the fast causal attention kernels apply.
* Log-probabilities come from the last hidden states through the output layer in chunks of rows,
  each chunk recomputed in the backward pass: a 32k x 152k logits tensor never exists.
* Gradient checkpointing on the decoder layers (when enabled on the model) keeps one layer's
  activations at a time; dropout is off everywhere, so learner and sampler see one function.
* The KL term's base log-probs come from the same model with the adapter disabled (docs/method.md §2).
* The importance ratio exp(logp_learner - logp_sampler) is reported per step (mean, max, mean
  absolute log-prob gap) and optionally truncated (`train.importance_ratio_cap`).
* The LoRA parameters (and so Adam's state) are float32 by default; `model.lora_dtype: bfloat16`
  keeps them in bfloat16 (half the adapter's memory, bf16 matmuls in the adapter's path).
* With `model.offload_while_generating` the vLLM sampler parks this trainer's tensors in CPU memory
  before vLLM generates (`offload.py`); everything here that computes or saves brings them back first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from discover.config import ModelConfig, TrainConfig
from discover.objectives import batch_kl_mean, batch_kl_sum, importance_sampling_loss, kl_shaped_advantages
from discover.policy import offload
from discover.policy.base import Completion, TrainBatch
from discover.policy.packing import pack_by_tokens, padded_tokens
from discover.policy.placement import training_devices
from discover.policy.resident import load_base, resolve_model_path, share_weights_copy
from storage.atomic import atomic_dir, atomic_path

LOGIT_CHUNK_ELEMENTS = 2**27  # rows x vocabulary per chunk of the output layer (512 MiB in float32)


def causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers CausalLM inside a peft model (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def disable_dropout(model: torch.nn.Module) -> None:
    """Dropout off in every module, so training mode (needed for checkpointing) computes the sampler's function."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0


def _chunk_logprobs(
    head: torch.nn.Module, h: torch.Tensor, targets: torch.Tensor, temperature: float, softcap: float | None
) -> torch.Tensor:
    logits = head(h).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits / temperature  # docs/method.md §2/§4: log-probs under the temperature-scaled distribution
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


class LogprobForward(torch.nn.Module):
    """Everything one log-prob pass runs, as one module: the model's body over the right-padded rows,
    then the output layer on the completion positions in chunks (`token_logprobs`).

    One module whose forward covers the whole pass is what FSDP's root needs (`sharded.py` shards the
    decoder layers, then this module): the embeddings, final norm and output layer (tied or not) are
    gathered for the pass and only for it.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model  # a peft model (or a plain CausalLM)

    def forward(self, ids: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, temperature: float) -> torch.Tensor:
        """Log-probs (float32, flat) of token ids[rows, cols + 1] given everything before it in its row."""
        lm = causal_lm(self.model)
        body = getattr(lm, lm.base_model_prefix)
        head = lm.get_output_embeddings()
        softcap = getattr(lm.config, "final_logit_softcapping", None)
        # (B, W, h): causal attention; the mask is all ones (padding sits after every real token of its
        # row, so it cannot influence one), which keeps the fast causal kernels
        hidden = body(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).last_hidden_state
        rows, cols = rows.to(hidden.device), cols.to(hidden.device)
        h = hidden[rows, cols]
        targets = ids.to(hidden.device)[rows, cols + 1]
        vocab = head.weight.shape[0]
        chunk = max(1, LOGIT_CHUNK_ELEMENTS // vocab)
        parts = []
        for s in range(0, h.shape[0], chunk):
            hs, ts = h[s : s + chunk], targets[s : s + chunk]
            if torch.is_grad_enabled() and hs.requires_grad:
                parts.append(checkpoint(_chunk_logprobs, head, hs, ts, temperature, softcap, use_reentrant=False))
            else:
                parts.append(_chunk_logprobs(head, hs, ts, temperature, softcap))
        return torch.cat(parts)


def token_logprobs(
    model: torch.nn.Module, completions: list[Completion], temperature: float, pad_id: int, forward: torch.nn.Module | None = None
) -> list[torch.Tensor]:
    """Per-token log-probs of each completion given its prompt, in one right-padded pass.

    With grad enabled the graph is kept (the output layer chunk-wise recomputed); float32 results.
    `forward` is the `LogprobForward` of `model` to run (sharded training passes its FSDP root);
    None: a plain one.
    """
    if not completions:
        return []
    lm = causal_lm(model)
    device = lm.get_input_embeddings().weight.device
    seqs = [list(c.prompt_ids) + list(c.completion_ids) for c in completions]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s, dtype=torch.long)
    ids = ids.to(device)
    counts = [len(c.completion_ids) for c in completions]
    if sum(counts) == 0:
        return [torch.zeros(0, device=device) for _ in completions]
    rows = torch.cat([torch.full((n,), b, dtype=torch.long) for b, n in enumerate(counts)])
    # position p predicts token p + 1: the completion of row b starts at len(prompt_b)
    cols = torch.cat([torch.arange(len(c.prompt_ids) - 1, len(c.prompt_ids) - 1 + n) for c, n in zip(completions, counts)])
    run = forward if forward is not None else LogprobForward(model)
    return list(run(ids, rows, cols, temperature).split(counts))


@dataclass
class _Totals:
    loss: float = 0.0
    tokens: int = 0
    ratio_sum: float = 0.0
    ratio_max: float = 0.0
    capped: int = 0
    gap_sum: float = 0.0
    kl_sum: float = 0.0


def _all_reduce(values: list[float], op: str, device: torch.device) -> list[float]:
    """`values` summed ("sum") or maximised ("max") over the ranks of the default process group, in float64."""
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()


def accumulate_gradients(
    model: torch.nn.Module,
    completions: list[Completion],
    advantages: list[float],
    *,
    kl_coef: float,
    temperature: float,
    micro_batch_tokens: int,
    pad_id: int,
    ratio_cap: float | None = None,
    kl_center: bool = False,
    forward: torch.nn.Module | None = None,
    distributed: bool = False,
) -> dict[str, Any]:
    """Backward of the step's loss (docs/method.md §2) into the adapter's .grad, micro-batch by micro-batch.

    Rollouts with no trainable token, or with a zero advantage and no KL term, contribute nothing
    and are skipped. With `kl_center` the base model's log-probs of every micro-batch are computed
    first, and the KL term is centred on their batch mean (the released code). Returns the step's
    statistics (the caller steps the optimizer).

    `distributed` (sharded training, `sharded.py`): `completions` are this rank's share of the batch
    and `forward` the FSDP root. Every rank then runs as many micro-batches as the rank with the
    most (the others add passes of weight zero: each pass gathers parameters collectively), the KL
    centre is the mean over every rank's tokens, and the statistics are the sums (maxima) over the
    ranks, so they equal one process's; only `micro_batches` and `padded_tokens` describe the ranks'
    own packing (summed).
    """
    chosen = [
        (c, float(a)) for c, a in zip(completions, advantages, strict=True) if any(c.loss_mask) and not (float(a) == 0.0 and kl_coef == 0.0)
    ]
    lengths = [len(c.prompt_ids) + len(c.completion_ids) for c, _ in chosen]
    batches: list[list[int] | None] = pack_by_tokens(lengths, micro_batch_tokens) if chosen else []  # type: ignore[assignment]
    real = len(batches)
    t = _Totals()
    comm_device = causal_lm(model).get_input_embeddings().weight.device
    if distributed:  # every rank runs the same number of passes (None: a pass of weight zero)
        most = int(_all_reduce([float(real)], "max", comm_device)[0])
        batches += [None] * (most - real)
    # a pass of weight zero: one pad token after a one-token prompt, its loss multiplied by 0
    blank = Completion(prompt_ids=[pad_id], completion_ids=[pad_id], sampler_logprobs=[0.0], loss_mask=[1], text="", answer="")

    def members(batch: list[int] | None) -> list[Completion]:
        return [blank] if batch is None else [chosen[i][0] for i in batch]

    def base_logprobs(comps: list[Completion]) -> torch.Tensor:
        with torch.no_grad(), model.disable_adapter():  # docs/method.md §2: pi_0 is the base model, LoRA off
            return torch.cat(token_logprobs(model, comps, temperature, pad_id, forward)).float().cpu()

    def sampler_logprobs(comps: list[Completion]) -> tuple[torch.Tensor, torch.Tensor]:
        mask = torch.tensor([m for c in comps for m in c.loss_mask], dtype=torch.bool)
        return mask, torch.tensor([x for c in comps for x in c.sampler_logprobs], dtype=torch.float32)

    center, base_first = 0.0, {}
    if kl_coef > 0 and kl_center:  # released code: the KL term's mean over the batch's tokens is removed
        for b, batch in enumerate(batches):
            base_first[b] = base_logprobs(members(batch))
        masks, samplers = zip(*(sampler_logprobs(members(batch)) for batch in batches[:real])) if real else ((), ())
        if distributed:  # the mean over every rank's tokens: sums and counts added over the ranks first
            total, count = _all_reduce(list(batch_kl_sum(samplers, [base_first[b] for b in range(real)], masks)), "sum", comm_device)
            center = total / count if count else 0.0
        else:
            center = batch_kl_mean(samplers, [base_first[b] for b in range(real)], masks)
    for b, batch in enumerate(batches):
        comps = members(batch)
        mask, lp_s = sampler_logprobs(comps)
        adv = torch.tensor([0.0] if batch is None else [chosen[i][1] for i in batch for _ in chosen[i][0].completion_ids])
        if kl_coef > 0:
            lp_b = base_first[b] if b in base_first else base_logprobs(comps)
        if distributed and forward is not None:  # gradients reduced across ranks once, after the last pass
            forward.set_requires_gradient_sync(b == len(batches) - 1)
        lp_l = torch.cat(token_logprobs(model, comps, temperature, pad_id, forward))
        dev = lp_l.device
        mask, lp_s, adv = mask.to(dev), lp_s.to(dev), adv.to(dev)
        lp_b = lp_b.to(dev) if kl_coef > 0 else lp_s
        token_adv = kl_shaped_advantages(adv, lp_s, lp_b, kl_coef, center)  # docs/method.md §2: A_n - lambda (log pi - log pi_0)
        loss = importance_sampling_loss(lp_l, lp_s, token_adv, mask, ratio_cap=ratio_cap)
        if batch is None:
            (loss * 0.0).backward()  # zero gradient: keeps this rank's collectives in step with the others'
            continue
        loss.backward()
        with torch.no_grad():
            diff = (lp_l.detach() - lp_s)[mask]
            ratio = torch.exp(diff)
            t.loss += float(loss.detach())
            t.tokens += int(mask.sum())
            t.ratio_sum += float(ratio.sum())
            t.ratio_max = max(t.ratio_max, float(ratio.max())) if ratio.numel() else t.ratio_max
            t.capped += int((ratio > ratio_cap).sum()) if ratio_cap is not None else 0
            t.gap_sum += float(diff.abs().sum())
            t.kl_sum += float((lp_s - lp_b)[mask].sum()) if kl_coef > 0 else 0.0
    trained, skipped, padded = len(chosen), len(completions) - len(chosen), padded_tokens(lengths, batches[:real])
    if distributed:  # the whole batch's statistics: sums over the ranks (the largest ratio: the maximum)
        sums = [t.loss, t.tokens, t.ratio_sum, t.capped, t.gap_sum, t.kl_sum, trained, skipped, real, padded]
        t.loss, tokens, t.ratio_sum, capped, t.gap_sum, t.kl_sum, trained, skipped, real, padded = _all_reduce(sums, "sum", comm_device)
        t.tokens, t.capped = int(tokens), int(capped)
        t.ratio_max = _all_reduce([t.ratio_max], "max", comm_device)[0]
    n = t.tokens
    return {
        "loss": t.loss,
        "tokens": float(n),
        "trained": float(trained),
        "skipped": float(skipped),
        "micro_batches": float(real),
        "padded_tokens": float(padded),
        "mean_ratio": t.ratio_sum / n if n else 1.0,
        "max_ratio": t.ratio_max if n else 1.0,
        "ratio_capped_fraction": t.capped / n if n else 0.0,
        "logprob_gap": t.gap_sum / n if n else 0.0,  # mean |logp_learner - logp_sampler| per token
        "kl": t.kl_sum / n if (n and kl_coef > 0) else math.nan,
    }


class LoRATrainer:
    """One LoRA adapter (trainable) on the resident base model, on transformers + peft: the
    `base.Trainer` of every policy backend (docs/architecture.md, "A policy backend")."""

    def __init__(self, tokenizer, model, model_config: ModelConfig):
        self.tokenizer = tokenizer
        self.model = model  # a peft PeftModel
        self.device = model.get_base_model().get_input_embeddings().weight.device
        self.model_config = model_config
        self._optimizer: torch.optim.Optimizer | None = None
        self._train_config: TrainConfig | None = None
        offload.register(self)

    def parkable_tensors(self) -> list[tuple[torch.Tensor, bool]]:
        """(tensor, frozen) for everything this trainer keeps on its device: the model's parameters and
        buffers (the base model's are shared with `resident.BASE_CACHE`) and Adam's state."""
        out = [(p, not p.requires_grad) for p in self.model.parameters()]
        out += [(b, True) for b in self.model.buffers()]
        if self._optimizer is not None:
            for state in self._optimizer.state.values():
                out += [(v, False) for v in state.values() if isinstance(v, torch.Tensor)]
        return out

    @classmethod
    def load(
        cls, model: ModelConfig, adapter_dir: Path | None = None, seed: int = 0, devices: list[torch.device] | None = None
    ) -> LoRATrainer:
        """The resident base model (loaded on first use) with the adapter of `adapter_dir` or a new one."""
        path = resolve_model_path(model.name)
        devices = devices or training_devices(model)
        offload.unpark_all()  # the resident base model back on its device, if it was parked
        tokenizer, base = load_base(path, model.dtype, devices)
        return cls.on_base(tokenizer, base, model, adapter_dir, seed, devices)

    @classmethod
    def on_base(
        cls, tokenizer, base, model: ModelConfig, adapter_dir: Path | None = None, seed: int = 0, devices: list[torch.device] | None = None
    ) -> LoRATrainer:
        """The adapter of `adapter_dir` (or a new one) over `base`, a model already in memory whose
        frozen weights it shares (`load` passes the resident one; a benchmark, one it built)."""
        from peft import LoraConfig, PeftModel, get_peft_model

        devices = devices or training_devices(model)
        local = share_weights_copy(base)
        disable_dropout(local)
        if adapter_dir is not None:
            adapter_dir = Path(adapter_dir)
            if not (adapter_dir / "adapter_config.json").is_file():
                raise FileNotFoundError(f"no LoRA adapter in {adapter_dir} (adapter_config.json missing)")
            peft_model = PeftModel.from_pretrained(local, str(adapter_dir), is_trainable=True)
        else:
            targets = model.target_modules
            lora = LoraConfig(
                r=model.lora_rank,
                lora_alpha=model.lora_alpha if model.lora_alpha is not None else model.lora_rank,
                lora_dropout=0.0,
                target_modules=targets if isinstance(targets, str) else list(targets),
                bias="none",
                task_type="CAUSAL_LM",
                fan_in_fan_out=getattr(base.config, "model_type", "") == "gpt2",  # GPT-2 uses Conv1D
            )
            cuda = [d for d in devices if d.type == "cuda"]
            with torch.random.fork_rng(devices=cuda):
                torch.manual_seed(seed)
                peft_model = get_peft_model(local, lora)
        if model.lora_dtype != "float32":  # peft keeps adapters in float32 (autocast_adapter_dtype); cast them
            lora_dtype = getattr(torch, model.lora_dtype)
            for p in peft_model.parameters():
                if p.requires_grad:
                    p.data = p.data.to(lora_dtype)
        if len(devices) == 1:
            peft_model.to(devices[0])
        if model.gradient_checkpointing:
            peft_model.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        peft_model.eval()  # no dropout anywhere: learner and sampler see the same function
        return cls(tokenizer, peft_model, model)

    def lora_parameters(self) -> list[torch.nn.Parameter]:
        return [p for _, p in self.model.named_parameters() if p.requires_grad]

    def _pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def sequence_logprobs(self, completions: list[Completion], with_adapter: bool = True, *, temperature: float) -> list[torch.Tensor]:
        """Per-token log-probs of each completion given its prompt, scaled by the sampling `temperature`.

        With the adapter the graph is kept (when grad is enabled); without it (base model) nothing
        is tracked.
        """
        offload.unpark_all()
        temp = float(temperature)
        lengths = [len(c.prompt_ids) + len(c.completion_ids) for c in completions]
        out: list[torch.Tensor | None] = [None] * len(completions)
        for batch in pack_by_tokens(lengths, self.model_config.micro_batch_tokens):
            comps = [completions[i] for i in batch]
            if with_adapter:
                lps = token_logprobs(self.model, comps, temp, self._pad_id())
            else:
                with torch.no_grad(), self.model.disable_adapter():
                    lps = [t.detach() for t in token_logprobs(self.model, comps, temp, self._pad_id())]
            for i, lp in zip(batch, lps, strict=True):
                out[i] = lp
        return out  # type: ignore[return-value]

    def _ensure_optimizer(self, train: TrainConfig) -> torch.optim.Optimizer:
        hyper = dict(lr=train.learning_rate, betas=tuple(train.adam_betas), eps=train.adam_eps)
        if self._optimizer is None or self._train_config != train:
            state = self._optimizer.state_dict() if self._optimizer is not None else None
            params = self.lora_parameters()
            fused = all(p.device.type == "cuda" for p in params)
            self._optimizer = torch.optim.Adam(params, **hyper, fused=fused or None)
            if state is not None:
                self._optimizer.load_state_dict(state)
                for g in self._optimizer.param_groups:
                    g.update(hyper)
            self._train_config = train
        return self._optimizer

    def train_step(
        self,
        batch: TrainBatch,
        train: TrainConfig,
        *,
        temperature: float,
        optimizer_state: Path | None = None,
    ) -> dict[str, float]:
        """One Adam step on the LoRA parameters with the KL-shaped importance-sampling loss (docs/method.md §2)."""
        if len(batch.advantages) != len(batch.completions):
            raise ValueError(f"{len(batch.completions)} completions but {len(batch.advantages)} advantages")
        offload.unpark_all()  # the weights back from CPU memory if vLLM generated meanwhile
        opt = self._ensure_optimizer(train)
        if optimizer_state is not None and Path(optimizer_state).is_file():
            opt.load_state_dict(torch.load(optimizer_state, map_location=self.device, weights_only=True))
            for g in opt.param_groups:
                g.update(lr=train.learning_rate, betas=tuple(train.adam_betas), eps=train.adam_eps)
        params = self.lora_parameters()
        opt.zero_grad(set_to_none=True)
        self.model.train()  # gradient checkpointing is active in training mode; dropout is off
        try:
            stats = accumulate_gradients(
                self.model,
                batch.completions,
                batch.advantages,
                kl_coef=train.kl_coef,
                temperature=temperature,
                micro_batch_tokens=self.model_config.micro_batch_tokens,
                pad_id=self._pad_id(),
                ratio_cap=train.importance_ratio_cap,
                kl_center=train.kl_center,
            )
        finally:
            self.model.eval()
        stats["grad_norm"] = 0.0
        if stats["tokens"] > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm=float("inf")))
            stats["grad_norm"] = norm if norm == norm and norm != float("inf") else float("nan")
            opt.step()
        opt.zero_grad(set_to_none=True)
        return stats

    def save(self, adapter_dir: Path, optimizer_path: Path | None = None) -> None:
        """Write the adapter (and the optimizer state) atomically: temp name first, then rename."""
        offload.unpark_all()
        with atomic_dir(Path(adapter_dir)) as tmp:
            self.model.save_pretrained(str(tmp), safe_serialization=True)
        if optimizer_path is not None:
            if self._optimizer is None:
                state = torch.optim.Adam(self.lora_parameters()).state_dict()
            else:
                state = self._optimizer.state_dict()
            with atomic_path(Path(optimizer_path)) as tmp_opt:
                torch.save(state, tmp_opt)


def adapter_is_identity(adapter_dir: Path) -> bool:
    """Whether a saved LoRA adapter leaves the base model unchanged: every `lora_B` matrix is zero
    (PEFT's initialisation; also after steps that did not train). Then the policy is the base model,
    and the KL term's gradient is zero but for rounding."""
    from safetensors import safe_open

    with safe_open(str(Path(adapter_dir) / "adapter_model.safetensors"), framework="pt") as f:
        return all(not f.get_tensor(k).any() for k in f.keys() if ".lora_B." in k)
