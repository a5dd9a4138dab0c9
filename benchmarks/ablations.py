"""The paper's ablation study (Table 8, Figure 4) and the released code's defaults, on the toy problem.

Two studies, each arm at the same sampling budget (steps x groups x rollouts_per_group) on the
embedded tiny model, several seeds per arm:

  --study table8    the rows of the paper's Table 8 plus SimpleTES (training-free parallel chains);
  --study defaults  the full method with the project's former rules against the released code's;
  --study migrate   the full method with MIGRATE's mixed groups (a Table 8 row of its own).

Each run executes the step functions the Prefect tasks wrap (discover/steps.py), in order, without
Prefect, so that `--jobs` runs go side by side in separate processes. It prints the table (mean,
standard deviation, min and max of the best reward per arm) and writes `results.json` and
`rewards_by_step.png` (the distribution of the valid rewards of each step, pooled over seeds, one
panel per arm, like the paper's Figure 4) under --out.

    .venv/bin/python benchmarks/ablations.py --study defaults --seeds 0 1 2 3 4 --steps 20 --jobs 2
    .venv/bin/python benchmarks/ablations.py --study table8 --seeds 0 1 2 --steps 20 --jobs 2
    .venv/bin/python benchmarks/ablations.py --study migrate --seeds 0 1 2 --steps 20 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Paper Table 8 (train x reuse), then SimpleTES (docs/method.md §6): no training, C chains of L steps, K candidates a step.
TABLE8 = {
    "TTT-Discover (adaptive entropic, PUCT)": {"train": {"objective": "entropic-adaptive"}, "reuse": {"rule": "puct"}},
    "constant-beta entropic, PUCT": {"train": {"objective": "entropic-constant"}, "reuse": {"rule": "puct"}},
    "expected reward, PUCT": {"train": {"objective": "expected"}, "reuse": {"rule": "puct"}},
    "no TTT, PUCT": {"train": {"objective": "none"}, "reuse": {"rule": "puct"}},
    "adaptive entropic, epsilon-greedy": {"train": {"objective": "entropic-adaptive"}, "reuse": {"rule": "epsilon-greedy"}},
    "adaptive entropic, no reuse": {"train": {"objective": "entropic-adaptive"}, "reuse": {"rule": "none"}},
    "naive RL (expected reward, no reuse)": {"train": {"objective": "expected"}, "reuse": {"rule": "none"}},
    "best-of-N (no TTT, no reuse)": {"train": {"objective": "none"}, "reuse": {"rule": "none"}},
    # SimpleTES's chains are independent: a state one chain found must not stop another (no dedup across H)
    "SimpleTES (no TTT, parallel chains)": {"train": {"objective": "none"}, "reuse": {"rule": "chains", "deduplicate": False}},
}

# The full method under the project's former rules and under the released code's (docs/method.md §5a).
FORMER = {"seed_states": 1, "invalid_children": "zero", "children_scope": "step", "deduplicate": False}
# The project's defaults (the released rules, the paper's uncentred KL) are table8's first arm.
DEFAULTS = {
    "former rules (1 shared seed, invalid = 0 in Q, top-2 per step, no dedup)": {"reuse": FORMER},
    "released code's choices (its rules + centred KL)": {"train": {"kl_center": True}},
}

# MIGRATE's mixed groups (docs/method.md §6) on the full method: of each group's slots, 2 re-use the best past
# completions and 2 come from the neighbourhood prompt (of 16 slots: 12 on-policy).
MIGRATE = {
    "MIGRATE groups (2 greedy + 2 neighbourhood), adaptive entropic, PUCT": {"mixed": {"greedy": 2, "neighbourhood": 2}},
}

STUDIES = {"table8": TABLE8, "defaults": DEFAULTS, "migrate": MIGRATE}

# A harder toy than configs/toy.yaml (evaluators/toy/digits.py): an 8-digit motif, so the policy
# must learn two alternating 4-digit chunks and which one a state's depth needs.
TOY = {"length": 96, "chunk": 4, "period": 8}


def arm_config(base: dict, arm: dict, name: str, seed: int, out: Path) -> dict:
    cfg = yaml.safe_load(yaml.safe_dump(base))
    cfg.update(seed=seed, run_dir=str(out / f"{slug(name)}-seed{seed}"), problem_options=dict(TOY))
    for section, values in arm.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")[:48]


def run_one(cfg: dict) -> dict:
    """One run, step by step; the best reward and each step's valid rewards."""
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    import torch

    torch.set_num_threads(1)
    from discover import steps
    from discover.config import parse_config
    from discover.run import read_evaluations

    config = parse_config(cfg)
    run_dir = Path(config.run_dir)
    t0 = time.time()
    run = steps.create_run(config)
    steps.initialise(run)
    for step in range(config.steps):
        steps.select_parents(run, step)
        steps.generate(run, step)
        steps.evaluate(run, step)
        steps.update_archive(run, step)
        steps.train(run, step)
    layout = run.layout
    by_step = [[e.reward for e in read_evaluations(layout.evaluations(s)) if e.valid] for s in range(config.steps)]
    best = steps.best_state(run).reward
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # adapters: the bulk of the disk, not needed after
    return {"best": best, "by_step": by_step, "seconds": time.time() - t0}


def table(results: dict, arms: list[str], seeds: list[int]) -> list[str]:
    lines = ["| arm | best reward, mean ± sd | min | max | per seed |", "|---|---:|---:|---:|---|"]
    for arm in arms:
        best = np.array([results[arm][str(s)]["best"] for s in seeds])
        per_seed = " ".join(f"{b:.3f}" for b in best)
        lines.append(
            f"| {arm} | {best.mean():.3f} ± {best.std(ddof=1) if len(best) > 1 else 0.0:.3f} "
            f"| {best.min():.3f} | {best.max():.3f} | {per_seed} |"
        )
    return lines


def figure(results: dict, arms: list[str], seeds: list[int], path: Path) -> None:
    """Valid rewards of each step pooled over seeds: 10-90% band, median, and the step's maximum."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(arms))
    rows = (len(arms) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), sharex=True, sharey=True, squeeze=False)
    for ax, arm in zip(axes.flat, arms):
        steps = len(results[arm][str(seeds[0])]["by_step"])
        pooled = [[r for s in seeds for r in results[arm][str(s)]["by_step"][t]] for t in range(steps)]
        x = np.arange(steps)
        q = np.array([np.percentile(p, [10, 50, 90]) if p else [np.nan] * 3 for p in pooled])
        top = np.array([max(p) if p else np.nan for p in pooled])
        ax.fill_between(x, q[:, 0], q[:, 2], alpha=0.3, label="10-90%")
        ax.plot(x, q[:, 1], label="median")
        ax.plot(x, top, ".", markersize=3, label="max")
        ax.set_title(arm, fontsize=8)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(arms) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("step")
    for ax in axes[:, 0]:
        ax.set_ylabel("reward (valid rollouts)")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def merge(folders: list[Path], out: Path) -> int:
    """The table and figure of several studies' results.json, arms in the order first seen."""
    results: dict[str, dict] = {}
    headers, seeds = [], None
    for folder in folders:
        data = json.loads((folder / "results.json").read_text())
        if seeds is not None and data["seeds"] != seeds:
            raise SystemExit(f"{folder} has seeds {data['seeds']}, the others {seeds}")
        seeds = data["seeds"]
        headers.append(data["header"])
        results.update(data["results"])
    out.mkdir(parents=True, exist_ok=True)
    lines = [*headers, "", *table(results, list(results), seeds)]
    print("\n".join(lines))
    (out / "table.md").write_text("\n".join(lines) + "\n")
    figure(results, list(results), seeds, out / "rewards_by_step.png")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", choices=sorted(STUDIES), default="table8")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="default: the configuration's")
    parser.add_argument("--rollouts", type=int, default=None, help="rollouts per group; default: the configuration's")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process")
    parser.add_argument("--only", default=None, help="run only the study's arms whose name contains this text")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "toy.yaml")
    parser.add_argument("--out", type=Path, default=None, help="default: runs/ablations-STUDY")
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="runs nothing: one table and figure from these --out folders (a later arm of the same name replaces an earlier)",
    )
    args = parser.parse_args()
    if args.merge:
        return merge(args.merge, args.out or ROOT / "runs" / "ablations-merged")

    out = args.out or ROOT / "runs" / f"ablations-{args.study}"
    base = yaml.safe_load(args.config.read_text())
    if args.steps:
        base["steps"] = args.steps
    if args.rollouts:
        base["rollouts_per_group"] = args.rollouts
    arms = {name: arm for name, arm in STUDIES[args.study].items() if args.only is None or args.only in name}
    if not arms:
        parser.error(f"no arm of {args.study} contains {args.only!r}")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    jobs = {(name, seed): arm_config(base, arm, name, seed, out) for seed in args.seeds for name, arm in arms.items()}
    results: dict[str, dict[str, dict]] = {name: {} for name in arms}
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {key: pool.submit(run_one, cfg) for key, cfg in jobs.items()}
        for (name, seed), fut in futures.items():
            res = fut.result()
            results[name][str(seed)] = res
            print(f"seed {seed} {name}: best {res['best']:.4f} ({res['seconds']:.0f} s)", flush=True)
    wall = time.time() - t0

    budget = base["steps"] * base["groups"] * base["rollouts_per_group"]
    header = (
        f"Toy problem {TOY}, tiny model, {base['steps']} steps x {base['groups']} groups x "
        f"{base['rollouts_per_group']} rollouts = {budget} samples per run; seeds {args.seeds}; "
        f"wall time {wall / 60:.1f} min with {args.jobs} job(s)"
    )
    lines = [header, "", *table(results, list(arms), args.seeds)]
    print("\n" + "\n".join(lines))
    (out / "results.json").write_text(json.dumps({"header": header, "seeds": args.seeds, "results": results}))
    (out / "table.md").write_text("\n".join(lines) + "\n")
    figure(results, list(arms), args.seeds, out / "rewards_by_step.png")
    print(f"\nwrote {out / 'table.md'} and {out / 'rewards_by_step.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
