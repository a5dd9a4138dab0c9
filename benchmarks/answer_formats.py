"""Whole programs against SEARCH/REPLACE edits (`sampling.answer_format`, issue 30): how many of a
real model's answers are valid programs, and, for edits, how many apply to the parent's program.

For each problem (by default circle packing, n = 26, and the second autocorrelation inequality,
from configs/smollm2-circles.yaml and configs/smollm2-ac2.yaml: SmolLM2-135M-Instruct on CPU, every
seed state carrying the problem's starter program) and each answer format, one arm is step 0 of a
discovery run without training, through the project's own tasks: `steps.create_run` (pre-flight),
`steps.initialise` (the seed state, scored in the sandbox), `steps.select_parents` (the context,
with the edit format under `edits`), `steps.generate` (--answers completions of that one context,
--answer-tokens each, the same sampling seed in both arms) and `steps.evaluate` (edits applied on
the host, every program run in the sandbox). The arms of a problem differ in the answer format and
in the answer prefix the configuration starts the answer with (SmolLM2 needs one to write code at
all): "```python" for `program`, "<<<<<<< SEARCH" for `edits`, whatever the configuration says.

Printed, per arm: the valid fraction, for edits the applied fraction (answers whose blocks applied),
the best and mean reward against the seed's, and a histogram of the reasons of invalid answers
(numbers and quoted text replaced by '#' and '…', so that the same failure counts once).

    .venv/bin/python benchmarks/answer_formats.py [--answers 32] [--answer-tokens 320]
        [--configs configs/smollm2-circles.yaml configs/smollm2-ac2.yaml] [--formats program edits]
        [--out runs/bench-formats] [--json PATH] [--markdown PATH]

Resumable: each arm is a run directory under --out (`<problem>-<format>`); an arm whose
`summary.json` is there is not run again, and an unfinished one repeats only the tasks whose
output is missing (a killed generation starts that arm's generation over). On 2 busy cores a
32-answer arm takes tens of minutes; OMP_NUM_THREADS sets torch's threads.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EDITS_PREFIX = "<<<<<<< SEARCH\n"
PROGRAM_PREFIX = "```python\n"  # what configs/smollm2-circles.yaml starts an answer with
SUMMARY = "summary.json"


def arm_config(base: dict, answer_format: str, answers: int, answer_tokens: int, out: Path) -> dict:
    """The configuration of one arm: the problem's, one group of `answers` rollouts, the format."""
    config = json.loads(json.dumps(base))
    config.update(run_dir=str(out / f"{config['problem']}-{answer_format}"), steps=1, groups=1, rollouts_per_group=answers)
    sampling = config.setdefault("sampling", {})
    sampling.update(answer_format=answer_format, max_answer_tokens=answer_tokens)
    sampling["answer_prefix"] = EDITS_PREFIX if answer_format == "edits" else PROGRAM_PREFIX
    config.setdefault("reuse", {})["seed_states"] = 1  # one initial state, the same for both arms
    config["sandbox"] = {**config.get("sandbox", {}), "backend": "process"}
    return config


_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")
_NUMBER = re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?")


def reason_kind(reason: str) -> str:
    """A reason with its particulars (quoted text but the edit markers, numbers) masked, cut to its first line."""
    from discover.edits import DIVIDER, REPLACE, SEARCH

    first = reason.strip().splitlines()[0] if reason.strip() else "(none)"
    masked = _QUOTED.sub(lambda m: m.group(0) if m.group(0)[1:-1] in (SEARCH, DIVIDER, REPLACE) else "'…'", first)
    return _NUMBER.sub("#", masked)[:120]


def run_arm(config: dict) -> dict:
    """Step 0 of the arm's run up to its evaluation (each task skipped when its output is there),
    then the arm's summary, kept as summary.json in the run directory."""
    from discover import steps
    from discover.config import parse_config
    from discover.edits import EDITS_NOT_APPLIED
    from discover.run import load_archive, read_evaluations

    cfg = parse_config(config)
    run_dir = Path(cfg.run_dir)
    if (run_dir / SUMMARY).is_file():
        return json.loads((run_dir / SUMMARY).read_text())
    t0 = time.time()
    run = steps.create_run(cfg)
    steps.initialise(run)
    for task, output in (
        (steps.select_parents, run.layout.parents(0)),
        (steps.generate, run.layout.rollouts(0)),
        (steps.evaluate, run.layout.evaluations(0)),
    ):
        if not output.is_file():
            task(run, 0)
    evaluations = read_evaluations(run.layout.evaluations(0))
    seed = next(iter(load_archive(run.layout.archive(0)).states.values()))
    n = len(evaluations)
    applied = [not e.reason.startswith(EDITS_NOT_APPLIED) for e in evaluations]
    rewards = [e.reward for e in evaluations]
    summary = {
        "problem": cfg.problem,
        "answer_format": cfg.sampling.answer_format,
        "answer_prefix": cfg.sampling.answer_prefix,
        "answers": n,
        "answer_tokens": cfg.sampling.answer_tokens,
        "seed": cfg.seed,
        "valid": sum(e.valid for e in evaluations),
        "valid_fraction": sum(e.valid for e in evaluations) / n,
        "applied": sum(applied) if cfg.sampling.answer_format == "edits" else None,
        "applied_fraction": sum(applied) / n if cfg.sampling.answer_format == "edits" else None,
        "seed_reward": seed.reward,
        "best_reward": max(rewards),
        "mean_reward": sum(rewards) / n,
        "better_than_seed": sum(e.valid and e.reward > seed.reward for e in evaluations),
        "reasons": dict(Counter(reason_kind(e.reason) for e in evaluations if not e.valid).most_common()),
        "seconds": time.time() - t0,
    }
    (run_dir / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def table(summaries: list[dict]) -> str:
    """The results as Markdown: one row per arm, then each arm's reasons."""
    lines = [
        "| problem | format | answers | valid | applied | seed reward | best | mean | better than seed | minutes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        applied = "–" if s["applied"] is None else f"{s['applied']}/{s['answers']}"
        lines.append(
            f"| {s['problem']} | {s['answer_format']} | {s['answers']} | {s['valid']}/{s['answers']} | {applied} | "
            f"{_fmt(s['seed_reward'], 4)} | {_fmt(s['best_reward'], 4)} | {_fmt(s['mean_reward'], 4)} | "
            f"{s['better_than_seed']} | {s['seconds'] / 60:.1f} |"
        )
    for s in summaries:
        lines += ["", f"Reasons of invalid answers, {s['problem']} / {s['answer_format']}:", ""]
        lines += [f"- {count} × `{kind}`" for kind, count in s["reasons"].items()] or ["- none"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=int, default=32, help="answers per arm (one group of this many rollouts)")
    parser.add_argument("--answer-tokens", type=int, default=320)
    parser.add_argument(
        "--configs", type=Path, nargs="+", default=[ROOT / "configs" / "smollm2-circles.yaml", ROOT / "configs" / "smollm2-ac2.yaml"]
    )
    parser.add_argument("--formats", nargs="+", default=["program", "edits"], choices=["program", "edits"])
    parser.add_argument("--seed", type=int, default=0, help="the runs' seed: the seed state and the sampling, the same in every arm")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-formats")
    parser.add_argument("--json", type=Path, default=None, help="write every arm's summary here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the table here")
    args = parser.parse_args(argv)

    summaries = []
    for path in args.configs:
        base = yaml.safe_load(path.read_text())
        base["seed"] = args.seed
        for answer_format in args.formats:
            config = arm_config(base, answer_format, args.answers, args.answer_tokens, args.out)
            summary = run_arm(config)
            print(
                f"{summary['problem']} {answer_format}: {summary['valid']}/{summary['answers']} valid"
                + ("" if summary["applied"] is None else f", {summary['applied']} applied")
                + f" ({summary['seconds'] / 60:.1f} min)",
                flush=True,
            )
            summaries.append(summary)
    text = table(summaries)
    header = (
        f"model {base['model']['name']}, {args.answers} answers per arm from the problem's "
        f"initial state, {args.answer_tokens} answer tokens, seed {args.seed}\n\n"
    )
    print("\n" + header + text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summaries, indent=1) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(header + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
