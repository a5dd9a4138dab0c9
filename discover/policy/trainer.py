"""One LoRA training step on a resident peft model (SPEC §2), sized for 512 rollouts of 32k tokens.

* Micro-batches by token count (`packing.pack_by_tokens`), gradients accumulated over them: the
  loss is a sum over tokens, so the step equals the unsplit one.
* Rows are right-padded and attention is plain causal: a padding token comes after every real
  token of its row, so it never influences one, and the fast causal attention kernels apply.
* Log-probabilities come from the last hidden states through the output layer in chunks of rows,
  each chunk recomputed in the backward pass: a 32k x 152k logits tensor never exists.
* Gradient checkpointing on the decoder layers (when enabled on the model) keeps one layer's
  activations at a time; dropout is off everywhere, so learner and sampler see one function.
* The KL term's base log-probs come from the same model with the adapter disabled (SPEC §2).
* The importance ratio exp(logp_learner - logp_sampler) is reported per step (mean, max, mean
  absolute log-prob gap) and optionally truncated (`train.importance_ratio_cap`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from discover.objectives import batch_kl_mean, importance_sampling_loss, kl_shaped_advantages
from discover.policy.base import Completion
from discover.policy.packing import pack_by_tokens, padded_tokens

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


def _chunk_logprobs(head: torch.nn.Module, h: torch.Tensor, targets: torch.Tensor, temperature: float, softcap: float | None) -> torch.Tensor:
    logits = head(h).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits / temperature  # SPEC §2/§4: log-probs under the temperature-scaled distribution
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_logprobs(
    model: torch.nn.Module, completions: list[Completion], temperature: float, pad_id: int
) -> list[torch.Tensor]:
    """Per-token log-probs of each completion given its prompt, in one right-padded pass.

    With grad enabled the graph is kept (the output layer chunk-wise recomputed); float32 results.
    """
    if not completions:
        return []
    lm = causal_lm(model)
    body = getattr(lm, lm.base_model_prefix)
    head = lm.get_output_embeddings()
    softcap = getattr(lm.config, "final_logit_softcapping", None)
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
    # (B, W, h): causal attention; the mask is all ones (padding sits after every real token of its
    # row, so it cannot influence one), which keeps the fast causal kernels
    hidden = body(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).last_hidden_state
    rows = torch.cat([torch.full((n,), b, dtype=torch.long) for b, n in enumerate(counts)])
    # position p predicts token p + 1: the completion of row b starts at len(prompt_b)
    cols = torch.cat([torch.arange(len(c.prompt_ids) - 1, len(c.prompt_ids) - 1 + n) for c, n in zip(completions, counts)])
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
    return list(torch.cat(parts).split(counts))


@dataclass
class _Totals:
    loss: float = 0.0
    tokens: int = 0
    ratio_sum: float = 0.0
    ratio_max: float = 0.0
    capped: int = 0
    gap_sum: float = 0.0
    kl_sum: float = 0.0


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
) -> dict[str, Any]:
    """Backward of the step's loss (SPEC §2) into the adapter's .grad, micro-batch by micro-batch.

    Rollouts with no trainable token, or with a zero advantage and no KL term, contribute nothing
    and are skipped. With `kl_center` the base model's log-probs of every micro-batch are computed
    first, and the KL term is centred on their batch mean (the released code). Returns the step's
    statistics (the caller steps the optimizer).
    """
    chosen = [
        (c, float(a)) for c, a in zip(completions, advantages, strict=True)
        if any(c.loss_mask) and not (float(a) == 0.0 and kl_coef == 0.0)
    ]
    lengths = [len(c.prompt_ids) + len(c.completion_ids) for c, _ in chosen]
    batches = pack_by_tokens(lengths, micro_batch_tokens) if chosen else []
    t = _Totals()

    def base_logprobs(comps: list[Completion]) -> torch.Tensor:
        with torch.no_grad(), model.disable_adapter():  # SPEC §2: pi_0 is the base model, LoRA off
            return torch.cat(token_logprobs(model, comps, temperature, pad_id)).float().cpu()

    def sampler_logprobs(comps: list[Completion]) -> tuple[torch.Tensor, torch.Tensor]:
        mask = torch.tensor([m for c in comps for m in c.loss_mask], dtype=torch.bool)
        return mask, torch.tensor([x for c in comps for x in c.sampler_logprobs], dtype=torch.float32)

    center, base_first = 0.0, {}
    if kl_coef > 0 and kl_center:  # released code: the KL term's mean over the batch's tokens is removed
        for b, batch in enumerate(batches):
            base_first[b] = base_logprobs([chosen[i][0] for i in batch])
        masks, samplers = zip(*(sampler_logprobs([chosen[i][0] for i in batch]) for batch in batches)) if batches else ((), ())
        center = batch_kl_mean(samplers, [base_first[b] for b in range(len(batches))], masks)
    for b, batch in enumerate(batches):
        comps = [chosen[i][0] for i in batch]
        mask, lp_s = sampler_logprobs(comps)
        adv = torch.tensor([chosen[i][1] for i in batch for _ in chosen[i][0].completion_ids], dtype=torch.float32)
        if kl_coef > 0:
            lp_b = base_first[b] if b in base_first else base_logprobs(comps)
        lp_l = torch.cat(token_logprobs(model, comps, temperature, pad_id))
        dev = lp_l.device
        mask, lp_s, adv = mask.to(dev), lp_s.to(dev), adv.to(dev)
        lp_b = lp_b.to(dev) if kl_coef > 0 else lp_s
        token_adv = kl_shaped_advantages(adv, lp_s, lp_b, kl_coef, center)  # SPEC §2: A_n - lambda (log pi - log pi_0)
        loss = importance_sampling_loss(lp_l, lp_s, token_adv, mask, ratio_cap=ratio_cap)
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
    n = t.tokens
    return {
        "loss": t.loss,
        "tokens": float(n),
        "trained": float(len(chosen)),
        "skipped": float(len(completions) - len(chosen)),
        "micro_batches": float(len(batches)),
        "padded_tokens": float(padded_tokens(lengths, batches)),
        "mean_ratio": t.ratio_sum / n if n else 1.0,
        "max_ratio": t.ratio_max if n else 1.0,
        "ratio_capped_fraction": t.capped / n if n else 0.0,
        "logprob_gap": t.gap_sum / n if n else 0.0,  # mean |logp_learner - logp_sampler| per token
        "kl": t.kl_sum / n if (n and kl_coef > 0) else math.nan,
    }
