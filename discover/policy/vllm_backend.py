"""The vLLM policy backend: generation on vLLM, training on the resident transformers + peft trainer.

* Generation: the process's engine (`vllm_engine.engine`), the step's LoRA adapter hot-loaded
  under a fresh id *and* name (vLLM keys its adapter cache by id and its prefix cache by name: a
  reused one would serve the previous step's adapter), the two-phase completion of
  `two_phase.py` run continuously (phase 1 stops at the thinking marker; the forced text that
  closes the thinking in the model's chat format goes in as prompt tokens with loss_mask 0; the
  answer phase joins the running batch the moment its thinking ends, the prefix cache reusing
  prompt + thinking; finished completions stream out), and the sampler's log-probs of the
  sampled tokens.
* Training and saving: the shared `trainer.LoRATrainer` on `model.training_devices` (or
  `model.device`), its base model resident in this process, loaded on first use
  (docs/architecture.md, "A policy backend"). With `model.sleep_while_training` the engine sleeps
  (weights to CPU, KV cache dropped) during the step and wakes for the next generation; with
  `model.offload_while_generating` the trainer's tensors go to CPU memory before vLLM generates
  (`offload.py`) and come back when it trains: one copy of the weights on the GPU at a time.
* Nothing here imports vLLM until something is generated, so initialising a run (a fresh adapter)
  and training work where vLLM is not installed.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from discover.config import ModelConfig, SamplingConfig
from discover.policy import offload, placement, vllm_engine
from discover.policy.base import Completion, Policy
from discover.policy.chat_format import chat_format_for
from discover.policy.engine import PhaseOutput, PhaseRequest
from discover.policy.resident import resolve_model_path
from discover.policy.trainer import LoRATrainer
from discover.policy.two_phase import stream_two_phase

__all__ = ["VLLMDecodeEngine", "VLLMSampler", "load", "stop_settings"]

log = logging.getLogger("discover")

_ADAPTER_IDS = itertools.count(1)  # process-wide: every adapter load gets an id never used before
_REQUEST_IDS = itertools.count()
_TOKENIZERS: dict[str, Any] = {}


def _tokenizer(path: str):
    if path not in _TOKENIZERS:
        from transformers import AutoTokenizer

        _TOKENIZERS[path] = AutoTokenizer.from_pretrained(path)
    return _TOKENIZERS[path]


def sampled_logprobs(logprobs: Any, token_ids: list[int]) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-position logprobs (dicts or FlatLogprobs)."""
    if logprobs is None or len(logprobs) != len(token_ids):
        raise RuntimeError(f"vLLM returned {0 if logprobs is None else len(logprobs)} log-probs for {len(token_ids)} tokens")
    if hasattr(logprobs, "start_indices"):  # FlatLogprobs: parallel lists, ranges per position
        out = []
        for pos, tok in enumerate(token_ids):
            for j in range(logprobs.start_indices[pos], logprobs.end_indices[pos]):
                if logprobs.token_ids[j] == tok:
                    out.append(float(logprobs.logprobs[j]))
                    break
            else:
                raise RuntimeError(f"vLLM gave no log-prob for the sampled token {tok} at position {pos}")
        return out
    return [float(position[tok].logprob) for position, tok in zip(logprobs, token_ids, strict=True)]


def phase_output(completion: Any, marker_ids: tuple[int, ...]) -> PhaseOutput:
    """A vLLM CompletionOutput as a PhaseOutput: tokens, sampler log-probs, why it stopped.

    vLLM reports finish_reason "stop" with stop_reason None for the EOS token, the token id for a
    stop token (our one-token marker, or another EOS id of the generation config, which vLLM adds
    to the stop tokens), and the string for a stop string (only the marker is one).
    """
    ids = [int(t) for t in completion.token_ids]
    lps = sampled_logprobs(completion.logprobs, ids)
    reason, why = completion.finish_reason, completion.stop_reason
    if reason == "length":
        stop = "length"
    elif reason == "stop":
        if why is None:
            stop = "eos"
        elif isinstance(why, str) or int(why) in marker_ids:
            stop = "marker"
        else:
            stop = "eos"
    else:
        raise RuntimeError(f"vLLM stopped a generation with finish_reason {reason!r} ({why!r})")
    return PhaseOutput(ids, lps, stop)


def stop_settings(request: PhaseRequest) -> dict[str, Any]:
    """vLLM's stop fields for a phase: the marker's token id when it is one token, else its text.

    A stop string makes vLLM detokenise every generated token of the request (incrementally, on
    the engine's output path) just to look for it; a one-token marker (Qwen3's `</think>`) is
    matched exactly and for free as a stop token id, so its string is dropped and nothing is
    detokenised. What is lost: the marker spelled out in several other tokens (the model writing
    "</", "think", ">") no longer stops the phase; the thinking then runs to its budget and is
    closed by the forced text, as for any completion that never closes it. A marker of several
    tokens (gpt-oss's `<|channel|>final<|message|>`) is still matched as text.
    """
    if request.stop_token_ids:
        return {"stop_token_ids": list(request.stop_token_ids), "stop": None, "detokenize": False}
    strings = list(request.stop_strings)
    return {"stop_token_ids": None, "stop": strings or None, "detokenize": bool(strings)}


def fresh_adapter(adapter_dir: Path) -> dict[str, Any]:
    """LoRARequest fields under an id and a name never used before in this process.

    vLLM caches adapter weights by id and prefix-cache blocks by name: reusing either for a new
    step's adapter (even from another path, or the same path rewritten) would serve stale weights.
    """
    i = next(_ADAPTER_IDS)
    return {"lora_name": f"adapter-{i}", "lora_int_id": i, "lora_path": str(adapter_dir)}


class VLLMDecodeEngine:
    """`engine.DecodeEngine` on a vLLM engine, with the step's LoRA adapter (or the base model).

    Requests go straight into vLLM's running batch (`LLMEngine.add_request`) and `poll` steps the
    engine until some finish, so a completion's answer phase joins the batch the moment its
    thinking ends: no barrier between the phases, and finished completions stream out at once.
    """

    max_context: int | None = None  # vLLM itself enforces max_model_len (= sampling.context_tokens)

    def __init__(self, llm: Any, lora_request: Any | None):
        self.engine = llm.llm_engine
        self.lora_request = lora_request
        self._pending: dict[str, tuple[Hashable, tuple[int, ...], str]] = {}  # request id -> (key, marker ids, phase)
        self._tokens = 0
        self._t0 = time.time()
        # per phase ("thinking": stops at the marker; "answer": no stop but EOS): requests, prompt tokens,
        # prompt tokens served from vLLM's prefix cache (RequestOutput.num_cached_tokens)
        self.cache_counts: dict[str, list[int]] = {"thinking": [0, 0, 0], "answer": [0, 0, 0]}

    def prefix_cache_stats(self) -> dict[str, dict[str, float]]:
        """Per phase: finished requests, their prompt tokens, how many came from the prefix cache, the hit rate.

        The answer phase's prompt is prompt + thinking (+ forced tokens): with the prefix cache on,
        all but the blocks written since the thinking phase should be hits.
        """
        out = {}
        for phase, (requests, prompt, cached) in self.cache_counts.items():
            out[phase] = {
                "requests": float(requests),
                "prompt_tokens": float(prompt),
                "cached_tokens": float(cached),
                "hit_rate": cached / prompt if prompt else float("nan"),
            }
        return out

    def submit(self, key: Hashable, request: PhaseRequest, temperature: float, seed: int) -> None:
        from vllm import SamplingParams
        from vllm.inputs.engine import tokens_input
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            n=1,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            min_p=0.0,
            max_tokens=request.max_tokens,
            logprobs=0,  # the sampled token's log-prob only
            seed=seed,
            include_stop_str_in_output=True,
            skip_special_tokens=False,  # a marker made of special tokens (gpt-oss) must match
            spaces_between_special_tokens=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
            **stop_settings(request),
        )
        rid = f"discover-{next(_REQUEST_IDS)}"
        # an engine input of token ids (vLLM 0.20's rendered form: nothing to tokenize)
        self.engine.add_request(rid, tokens_input(list(request.prompt_ids)), params, lora_request=self.lora_request)
        phase = "thinking" if (request.stop_token_ids or request.stop_strings) else "answer"
        self._pending[rid] = (key, request.stop_token_ids, phase)

    def poll(self) -> list[tuple[Hashable, PhaseOutput]]:
        done: list[tuple[Hashable, PhaseOutput]] = []
        while self._pending and not done:
            if not self.engine.has_unfinished_requests():
                raise RuntimeError(f"vLLM has no work left but {len(self._pending)} requests never finished")
            for out in self.engine.step():
                if out.finished and out.request_id in self._pending:
                    key, markers, phase = self._pending.pop(out.request_id)
                    (completion,) = out.outputs
                    done.append((key, phase_output(completion, markers)))
                    self._tokens += len(completion.token_ids)
                    counts = self.cache_counts[phase]
                    counts[0] += 1
                    counts[1] += len(getattr(out, "prompt_token_ids", None) or ())
                    counts[2] += int(getattr(out, "num_cached_tokens", None) or 0)
        if not self._pending and done:
            seconds = time.time() - self._t0
            answer = self.cache_counts["answer"]
            log.info(
                "vLLM: %d tokens in %.1f s (%.0f tokens/s); answer phase prefix-cache hits %d of %d prompt tokens",
                self._tokens,
                seconds,
                self._tokens / max(seconds, 1e-9),
                answer[2],
                answer[1],
            )
        return done

    def cancel(self) -> None:
        """Abort what is still running (a consumer stopped early), so the next call starts clean."""
        if self._pending:
            self.engine.abort_request(list(self._pending))
            self._pending.clear()


def load(model: ModelConfig, adapter_dir: Path | None = None, seed: int = 0) -> Policy:
    """Generation on vLLM with the adapter of `adapter_dir` (None: the base model, which a new
    adapter is), training on the shared `LoRATrainer`; the engine and the trainer load on first use."""
    return Policy(VLLMSampler(model, adapter_dir), lambda: LoRATrainer.load(model, adapter_dir, seed=seed))


class VLLMSampler:
    """`base.Sampler` on the process's vLLM engine, with the step's LoRA adapter."""

    def __init__(self, model: ModelConfig, adapter_dir: Path | None = None):
        self.model_config = model
        self.adapter_dir = Path(adapter_dir) if adapter_dir is not None else None
        self.path = resolve_model_path(model.name)
        self._lora: Any | None = None
        self.last_engine: VLLMDecodeEngine | None = None  # the last sample's, for its prefix-cache counts

    @property
    def tokenizer(self):
        return _tokenizer(self.path)

    def engine_spec(self, context_tokens: int) -> vllm_engine.EngineSpec:
        m = self.model_config
        return vllm_engine.EngineSpec(
            model_path=self.path,
            dtype=m.dtype,
            devices=tuple(placement.generation_devices(m)),
            max_model_len=int(context_tokens),
            memory_fraction=placement.generation_memory_fraction(m),
            lora_rank=m.lora_rank,
            sleep_mode=m.sleep_while_training,
        )

    def lora_request(self) -> Any | None:
        """The step's adapter under a fresh id and name (None: a new adapter is the base model)."""
        if self.adapter_dir is None:
            return None
        if self._lora is None:
            from vllm.lora.request import LoRARequest

            self._lora = LoRARequest(**fresh_adapter(self.adapter_dir))
        return self._lora

    def sample_stream(
        self, prompts: list[str], n: int, sampling: SamplingConfig, seed: int, skip: frozenset[tuple[int, int]] = frozenset()
    ) -> Iterator[tuple[int, int, Completion]]:
        """`n` completions per prompt through vLLM (docs/method.md §4) as (prompt index, index among its n,
        completion), each as it finishes; sampler log-probs at the sampling temperature; none for the keys in `skip`."""
        tok = self.tokenizer
        fmt = chat_format_for(tok, sampling.think_end)
        kwargs = self.model_config.chat_template_kwargs
        rendered = [fmt.render(tok, p, thinking=sampling.think_end is not None, **kwargs) for p in prompts]
        if self.model_config.offload_while_generating:
            self.offload_trainer()  # before the engine is built or wakes: its memory is counted then
        held = vllm_engine.engine(self.engine_spec(sampling.context_tokens))
        lora = self.lora_request()
        if lora is not None:
            vllm_engine.use_adapter(held, lora.lora_int_id)
        self.last_engine = VLLMDecodeEngine(held.llm, lora)
        return stream_two_phase(
            self.last_engine,
            rendered,
            n,
            sampling,
            seed,
            fmt,
            encode=lambda s: [int(t) for t in tok.encode(s, add_special_tokens=False)],
            decode=tok.decode,
            eos_ids=eos_ids(self.path),
            skip=skip,
        )

    def offload_trainer(self) -> dict[str, float]:
        """Park the trainer's tensors (resident base model, adapters, Adam state) in CPU memory (`offload.py`)."""
        stats = offload.park_all()
        if stats.tensors:
            log.info(
                "trainer offloaded to CPU memory: %d tensors, %.2f GiB freed, %.2f GiB copied, %.2f s",
                stats.tensors,
                stats.device_bytes / 2**30,
                stats.copied_bytes / 2**30,
                stats.seconds,
            )
        return stats.as_dict()

    @contextmanager
    def while_training(self) -> Iterator[None]:
        """vLLM sleeps during the trainer's step if so configured; its memory is handed back after."""
        slept = vllm_engine.sleep_if_held()
        try:
            yield
        finally:
            import torch

            if slept or torch.cuda.is_available():
                torch.cuda.empty_cache()  # hand the activations' memory back before vLLM generates again


def eos_ids(path: str) -> set[int]:
    """The tokenizer's EOS and the generation config's EOS ids (vLLM stops at all of them)."""
    tok = _tokenizer(path)
    ids = {int(tok.eos_token_id)} if tok.eos_token_id is not None else set()
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(path).eos_token_id
    except Exception:  # no generation_config.json: the tokenizer's EOS is the only one
        eos = None
    ids |= {int(e) for e in ([eos] if isinstance(eos, int) else eos or [])}
    return ids
