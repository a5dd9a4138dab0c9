"""One training step of the resident trainer: tokens/s and model FLOPs utilisation (issue 14, 3b).

    python benchmarks/training.py [--shape 8b] [--model DIR] [--rank 32] [--rollouts 16]
                                  [--prompt-tokens 3000] [--min-completion 4000] [--max-completion 28000]
                                  [--micro-batch-tokens 32768] [--peak-tflops X]
                                  [--lora-dtype float32|bfloat16] [--offload-cycles N] [--json PATH]

The step is the real one (`trainer.LoRATrainer.train_step`: bf16 weights, float32 LoRA on every
linear layer at rank `--rank`, gradient checkpointing, token-budget micro-batches, the base
model's forward for the KL term, one Adam step). Lengths follow the paper's accounting (prompt
about 3000 tokens, completions 16000 on average: uniform in [min, max]); token ids are random.

What is counted as model FLOPs (per sequence of L tokens, C of them completion tokens; N = the
weights of the decoder's linear layers, N_lora = the adapter's weights, d = heads x head_dim):
  learner forward            2 N L + 2 h V C + 2 layers d L^2     (causal attention: L^2/2 pairs, QK and AV)
  learner backward           2 N L + 2 h V C + 4 layers d L^2     (activation gradients; frozen weights get none)
  LoRA weight gradients      2 N_lora L  (+ their 4 N_lora L forward/activation share)
  base-model forward (KL)    2 N L + 2 h V C + 2 layers d L^2
Not counted: the forward recomputed by gradient checkpointing, padding, the optimizer. The
usual "6 N D" figure would credit weight gradients that LoRA never computes; it is printed for
reference only. MFU = counted FLOPs / (seconds x the GPU's dense bf16 peak).
`--lora-dtype bfloat16` trains bf16 LoRA parameters (model.lora_dtype) instead of float32.
`--offload-cycles N` then parks the trainer's tensors in CPU memory and brings them back N times
(discover/policy/offload.py, model.offload_while_generating), timing each way: the first park
copies the base weights, later ones only the adapter and Adam's state. `--json PATH` writes the
figures for benchmarks/gpu_check.py. The random model of `--shape` is built on the GPU in memory
(never written to disk: the step does not need a copy there); `--model DIR` loads one from disk.
Without a GPU: a tiny CPU variant checks the script (its figures say nothing about the target).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from gpu_common import NEEDS_GPU, gpu_name, has_cuda, peak_bf16_tflops, table, write_figures

from discover.config import ModelConfig, SamplingConfig, TrainConfig
from discover.policy.base import Completion, TrainBatch


def rollouts(n: int, prompt: int, lo: int, hi: int, vocab: int, seed: int = 0) -> list[Completion]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        c = rng.randint(lo, hi)
        out.append(
            Completion(
                prompt_ids=[rng.randrange(vocab) for _ in range(prompt)],
                completion_ids=[rng.randrange(vocab) for _ in range(c)],
                sampler_logprobs=[-8.0] * c,
                loss_mask=[1] * c,
                text="",
                answer="",
            )
        )
    return out


def counted_flops(cfg, comps: list[Completion], lora_params: int) -> tuple[float, float]:
    """(counted model FLOPs, the 6 N D convention) for one step on `comps` (see the module docstring)."""
    h, layers = cfg.hidden_size, cfg.num_hidden_layers
    d = cfg.num_attention_heads * getattr(cfg, "head_dim", h // cfg.num_attention_heads)
    kv = cfg.num_key_value_heads * getattr(cfg, "head_dim", h // cfg.num_attention_heads)
    n_linear = layers * (h * d + 2 * h * kv + d * h + 3 * h * cfg.intermediate_size)
    total, six_nd = 0.0, 0.0
    for c in comps:
        L, C = len(c.prompt_ids) + len(c.completion_ids), len(c.completion_ids)
        fwd = 2 * n_linear * L + 2 * h * cfg.vocab_size * C + 2 * layers * d * L * L
        bwd = 2 * n_linear * L + 2 * h * cfg.vocab_size * C + 4 * layers * d * L * L
        total += 2 * fwd + bwd + 6 * lora_params * L  # learner fwd + bwd, base fwd, LoRA
        six_nd += 6 * (n_linear + h * cfg.vocab_size) * L
    return total, six_nd


def parser() -> argparse.ArgumentParser:
    """The command line (benchmarks/gpu_rehearsal.py reads a part's arguments with it)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8b")
    ap.add_argument("--model", default=None)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--rollouts", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=3000)
    ap.add_argument("--min-completion", type=int, default=4000)
    ap.add_argument("--max-completion", type=int, default=28000)
    ap.add_argument("--micro-batch-tokens", type=int, default=32768)
    ap.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, if not in the table")
    ap.add_argument("--lora-dtype", default="float32", choices=("float32", "bfloat16"), help="model.lora_dtype")
    ap.add_argument("--offload-cycles", type=int, default=0, help="park/unpark the trainer this many times after the step, timed")
    ap.add_argument("--json", default=None, help="write the figures here (JSON)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import torch

    from discover.policy.qwen3_model import random_qwen3
    from discover.policy.resident import as_base
    from discover.policy.trainer import LoRATrainer

    cpu = not has_cuda()
    if cpu:
        print(
            f"training benchmark: {NEEDS_GPU}.\nRunning the tiny CPU variant to "
            "check the script; its figures say nothing about the 8B target."
        )
        args.shape, args.rollouts, args.prompt_tokens, args.min_completion, args.max_completion = "tiny", 4, 64, 32, 192
        args.micro_batch_tokens, args.rank = 512, 8
    model_cfg = ModelConfig(
        name=args.model or f"random-qwen3-{args.shape}",
        dtype="float32" if cpu else "bfloat16",
        device="cpu" if cpu else "cuda:0",
        lora_rank=args.rank,
        micro_batch_tokens=args.micro_batch_tokens,
        gradient_checkpointing=True,
        lora_dtype=args.lora_dtype,
    )
    if args.model:
        policy = LoRATrainer.load(model_cfg, seed=0)
    else:  # built on the device in memory: the step needs no copy on disk (issue 42)
        print(f"building a random Qwen3-architecture model, shape {args.shape}, on {model_cfg.device} ...", flush=True)
        built = random_qwen3(args.shape, seed=0, device=model_cfg.device, dtype=model_cfg.dtype)
        policy = LoRATrainer.on_base(*as_base(*built), model_cfg, seed=0)
    cfg = policy.model.get_base_model().config
    comps = rollouts(args.rollouts, args.prompt_tokens, args.min_completion, args.max_completion, cfg.vocab_size)
    batch = TrainBatch(comps, [1.0 if i % 2 else -1.0 for i in range(len(comps))])
    train = TrainConfig()  # the paper's: lr 4e-5, KL 0.1
    temperature = SamplingConfig().temperature  # the paper's sampling temperature, 1.0
    warm = TrainBatch(comps[:1], [1.0])
    policy.train_step(warm, train, temperature=temperature)  # warm-up: kernels, allocator, optimizer state
    sync = torch.cuda.synchronize if not cpu else (lambda: None)
    if not cpu:
        torch.cuda.reset_peak_memory_stats()
    sync()
    t0 = time.perf_counter()
    stats = policy.train_step(batch, train, temperature=temperature)
    sync()
    seconds = time.perf_counter() - t0
    tokens = sum(len(c.prompt_ids) + len(c.completion_ids) for c in comps)
    lora = sum(p.numel() for p in policy.lora_parameters())
    flops, six_nd = counted_flops(cfg, comps, lora)
    peak = None if cpu else peak_bf16_tflops(args.peak_tflops)
    mfu = f"{100 * flops / seconds / (peak * 1e12):.1f}%" if peak else "n/a"
    mfu6 = f"{100 * six_nd / seconds / (peak * 1e12):.1f}%" if peak else "n/a"
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if not cpu else 0.0
    offload_rows = []
    if args.offload_cycles:
        from discover.policy import offload

        for i in range(args.offload_cycles):
            out = offload.park_all()
            free = torch.cuda.mem_get_info()[0] / 2**30 if not cpu else None  # what vLLM could have meanwhile
            held = torch.cuda.memory_allocated() / 2**30 if not cpu else None
            back = offload.unpark_all()
            offload_rows.append(
                {
                    "cycle": i,
                    "park": out.as_dict(),
                    "unpark": back.as_dict(),
                    "free_GiB_while_parked": free,
                    "allocated_GiB_while_parked": held,
                }
            )
        print(
            table(
                ["cycle", "park s", "park copied GiB", "freed GiB", "unpark s", "unpark GiB"],
                [
                    [
                        r["cycle"],
                        f"{r['park']['seconds']:.2f}",
                        f"{r['park']['copied_GiB']:.2f}",
                        f"{r['park']['device_GiB']:.2f}",
                        f"{r['unpark']['seconds']:.2f}",
                        f"{r['unpark']['device_GiB']:.2f}",
                    ]
                    for r in offload_rows
                ],
            )
        )
    write_figures(
        args.json,
        {
            "cpu_variant": cpu,
            "gpu": gpu_name(),
            "shape": args.shape,
            "lora_dtype": args.lora_dtype,
            "rank": args.rank,
            "rollouts": len(comps),
            "tokens": tokens,
            "padded_tokens": stats["padded_tokens"],
            "micro_batches": stats["micro_batches"],
            "micro_batch_tokens": args.micro_batch_tokens,
            "lora_params_M": lora / 1e6,
            "seconds": seconds,
            "tokens_per_s": tokens / seconds,
            "counted_TFLOP": flops / 1e12,
            "peak_TFLOPs": peak,
            "MFU": flops / seconds / (peak * 1e12) if peak else None,
            "MFU_6ND_ref": six_nd / seconds / (peak * 1e12) if peak else None,
            "peak_memory_GiB": peak_gib,
            "offload": offload_rows,
        },
    )
    label = "CPU smoke (tiny shape)" if cpu else f"{gpu_name()}, shape {args.shape}"
    print(
        f"\n{label}: {len(comps)} rollouts, {tokens} tokens ({stats['padded_tokens']:.0f} with padding), "
        f"{stats['micro_batches']:.0f} micro-batches of <= {args.micro_batch_tokens} tokens, LoRA rank {args.rank} "
        f"({lora / 1e6:.1f}M params, {args.lora_dtype}), peak memory {peak_gib:.1f} GiB"
    )
    print(
        table(
            ["step", "seconds", "tokens/s", "counted TFLOP", "MFU", "6ND TFLOP (ref.)", "MFU 6ND (ref.)", "GPU peak"],
            [
                [
                    "train",
                    f"{seconds:.1f}",
                    f"{tokens / seconds:.0f}",
                    f"{flops / 1e12:.0f}",
                    mfu,
                    f"{six_nd / 1e12:.0f}",
                    mfu6,
                    f"{peak:.0f}" if peak else "n/a",
                ]
            ],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
