"""The report of a run: a table per step, the reward distribution by step, the best states, and for
problems judged case by case (AtCoder) the best program's result on every case.

Plain Python and matplotlib (Agg), no Prefect: `discover report RUN_DIR` and the run flow's end
both call `write_report`; the flow's per-step artifacts (flows/artifacts.py) reuse `step_rows` and
`reward_figure`. The figure follows the method paper's Figure 1: one distribution of rollout
rewards per training step, with the best reward found so far drawn over it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from discover.config import load_config
from discover.run import load_archive, make_problem
from discover.status import step_rows
from evaluators.markdown import markdown_table
from storage.atomic import atomic_path, atomic_write_text
from storage.layout import RunLayout
from discover.run import TASKS
from storage.manifest import read_manifest

REPORT_DIR = "report"
COLUMNS = ("step", "best", "mean", "valid", "beta", "tokens", *(f"{t}_s" for t in TASKS))


def step_rewards(run_dir: Path) -> dict[int, np.ndarray]:
    """The reward of every rollout, per step whose evaluations exist (invalid rollouts score 0)."""
    layout = RunLayout(Path(run_dir))
    out = {}
    for path in sorted((layout.root / "steps").glob("*/evaluations.parquet")):
        out[int(path.parent.name)] = pq.read_table(path, columns=["reward"]).column("reward").to_numpy()
    return out


def reward_figure(run_dir: Path, path: Path) -> Path:
    """Violin plots of rollout rewards per step with the best-so-far curve (method paper, Fig. 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layout = RunLayout(Path(run_dir))
    rewards = step_rewards(run_dir)
    seeds = load_archive(layout.archive(0)).states.values()
    best = max((s.reward for s in seeds), default=0.0)
    steps = sorted(rewards)
    best_so_far = []
    for s in steps:
        best = max(best, float(rewards[s].max()) if len(rewards[s]) else best)
        best_so_far.append(best)

    fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(steps) + 3.0), 3.6), dpi=110)
    if steps:
        data = [rewards[s] if np.ptp(rewards[s]) > 0 else rewards[s] + np.linspace(-1e-9, 1e-9, len(rewards[s])) for s in steps]
        parts = ax.violinplot(data, positions=steps, widths=0.8, showmeans=True, showextrema=False)
        for body in parts["bodies"]:
            body.set_facecolor("#7aa6d8")
            body.set_alpha(0.6)
        ax.plot(steps, best_so_far, color="#c0392b", marker="o", markersize=3, label="best so far")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("training step")
    ax.set_ylabel("reward")
    ax.set_title(f"Rewards of the rollouts by step ({load_config(layout.config).problem})", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(Path(path)) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return Path(path)


def best_states(run_dir: Path, k: int = 5) -> list[dict[str, Any]]:
    """The k best states of the newest archive: id, reward, step, depth of lineage, construction."""
    archives = sorted((Path(run_dir) / "archive").glob("*.parquet"))
    if not archives:
        return []
    states = sorted(load_archive(archives[-1]).states.values(), key=lambda s: s.reward, reverse=True)
    out = []
    for s in states[:k]:
        construction = json.dumps(s.construction)
        if len(construction) > 60:
            construction = construction[:57] + "..."
        out.append({"state": s.id, "reward": float(s.reward), "step": s.step, "depth": len(s.lineage), "construction": construction})
    return out


def per_case_section(run_dir: Path) -> list[str]:
    """The best state's results case by case, for problems whose states keep them (the AtCoder
    problems: a construction {"cases": [[case, verdict, score, cpu_s, peak_mb], ...]})."""
    archives = sorted((Path(run_dir) / "archive").glob("*.parquet"))
    if not archives:
        return []
    best = load_archive(archives[-1]).best()
    table = best.construction.get("cases") if isinstance(best.construction, dict) else None
    if not table:
        return []
    rows = [dict(zip(("case", "verdict", "score", "cpu_s", "peak_mb"), r)) for r in table]
    scores = [r["score"] for r in rows]
    return [
        "## Per-case results of the best program",
        "",
        f"State `{best.id}` (reward {best.reward:.6g}{', a seed' if best.is_seed else f', step {best.step}'}): "
        f"{sum(r['verdict'] == 'AC' for r in rows)}/{len(rows)} cases accepted, mean case score "
        f"{float(np.mean(scores)):.1f} (min {min(scores)}, max {max(scores)}); cpu_s is CPU seconds, peak_mb the peak "
        "resident memory.",
        "",
        markdown_table(rows, ("case", "verdict", "score", "cpu_s", "peak_mb")),
    ]


def _problem_section(config, run_dir: Path) -> list[str]:
    """What the run's problem adds (e.g. denoising: the best program against the baselines)."""
    archives = sorted((Path(run_dir) / "archive").glob("*.parquet"))
    if not archives:
        return []
    states = sorted(load_archive(archives[-1]).states.values(), key=lambda s: s.reward, reverse=True)
    fields = ("id", "reward", "step", "is_seed", "code", "construction")
    return make_problem(config).report_section([{f: getattr(s, f) for f in fields} for s in states])


def _reevaluation_section(layout: RunLayout) -> list[str]:
    tables = sorted((layout.root / "reevaluations").glob("*.md"))
    if not tables:
        return []
    lines = ["## Re-evaluations", ""]
    for t in tables:
        lines.append(f"- [{t.stem}](../reevaluations/{t.name})")
    return [*lines, ""]


def write_report(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Write report.md and rewards.png into RUN_DIR/report (or `out_dir`); return report.md's path."""
    layout = RunLayout(Path(run_dir))
    if not layout.config.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.yaml)")
    config = load_config(layout.config)
    out = Path(out_dir) if out_dir else layout.root / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    reward_figure(run_dir, out / "rewards.png")
    rows = step_rows(run_dir)
    run_id = json.loads(layout.run_info.read_text())["run_id"]
    top = best_states(run_dir)
    lines = [
        f"# Run report: {config.problem}",
        "",
        f"Run `{run_id}`, seed {config.seed}: {len(rows)}/{config.steps} steps started, "
        f"{config.groups} groups × {config.rollouts_per_group} rollouts per step, "
        f"objective `{config.train.objective}`, reuse `{config.reuse.rule}`, model `{config.model.name}`.",
        "",
        "## Rewards by step",
        "",
        "Each violin is the distribution of the rewards of one step's rollouts (invalid ones score 0);",
        "the line is the best reward found so far (the seeds' best before step 0).",
        "",
        "![Rewards of the rollouts by step](rewards.png)",
        "",
        "## Steps",
        "",
        "best: the best state of the archive after the step; mean and valid: over the step's rollouts;",
        "beta: the mean adaptive beta of the groups; tokens: completion tokens; *_s: seconds per task.",
        "",
        markdown_table(rows, COLUMNS),
        "## Best states",
        "",
        markdown_table(top),
        *per_case_section(run_dir),
        *_problem_section(config, run_dir),
        *_reevaluation_section(layout),
    ]
    report = out / "report.md"
    atomic_write_text(report, "\n".join(lines))
    return report
