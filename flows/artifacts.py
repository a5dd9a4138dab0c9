"""Prefect artifacts of a run: after each step the steps' metrics records as a table and the reward
picture; at the end the report.

Thin: the records come from discover/metrics.py, the picture and the report from
discover/report.py. Artifact keys hold the run id, so each run's artifacts form one history per key
in the UI (flows/naming.py: `discover-<run>-<id>-<what>`).
"""

from __future__ import annotations

import base64
from pathlib import Path

from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact

from discover import metrics, report
from discover.run import Run
from flows.naming import artifact_key


def _data_url(png: Path) -> str:
    """The picture inline, so the UI shows it without access to the run directory."""
    return "data:image/png;base64," + base64.b64encode(Path(png).read_bytes()).decode()


def publish_step(run: Run, step: int) -> None:
    """First the step's metrics record (steps/NNNN/metrics.json, and TensorBoard's event files when
    `metrics.tensorboard` is on), then the artifacts: a table of the records of every step so far
    and the reward distribution by step with the best so far."""
    records = metrics.publish_metrics(run, step)
    keys = list(dict.fromkeys(k for _, r in records for k in r))  # one set of columns, None where a step lacks a key
    rows = [{"step": s, **{k: r.get(k) for k in keys}} for s, r in records]
    create_table_artifact(rows, key=artifact_key(run, "steps"), description=f"{run.root}: metrics record of each step after step {step}")
    png = report.reward_figure(run, run.root / report.REPORT_DIR / "rewards.png")
    create_image_artifact(_data_url(png), key=artifact_key(run, "rewards"), description=f"{run.root}: rewards by step after step {step}")


def publish_report(run: Run) -> Path:
    """Write RUN_DIR/report/report.md (with its PNG) and show it as a Markdown artifact."""
    path = report.write_report(run)
    text = path.read_text().replace("](rewards.png)", f"]({_data_url(path.parent / 'rewards.png')})")
    create_markdown_artifact(text, key=artifact_key(run, "report"), description=f"report written to {path}")
    return path
