"""An `engine.DecodeEngine` on a transformers model: batched sampling with a KV cache, one token at a time.

Log-probabilities are under the temperature-scaled distribution the sampler draws from,
`log_softmax(logits / temperature)`. Each request draws its tokens from its own random stream,
seeded by its own seed (`sample_tokens`), never from one shared by the batch: a request's tokens
do not depend on which other requests were decoded with it, so a resumed `generate` that decodes
only the missing rollouts gets the tokens of the full batch (up to the floating-point differences
batching makes in the logits: tests/test_resume_generate.py measures them on the tiny model).
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import torch

from discover.policy.engine import PhaseOutput, PhaseRequest


def sample_tokens(logp: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of `logp` (rows x vocabulary, normalised log-probabilities) by inverting
    the row's cumulative distribution at its uniform draw in [0, 1): an exact draw from the
    categorical distribution, and a function of that row's probabilities and draw alone. The sum
    runs in float64, so its rounding over a whole vocabulary (about 1e-11) is far below the float32
    rounding of the probabilities themselves. A token of probability 0 is never drawn."""
    cdf = torch.cumsum(logp.double().exp(), dim=-1)
    u = uniforms.to(device=cdf.device, dtype=torch.float64).unsqueeze(-1) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=logp.shape[-1] - 1)


class _Row:
    __slots__ = ("prompt", "limit", "stop_ids", "stop_strings", "tail", "tokens", "logps", "stop", "rng")

    def __init__(self, req: PhaseRequest, seed: int):
        self.rng = np.random.default_rng(seed % (2**63))  # this request's own stream: one uniform per token
        self.prompt = req.prompt_ids
        self.limit = req.max_tokens
        self.stop_ids = set(req.stop_token_ids)
        self.stop_strings = req.stop_strings
        self.tail = max((len(s.encode("utf-8")) for s in req.stop_strings), default=0) + 2
        self.tokens: list[int] = []
        self.logps: list[float] = []
        self.stop: str | None = None


class HFDecodeEngine:
    """Continues token prompts with a causal LM (any transformers model with a KV cache).

    Submitted requests wait until `poll`, which decodes the oldest `batch_size` of them
    together, each row sampling from its own request's seed, and returns those: the same request
    gives the same tokens whatever else is in its batch (up to the batch's floating-point effect on
    the logits), and a caller streaming completions gets each batch as soon as it is decoded (its
    evaluation can start while the next batch decodes).
    """

    def __init__(self, model, tokenizer, device: torch.device, eos_ids: set[int], max_context: int | None, batch_size: int):
        self.model = model
        self.batch_size = batch_size  # model.decode_batch_size
        self.tokenizer = tokenizer
        self.device = device
        self.eos_ids = eos_ids
        self.max_context = max_context
        self._queue: list[tuple[Hashable, PhaseRequest, float, int]] = []

    def submit(self, key: Hashable, request: PhaseRequest, temperature: float, seed: int) -> None:
        self._queue.append((key, request, float(temperature), int(seed)))

    def cancel(self) -> None:
        self._queue = []

    @torch.no_grad()
    def poll(self) -> list[tuple[Hashable, PhaseOutput]]:
        if not self._queue:
            return []
        batch, self._queue = self._queue[: self.batch_size], self._queue[self.batch_size :]
        temperatures = {t for _, _, t, _ in batch}
        if len(temperatures) != 1:
            raise ValueError(f"one temperature per batch, got {sorted(temperatures)}")
        rows = [_Row(req, seed) for _, req, _, seed in batch]
        self._decode(rows, batch[0][2])
        return [(key, PhaseOutput(r.tokens, r.logps, r.stop or "length")) for (key, _, _, _), r in zip(batch, rows)]

    def _finished(self, row: _Row, token: int) -> bool:
        if token in self.eos_ids:
            row.stop = "eos"
        elif token in row.stop_ids or (
            row.stop_strings and any(s in self.tokenizer.decode(row.tokens[-row.tail :]) for s in row.stop_strings)
        ):
            row.stop = "marker"
        elif len(row.tokens) >= row.limit:
            row.stop = "length"
        return row.stop is not None

    def _decode(self, rows: list[_Row], temperature: float) -> None:
        # Each distinct prompt is prefilled once and its KV cache copied to every row that
        # continues it (the K rollouts of a group share one context): the prompt's forward pass
        # is most of the cost of a short answer on a CPU (benchmarks/cpu_decoding.py).
        distinct: dict[tuple[int, ...], int] = {}
        row_prompt = [distinct.setdefault(tuple(r.prompt), len(distinct)) for r in rows]
        prompts = list(distinct)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for b, prompt in enumerate(prompts):  # left padding: every prompt ends at the right edge
            ids[b, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attn[b, width - len(prompt) :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        # logits of the last position only: a (rows x prompt x vocabulary) tensor would not fit a GPU
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
        cache, logits, next_pos = out.past_key_values, out.logits[:, -1, :], pos[:, -1] + 1
        if len(prompts) < len(rows):  # one cache row per sampled sequence
            expand = torch.tensor(row_prompt, dtype=torch.long, device=self.device)
            cache.batch_select_indices(expand)
            attn, logits, next_pos = attn[expand], logits[expand], next_pos[expand]
        active = list(range(len(rows)))
        while True:
            logp = torch.log_softmax(logits.float() / temperature, dim=-1)
            uniforms = torch.tensor([rows[i].rng.random() for i in active], dtype=torch.float64)
            sampled = sample_tokens(logp, uniforms)
            chosen = logp.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
            keep = []
            for b, (t, lp) in enumerate(zip(sampled.tolist(), chosen.tolist())):
                row = rows[active[b]]
                row.tokens.append(t)
                row.logps.append(lp)
                if not self._finished(row, t):
                    keep.append(b)
            if not keep:
                return
            feed = sampled
            if len(keep) < len(active):
                idx = torch.tensor(keep, dtype=torch.long, device=self.device)
                cache.batch_select_indices(idx)
                attn, feed, next_pos = attn[idx], feed[idx], next_pos[idx]
                active = [active[b] for b in keep]
            attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=-1)
            out = self.model(
                input_ids=feed.unsqueeze(-1),
                attention_mask=attn,
                position_ids=next_pos.unsqueeze(-1),
                past_key_values=cache,
                use_cache=True,
            )
            cache, logits, next_pos = out.past_key_values, out.logits[:, -1, :], next_pos + 1
