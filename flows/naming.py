"""How a discovery run shows in Prefect: the names of its flow runs, its tags and its artifact keys.

A run is known by its run directory's name (`runs/erdos-8b` -> `erdos-8b`), so that the UI's list
of flow runs reads as the list of runs on disk, and by a short prefix of its run id, which tells
two directories of the same name apart:

    flow run of the run         erdos-8b
    flow run of its step 3      erdos-8b-step-3
    tags                        discover-run:erdos-8b-1a2b3c4d, discover-dir:5e6f..., step:3 (on the step's runs)
    artifact keys               discover-erdos-8b-1a2b3c4d-steps, ...-rewards, ...-report
    re-evaluation artifact      reevaluation-erdos-8b-1a2b3c4d-gpu-h100

Artifact keys allow lowercase letters, digits and dashes only; every other character becomes a
dash.

The run's tag is the same for a copy of its directory (`cp -a runs/toy /elsewhere/toy` keeps the
name and the run id); the directory's tag (`dir_tag`: a hash of the host and the directory's
resolved path) tells the copy apart. A writer ends earlier flow runs of its run only where they
carry both (`run_tags`): those of its own directory, whose lease it holds, so their process is gone.
"""

from __future__ import annotations

import hashlib
import re
import socket
from pathlib import Path
from typing import Any

from discover.run import Run

ID_CHARS = 8  # of the run id, in tags and artifact keys


def slug(text: str) -> str:
    """Lowercase letters, digits and single dashes (what Prefect accepts in an artifact key)."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-") or "run"


def run_name(run_dir: str | Path) -> str:
    """The name a run goes by: its directory's name."""
    return Path(run_dir).resolve().name or "run"


def run_tag(run: Run) -> str:
    """The tag on every flow run of the run (the run itself, its steps, their retries)."""
    return f"discover-run:{slug(run_name(run.root))}-{run.run_id[:ID_CHARS]}"


def dir_tag(run: Run) -> str:
    """The tag of the run's directory on this host: a copy of the directory has another."""
    where = f"{socket.gethostname()}:{Path(run.root).resolve()}"
    return f"discover-dir:{hashlib.sha256(where.encode()).hexdigest()[:12]}"


def run_tags(run: Run) -> list[str]:
    """The tags a flow run of this run in this directory carries (and is superseded by): run and directory."""
    return [run_tag(run), dir_tag(run)]


def step_run_name(run: Run, step: int) -> str:
    return f"{run_name(run.root)}-step-{step}"


def artifact_key(run: Run, what: str) -> str:
    """`discover-<run>-<id>-<what>`: one history per key and run in the UI."""
    return f"discover-{slug(run_name(run.root))}-{run.run_id[:ID_CHARS]}-{slug(what)}"


def reevaluation_key(run: Run, pool: str) -> str:
    """The re-evaluation table of a run on a pool: one history per run and pool."""
    return f"reevaluation-{slug(run_name(run.root))}-{run.run_id[:ID_CHARS]}-{slug(pool)}"


def discovery_run_name(parameters: dict[str, Any]) -> str:
    """The name of a `discovery-run` flow run, from its parameters: the run directory's name
    (`run_dir`, else the configuration's run_dir, else the configuration file's name)."""
    run_dir = parameters.get("run_dir")
    config = parameters.get("config")
    if not run_dir and config is not None:
        run_dir = getattr(config, "run_dir", None) or (config.get("run_dir") if isinstance(config, dict) else None)
    if not run_dir and parameters.get("config_path"):
        import yaml

        try:
            run_dir = (yaml.safe_load(Path(parameters["config_path"]).read_text()) or {}).get("run_dir")
        except (OSError, yaml.YAMLError, AttributeError):
            run_dir = Path(parameters["config_path"]).stem
    return run_name(run_dir) if run_dir else "discovery-run"
