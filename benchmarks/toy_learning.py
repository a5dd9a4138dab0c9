"""Does learning work? TTT-Discover against best-of-N on the toy problem, same sampling budget.

For each seed it runs, as real discovery flows on the embedded tiny model:
  ttt        adaptive entropic objective + PUCT reuse (the method);
  puct-only  PUCT reuse, no training (the paper's "No TTT" ablation: what training adds);
  best-of-N  no reuse, no training: every rollout from the empty seed.
Each arm samples steps x groups x rollouts_per_group completions. It prints a table of the best
reward per arm and seed, and exits non-zero unless TTT beats best-of-N on every seed.

    .venv/bin/python benchmarks/toy_learning.py [--seeds 0 1 2] [--steps N] [--out runs/bench-toy]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = {
    "ttt": {"train": {"objective": "entropic-adaptive"}, "reuse": {"rule": "puct"}},
    "puct-only": {"train": {"objective": "none"}, "reuse": {"rule": "puct"}},
    "best-of-N": {"train": {"objective": "none"}, "reuse": {"rule": "none"}},
}


def arm_config(base: dict, arm: str, seed: int, steps: int, out: Path) -> dict:
    cfg = yaml.safe_load(yaml.safe_dump(base))
    cfg.update(seed=seed, steps=steps, run_dir=str(out / f"{arm}-seed{seed}"))
    for section, values in ARMS[arm].items():
        cfg.setdefault(section, {}).update(values)
    return cfg


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="default: the configuration's")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "toy.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-toy")
    args = parser.parse_args()

    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from discover.config import parse_config
    from flows.run_flow import discovery_run

    base = yaml.safe_load(args.config.read_text())
    steps = args.steps or base["steps"]
    shutil.rmtree(args.out, ignore_errors=True)
    results: dict[tuple[str, int], tuple[float, float]] = {}
    for seed in args.seeds:
        for arm in ARMS:
            cfg = parse_config(arm_config(base, arm, seed, steps, args.out))
            t0 = time.time()
            out = discovery_run(config=cfg)
            results[(arm, seed)] = (out["best_reward"], time.time() - t0)
            print(f"seed {seed} {arm:>10}: best {out['best_reward']:.4f} ({time.time() - t0:.0f} s)", flush=True)

    budget = base["groups"] * base["rollouts_per_group"] * steps
    print(f"\nToy problem, best reward after {steps} steps ({budget} samples per arm and seed)\n")
    print("| seed | " + " | ".join(ARMS) + " | TTT − best-of-N |")
    print("|---:|" + "---:|" * (len(ARMS) + 1))
    wins = 0
    for seed in args.seeds:
        best = {arm: results[(arm, seed)][0] for arm in ARMS}
        wins += best["ttt"] > best["best-of-N"]
        print(f"| {seed} | " + " | ".join(f"{best[a]:.4f}" for a in ARMS) + f" | {best['ttt'] - best['best-of-N']:+.4f} |")
    print(f"\nTTT beats best-of-N on {wins}/{len(args.seeds)} seeds")
    return 0 if wins == len(args.seeds) else 1


if __name__ == "__main__":
    raise SystemExit(main())
