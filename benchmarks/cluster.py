"""What do generation replicas on Ray cost? The generate task of a toy step, in the step's process against on R replicas.

Two real discovery flows of the toy problem on the tiny model, identical but for the `cluster:`
section: the single-process path, and `generation_replicas: R` on a Ray instance the run starts on
the loopback (docs/cluster.md). From the run manifests it prints, per step, the generate task's
seconds in both and their ratio (replicas / single), and whether step 0's rollouts are the same
tokens. Step 0 of the replica run includes loading the model in each replica; later steps load an
adapter only. On CPU the transformers engine's batches are decoded whole by one replica (docs/cluster.md,
"Spreading"), so the ratio measures the overhead of the round trips (submissions and outputs
through Ray, the adapter's hash check) and nothing is gained: replicas pay off with vLLM on GPUs,
which was never run here.

    .venv/bin/python benchmarks/cluster.py [--steps 2] [--groups 4] [--rollouts 8] [--replicas 2] [--function replicas]

`--function` picks the measurement (one so far: `replicas`), so other cluster measurements can join this file.
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


def config(run_dir: Path, args: argparse.Namespace, replicas: int) -> dict:
    out: dict = {
        "problem": "toy",
        "run_dir": str(run_dir),
        "seed": 1,
        "steps": args.steps,
        "groups": args.groups,
        "rollouts_per_group": args.rollouts,
        "model": {"name": "tiny", "lora_rank": 4, "device": "cpu"},
        "train": {"learning_rate": 0.003},
        "sampling": {"context_tokens": 512, "thinking_budget": 512, "max_answer_tokens": args.answer_tokens},
        "problem_options": {"lenient": True},
    }
    if replicas > 1:
        out["cluster"] = {"generation_replicas": replicas}
    return out


def generate_seconds(run_dir: Path, step: int) -> float:
    from storage.manifest import read_manifest

    entry = read_manifest(run_dir / "manifest.json")["tasks"][f"{step}/generate"]
    return entry["finished"] - entry["started"]


def replicas(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from flows.run_flow import discovery_run

    out = args.out or Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    runs = {}
    for name, r in (("single", 1), ("replicas", args.replicas)):
        run_dir = out / name
        shutil.rmtree(run_dir, ignore_errors=True)
        discovery_run(config=config(run_dir, args, r))
        runs[name] = run_dir
    tokens = [[row["completion_ids"] for row in pq.read_table(runs[n] / "steps" / "0000" / "rollouts.parquet").to_pylist()] for n in runs]
    print(
        f"\ntoy, tiny model on CPU: {args.groups}x{args.rollouts} rollouts of <= {args.answer_tokens} tokens per step; "
        f"{args.replicas} replicas on a local Ray instance; {os.cpu_count()} CPUs"
    )
    print(f"{'step':>4} {'single (s)':>10} {'replicas (s)':>12} {'replicas/single':>15}")
    for step in range(args.steps):
        a, b = generate_seconds(runs["single"], step), generate_seconds(runs["replicas"], step)
        print(f"{step:>4} {a:>10.2f} {b:>12.2f} {b / a:>15.2f}")
    same = tokens[0] == tokens[1]
    print(f"step 0 rollouts, token for token the same: {same}")
    return 0 if same else 1


FUNCTIONS = {"replicas": replicas}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--function", choices=sorted(FUNCTIONS), default="replicas")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=8, help="rollouts per group")
    parser.add_argument("--answer-tokens", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    return FUNCTIONS[args.function](args)


if __name__ == "__main__":
    raise SystemExit(main())
