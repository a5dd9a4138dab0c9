"""Wall time of full steps (G = 8 groups x K = 64 rollouts), split by task (issue 14, Must show 3c).

    python benchmarks/step_time.py [--shape 8b] [--model DIR] [--problem erdos] [--steps 2]
                                   [--groups 8] [--rollouts-per-group 64]
                                   [--context-tokens 32768] [--thinking-budget 26000] [--json PATH]

Runs the five tasks of `discover/steps.py` in this process (as one worker runs them: the vLLM
engine and the trainer's base model stay resident between tasks and steps), with the vLLM backend
and the trainer on GPU 0, on a random Qwen3-architecture model unless `--model` is given. Step 0
includes starting vLLM; later steps show the steady state. A random model rarely closes its
thinking or emits EOS, so nearly every rollout runs to the thinking budget and is forced: the
heaviest case for generation and training. Without a GPU a labelled CPU variant runs the same
tasks on the toy problem with the tiny GPT-2 (transformers backend) to check the script.
`--json PATH` writes the seconds per task and step for benchmarks/gpu_check.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from gpu_common import NEEDS_GPU, gpu_name, has_cuda, has_vllm, random_model, table, write_figures

from discover import steps
from discover.config import parse_config
from discover.run import TASKS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8b")
    ap.add_argument("--model", default=None)
    ap.add_argument("--problem", default="erdos")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--rollouts-per-group", type=int, default=64)
    ap.add_argument("--context-tokens", type=int, default=32768)
    ap.add_argument("--thinking-budget", type=int, default=26000)
    ap.add_argument("--json", default=None, help="write the figures here (JSON)")
    args = ap.parse_args(argv)
    gpu = has_cuda() and has_vllm()
    run_dir = Path(tempfile.mkdtemp(prefix="step-time-"))
    if gpu:
        model = {"name": str(random_model(args.shape, args.model)), "backend": "vllm", "dtype": "bfloat16", "device": "cuda:0"}
        data = {
            "problem": args.problem,
            "model": model,
            "sampling": {"context_tokens": args.context_tokens, "thinking_budget": args.thinking_budget, "think_end": "</think>"},
        }
        label = f"{gpu_name()}, {args.problem}, model {model['name']}, vLLM + resident trainer"
    else:
        print(
            f"step-time benchmark: {NEEDS_GPU}.\nRunning the CPU variant (toy "
            "problem, tiny GPT-2, transformers backend) to check the script."
        )
        data = {
            "problem": "toy",
            "model": {"name": "tiny", "lora_rank": 8, "device": "cpu"},
            "sampling": {"context_tokens": 2048, "thinking_budget": 2048, "max_answer_tokens": 6},
            "train": {"learning_rate": 0.003},
        }
        label = "CPU variant: toy problem, tiny GPT-2"
    data |= {"run_dir": str(run_dir), "steps": args.steps, "groups": args.groups, "rollouts_per_group": args.rollouts_per_group}
    cfg = parse_config(data)
    t0 = time.perf_counter()
    run = steps.create_run(cfg)
    steps.initialise(run)
    init = time.perf_counter() - t0
    rows = []
    per_step = []
    for step in range(args.steps):
        times = []
        for task in TASKS:
            t = time.perf_counter()
            steps.STEP_FUNCTIONS[task](run, step)
            times.append(time.perf_counter() - t)
            print(f"step {step} {task}: {times[-1]:.1f} s", flush=True)
        total = sum(times)
        per_step.append({"step": step, **{t: s for t, s in zip(TASKS, times)}, "total": total})
        rows.append([f"step {step}"] + [f"{s:.1f} ({100 * s / total:.0f}%)" for s in times] + [f"{total:.1f}"])
    print(f"\n{label}; G = {args.groups}, K = {args.rollouts_per_group}; initialisation {init:.1f} s; run directory {run_dir}")
    print(table(["", *TASKS, "total s"], rows))
    write_figures(
        args.json,
        {
            "label": label,
            "gpu": gpu_name(),
            "groups": args.groups,
            "rollouts_per_group": args.rollouts_per_group,
            "context_tokens": args.context_tokens,
            "thinking_budget": args.thinking_budget,
            "initialisation_s": init,
            "steps": per_step,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
