"""The one-GPU plan, measured: vLLM and the trainer on one GPU with one copy of the weights there at a time.

    python benchmarks/one_gpu.py [--shape 8b] [--model DIR] [--prompts 4] [--per-prompt 8]
                                 [--prompt-tokens 1024] [--thinking-tokens 2048] [--answer-tokens 512]
                                 [--cycles 2] [--memory-fraction F] [--json PATH]

What it does, on GPU 0 and in this one process (as a worker runs the step's tasks), with
`model.sleep_while_training` and `model.offload_while_generating` on:

1. The trainer loads the base model (bf16) and saves a fresh adapter, as a run's initialisation does.
2. Each cycle: *generate*: the trainer's tensors are parked in CPU memory (timed,
   discover/policy/offload.py); vLLM is built (first cycle) or woken (timed) at the one-copy memory
   share (`placement.ONE_COPY_GPU_FRACTION`, or `--memory-fraction`); the KV cache vLLM allocated
   (blocks, tokens, GiB, sequences of the context length); two-phase sampling with the `</think>`
   marker: a random model never closes its thinking, so every completion is forced and its answer
   phase continues from prompt + thinking + forced tokens: the answer phase's prefix-cache hit rate
   (RequestOutput.num_cached_tokens over its prompt tokens) says whether vLLM reused that KV.
   *train*: vLLM sleeps (level 1, timed), the trainer's tensors come back (timed), one training step
   on the sampled completions (timed, peak memory), the adapter is saved and the next cycle serves
   it under a fresh LoRA id.
3. Free GPU memory (torch.cuda.mem_get_info, device-wide) is recorded at each point, and with the
   trainer parked the largest share of the GPU vLLM could have been given (free / total): the
   figure to set `model.generation_memory_fraction` (or ONE_COPY_GPU_FRACTION) from.

The model is a random Qwen3-architecture one of a published shape unless `--model` is given.
`--json PATH` writes the figures for benchmarks/gpu_check.py. Without a GPU and vLLM it says so
and measures nothing (exit 0). Not yet run on a GPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from gpu_common import NEEDS_GPU, gpu_name, has_cuda, has_vllm, random_model, table, write_figures

from discover.config import ModelConfig, SamplingConfig, TrainConfig


def _free_gib() -> float:
    import torch

    return torch.cuda.mem_get_info()[0] / 2**30


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8b", help="random Qwen3 shape (tiny, small, 0.6b, 8b)")
    ap.add_argument("--model", default=None, help="a local model directory instead of a random one")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--per-prompt", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--thinking-tokens", type=int, default=2048)
    ap.add_argument("--answer-tokens", type=int, default=512)
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--memory-fraction", type=float, default=None, help="vLLM's gpu_memory_utilization; default: the one-copy share")
    ap.add_argument("--json", default=None, help="write the figures here (JSON)")
    args = ap.parse_args(argv)
    if not (has_cuda() and has_vllm()):
        print(f"one-GPU benchmark: {NEEDS_GPU}")
        return 0
    import torch
    from generation import _prompts

    from discover.policy import load_policy, offload, placement, vllm_engine
    from discover.policy.base import TrainBatch

    path = random_model(args.shape, args.model)
    cfg = ModelConfig(
        name=str(path),
        backend="vllm",
        dtype="bfloat16",
        lora_rank=32,
        device="cuda:0",
        sleep_while_training=True,
        offload_while_generating=True,
        generation_memory_fraction=args.memory_fraction,
    )
    from transformers import AutoTokenizer

    prompts = _prompts(args.prompts, args.prompt_tokens)
    tok = AutoTokenizer.from_pretrained(str(path))
    longest = max(len(tok.encode(p, add_special_tokens=False)) for p in prompts) + 64  # + the chat template's tokens
    budget = longest + args.thinking_tokens  # prompt + thinking before the forced answer
    settings = SamplingConfig(
        context_tokens=budget + args.answer_tokens + 64,
        thinking_budget=budget,
        max_answer_tokens=args.answer_tokens,
        think_end="</think>",
    )
    work = Path(tempfile.mkdtemp(prefix="one-gpu-"))
    figures: dict = {
        "gpu": gpu_name(),
        "model": path.name,
        "memory_fraction": placement.generation_memory_fraction(cfg),
        "free_GiB_at_start": _free_gib(),
        "settings": settings.model_dump(),
        "cycles": [],
    }

    t0 = time.perf_counter()
    first = load_policy(cfg, seed=0)
    adapter = work / "adapter-0"
    first.save(adapter)  # the trainer loads (base model on the GPU) and writes a fresh adapter
    figures["trainer_load_s"] = time.perf_counter() - t0
    figures["free_GiB_trainer_loaded"] = _free_gib()
    del first

    for cycle in range(args.cycles):
        row: dict = {"cycle": cycle}
        policy = load_policy(cfg, adapter)
        row["park"] = policy.sampler.offload_trainer()
        row["free_GiB_parked"] = _free_gib()
        # the largest gpu_memory_utilization vLLM could be given now (its start-up check: free >= share x total)
        row["largest_share_free_when_parked"] = row["free_GiB_parked"] * 2**30 / torch.cuda.get_device_properties(0).total_memory
        spec = policy.sampler.engine_spec(settings.context_tokens)
        t = time.perf_counter()
        held = vllm_engine.engine(spec)  # built on the first cycle, woken on later ones
        row["engine_build_s" if cycle == 0 else "wake_s"] = time.perf_counter() - t
        row["kv_cache"] = vllm_engine.kv_cache_size(held)
        row["free_GiB_generating"] = _free_gib()
        t = time.perf_counter()
        groups = policy.sample(prompts, args.per_prompt, settings, seed=cycle)
        row["generate_s"] = time.perf_counter() - t
        comps = [c for g in groups for c in g]
        row["generated_tokens"] = sum(len(c.completion_ids) for c in comps)
        row["generate_tokens_per_s"] = row["generated_tokens"] / row["generate_s"]
        row["forced"] = sum(c.forced for c in comps)
        engine = policy.sampler.last_engine
        row["prefix_cache"] = engine.prefix_cache_stats() if engine is not None else {}

        t = time.perf_counter()
        vllm_engine.sleep_if_held()
        row["sleep_s"] = time.perf_counter() - t
        row["free_GiB_asleep"] = _free_gib()
        row["unpark"] = offload.unpark_all().as_dict()  # the base model (and older adapters) back from CPU memory
        t = time.perf_counter()
        trainer = policy.trainer  # this step's adapter, read from disk onto the resident base model
        row["trainer_load_s"] = time.perf_counter() - t
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        stats = policy.train_step(
            TrainBatch(comps, [1.0 if i % 2 else -1.0 for i in range(len(comps))]), TrainConfig(), temperature=settings.temperature
        )
        torch.cuda.synchronize()
        row["train_s"] = time.perf_counter() - t
        row["train_tokens"] = stats["tokens"]
        row["trainer_peak_GiB"] = torch.cuda.max_memory_allocated() / 2**30
        row["free_GiB_training"] = _free_gib()
        adapter = work / f"adapter-{cycle + 1}"
        trainer.save(adapter)
        figures["cycles"].append(row)
        print(f"cycle {cycle}: {row}", flush=True)
    vllm_engine.shutdown()

    rows = []
    for r in figures["cycles"]:
        kv, answer = r["kv_cache"], r["prefix_cache"].get("answer", {})
        rows.append(
            [
                r["cycle"],
                f"{r['park']['seconds']:.2f}",
                f"{r.get('wake_s', r.get('engine_build_s', 0)):.1f}",
                f"{kv.get('tokens', 0):.0f} ({kv.get('GiB', float('nan')):.1f} GiB)",
                f"{r['generate_tokens_per_s']:.0f}",
                f"{answer.get('hit_rate', float('nan')):.3f}",
                f"{r['sleep_s']:.2f}",
                f"{r['unpark']['seconds']:.2f}",
                f"{r['train_s']:.1f}",
                f"{r['trainer_peak_GiB']:.1f}",
            ]
        )
    print(
        f"\n{gpu_name()}, model {path.name}, vLLM at {figures['memory_fraction']:.2f} of the GPU, "
        f"{args.prompts} x {args.per_prompt} completions, thinking budget {budget}, answer {args.answer_tokens}"
    )
    print(
        table(
            [
                "cycle",
                "park s",
                "build/wake s",
                "KV cache tokens",
                "gen tok/s",
                "answer hit rate",
                "sleep s",
                "unpark s",
                "train s",
                "trainer peak GiB",
            ],
            rows,
        )
    )
    write_figures(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
