"""Does evaluation overlap generation? Step wall time with overlap, without, and the ideal.

Two real discovery flows of the toy problem on the tiny model, identical but for
`evaluation.overlap`, with an evaluation delay (`problem_options.eval_delay_s`, seconds per
candidate) that makes evaluating a step take about as long as generating it. From the run
manifests (each task's start and end) it prints, per step after the first (which also loads the
model):

  without   each task's time and the step's wall time when every rollout is generated first,
            then evaluated
  with      the same with each rollout evaluated as soon as it is finished: `tail` is the
            evaluate task, which now only waits for what generation could not hide
  ideal     max(generate, evaluate) + train + the other tasks: generate, train and the others
            from the run with overlap, evaluate from the run without (the same candidates)

and the ratios with/without and with/ideal (target: with/ideal <= 1.1). On a machine whose load
changes between the two runs, with/without moves with it; with/ideal compares within one run. Both runs give the same
archive and adapters (tests/test_distributed_evaluation.py checks it); the table says so too.

Completions stream out of the transformers backend as each sequence ends. Rows decoded in one
batch end together when they all run to the answer limit, so the benchmark decodes one group
per batch (`--sample-batch`, default rollouts_per_group), the way a serving engine's continuous
batching finishes requests one after another; on a CPU this costs little generation throughput.

    .venv/bin/python benchmarks/pipeline.py [--steps 3] [--groups 8] [--rollouts 8] [--delay 3] [--concurrency 2]

About one answer in four of the untrained tiny model holds a candidate (the others cost no
evaluation), so a step of 8x8 rollouts evaluates about 16 candidates: 3 s each, 2 at once, is about
as long as generating the step on a busy 2-core machine. What overlap cannot hide is the
evaluation of the last group to finish, about evaluate/groups.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def config(run_dir: Path, args: argparse.Namespace, overlap: bool) -> dict:
    return {
        "problem": "toy",
        "run_dir": str(run_dir),
        "seed": 1,
        "steps": args.steps,
        "groups": args.groups,
        "rollouts_per_group": args.rollouts,
        "model": {"name": "tiny", "lora_rank": 4, "device": "cpu", "decode_batch_size": args.sample_batch or args.rollouts},
        "train": {"learning_rate": 0.003},
        "sampling": {"context_tokens": 512, "thinking_budget": 512, "max_answer_tokens": args.answer_tokens},
        "sandbox": {"concurrency": args.concurrency},
        "evaluation": {"runner": "local", "overlap": overlap},
        "problem_options": {"eval_delay_s": args.delay, "lenient": True},  # every rollout a candidate
    }


def task_seconds(run_dir: Path, step: int) -> dict[str, float]:
    from discover.run import TASKS
    from storage.manifest import read_manifest

    tasks = read_manifest(run_dir / "manifest.json")["tasks"]
    entries = {t: tasks[f"{step}/{t}"] for t in TASKS}
    out = {t: e["finished"] - e["started"] for t, e in entries.items()}
    out["wall"] = entries["train"]["finished"] - entries["select_parents"]["started"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--groups", type=int, default=8, help="the last group's evaluation is what overlap cannot hide")
    parser.add_argument("--rollouts", type=int, default=8, help="rollouts per group")
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--delay", type=float, default=3.0, help="evaluation seconds per candidate")
    parser.add_argument("--concurrency", type=int, default=2, help="candidates evaluated at once")
    parser.add_argument("--sample-batch", type=int, default=None, help="rows decoded together (default: one group)")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()

    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.run_flow import discovery_run
    from tests.conftest import archive_records

    out = args.out or Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    runs = {}
    for name, overlap in (("without", False), ("with", True)):
        run_dir = out / name
        shutil.rmtree(run_dir, ignore_errors=True)
        discovery_run(config=config(run_dir, args, overlap))
        runs[name] = run_dir

    last = f"archive/{args.steps:04d}.parquet"
    same = archive_records(runs["with"] / last) == archive_records(runs["without"] / last)
    adapter = f"checkpoints/{args.steps:04d}/adapter/adapter_model.safetensors"
    same = same and (runs["with"] / adapter).read_bytes() == (runs["without"] / adapter).read_bytes()

    print(
        f"\ntoy, tiny model on CPU: {args.groups}x{args.rollouts} rollouts of <= {args.answer_tokens} tokens per step, "
        f"{args.delay:g} s per evaluation, {args.concurrency} at once; {os.cpu_count()} CPUs"
    )
    print(
        f"{'':>10}| without overlap                       | with overlap\n"
        f"{'step':>4} {'cands':>5}| {'generate':>8} {'evaluate':>8} {'train':>6} {'wall':>6} | {'generate':>8} {'tail':>5} "
        f"{'train':>6} {'wall':>6} {'ideal':>6} | {'with/without':>12} {'with/ideal':>10}"
    )
    ratios = []
    for step in range(1, args.steps):
        a, b = task_seconds(runs["without"], step), task_seconds(runs["with"], step)
        cands = len(list((runs["without"] / "steps" / f"{step:04d}" / "candidates").glob("*.json")))
        # The ideal of the run with overlap: its own generation, training and other tasks (they
        # depend on the machine's load at the time), and the evaluation measured without overlap
        # (the same candidates; sleep-bound, so the load hardly changes it).
        ideal = max(b["generate"], a["evaluate"]) + b["train"] + b["select_parents"] + b["update_archive"]
        ratios.append(b["wall"] / ideal)
        print(
            f"{step:>4} {cands:>5}| {a['generate']:>8.2f} {a['evaluate']:>8.2f} {a['train']:>6.2f} {a['wall']:>6.2f} | "
            f"{b['generate']:>8.2f} {b['evaluate']:>5.2f} {b['train']:>6.2f} {b['wall']:>6.2f} {ideal:>6.2f} | "
            f"{b['wall'] / a['wall']:>12.2f} {b['wall'] / ideal:>10.2f}"
        )
    print(f"same archive and adapter with and without overlap: {same}")
    print(f"worst with/ideal: {max(ratios):.2f} (target <= 1.1)")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
