"""The report of a run: the reward distribution by step, a table of the steps' metrics records
(discover/metrics.py), the best states, and what the run's problem adds (its `report_sections`).

Plain Python and matplotlib (Agg), no Prefect: `discover report RUN_DIR` and the run flow's end
both call `write_report`; the flow's per-step artifacts (flows/artifacts.py) reuse `reward_figure`.
The figure follows the method paper's Figure 1: one distribution of rollout rewards per training
step, with the best reward found so far drawn over it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from discover.archive import State
from discover.run import Run, load_archive, read_evaluations, read_rollouts
from discover.status import step_rows
from evaluators.markdown import escape_unprintable, markdown_table
from storage.atomic import atomic_path, atomic_write_text

REPORT_DIR = "report"
TRAIN_SHOWN = ("loss", "kl", "beta_mean")  # of the train/ keys of a step's record, those the step table shows


def step_rewards(run: Run) -> dict[int, np.ndarray]:
    """The reward of every rollout, per step whose evaluations exist (invalid rollouts score 0)."""
    out = {}
    for path in sorted((run.root / "steps").glob("*/evaluations.parquet")):
        out[int(path.parent.name)] = pq.read_table(path, columns=["reward"]).column("reward").to_numpy()
    return out


def reward_figure(run: Run, path: Path) -> Path:
    """Violin plots of rollout rewards per step with the best-so-far curve (method paper, Fig. 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rewards = step_rewards(run)
    seeds = load_archive(run.layout.archive(0)).states.values()
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
    ax.set_title(f"Rewards of the rollouts by step ({run.config.problem})", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(Path(path)) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return Path(path)


def best_states(run: Run, k: int = 5) -> list[dict[str, Any]]:
    """The k best states of the newest archive: id, reward, step, depth of lineage, construction."""
    out = []
    for s in newest_states(run)[:k]:
        construction = json.dumps(s.construction)
        if len(construction) > 60:
            construction = construction[:57] + "..."
        out.append({"state": s.id, "reward": float(s.reward), "step": s.step, "depth": len(s.lineage), "construction": construction})
    return out


def newest_states(run: Run) -> list[State]:
    """The states of the newest archive, best first ([] before the seeds are written)."""
    archives = sorted((run.root / "archive").glob("*.parquet"))
    if not archives:
        return []
    return sorted(load_archive(archives[-1]).states.values(), key=lambda s: s.reward, reverse=True)


ANSWER_CHARS = 1200  # of each answer quoted in the report


def model_answers(run: Run) -> list[str]:
    """The newest evaluated step's best and worst answers as the model wrote them (Markdown), so a
    reader sees what the model actually produces: its text, and the verdict it got; control and other
    unprintable characters shown as escapes (`escape_unprintable`)."""
    layout = run.layout
    steps = [s for s in range(run.config.steps) if layout.evaluations(s).is_file()]
    if not steps:
        return []
    step = steps[-1]
    rollouts = read_rollouts(layout.rollouts(step))
    verdicts = read_evaluations(layout.evaluations(step))
    ranked = sorted(zip(rollouts, verdicts), key=lambda rv: rv[1].reward, reverse=True)
    lines = [
        "## The model's answers",
        "",
        f"The best and the worst rollout of step {step}, as the model wrote them (first {ANSWER_CHARS} characters).",
        "",
    ]
    for title, (rollout, verdict) in (("Best", ranked[0]), ("Worst", ranked[-1])):
        text = rollout.text if len(rollout.text) <= ANSWER_CHARS else rollout.text[:ANSWER_CHARS] + " [...]"
        outcome = f"reward {verdict.reward:.6g}" if verdict.valid else f"invalid: {escape_unprintable(verdict.reason[:200])}"
        heading = f"**{title}** (group {rollout.group}, rollout {rollout.index}; {outcome}):"
        lines += [heading, "", "````text", escape_unprintable(text), "````", ""]
    return lines


def problem_sections(run: Run) -> list[str]:
    """What the run's problem adds (its `report_sections` hook, docs/architecture.md "Problem
    hooks"), as Markdown: a heading, a paragraph and a table per section; a section may quote
    candidate text, so its text and cells are escaped like the model's answers."""
    states = newest_states(run)
    if not states:
        return []
    lines: list[str] = []
    for section in run.problem().report_sections(states):
        lines += [f"## {escape_unprintable(section.title)}", ""]
        if section.text:
            lines += [escape_unprintable(section.text), ""]
        if section.rows:
            lines += [markdown_table(section.rows, section.columns or None)]
    return lines


def step_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The step table's columns: the step, then the record's keys of every namespace but train/
    (whose few shown keys are `TRAIN_SHOWN`), grouped by namespace, in the record's order within
    one; steps/NNNN/metrics.json and TensorBoard hold the rest."""
    keys: dict[str, None] = {}
    for r in rows:
        keys.update(dict.fromkeys(k for k in r if k != "step"))
    shown = [k for k in keys if not k.startswith("train/") or k.removeprefix("train/") in TRAIN_SHOWN]
    order = {ns: i for i, ns in enumerate(("reward", "problem", "archive", "tokens", "train", "time"))}
    return ["step", *sorted(shown, key=lambda k: order.get(k.split("/")[0], len(order)))]


def _reevaluation_section(run: Run) -> list[str]:
    tables = sorted((run.root / "reevaluations").glob("*.md"))
    if not tables:
        return []
    lines = ["## Re-evaluations", ""]
    for t in tables:
        lines.append(f"- [{t.stem}](../reevaluations/{t.name})")
    return [*lines, ""]


def write_report(run: Run, out_dir: Path | None = None) -> Path:
    """Write report.md and rewards.png into RUN_DIR/report (or `out_dir`); return report.md's path."""
    config = run.config
    out = Path(out_dir) if out_dir else run.root / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    reward_figure(run, out / "rewards.png")
    rows = step_rows(run)
    run_id = run.run_id
    top = best_states(run)
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
        "Each step's metrics record (steps/NNNN/metrics.json): reward/best is the best state of the archive",
        "after the step; reward/mean, reward/max and reward/valid_fraction are over the step's rollouts;",
        "problem/* the problem's own figures averaged over its valid candidates; train/beta_mean the mean",
        "adaptive beta of the groups; time/* seconds per task. The record's other train/ figures are in the",
        "file (and in TensorBoard with `metrics.tensorboard: true`).",
        "",
        markdown_table(rows, step_columns(rows)),
        "## Best states",
        "",
        markdown_table(top),
        *problem_sections(run),
        *model_answers(run),
        *_reevaluation_section(run),
    ]
    report = out / "report.md"
    atomic_write_text(report, "\n".join(lines))
    return report
