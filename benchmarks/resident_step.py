"""What a resident trainer saves per step: a cold worker's step against a resident one's (issue 37).

    python benchmarks/resident_step.py [--shape 8b] [--rollouts 4] [--prompt-tokens 1000]
                                       [--completion-tokens 3000] [--json PATH]

Before the trainer ranks were resident, every `train` started new worker processes: each imported
torch, transformers and peft, read the base model from disk, built the LoRA model and Adam, and
trained once. This script is such a cold worker, timed by stage, followed by what a resident rank
does: the same step again in the same process. Printed, and written with `--json`:
import seconds, model load seconds (from the disk copy of the random model, as a worker reads it),
the first step, the resident step, and the ratio (import + load + first step) / resident step.

One process, one GPU (world size 1): the process group's rendezvous and FSDP's sharding, which a
rank also paid every step, are not in these figures (they only add to the cold side). The model is
the cached random Qwen3-architecture model of `--shape` (benchmarks/gpu_common.py; built and
written to disk once by whichever benchmark asks first); its build is not timed.
Without a GPU: the tiny model on CPU checks the script (its figures say nothing about the target).
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # before the heavy imports: a cold worker pays them

import argparse  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402, F401 - what a worker imports before it can load anything
from gpu_common import NEEDS_GPU, gpu_name, has_cuda, random_model, table, write_figures  # noqa: E402
from training import rollouts  # noqa: E402

from discover.config import ModelConfig, SamplingConfig, TrainConfig  # noqa: E402
from discover.policy.base import TrainBatch  # noqa: E402
from discover.policy.trainer import LoRATrainer  # noqa: E402

IMPORTED = time.perf_counter()


def parser() -> argparse.ArgumentParser:
    """The command line (benchmarks/gpu_rehearsal.py reads a part's arguments with it)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8b")
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--completion-tokens", type=int, default=3000)
    ap.add_argument("--json", default=None, help="write the figures here (JSON)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    cpu = not has_cuda()
    if cpu:
        print(f"resident step benchmark: {NEEDS_GPU}.\nRunning the tiny CPU variant to check the script.")
        args.shape, args.rollouts, args.prompt_tokens, args.completion_tokens = "tiny", 2, 32, 64
    path = random_model(args.shape)  # built and written once (not timed): a worker reads it from disk
    config = ModelConfig(
        name=str(path),
        dtype="float32" if cpu else "bfloat16",
        device="cpu" if cpu else "cuda:0",
        lora_rank=8 if cpu else 32,
        micro_batch_tokens=512 if cpu else 32768,
        gradient_checkpointing=True,
    )
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    t0 = time.perf_counter()
    trainer = LoRATrainer.load(config, seed=0)  # disk -> device, the adapter, as a cold worker
    sync()
    loaded = time.perf_counter() - t0
    vocab = trainer.model.get_base_model().config.vocab_size
    comps = rollouts(args.rollouts, args.prompt_tokens, args.completion_tokens, args.completion_tokens, vocab)
    batch = TrainBatch(comps, [1.0 if i % 2 else -1.0 for i in range(len(comps))])
    train, temperature = TrainConfig(), SamplingConfig().temperature
    times = []
    for _ in range(2):  # the cold worker's only step, then the resident rank's next one
        t0 = time.perf_counter()
        trainer.train_step(batch, train, temperature=temperature)
        sync()
        times.append(time.perf_counter() - t0)
    imported = IMPORTED - STARTED
    cold = imported + loaded + times[0]
    figures = {
        "cpu_variant": cpu,
        "gpu": gpu_name(),
        "shape": args.shape,
        "tokens_per_step": sum(len(c.prompt_ids) + len(c.completion_ids) for c in comps),
        "import_s": imported,
        "load_s": loaded,
        "first_step_s": times[0],
        "resident_step_s": times[1],
        "cold_over_resident": cold / times[1],
    }
    print(
        table(
            ["import s", "load s", "first step s", "resident step s", "cold / resident"],
            [[f"{imported:.2f}", f"{loaded:.2f}", f"{times[0]:.2f}", f"{times[1]:.2f}", f"{cold / times[1]:.2f}"]],
        )
    )
    write_figures(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
