"""A real pretrained model through the whole method: TTT-Discover against PUCT without training and
against best-of-N, at one sampling budget, on CPU (issue 19).

Each arm is a real discovery run (Prefect flow, sandboxed evaluation) of the same configuration,
by default configs/smollm2-circles.yaml (SmolLM2-135M-Instruct on circle packing, n = 26, every
seed state carrying the starter program circles_grow.py); the arms differ only as in
benchmarks/toy_learning.py:
  ttt        adaptive entropic objective + PUCT reuse (the method);
  puct-only  PUCT reuse, no training;
  best-of-N  no reuse, no training: every rollout from a seed state.
Every arm samples steps x groups x rollouts_per_group completions per seed.

Printed, per arm: the best reward a rollout reached (seeds excluded) per seed, the valid fraction
and the mean reward by step (means over seeds), wall time; per arm, seed and step the best and
mean reward, the valid fraction and the groups with a reward signal (`train/groups_with_signal`:
the groups with a non-zero advantage under the arm's objective, the only ones it learns from; 0 for
the arms without training; under the adaptive entropic objective only a group whose rollouts all
scored the same has none, docs/method.md §2); and for the TTT arm the mean
|sampler - learner| log-probability gap of each training step (train/logprob_gap). The picture
(mean reward and valid fraction by step, one line per arm) goes to --plot.

    .venv/bin/python benchmarks/real_model.py [--seeds 0 1 2] [--steps 4] [--groups 1]
        [--rollouts 4] [--answer-tokens 320] [--config configs/smollm2-circles.yaml] [--answer-format edits]
        [--out runs/bench-real] [--plot docs/plots/real_model_circles.png] [--fresh]

A killed benchmark started again with the same arguments resumes: each arm's run directory is a
discovery run, finished runs return at once and an unfinished one resumes at its first unfinished
task (--fresh starts over); the wall time of a run adds up over the invocations. Seeds can run as
separate processes at once (`--seeds 0` and `--seeds 1` with the same --out), then a last
invocation with all the seeds prints the table from the finished runs (--report-only: from the runs
as they are, running nothing; a run not there is reported as not run, an unfinished one by its
finished steps).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from answer_formats import EDITS_PREFIX, PROGRAM_PREFIX  # noqa: E402 - benchmarks/ is this script's folder
from toy_learning import ARMS, arm_config  # noqa: E402


def _mean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def plot(per_step: dict[str, dict[str, list[float | None]]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for arm, series in per_step.items():
        steps = list(range(len(series["mean"])))
        axes[0].plot(steps, [float("nan") if v is None else v for v in series["mean"]], marker="o", label=arm)
        axes[1].plot(steps, [float("nan") if v is None else v for v in series["valid"]], marker="o", label=arm)
    axes[0].set(xlabel="step", ylabel="mean reward of the step's rollouts", title="mean reward (invalid = 0)")
    axes[1].set(xlabel="step", ylabel="valid fraction", title="valid candidates", ylim=(-0.02, 1.02))
    for ax in axes:
        ax.xaxis.get_major_locator().set_params(integer=True)  # steps are whole numbers
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per group")
    parser.add_argument("--answer-tokens", type=int, default=320)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument(
        "--answer-format",
        choices=["program", "edits"],
        default=None,
        help="sampling.answer_format (default: the configuration's); edits starts each answer with '<<<<<<< SEARCH', program with a fence",
    )
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "smollm2-circles.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-real")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "plots" / "real_model_circles.png")
    parser.add_argument(
        "--fresh", action="store_true", help="delete --out first (default: finished runs are kept, unfinished ones resumed)"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="run nothing: print the table and draw the picture from the runs in --out"
    )
    args = parser.parse_args()

    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")  # a busy machine: Prefect's 20 s is not enough
    from discover.config import parse_config
    from discover.metrics import run_metrics
    from discover.run import Run
    from flows.run_flow import discovery_run

    base = yaml.safe_load(args.config.read_text())
    base.update(groups=args.groups, rollouts_per_group=args.rollouts)
    base.setdefault("sampling", {})["max_answer_tokens"] = args.answer_tokens
    if args.answer_format is not None:
        base["sampling"]["answer_format"] = args.answer_format
        base["sampling"]["answer_prefix"] = EDITS_PREFIX if args.answer_format == "edits" else PROGRAM_PREFIX
    if args.fresh:
        shutil.rmtree(args.out, ignore_errors=True)
    records: dict[tuple[str, int], list[dict]] = {}
    seconds: dict[str, float] = {arm: 0.0 for arm in args.arms}
    for seed in args.seeds:
        for arm in args.arms:
            cfg = parse_config(arm_config(base, arm, seed, args.steps, args.out))
            t0 = time.time()
            if args.report_only and not (Path(cfg.run_dir) / "run.json").is_file():
                records[(arm, seed)] = []  # not run (yet): its cells say so
                print(f"seed {seed} {arm:>10}: not run", flush=True)
                continue
            if not args.report_only:
                discovery_run(config=cfg)
            seconds[arm] += _wall_seconds(Path(cfg.run_dir), 0.0 if args.report_only else time.time() - t0)
            records[(arm, seed)] = [rec for _, rec in run_metrics(Run.open(cfg.run_dir))]
            print(f"seed {seed} {arm:>10}: best rollout {_fmt(_best(records[(arm, seed)]), 4)} ({time.time() - t0:.0f} s)", flush=True)

    budget = args.groups * args.rollouts * args.steps
    problem = base["problem"]
    print(
        f"\n{problem}, model {base['model']['name']}: {args.steps} steps x {args.groups} groups x {args.rollouts} rollouts "
        f"= {budget} samples per arm and seed, {args.answer_tokens} answer tokens, seeds {args.seeds}\n"
    )
    print("| arm | " + " | ".join(f"best, seed {s}" for s in args.seeds) + " | seed states' best (mean) | wall time (all seeds) |")
    print("|---|" + "---:|" * (len(args.seeds) + 2))
    per_step: dict[str, dict[str, list[float | None]]] = {}
    for arm in args.arms:
        bests = [_best(records[(arm, s)]) for s in args.seeds]
        seed_best = _mean([_seed_best(args.out, arm, s) for s in args.seeds])
        print(f"| {arm} | " + " | ".join(_fmt(b, 4) for b in bests) + f" | {_fmt(seed_best, 4)} | {seconds[arm] / 60:.1f} min |")
        per_step[arm] = {
            key: [_mean([_at(records[(arm, s)], t, metric) for s in args.seeds]) for t in range(args.steps)]
            for key, metric in (("mean", "reward/mean"), ("valid", "reward/valid_fraction"))
        }
    print("\n| arm | " + " | ".join(f"step {t}: valid / mean" for t in range(args.steps)) + " |")
    print("|---|" + "---:|" * args.steps)
    for arm, series in per_step.items():
        print(f"| {arm} | " + " | ".join(f"{_fmt(v, 2)} / {_fmt(m, 3)}" for v, m in zip(series["valid"], series["mean"])) + " |")
    print(
        "\nPer seed and step: best / mean reward of the step's rollouts, valid fraction, groups with a reward signal "
        "(a non-zero advantage under the arm's objective: train/groups_with_signal, of --groups; 0 without training)"
    )
    print("\n| arm | seed | " + " | ".join(f"step {t}" for t in range(args.steps)) + " |")
    print("|---|---:|" + "---|" * args.steps)
    for arm in args.arms:
        for s in args.seeds:
            cells = [
                f"{_fmt(r['reward/max'], 4)} / {_fmt(r['reward/mean'], 3)}, {_fmt(r['reward/valid_fraction'], 2)}, "
                f"{_signal(r.get('train/groups_with_signal'))}/{args.groups}"
                for r in records[(arm, s)]
            ] + ["–"] * (args.steps - len(records[(arm, s)]))
            print(f"| {arm} | {s} | " + " | ".join(cells) + " |")
    if "ttt" in args.arms:
        gaps = [[_at(records[("ttt", s)], t, "train/logprob_gap") for s in args.seeds] for t in range(args.steps)]
        print(f"\nTTT: mean |sampler - learner| log-probability gap per completion token, by step (seeds {args.seeds}):")
        print("  " + ", ".join(f"step {t}: " + "/".join("–" if g is None else f"{g:.2e}" for g in gs) for t, gs in enumerate(gaps)))
    if base["sampling"].get("answer_format") == "edits":
        print("\nWhat the valid answers were, per run and step: the parent, the rewards, and each distinct edit (its first")
        print("changed line, before -> after) with its count; 'the example' marks the prompt's own example block copied:\n")
        for arm in args.arms:
            for s in args.seeds:
                for line in _edit_answers(args.out / f"{arm}-seed{s}"):
                    print(f"    {arm}-seed{s} {line}")
    title = f"{base['model']['name']} on {problem}, {budget} samples per arm and seed, mean over seeds {args.seeds}"
    plot(per_step, title, args.plot)
    (args.out / "results.json").write_text(json.dumps({f"{a}/{s}": r for (a, s), r in records.items()}, indent=1))
    print(f"\npicture: {args.plot}; per-step records: {args.out / 'results.json'}")
    return 0


def _best(records: list[dict]) -> float | None:
    """The best reward a rollout of the run reached (invalid = 0); None for a run not there or not evaluated yet."""
    evaluated = [r["reward/max"] for r in records if r.get("reward/valid_fraction") is not None]
    return max((x or 0.0) for x in evaluated) if evaluated else None


def _at(records: list[dict], step: int, metric: str) -> float | None:
    """A step's metric, None when the run has not reached that step (--report-only on an unfinished benchmark)."""
    return records[step].get(metric) if step < len(records) else None


def _signal(groups: float | None) -> str:
    return "–" if groups is None else str(int(groups))


def _wall_seconds(run_dir: Path, elapsed: float) -> float:
    """The run's wall time over every invocation that worked on it (a resumed or finished run adds its part)."""
    record = run_dir / "benchmark_seconds.json"
    total = (json.loads(record.read_text())["seconds"] if record.is_file() else 0.0) + elapsed
    record.write_text(json.dumps({"seconds": total}))
    return total


def _edit_answers(run_dir: Path) -> list[str]:
    """Per step of a run with answers as edits: the parent, the valid answers' rewards and their distinct edits."""
    import pyarrow.parquet as pq

    from discover.edits import example_block, parse_blocks

    steps = sorted((run_dir / "steps").glob("[0-9]*/evaluations.parquet"))
    archive0 = run_dir / "archive" / "0000.parquet"
    if not steps or not archive0.is_file():
        return []
    code = {r["state_id"]: (r["code"], r["reward"]) for r in pq.read_table(archive0, columns=["state_id", "code", "reward"]).to_pylist()}
    out = []
    for path in steps:
        rows = pq.read_table(path).to_pylist()
        answers = {(r["group"], r["index"]): r["answer"] for r in pq.read_table(path.parent / "rollouts.parquet").to_pylist()}
        parent = rows[0]["parent_id"] if rows else "?"
        example = example_block(code.get(parent, ("", None))[0] or "")
        valid = [r for r in rows if r["valid"]]
        edits: dict[str, list[float]] = {}
        for r in valid:
            block = parse_blocks(answers[(r["group"], r["index"])])[0]
            before = next((x.strip() for x in block.search if x.strip()), "")
            after = next((x.strip() for x in block.replace if x.strip()), "")
            same = (
                example is not None
                and [x.strip() for x in block.search] == [example[0].strip()]
                and [x.strip() for x in block.replace] == [x.strip() for x in example[1].splitlines()]
            )
            key = ("the example: " if same else "") + f"{before!r} -> {after!r}"
            edits.setdefault(key, []).append(r["reward"])
        parent_reward = code.get(parent, (None, None))[1]
        said = "; ".join(f"{len(v)} x {k} ({', '.join(f'{x:.6f}' for x in sorted(set(v)))})" for k, v in edits.items())
        out.append(
            f"step {int(path.parent.name)}: parent {parent} ({parent_reward:.6f}); valid {len(valid)}/{len(rows)}"
            + (f": {said}" if said else "")
        )
        for r in rows:
            code[r["child_id"]] = (r["code"], r["reward"])
    return out


def _seed_best(out: Path, arm: str, seed: int) -> float | None:
    """The best reward among the run's seed states (what every arm starts from)."""
    import pyarrow.parquet as pq

    from storage.layout import RunLayout

    archive = RunLayout(out / f"{arm}-seed{seed}").archive(0)
    if not archive.is_file():
        return None
    return float(max(pq.read_table(archive, columns=["reward"]).column("reward").to_pylist()))


if __name__ == "__main__":
    raise SystemExit(main())
