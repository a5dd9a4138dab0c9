"""Generation on CPU with a real model: K completions of one prompt decoded one at a time against
the same K decoded together (batched, with the KV cache; the prompt prefilled once and its cache
shared by the K rows, discover/policy/hf_decode.py).

    .venv/bin/python benchmarks/cpu_decoding.py [--model smollm2-135m] [--k 8] [--new-tokens 48]
        [--threads N]

The prompt is a real one: the context of a circle-packing seed state with its starter program
(configs/smollm2-circles.yaml), about 1,600 tokens. Both sides sample the same budget at
temperature 1.0 with no early stop allowed to dominate (EOS ends a row early on both sides alike).
Printed: generated tokens, seconds, tokens/s, and the ratio batched / one at a time. Run both sides
on the same machine in the same state; the ratio is the figure, not the absolute speed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def circles_context() -> str:
    import numpy as np

    from discover.config import load_config
    from discover.prompts import build_context
    from discover.run import make_problem

    problem = make_problem(load_config(ROOT / "configs" / "smollm2-circles.yaml"))
    seed = problem.seeds(np.random.default_rng(0), 1)[0]
    verdict = problem.verify(seed.construction)
    return build_context(problem.description, problem.render_state(seed.code, seed.construction), verdict.reward, target=problem.target)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--k", type=int, default=8, help="completions of the prompt")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    args = parser.parse_args()

    import torch

    from discover.config import ModelConfig, SamplingConfig
    from discover.policy.registry import load_policy

    if args.threads:
        torch.set_num_threads(args.threads)
    policy = load_policy(ModelConfig(name=args.model, device="cpu", lora_rank=8))
    prompt = circles_context()
    settings = SamplingConfig(temperature=1.0, context_tokens=4096, max_answer_tokens=args.new_tokens)
    prompt_tokens = len(policy.sampler.render_prompt(prompt))
    policy.sample([prompt], 1, SamplingConfig(context_tokens=4096, max_answer_tokens=2), seed=0)  # warm-up

    t0 = time.perf_counter()
    single = sum(len(c.completion_ids) for s in range(args.k) for c in policy.sample([prompt], 1, settings, seed=100 + s)[0])
    single_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batched = sum(len(c.completion_ids) for c in policy.sample([prompt], args.k, settings, seed=100)[0])
    batched_s = time.perf_counter() - t0

    print(
        f"{args.model}, prompt {prompt_tokens} tokens, {args.k} completions of up "
        f"to {args.new_tokens} tokens, {torch.get_num_threads()} torch threads\n"
    )
    print("| decoding | tokens | seconds | tokens/s |")
    print("|---|---:|---:|---:|")
    print(f"| one at a time | {single} | {single_s:.1f} | {single / single_s:.2f} |")
    print(f"| batched ({args.k} rows, prompt prefilled once) | {batched} | {batched_s:.1f} | {batched / batched_s:.2f} |")
    print(f"\nbatched / one at a time: {(batched / batched_s) / (single / single_s):.2f}x tokens/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
