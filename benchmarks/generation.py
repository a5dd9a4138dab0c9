"""Generation throughput: the vLLM backend against the transformers backend (issue 14, Must show 3a).

    python benchmarks/generation.py [--shape 8b] [--model DIR] [--prompts 8] [--per-prompt 8]
                                    [--prompt-tokens 2048] [--new-tokens 1024] [--json PATH]

Both backends sample the same prompts (`--prompts` contexts of about `--prompt-tokens` tokens,
`--per-prompt` completions each, as a step samples K per group) with the same budget
(`--new-tokens` answer tokens, no thinking phase, temperature 1.0) from the same model on the same
GPU, one after the other (the transformers model is freed before vLLM starts, and vLLM gets 90% of
the GPU). The model is a random Qwen3-architecture one of a published shape unless `--model` is
given; a random model rarely emits EOS, so nearly every completion runs the whole budget.
Printed: generated tokens, seconds, tokens/s and the ratio vLLM / transformers (target >= 10).
`--json PATH` writes the figures for benchmarks/gpu_check.py. Without a GPU it says so and
measures nothing.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

from gpu_common import NEEDS_GPU, gpu_name, has_cuda, has_vllm, random_model, table, write_figures

from discover.config import ModelConfig, SamplingConfig


def _prompts(n: int, tokens: int) -> list[str]:
    base = "Find a step function on [0, 2] whose maximum overlap is as small as possible. Values: "
    return [base + " ".join(f"{(i * 7919 + j * 104729) % 1000 / 1000:.3f}" for j in range(tokens // 6)) for i in range(n)]


def _measure(policy, prompts, k, settings) -> tuple[int, float]:
    import torch

    policy.sample(prompts[:1], 1, SamplingConfig(context_tokens=settings.context_tokens, max_answer_tokens=8), seed=0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = policy.sample(prompts, k, settings, seed=1)
    torch.cuda.synchronize()
    return sum(len(c.completion_ids) for g in out for c in g), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8b", help="random Qwen3 shape (tiny, small, 0.6b, 8b)")
    ap.add_argument("--model", default=None, help="a local model directory instead of a random one")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--per-prompt", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=1024)
    ap.add_argument("--json", default=None, help="write the figures here (JSON)")
    args = ap.parse_args(argv)
    if not (has_cuda() and has_vllm()):
        print(f"generation benchmark: {NEEDS_GPU}")
        return 0
    import torch

    from discover.policy import load_policy, resident, vllm_engine

    path = random_model(args.shape, args.model)
    prompts = _prompts(args.prompts, args.prompt_tokens)
    context = args.prompt_tokens * 2 + args.new_tokens + 64
    settings = SamplingConfig(context_tokens=context, thinking_budget=context, max_answer_tokens=args.new_tokens)
    common = dict(name=str(path), dtype="bfloat16", lora_rank=32, device="cuda:0")

    hf = load_policy(ModelConfig(backend="transformers", **common))
    hf_tokens, hf_s = _measure(hf, prompts, args.per_prompt, settings)
    del hf
    resident.BASE_CACHE.clear()
    gc.collect()
    torch.cuda.empty_cache()

    vl = load_policy(ModelConfig(backend="vllm", generation_memory_fraction=0.9, **common))
    vl_tokens, vl_s = _measure(vl, prompts, args.per_prompt, settings)
    kv = vllm_engine.kv_cache_size(vllm_engine._HELD) if vllm_engine._HELD is not None else {}
    vllm_engine.shutdown()
    write_figures(
        args.json,
        {
            "gpu": gpu_name(),
            "model": path.name,
            "prompts": args.prompts,
            "per_prompt": args.per_prompt,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "transformers": {"tokens": hf_tokens, "seconds": hf_s, "tokens_per_s": hf_tokens / hf_s},
            "vllm": {"tokens": vl_tokens, "seconds": vl_s, "tokens_per_s": vl_tokens / vl_s, "memory_fraction": 0.9, "kv_cache": kv},
            "ratio": (vl_tokens / vl_s) / (hf_tokens / hf_s),
        },
    )

    rows = [
        ["transformers", hf_tokens, f"{hf_s:.1f}", f"{hf_tokens / hf_s:.0f}", "1.0"],
        ["vllm", vl_tokens, f"{vl_s:.1f}", f"{vl_tokens / vl_s:.0f}", f"{(vl_tokens / vl_s) / (hf_tokens / hf_s):.1f}"],
    ]
    print(
        f"\n{gpu_name()}, model {path.name}, {args.prompts} prompts x {args.per_prompt} completions, "
        f"~{args.prompt_tokens} prompt tokens, {args.new_tokens} new tokens each, temperature 1.0"
    )
    print(table(["backend", "tokens", "seconds", "tokens/s", "ratio"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
