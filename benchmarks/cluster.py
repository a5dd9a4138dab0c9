"""Cluster planning: the estimated time of a training step on N GPUs, split by task (docs/cluster.md, "Cost model").

    python benchmarks/cluster.py --cost-model [--gpus 1,8,16,32,64] [--results-dir benchmarks/results]
                                 [--markdown] [--decode-tps-8b X] [--train-tps-8b X] [--eval-seconds X] ...

`--cost-model` prints, for Qwen3-8B and gpt-oss-120b at the paper's setting (512 rollouts a step =
8 groups x 64, a thinking budget of 26,000 tokens in a 32,768 context, 50 steps), the estimated
seconds of `generate`, `evaluate` and `train` per step, the step, and the whole run against the
number of GPUs. It measures nothing: it is arithmetic on stated inputs (decode tokens/s per GPU,
one sequence's decode tokens/s, training tokens/s per GPU, evaluation seconds per candidate,
rollout lengths), each printed with where it comes from. The defaults are labelled assumptions;
where a GPU check's results file (benchmarks/results/gpu-*.json, docs/gpu-check.md) holds a
measured figure for a model, the newest file's figure replaces the assumption and is labelled
with the file. The formula is `step_seconds`, in one place.

`--overhead` runs a 4-step toy run (the tiny model on CPU) in the step's process and on
`--replicas` generation replicas and `--ranks` trainer ranks (Ray actors) of a Ray instance the run
starts on the loopback, and prints the generate and train tasks' seconds of each step in both and
their ratios (cluster / single), and whether the step-0 rollouts are the same tokens:

    python benchmarks/cluster.py --overhead [--steps 4] [--groups 4] [--rollouts 8] [--replicas 2] [--ranks 2] [--out DIR]

Step 0 of the cluster run includes the workers' start (the replicas' and ranks' processes, model
loads, the ranks' process group); later steps send the replicas an adapter and the ranks the step's
rollouts (the ranks are resident: docs/cluster.md, "Resident ranks"). The ratios of the later steps
are summarised apart; `--results-dir DIR` writes them as DIR/cluster_overhead.md and .json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# The paper's setting (docs/method.md §1, Table 9 of the paper).
ROLLOUTS = 512  # 8 groups x 64 rollouts a step
STEPS = 50
THINKING_BUDGET = 26_000  # prompt + thinking; the answer follows in what is left of the 32,768 context
GPU_COUNTS = (1, 8, 16, 32, 64)


@dataclass(frozen=True)
class Input:
    """One input of the model: its value and where it comes from ("assumption: ..." or a results file)."""

    value: float
    source: str


@dataclass(frozen=True)
class ModelInputs:
    name: str
    decode_tps_per_gpu: Input  # generated tokens/s of one GPU decoding many sequences at once (vLLM, long contexts)
    sequence_tps: Input  # generated tokens/s of one sequence (what bounds the longest rollout)
    train_tps_per_gpu: Input  # trained tokens/s (prompt + completion) of one GPU, forward and backward
    min_gpus: Input  # GPUs one copy of the model needs to train (bf16 base weights, activations)
    prompt_tokens: Input
    mean_generated_tokens: Input  # a rollout's thinking + answer, on average
    eval_seconds: Input  # one candidate in the sandbox
    eval_slots: Input  # candidates evaluated at once (a CPU pool beside the GPUs)


def _assume(value: float, why: str) -> Input:
    return Input(value, f"assumption: {why}")


_COMMON = {
    "prompt_tokens": _assume(3_000, "problem description and parent state"),
    "mean_generated_tokens": _assume(20_000, "most rollouts think to the 26,000-token budget"),
    "eval_seconds": _assume(15.0, "a sandboxed program: Erdos under 1 s, AHC and TriMul tens of seconds"),
    "eval_slots": _assume(64, "a 64-core evaluation pool"),
}

DEFAULTS = {
    "Qwen3-8B": ModelInputs(
        name="Qwen3-8B",
        decode_tps_per_gpu=_assume(2_000, "vLLM on one H100, KV cache bound at 26k-token contexts"),
        sequence_tps=_assume(60, "one sequence, bf16, H100"),
        train_tps_per_gpu=_assume(4_000, "about 30% MFU of an H100 at about 70 GFLOP a trained token"),
        min_gpus=_assume(1, "16 GB of bf16 weights, activation checkpointing"),
        **_COMMON,
    ),
    "gpt-oss-120b": ModelInputs(
        name="gpt-oss-120b",
        decode_tps_per_gpu=_assume(1_500, "vLLM, MXFP4 experts, 5.1B active parameters"),
        sequence_tps=_assume(80, "one sequence, MoE with 5.1B active parameters"),
        train_tps_per_gpu=_assume(2_500, "5.1B active parameters, MoE routing overhead"),
        min_gpus=_assume(8, "234 GB of bf16 base weights sharded over the ranks"),
        **_COMMON,
    ),
}


def step_seconds(m: ModelInputs, gpus: int) -> dict[str, float] | None:
    """The estimated seconds of one step's tasks on `gpus` GPUs (None: the model does not fit them).

    Generation and training take turns on all the GPUs (one copy of the weights at a time, as on
    one GPU: docs/real-models.md). A GPU decodes min(its throughput, its sequences x one sequence's
    speed), so with few sequences a GPU the step waits on single sequences; the longest rollout
    (the thinking budget) bounds generation from below. Evaluation runs on its own pool: serial,
    it follows generation; overlapped (evaluation.overlap), only what outlasts generation and the
    last candidate remain. Training scales linearly over the GPUs (a lower bound). Prefill is left
    out: the 8 prompts of a step are shared by their 64 rollouts through the prefix cache.
    """
    if gpus < m.min_gpus.value:
        return None
    rollouts_per_gpu = ROLLOUTS / gpus
    per_gpu = min(m.decode_tps_per_gpu.value, rollouts_per_gpu * m.sequence_tps.value)
    generated = ROLLOUTS * m.mean_generated_tokens.value
    generate = max(generated / (gpus * per_gpu), THINKING_BUDGET / m.sequence_tps.value)
    evaluate = math.ceil(ROLLOUTS / m.eval_slots.value) * m.eval_seconds.value
    trained = ROLLOUTS * (m.prompt_tokens.value + m.mean_generated_tokens.value)
    train = trained / (gpus * m.train_tps_per_gpu.value)
    overlapped = max(m.eval_seconds.value, evaluate - generate)
    return {
        "generate": generate,
        "evaluate": evaluate,
        "train": train,
        "step": generate + evaluate + train,
        "step_overlap": generate + overlapped + train,
    }


# ----------------------------------------------------------------------------- measured inputs


def newest_results(results_dir: Path) -> Path | None:
    """The newest GPU check results file (names begin with the UTC date), or None."""
    files = sorted(results_dir.glob("gpu-*.json"))
    return files[-1] if files else None


def _figure(doc: dict[str, Any], part: str, *keys: str) -> float | None:
    record = doc.get("parts", {}).get(part, {})
    if record.get("status") != "passed":
        return None
    value: Any = record.get("figures", {})
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def with_measurements(defaults: dict[str, ModelInputs], path: Path | None) -> dict[str, ModelInputs]:
    """The inputs with the figures a GPU check measured: vLLM's decode tokens/s (part `generation`)
    and training tokens/s (part `train-bf16`), both on the 8B shape, so for Qwen3-8B only."""
    if path is None:
        return defaults
    doc = json.loads(path.read_text())
    found: dict[str, Input] = {}
    decode = _figure(doc, "generation", "vllm", "tokens_per_s")
    if decode is not None:
        found["decode_tps_per_gpu"] = Input(decode, f"measured: {path.name}, part generation (2k-token prompts, 1k new tokens)")
    train = _figure(doc, "train-bf16", "tokens_per_s")
    if train is not None:
        found["train_tps_per_gpu"] = Input(train, f"measured: {path.name}, part train-bf16")
    out = dict(defaults)
    out["Qwen3-8B"] = dataclasses.replace(defaults["Qwen3-8B"], **found)  # type: ignore[arg-type]
    return out


# ----------------------------------------------------------------------------- output


def _s(x: float) -> str:
    return f"{x:,.0f}"


def cost_model(models: dict[str, ModelInputs], gpu_counts: tuple[int, ...], results: Path | None) -> str:
    """The inputs and the table of each model, as Markdown."""
    lines = []
    if results is None:
        lines.append(
            "No GPU check results file (benchmarks/results/gpu-*.json) exists yet: every input below is an assumption, not a measurement."
        )
    else:
        lines.append(f"GPU check results: {results.name} (measured figures say so; the others are assumptions).")
    lines.append(f"Setting: {ROLLOUTS} rollouts a step (8 groups x 64), thinking budget {THINKING_BUDGET:,} tokens, {STEPS} steps.")
    for m in models.values():
        lines += ["", f"**{m.name}**", "", "| input | value | source |", "|---|---|---|"]
        for f in dataclasses.fields(m):
            if f.name != "name":
                i: Input = getattr(m, f.name)
                lines.append(f"| {f.name} | {i.value:,.6g} | {i.source} |")
        lines += [
            "",
            "| GPUs | generate s | evaluate s | train s | step s | step s, overlapped | 50 steps, h | GPU-hours |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for n in gpu_counts:
            t = step_seconds(m, n)
            if t is None:
                lines.append(f"| {n} | does not fit ({m.min_gpus.value:.0f} GPUs needed) | | | | | | |")
                continue
            hours = STEPS * t["step_overlap"] / 3600
            lines.append(
                f"| {n} | {_s(t['generate'])} | {_s(t['evaluate'])} | {_s(t['train'])} | {_s(t['step'])} | "
                f"{_s(t['step_overlap'])} | {hours:,.1f} | {hours * n:,.0f} |"
            )
    return "\n".join(lines) + "\n"


def _override(models: dict[str, ModelInputs], args: argparse.Namespace) -> dict[str, ModelInputs]:
    """Inputs given on the command line replace the defaults and the measurements (source: the flag)."""
    out = dict(models)
    for flag, (model, field) in _FLAGS.items():
        value = getattr(args, flag.replace("-", "_"))
        if value is not None:
            targets = list(out) if model is None else [model]
            for name in targets:
                out[name] = dataclasses.replace(out[name], **{field: Input(value, f"given: --{flag}")})
    return out


_FLAGS: dict[str, tuple[str | None, str]] = {
    "decode-tps-8b": ("Qwen3-8B", "decode_tps_per_gpu"),
    "decode-tps-120b": ("gpt-oss-120b", "decode_tps_per_gpu"),
    "train-tps-8b": ("Qwen3-8B", "train_tps_per_gpu"),
    "train-tps-120b": ("gpt-oss-120b", "train_tps_per_gpu"),
    "eval-seconds": (None, "eval_seconds"),
    "eval-slots": (None, "eval_slots"),
    "generated-tokens": (None, "mean_generated_tokens"),
}


def config(run_dir: Path, args: argparse.Namespace, replicas: int, ranks: int = 1) -> dict:
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
    if ranks > 1:
        out.setdefault("cluster", {}).update(trainer_world_size=ranks, trainer_placement="ray")
    return out


def task_seconds(run_dir: Path, step: int, task: str) -> float:
    from storage.manifest import read_manifest

    entry = read_manifest(run_dir / "manifest.json")["tasks"][f"{step}/{task}"]
    return entry["finished"] - entry["started"]


def overhead(args: argparse.Namespace) -> int:
    """The generate task in the step's process against on R replicas (docs/cluster.md, "What is compared, and what was run")."""
    import pyarrow.parquet as pq

    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    sys.path.insert(0, str(ROOT))
    from flows.run_flow import discovery_run

    out = args.out or Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    runs = {}
    for name, r, w in (("single", 1, 1), ("cluster", args.replicas, args.ranks)):
        run_dir = out / name
        shutil.rmtree(run_dir, ignore_errors=True)
        discovery_run(config=config(run_dir, args, r, w))
        runs[name] = run_dir
    tokens = [[row["completion_ids"] for row in pq.read_table(runs[n] / "steps" / "0000" / "rollouts.parquet").to_pylist()] for n in runs]
    setting = (
        f"toy, tiny model on CPU: {args.groups}x{args.rollouts} rollouts of <= {args.answer_tokens} tokens per step; "
        f"{args.replicas} generation replicas and {args.ranks} resident trainer ranks on a local Ray instance; {os.cpu_count()} CPUs"
    )
    rows = []
    for step in range(args.steps):
        for task in ("generate", "train"):
            a, b = task_seconds(runs["single"], step, task), task_seconds(runs["cluster"], step, task)
            rows.append({"step": step, "task": task, "single_s": a, "cluster_s": b, "ratio": b / a})
    later = {task: _median([r["ratio"] for r in rows if r["task"] == task and r["step"] > 0]) for task in ("generate", "train")}
    same = tokens[0] == tokens[1]
    lines = [
        f"# Cluster overhead: generate and train on Ray workers against the step's process ({_today()})",
        "",
        setting + ".",
        "`python benchmarks/cluster.py --overhead "
        + f"--steps {args.steps} --groups {args.groups} --rollouts {args.rollouts} --answer-tokens {args.answer_tokens} "
        + f"--replicas {args.replicas} --ranks {args.ranks}`.",
        "",
        "| step | task | single (s) | cluster (s) | cluster / single |",
        "|---:|---|---:|---:|---:|",
        *[f"| {r['step']} | {r['task']} | {r['single_s']:.2f} | {r['cluster_s']:.2f} | {r['ratio']:.2f} |" for r in rows],
        "",
        "Step 0 of the cluster run includes starting the workers: the replicas' and the ranks' processes, their",
        "model loads and the ranks' process group. Later steps send data only.",
        "",
        f"Steps after the first, median cluster / single: generate {later['generate']:.2f}, train {later['train']:.2f}.",
        f"Step 0 rollouts token for token the same: {same}.",
    ]
    print("\n" + "\n".join(lines))
    if args.results_dir is not None:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        (args.results_dir / "cluster_overhead.md").write_text("\n".join(lines) + "\n")
        record = {"setting": setting, "rows": rows, "median_later_steps": later, "same_step0_rollouts": same}
        (args.results_dir / "cluster_overhead.json").write_text(json.dumps(record, indent=2) + "\n")
        print(f"written: {args.results_dir / 'cluster_overhead.md'} and .json")
    return 0 if same else 1


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _today() -> str:
    import datetime

    return datetime.date.today().isoformat()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--cost-model", action="store_true", help="estimated step time by task against the number of GPUs")
    mode.add_argument("--overhead", action="store_true", help="generate and train on Ray against the step's process (toy, CPU)")
    ap.add_argument("--steps", type=int, default=4, help="--overhead: steps of each run")
    ap.add_argument("--groups", type=int, default=4, help="--overhead: groups a step")
    ap.add_argument("--rollouts", type=int, default=8, help="--overhead: rollouts a group")
    ap.add_argument("--answer-tokens", type=int, default=8, help="--overhead: sampling.max_answer_tokens")
    ap.add_argument("--replicas", type=int, default=2, help="--overhead: generation replicas")
    ap.add_argument("--ranks", type=int, default=2, help="--overhead: trainer ranks on Ray (1: one process, as the single run)")
    ap.add_argument("--out", type=Path, default=None, help="--overhead: keep the runs here (default: a temporary folder)")
    ap.add_argument("--gpus", default=",".join(map(str, GPU_COUNTS)), help="comma-separated GPU counts")
    ap.add_argument("--results-dir", type=Path, default=RESULTS, help="where the GPU check's gpu-*.json files are")
    for flag in _FLAGS:
        ap.add_argument(f"--{flag}", type=float, default=None)
    args = ap.parse_args(argv)
    try:
        gpus = tuple(int(x) for x in args.gpus.split(","))
    except ValueError:
        ap.error(f"--gpus takes comma-separated whole numbers, got {args.gpus!r}")
    if any(n < 1 for n in gpus):
        ap.error(f"--gpus must all be >= 1, got {args.gpus!r}")
    if args.overhead:
        return overhead(args)
    if args.cost_model:
        results = newest_results(args.results_dir)
        models = _override(with_measurements(DEFAULTS, results), args)
        sys.stdout.write(cost_model(models, gpus, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
