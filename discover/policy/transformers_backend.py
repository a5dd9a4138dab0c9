"""The policy backend on transformers + peft: sampling, log-probabilities, LoRA training, saving.

Conventions (SPEC §2, §4):

* Log-probabilities are always under the temperature-scaled distribution,
  `log_softmax(logits / temperature)`, the distribution the sampler drew from.
* Sampling is the two-phase completion of `two_phase.py` on `hf_decode.HFDecodeEngine`; the prompt
  is rendered and the thinking closed in the model's chat format (`chat_format.py`).
* The base model is loaded once per process and kept resident (`_BASE_CACHE`): every `load` wraps
  a structural copy that shares the frozen weights with a LoRA adapter of its own, so a training
  step in a long-lived worker never reads the weights from disk again.
* Training is `trainer.accumulate_gradients` (token-budget micro-batches, gradient checkpointing,
  chunked output layer) followed by one Adam step on the LoRA parameters.
"""

from __future__ import annotations

import copy
import os
import shutil
import threading
import uuid
from pathlib import Path
from typing import Iterator

import torch

from discover.config import EMBEDDED_MODEL, ModelConfig, TrainConfig
from discover.policy.base import Completion, GenerationSettings, Policy, TrainBatch
from discover.policy.chat_format import ChatFormat, chat_format_for
from discover.policy.hf_decode import HFDecodeEngine
from discover.policy.packing import pack_by_tokens
from discover.policy.placement import pick_device, training_devices
from discover.policy.trainer import accumulate_gradients, disable_dropout, token_logprobs
from discover.policy.two_phase import stream_two_phase

__all__ = ["TransformersPolicy", "pick_device", "resolve_model_path"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# (resolved path, dtype name, devices) -> (tokenizer, clean base model). The cached base model is
# never wrapped itself: every load wraps a structural copy that shares the frozen weights.
_BASE_CACHE: dict[tuple[str, str, str], tuple[object, torch.nn.Module]] = {}
_BASE_LOCK = threading.Lock()


def resolve_model_path(name: str) -> str:
    """'tiny' / 'tiny-qwen3' -> the embedded model's directory; a local dir -> itself; else the hub id."""
    if name == EMBEDDED_MODEL:
        from discover.policy.tiny_model import tiny_model_path

        return str(tiny_model_path())
    if name == "tiny-qwen3":
        from discover.policy.qwen3_model import tiny_qwen3_path

        return str(tiny_qwen3_path())
    p = Path(name).expanduser()
    if p.is_dir():
        return str(p)
    return name


def _load_base(path: str, dtype: str, devices: list[torch.device]):
    key = (path, dtype, ",".join(str(d) for d in devices))
    with _BASE_LOCK:
        if key in _BASE_CACHE:
            return _BASE_CACHE[key]
        from transformers import AutoModelForCausalLM, AutoTokenizer

        kwargs = {}
        if len(devices) > 1:  # layers split across the trainer's GPUs (accelerate's device map)
            kwargs["device_map"] = "auto"
            kwargs["max_memory"] = {d.index: torch.cuda.get_device_properties(d.index).total_memory * 0.85 for d in devices}
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype], **kwargs)
        except Exception as err:  # transformers raises OSError/ValueError/HF hub errors; re-raise as one type
            raise RuntimeError(
                f"could not load model {path!r}: {str(err).rstrip('.')}. Pass a local model directory as model.name, or "
                f"pre-download it into the Hugging Face cache (and set HF_HUB_OFFLINE=1 to use it offline)."
            ) from err
        if len(devices) == 1:
            model.to(devices[0])
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


class TransformersPolicy(Policy):
    """A causal LM with one LoRA adapter (trainable), on transformers + peft."""

    def __init__(self, tokenizer, model, model_config: ModelConfig):
        self.tokenizer = tokenizer
        self.model = model  # a peft PeftModel
        self.device = model.get_base_model().get_input_embeddings().weight.device
        self.model_config = model_config
        self.temperature = 1.0  # the temperature of the last sample(); default for sequence_logprobs
        self._optimizer: torch.optim.Optimizer | None = None
        self._train_config: TrainConfig | None = None

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(
        cls, model: ModelConfig, adapter_dir: Path | None = None, seed: int = 0, devices: list[torch.device] | None = None
    ) -> "TransformersPolicy":
        """The resident base model (loaded on first use) with the adapter of `adapter_dir` or a new one."""
        from peft import LoraConfig, PeftModel, get_peft_model

        path = resolve_model_path(model.name)
        devices = devices or training_devices(model)
        tokenizer, base = _load_base(path, model.dtype, devices)
        local = _share_weights_copy(base)
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
        if len(devices) == 1:
            peft_model.to(devices[0])
        if model.gradient_checkpointing:
            peft_model.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        peft_model.eval()  # no dropout anywhere: learner and sampler see the same function
        return cls(tokenizer, peft_model, model)

    def lora_parameters(self) -> list[torch.nn.Parameter]:
        return [p for _, p in self.model.named_parameters() if p.requires_grad]

    # ------------------------------------------------------------------ prompts

    def chat_format(self, think_end: str | None = None) -> ChatFormat:
        return chat_format_for(self.tokenizer, think_end)

    def render_prompt(self, text: str, think_end: str | None = None) -> list[int]:
        """Token ids of the prompt: the model's chat template (user turn + generation prompt), if it has one."""
        return self.chat_format(think_end).render(
            self.tokenizer, text, thinking=think_end is not None, **self.model_config.chat_template_kwargs
        )

    def eos_ids(self) -> set[int]:
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
        return ids

    def _max_positions(self) -> int | None:
        # only models with learned absolute positions have a hard limit
        return getattr(self.model.get_base_model().config, "n_positions", None)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    # ------------------------------------------------------------------ sampling

    def sample(self, prompts: list[str], n: int, settings: GenerationSettings, seed: int) -> list[list[Completion]]:
        """`n` completions per prompt; identical tokens for the same seed (SPEC §4)."""
        out: list[list[Completion | None]] = [[None] * n for _ in prompts]
        for i, j, completion in self.sample_stream(prompts, n, settings, seed):
            out[i][j] = completion
        return out  # type: ignore[return-value]

    def sample_stream(
        self, prompts: list[str], n: int, settings: GenerationSettings, seed: int
    ) -> Iterator[tuple[int, int, Completion]]:
        """The completions of `sample` as (prompt index, index among its n, completion), as they finish."""
        self.temperature = float(settings.temperature)
        fmt = self.chat_format(settings.think_end)
        rendered = [self.render_prompt(p, settings.think_end) for p in prompts]
        self.model.eval()
        engine = HFDecodeEngine(self.model, self.tokenizer, self.device, self.eos_ids(), self._max_positions())
        return stream_two_phase(
            engine, rendered, n, settings, seed, fmt, encode=self.encode, decode=self.decode, eos_ids=self.eos_ids()
        )

    # ------------------------------------------------------------------ log-probabilities

    def _pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def sequence_logprobs(
        self, completions: list[Completion], with_adapter: bool = True, temperature: float | None = None
    ) -> list[torch.Tensor]:
        """Per-token log-probs of each completion given its prompt, temperature-scaled.

        `temperature` defaults to the one of the last sample() (1.0 before any). With the adapter
        the graph is kept (when grad is enabled); without it (base model) nothing is tracked.
        """
        temp = float(temperature if temperature is not None else self.temperature)
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

    # ------------------------------------------------------------------ training

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
        temperature: float = 1.0,
        optimizer_state: Path | None = None,
    ) -> dict[str, float]:
        """One Adam step on the LoRA parameters with the KL-shaped importance-sampling loss (SPEC §2)."""
        if len(batch.advantages) != len(batch.completions):
            raise ValueError(f"{len(batch.completions)} completions but {len(batch.advantages)} advantages")
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
                self.model, batch.completions, batch.advantages,
                kl_coef=train.kl_coef, temperature=temperature,
                micro_batch_tokens=self.model_config.micro_batch_tokens, pad_id=self._pad_id(),
                ratio_cap=train.importance_ratio_cap, kl_center=train.kl_center,
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
