"""The policy backend on transformers + peft: sampling, log-probabilities, LoRA training, saving.

Conventions (SPEC §2, §4):

* Log-probabilities are always under the temperature-scaled distribution,
  `log_softmax(logits / temperature)`, the distribution the sampler drew from.
* End of sequence: when the model samples its EOS token, that token IS kept as the last entry of
  `completion_ids`, with its sampler log-probability and `loss_mask` 1 (stopping is an action of
  the policy and gets trained like any other token). `text` and `answer` never contain it.
* Two-phase completion: with `think_end` set, the thinking phase runs until the marker appears in
  the decoded text, EOS, or prompt + thinking reaches `thinking_budget`. When the budget runs out
  the tokens of `forced_phrase` are appended (loss_mask 0, sampler log-prob 0.0, forced=True) and
  the answer phase follows. The answer phase (and the single phase without `think_end`) stops at
  EOS, after `max_answer_tokens` tokens, or when prompt + completion reaches `context_tokens`
  (finish_reason "length" for the last two). An EOS inside the thinking phase ends the completion
  with an empty answer (there was no final message).
* All randomness comes from a `torch.Generator` seeded with the `seed` argument.
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import uuid
from collections import deque
from pathlib import Path
from typing import Iterator

import torch

from discover.config import EMBEDDED_MODEL, ModelConfig, TrainConfig
from discover.objectives import importance_sampling_loss, kl_shaped_advantages
from discover.policy.base import Completion, GenerationSettings, Policy, TrainBatch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# (resolved path, dtype name, device) -> (tokenizer, clean base model). The cached base model is
# never wrapped itself: every load wraps a structural copy that shares the frozen weights.
_BASE_CACHE: dict[tuple[str, str, str], tuple[object, torch.nn.Module]] = {}

MAX_SAMPLE_BATCH = 512  # sequences decoded together in one batch (memory bound only)


def resolve_model_path(name: str) -> str:
    """'tiny' -> the embedded model's directory; an existing local dir -> itself; else the hub id."""
    if name == EMBEDDED_MODEL:
        from discover.policy.tiny_model import tiny_model_path

        return str(tiny_model_path())
    p = Path(name).expanduser()
    if p.is_dir():
        return str(p)
    return name


def pick_device(spec: str) -> torch.device:
    """'auto': cuda if available, else cpu; anything else is passed to torch.device."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def _load_base(path: str, dtype: str, device: torch.device):
    key = (path, dtype, str(device))
    if key in _BASE_CACHE:
        return _BASE_CACHE[key]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype])
    except Exception as err:  # transformers raises OSError/ValueError/HF hub errors; re-raise as one type
        raise RuntimeError(
            f"could not load model {path!r}: {str(err).rstrip('.')}. Pass a local model directory as model.name, or "
            f"pre-download it into the Hugging Face cache (and set HF_HUB_OFFLINE=1 to use it offline)."
        ) from err
    model.to(device)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    _BASE_CACHE[key] = (tokenizer, model)
    return tokenizer, model


def _share_weights_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the module tree that shares (does not copy) every parameter and buffer."""
    memo = {id(t): t for t in model.parameters()}
    memo.update({id(t): t for t in model.buffers()})
    return copy.deepcopy(model, memo)


def _atomic_replace_dir(tmp: Path, target: Path) -> None:
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
    os.rename(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


class _Row:
    """Bookkeeping of one sequence while it is being sampled."""

    __slots__ = (
        "prompt", "tokens", "logps", "mask", "phase", "queue", "forced", "answer_start",
        "answer_limit", "done", "finish", "marker_at",
    )

    def __init__(self, prompt: list[int]):
        self.prompt = prompt
        self.tokens: list[int] = []
        self.logps: list[float] = []
        self.mask: list[int] = []
        self.phase = 1
        self.queue: deque[int] = deque()
        self.forced = False
        self.answer_start = 0
        self.answer_limit = 0
        self.done = False
        self.finish = "stop"
        self.marker_at = False


class TransformersPolicy(Policy):
    """A causal LM with one LoRA adapter (trainable), on transformers + peft."""

    def __init__(self, tokenizer, model, device: torch.device, model_config: ModelConfig):
        self.tokenizer = tokenizer
        self.model = model  # a peft PeftModel
        self.device = device
        self.model_config = model_config
        self.temperature = 1.0  # the temperature of the last sample(); default for sequence_logprobs
        self._optimizer: torch.optim.Optimizer | None = None
        self._train_config: TrainConfig | None = None

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, model: ModelConfig, adapter_dir: Path | None = None, seed: int = 0) -> "TransformersPolicy":
        from peft import LoraConfig, PeftModel, get_peft_model

        path = resolve_model_path(model.name)
        device = pick_device(model.device)
        tokenizer, base = _load_base(path, model.dtype, device)
        local = _share_weights_copy(base)
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
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(seed)
                peft_model = get_peft_model(local, lora)
        peft_model.to(device)
        peft_model.eval()  # no dropout anywhere: learner and sampler see the same function
        return cls(tokenizer, peft_model, device, model)

    def lora_parameters(self) -> list[torch.nn.Parameter]:
        return [p for _, p in self.model.named_parameters() if p.requires_grad]

    # ------------------------------------------------------------------ prompts

    def render_prompt(self, text: str) -> list[int]:
        """Token ids of the prompt: chat template (user turn + generation prompt) if the tokenizer has one."""
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def _eos_ids(self) -> set[int]:
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen_cfg = getattr(self.model, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
        return ids

    def _max_positions(self) -> int | None:
        cfg = self.model.config if hasattr(self.model, "config") else None
        # only models with learned absolute positions have a hard limit
        return getattr(cfg, "n_positions", None) if cfg is not None else None

    # ------------------------------------------------------------------ sampling

    def sample(
        self, prompts: list[str], n: int, settings: GenerationSettings, seed: int
    ) -> list[list[Completion]]:
        """`n` completions per prompt; identical tokens for the same seed (SPEC §4)."""
        out: list[list[Completion | None]] = [[None] * n for _ in prompts]
        for i, j, completion in self.sample_stream(prompts, n, settings, seed):
            out[i][j] = completion
        return out  # type: ignore[return-value]

    def sample_stream(
        self, prompts: list[str], n: int, settings: GenerationSettings, seed: int
    ) -> Iterator[tuple[int, int, Completion]]:
        """The completions of `sample`, each yielded as soon as its sequence ends."""
        if settings.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {settings.temperature}")
        self.temperature = float(settings.temperature)
        rendered = [self.render_prompt(p) for p in prompts]
        context = settings.context_tokens
        max_pos = self._max_positions()
        if max_pos is not None:
            context = min(context, int(max_pos))
        for ids in rendered:
            if settings.think_end is not None and len(ids) > settings.thinking_budget:
                raise ValueError(
                    f"the prompt has {len(ids)} tokens, more than the thinking budget of "
                    f"{settings.thinking_budget} tokens; shorten the prompt or raise sampling.thinking_budget"
                )
            if len(ids) >= context:
                raise ValueError(
                    f"the prompt has {len(ids)} tokens, which leaves no room in the context of "
                    f"{context} tokens; shorten the prompt or raise sampling.context_tokens"
                )
        gen = torch.Generator(device=self.device).manual_seed(int(seed))
        all_rows = [_Row(ids) for ids in rendered for _ in range(n)]
        for start in range(0, len(all_rows), MAX_SAMPLE_BATCH):
            for i in self._sample_rows(all_rows[start : start + MAX_SAMPLE_BATCH], settings, context, gen):
                row = start + i
                yield row // n, row % n, self._to_completion(all_rows[row], settings)

    def _start_answer(self, row: _Row, settings: GenerationSettings, context: int, pending: int) -> None:
        row.phase = 2
        row.answer_start = len(row.tokens) + pending
        room = context - len(row.prompt) - len(row.tokens) - pending
        row.answer_limit = max(0, min(settings.max_answer_tokens, room))

    def _force(self, row: _Row, settings: GenerationSettings, context: int, phrase: list[int]) -> None:
        room = context - len(row.prompt) - len(row.tokens)
        take = phrase[: max(0, room)]
        row.queue.extend(take)
        row.forced = True
        self._start_answer(row, settings, context, len(take))

    def _sample_rows(
        self, rows: list[_Row], settings: GenerationSettings, context: int, gen: torch.Generator
    ) -> Iterator[int]:
        """Sample `rows` together; yield each row's index as soon as it is done."""
        tok = self.tokenizer
        eos_ids = self._eos_ids()
        marker = settings.think_end
        phrase = tok.encode(settings.forced_phrase, add_special_tokens=False) if marker is not None else []
        tail = len(marker.encode("utf-8")) + 2 if marker is not None else 0
        for row in rows:
            if marker is None:
                self._start_answer(row, settings, context, 0)
            elif len(row.prompt) >= settings.thinking_budget:
                self._force(row, settings, context, phrase)
            if row.phase == 2 and not row.queue and row.answer_limit <= 0:
                row.done, row.finish = True, "length"
        yield from (i for i, r in enumerate(rows) if r.done)

        active = [i for i, r in enumerate(rows) if not r.done]
        if not active:
            return
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        lens = [len(rows[i].prompt) for i in active]
        width = max(lens)
        ids = torch.full((len(active), width), pad, dtype=torch.long)
        attn = torch.zeros((len(active), width), dtype=torch.long)
        for b, i in enumerate(active):
            L = lens[b]
            ids[b, width - L :] = torch.tensor(rows[i].prompt, dtype=torch.long)
            attn[b, width - L :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        model = self.model
        with torch.no_grad():  # per call, not around the generator: it yields to its caller
            out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        cache = out.past_key_values
        logits = out.logits[:, -1, :]
        next_pos = pos[:, -1] + 1
        temp = self.temperature
        while True:
            logp = torch.log_softmax(logits.float() / temp, dim=-1)
            sampled = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
            chosen_lp = logp.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
            sampled_l, lp_l = sampled.tolist(), chosen_lp.tolist()
            feed = []
            for b, i in enumerate(active):
                row = rows[i]
                if row.queue:
                    t, lp, m = row.queue.popleft(), 0.0, 0
                else:
                    t, lp, m = sampled_l[b], lp_l[b], 1
                row.tokens.append(t)
                row.logps.append(lp)
                row.mask.append(m)
                feed.append(t)
                total = len(row.prompt) + len(row.tokens)
                if m == 1 and t in eos_ids:
                    row.done, row.finish = True, "stop"
                    continue
                if row.phase == 1:
                    if marker in tok.decode(row.tokens[-tail:]):
                        row.marker_at = True
                        self._start_answer(row, settings, context, 0)
                    elif total >= settings.thinking_budget:
                        self._force(row, settings, context, phrase)
                if row.phase == 2 and not row.queue and len(row.tokens) - row.answer_start >= row.answer_limit:
                    row.done, row.finish = True, "length"
                elif total >= context:
                    row.done, row.finish = True, "length"
            keep = [b for b, i in enumerate(active) if not rows[i].done]
            yield from (i for i in active if rows[i].done)
            if not keep:
                return
            feed_t = torch.tensor(feed, dtype=torch.long, device=self.device)
            if len(keep) < len(active):
                idx = torch.tensor(keep, dtype=torch.long, device=self.device)
                cache.batch_select_indices(idx)
                attn, feed_t, next_pos = attn[idx], feed_t[idx], next_pos[idx]
                active = [active[b] for b in keep]
            attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=-1)
            with torch.no_grad():
                out = model(
                    input_ids=feed_t.unsqueeze(-1),
                    attention_mask=attn,
                    position_ids=next_pos.unsqueeze(-1),
                    past_key_values=cache,
                    use_cache=True,
                )
            cache = out.past_key_values
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1

    def _to_completion(self, row: _Row, settings: GenerationSettings) -> Completion:
        tok = self.tokenizer
        eos_ids = self._eos_ids()
        body = row.tokens
        if body and row.mask[-1] == 1 and body[-1] in eos_ids and row.finish == "stop":
            body = body[:-1]
        text = tok.decode(body)
        if settings.think_end is None:
            answer = text
        elif row.forced:
            answer = tok.decode(body[row.answer_start :]) if row.answer_start < len(body) else ""
        elif row.marker_at and settings.think_end in text:
            answer = text.split(settings.think_end, 1)[1]
        else:
            answer = ""  # ended (EOS) inside the thinking phase: no final message
        return Completion(
            prompt_ids=list(row.prompt),
            completion_ids=list(row.tokens),
            sampler_logprobs=list(row.logps),
            loss_mask=list(row.mask),
            text=text,
            answer=answer,
            forced=row.forced,
            finish_reason=row.finish,
        )

    # ------------------------------------------------------------------ log-probabilities

    def sequence_logprobs(
        self, completions: list[Completion], with_adapter: bool = True, temperature: float | None = None
    ) -> list[torch.Tensor]:
        """Per-token log-probs of each completion given its prompt, temperature-scaled.

        `temperature` defaults to the one of the last sample() (1.0 before any). With the adapter
        the graph is kept (when grad is enabled); without it (base model) nothing is tracked.
        """
        temp = float(temperature if temperature is not None else self.temperature)
        if not completions:
            return []
        if with_adapter:
            return self._logprobs(completions, temp)
        with torch.no_grad(), self.model.disable_adapter():
            return [t.detach() for t in self._logprobs(completions, temp)]

    def _logprobs(self, completions: list[Completion], temp: float) -> list[torch.Tensor]:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        seqs = [list(c.prompt_ids) + list(c.completion_ids) for c in completions]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        for b, s in enumerate(seqs):  # left padding: every completion ends at the right edge
            ids[b, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            attn[b, width - len(s) :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        max_c = max(len(c.completion_ids) for c in completions)
        if max_c == 0:
            return [torch.zeros(0, device=self.device) for _ in completions]
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False)
        logits = out.logits[:, width - max_c - 1 : width - 1, :]  # predicts the last max_c tokens
        targets = ids[:, width - max_c :]
        result = []
        for b, c in enumerate(completions):
            C = len(c.completion_ids)
            if C == 0:
                result.append(logits.new_zeros(0, dtype=torch.float32))
                continue
            lg = logits[b, max_c - C :, :].float() / temp
            lp = torch.log_softmax(lg, dim=-1).gather(-1, targets[b, max_c - C :].unsqueeze(-1)).squeeze(-1)
            result.append(lp)
        return result

    # ------------------------------------------------------------------ training

    def _ensure_optimizer(self, train: TrainConfig) -> torch.optim.Optimizer:
        if self._optimizer is None or self._train_config != train:
            state = self._optimizer.state_dict() if self._optimizer is not None else None
            self._optimizer = torch.optim.Adam(
                self.lora_parameters(), lr=train.learning_rate, betas=tuple(train.adam_betas), eps=train.adam_eps
            )
            if state is not None:
                self._optimizer.load_state_dict(state)
                for g in self._optimizer.param_groups:
                    g.update(lr=train.learning_rate, betas=tuple(train.adam_betas), eps=train.adam_eps)
            self._train_config = train
        return self._optimizer

    def train_step(
        self,
        batch: TrainBatch,
        train: TrainConfig,
        temperature: float = 1.0,
        optimizer_state: Path | None = None,
    ) -> dict[str, float]:
        """One Adam step on the LoRA parameters with the KL-shaped importance-sampling loss (SPEC §2)."""
        if len(batch.advantages) != len(batch.completions):
            raise ValueError(
                f"{len(batch.completions)} completions but {len(batch.advantages)} advantages"
            )
        opt = self._ensure_optimizer(train)
        if optimizer_state is not None and Path(optimizer_state).is_file():
            opt.load_state_dict(torch.load(optimizer_state, map_location=self.device, weights_only=True))
            for g in opt.param_groups:
                g.update(lr=train.learning_rate, betas=tuple(train.adam_betas), eps=train.adam_eps)
        chosen = [
            (c, float(a))
            for c, a in zip(batch.completions, batch.advantages)
            if not (float(a) == 0.0 and train.kl_coef == 0.0) and any(c.loss_mask)
        ]
        stats = {"loss": 0.0, "tokens": 0.0, "mean_ratio": 1.0, "kl": 0.0, "grad_norm": 0.0,
                 "trained": float(len(chosen)), "skipped": float(len(batch.completions) - len(chosen))}
        if not chosen:
            return stats
        params = self.lora_parameters()
        opt.zero_grad(set_to_none=True)
        self.model.eval()
        total_loss, tokens, ratio_sum, kl_sum = 0.0, 0.0, 0.0, 0.0
        for start in range(0, len(chosen), train.micro_batch):
            part = chosen[start : start + train.micro_batch]
            comps = [c for c, _ in part]
            base = self.sequence_logprobs(comps, with_adapter=False, temperature=temperature)
            with torch.enable_grad():
                learner = self.sequence_logprobs(comps, with_adapter=True, temperature=temperature)
                width = max(len(c.completion_ids) for c in comps)
                B = len(comps)
                lp_l = torch.stack([
                    torch.cat([lp, lp.new_zeros(width - lp.shape[0])]) for lp in learner
                ])
                lp_s = torch.zeros((B, width), device=self.device)
                lp_b = torch.zeros((B, width), device=self.device)
                mask = torch.zeros((B, width), device=self.device)
                for b, c in enumerate(comps):
                    C = len(c.completion_ids)
                    lp_s[b, :C] = torch.tensor(c.sampler_logprobs, dtype=torch.float32)
                    lp_b[b, :C] = base[b].float()
                    mask[b, :C] = torch.tensor(c.loss_mask, dtype=torch.float32)
                adv = torch.tensor([a for _, a in part], dtype=torch.float32, device=self.device).unsqueeze(-1)
                token_adv = kl_shaped_advantages(adv, lp_s, lp_b, train.kl_coef)
                loss = importance_sampling_loss(lp_l, lp_s, token_adv, mask)
                loss.backward()
            with torch.no_grad():
                keep = mask.bool()
                ratio = torch.exp(torch.where(keep, lp_l.detach() - lp_s, torch.zeros_like(lp_s)))
                ratio_sum += float(ratio[keep].sum())
                kl_sum += float((lp_s - lp_b)[keep].sum())
                tokens += float(keep.sum())
                total_loss += float(loss.detach())
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.update(
            loss=total_loss,
            tokens=tokens,
            mean_ratio=ratio_sum / tokens if tokens else 1.0,
            kl=kl_sum / tokens if tokens else 0.0,
            grad_norm=float(grad_norm) if math.isfinite(float(grad_norm)) else float("nan"),
        )
        return stats

    # ------------------------------------------------------------------ saving

    def save(self, adapter_dir: Path, optimizer_path: Path | None = None) -> None:
        """Write the adapter (and the optimizer state) atomically: temp name first, then rename."""
        adapter_dir = Path(adapter_dir)
        adapter_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = adapter_dir.parent / f".{adapter_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            self.model.save_pretrained(str(tmp), safe_serialization=True)
            _atomic_replace_dir(tmp, adapter_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        if optimizer_path is not None:
            optimizer_path = Path(optimizer_path)
            optimizer_path.parent.mkdir(parents=True, exist_ok=True)
            if self._optimizer is None:
                state = torch.optim.Adam(self.lora_parameters()).state_dict()
            else:
                state = self._optimizer.state_dict()
            tmp_opt = optimizer_path.parent / f".{optimizer_path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            torch.save(state, tmp_opt)
            os.replace(tmp_opt, optimizer_path)
