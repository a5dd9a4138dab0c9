"""One vLLM engine per worker process, kept alive across steps (docs/architecture.md, "Where things run").

Building an engine takes minutes (weights, CUDA graphs, KV cache), so the engine is cached at
module level, keyed by everything that fixes it (`EngineSpec`: model, dtype, devices, context,
memory share, LoRA rank, sleep mode). A later step in the same process reuses it; a different spec
shuts the old one down first; a resumed run (a new process) builds it again.

vLLM's engine core runs in processes of its own. They are started with CUDA_VISIBLE_DEVICES set
to the generation devices, and with the `spawn` start method (forking a process that has threads
and CUDA state is unsafe). This process's own CUDA view is fixed first (its CUDA is initialised
before the environment changes), so the trainer's device indices keep their meaning.

Log-probabilities: `logprobs_mode="processed_logprobs"`, the log-softmax of the logits after
temperature scaling, i.e. of the distribution the token was drawn from (the learner's convention,
docs/method.md §2). With temperature 1.0 and no top-k/top-p/min-p/penalties (none are set) they equal vLLM's
"raw" log-probs; at another temperature only the processed ones are the sampler's.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from discover.policy.placement import visible_devices_for

log = logging.getLogger("discover")

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the values vLLM accepts for max_lora_rank


@dataclass(frozen=True)
class EngineSpec:
    """Everything that fixes a vLLM engine; a different spec needs a different engine."""

    model_path: str
    dtype: str
    devices: tuple[int, ...]
    max_model_len: int
    memory_fraction: float
    lora_rank: int
    sleep_mode: bool
    seed: int = 0

    @property
    def max_lora_rank(self) -> int:
        for r in LORA_RANKS:
            if r >= self.lora_rank:
                return r
        raise ValueError(f"model.lora_rank {self.lora_rank} exceeds vLLM's largest LoRA rank {LORA_RANKS[-1]}")


class _Held:
    def __init__(self, spec: EngineSpec, llm: Any):
        self.spec = spec
        self.llm = llm
        self.asleep = False
        self.lora_ids: set[int] = set()


_HELD: _Held | None = None
_LOCK = threading.RLock()


MULTIPROCESSING_VAR = "VLLM_ENABLE_V1_MULTIPROCESSING"


def multiprocessing_problem(environ: dict[str, str] | None = None) -> str | None:
    """Why the environment would put vLLM's engine in this process, or None when it does not.

    With VLLM_ENABLE_V1_MULTIPROCESSING=0 vLLM runs its engine core inside the calling process,
    i.e. the trainer's: CUDA_VISIBLE_DEVICES is set for vLLM's own processes only
    (`_child_environment`), so the engine would take this process's device 0 instead of
    `model.generation_devices`, and its memory accounting would include the trainer's.
    """
    env = os.environ if environ is None else environ
    value = env.get(MULTIPROCESSING_VAR)
    if value is not None and value.strip().lower() in ("0", "false", "no", "off"):
        return (
            f"{MULTIPROCESSING_VAR}={value} would run vLLM's engine inside the trainer's process, on the wrong GPU; "
            f"unset it (or set it to 1) before starting the run"
        )
    return None


def check_environment() -> None:
    """Refuse (one line) an environment that would misplace vLLM's engine (`multiprocessing_problem`)."""
    problem = multiprocessing_problem()
    if problem is not None:
        raise RuntimeError(problem)


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise RuntimeError(
            "model.backend is 'vllm' but vLLM is not installed here; install the gpu extra "
            "(`uv sync --extra gpu`, Linux x86_64 with CUDA) or set model.backend: transformers"
        ) from err
    return vllm


@contextmanager
def _child_environment(devices: tuple[int, ...]) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES (the generation devices) and the spawn start method for vLLM's processes."""
    import torch

    if torch.cuda.is_available() and not torch.cuda.is_initialized():
        torch.cuda.init()  # fix this process's own device view before the environment changes
    saved = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "VLLM_WORKER_MULTIPROC_METHOD")}
    os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices_for(list(devices))
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _build(spec: EngineSpec) -> Any:
    check_environment()
    vllm = _import_vllm()
    log.info(
        "starting vLLM %s for %s on GPU(s) %s (%.0f%% of their memory, context %d, LoRA rank <= %d%s)",
        vllm.__version__,
        spec.model_path,
        list(spec.devices),
        100 * spec.memory_fraction,
        spec.max_model_len,
        spec.max_lora_rank,
        ", sleep mode" if spec.sleep_mode else "",
    )
    with _child_environment(spec.devices):
        return vllm.LLM(
            model=spec.model_path,
            tokenizer=spec.model_path,
            dtype=spec.dtype,
            tensor_parallel_size=len(spec.devices),
            gpu_memory_utilization=spec.memory_fraction,
            max_model_len=spec.max_model_len,
            enable_lora=True,
            max_lora_rank=spec.max_lora_rank,
            max_loras=1,
            max_cpu_loras=1,
            enable_prefix_caching=True,
            enable_sleep_mode=spec.sleep_mode,
            logprobs_mode="processed_logprobs",
            seed=spec.seed,
        )


def shutdown() -> None:
    """Stop the held engine (if any) and free its GPU memory."""
    global _HELD
    with _LOCK:
        if _HELD is None:
            return
        held, _HELD = _HELD, None
        try:
            held.llm.llm_engine.engine_core.shutdown()
        except Exception as err:  # already gone: nothing to free
            log.debug("vLLM engine shutdown: %s", err)
        del held
        gc.collect()


def engine(spec: EngineSpec) -> _Held:
    """The engine for `spec`, built on first use in this process and awake."""
    global _HELD
    with _LOCK:
        if _HELD is not None and _HELD.spec != spec:
            log.info("vLLM engine settings changed; restarting the engine")
            shutdown()
        if _HELD is None:
            _HELD = _Held(spec, _build(spec))
        if _HELD.asleep:
            _HELD.llm.wake_up()
            _HELD.llm.reset_prefix_cache()  # the KV cache was dropped while asleep
            _HELD.asleep = False
        return _HELD


def sleep_if_held() -> bool:
    """Release the held engine's GPU memory (weights to CPU, KV cache dropped); True if it slept."""
    with _LOCK:
        if _HELD is None or _HELD.asleep or not _HELD.spec.sleep_mode:
            return False
        _HELD.llm.sleep(level=1)
        _HELD.asleep = True
        return True


def kv_cache_size(held: _Held) -> dict[str, float]:
    """The KV cache vLLM allocated: blocks, tokens (blocks x block size) and GiB (per token: 2 x layers x
    KV heads x head dim x the dtype's bytes, from the model's configuration; NaN where unknown)."""
    config = held.llm.llm_engine.vllm_config
    blocks = int(getattr(config.cache_config, "num_gpu_blocks", None) or 0)
    block_size = int(getattr(config.cache_config, "block_size", None) or 0)
    tokens = blocks * block_size
    per_token = float("nan")
    try:
        model = config.model_config
        hf = model.hf_text_config
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        per_token = 2.0 * hf.num_hidden_layers * hf.num_key_value_heads * head_dim * model.dtype.itemsize
    except Exception as err:  # a configuration of another shape: the token count alone
        log.debug("KV cache bytes per token unknown: %s", err)
    return {
        "blocks": float(blocks),
        "block_size": float(block_size),
        "tokens": float(tokens),
        "GiB": tokens * per_token / 2**30,
        "max_model_len": float(held.spec.max_model_len),
        "sequences_of_max_len": tokens / held.spec.max_model_len if held.spec.max_model_len else float("nan"),
    }


def use_adapter(held: _Held, lora_id: int) -> None:
    """Drop every other adapter from the engine (and the prefix cache computed under them)."""
    stale = held.lora_ids - {lora_id}
    for i in stale:
        held.llm.llm_engine.remove_lora(i)
    if stale:
        held.llm.reset_prefix_cache()
    held.lora_ids = (held.lora_ids - stale) | {lora_id}
