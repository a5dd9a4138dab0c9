"""Scheduled re-evaluation of one run on one pool, without editing prefect.yaml:

    discover schedule runs/erdos --pool gpu-h100 --cron "0 3 * * *" [--top-k 5] [--timezone UTC]

creates, or updates, the deployment `reevaluate/<run>-<pool>` (flows/reevaluate_flow.py) through
Prefect's API: its parameters name the run (absolute run directory, top-k, the pool's GPU limit),
its schedule is the cron given, and its job variables are those prefect.yaml declares for the pool
(`definitions.work_pools`: the pool's GPU type and limit). A process worker of the pool runs it
from the directory the command was run in (the deployment's working directory), as `prefect
deploy` does: the project's checkout, which must hold the flow's entrypoint. Running it again for
the same run and pool replaces the schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from discover.run import Run
from flows.naming import run_name, slug

REPO = Path(__file__).resolve().parents[1]
ENTRYPOINT = "flows/reevaluate_flow.py:reevaluate"


@dataclass(frozen=True)
class Scheduled:
    deployment: str  # "reevaluate/<name>"
    deployment_id: str
    cron: str
    pool: str
    created: bool
    directory: str  # where a worker of the pool runs it


def pool_definition(prefect_yaml: Path, pool: str) -> tuple[dict[str, Any], int]:
    """The job variables prefect.yaml gives `pool` (definitions.work_pools) and its number of GPUs
    (definitions.infrastructure); a pool it does not declare is an error naming the ones it does."""
    definitions = yaml.safe_load(Path(prefect_yaml).read_text()).get("definitions", {})
    pools = {p["name"]: p for p in definitions.get("work_pools", {}).values() if isinstance(p, dict) and "name" in p}
    if pool not in pools:
        raise ValueError(f"{prefect_yaml} declares no work pool {pool!r} under definitions.work_pools; it has: {', '.join(sorted(pools))}")
    gpus = next((int(i.get("gpus", 0)) for i in definitions.get("infrastructure", []) if i.get("pool") == pool), 0)
    return dict(pools[pool].get("job_variables", {})), gpus


def working_directory(directory: Path | None = None) -> Path:
    """The deployment's working directory: `directory`, else the current one, as `prefect deploy`
    takes it; one without the flow's entrypoint is an error saying where to run from."""
    directory = (directory or Path.cwd()).resolve()
    if not (directory / ENTRYPOINT.split(":")[0]).is_file():
        raise ValueError(
            f"{directory} holds no {ENTRYPOINT.split(':')[0]}: run `discover schedule` from the project's checkout "
            f"(the directory of prefect.yaml, where `prefect deploy` runs), e.g. cd {REPO}"
        )
    return directory


def deployment_name(run: Run, pool: str) -> str:
    return f"{slug(run_name(run.root))}-{slug(pool)}"


def schedule_reevaluation(
    run: Run,
    pool: str,
    cron: str,
    top_k: int = 5,
    timezone: str = "UTC",
    prefect_yaml: Path = Path("prefect.yaml"),
    directory: Path | None = None,
) -> Scheduled:
    """Create or update `reevaluate/<run>-<pool>` with this cron schedule (see the module)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.exceptions import ObjectNotFound
    from prefect.utilities.callables import parameter_schema

    from flows.reevaluate_flow import reevaluate

    workdir = working_directory(directory)
    job_variables, gpus = pool_definition(prefect_yaml, pool)
    schedule = CronSchedule(cron=cron, timezone=timezone)  # a bad cron or timezone fails here, naming it
    name = deployment_name(run, pool)
    parameters = {"run_dir": str(run.root.resolve()), "top_k": top_k, "gpu_limit": pool if gpus else None}
    with get_client(sync_client=True) as client:
        client.read_work_pool(pool)  # ObjectNotFound: `discover setup` creates the pools
        try:
            client.read_deployment_by_name(f"{reevaluate.name}/{name}")
            created = False
        except ObjectNotFound:
            created = True
        flow_id = client.create_flow_from_name(reevaluate.name)
        deployment_id = client.create_deployment(
            flow_id=flow_id,
            name=name,
            description=f"Re-score the top-{top_k} states of {run.root} on the {pool} pool ({cron}, {timezone}).",
            work_pool_name=pool,
            work_queue_name="default",
            entrypoint=ENTRYPOINT,
            path=str(workdir),
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(workdir)}}],
            parameters=parameters,
            parameter_openapi_schema=parameter_schema(reevaluate).model_dump_for_openapi(),
            job_variables=job_variables,
            tags=["discover", "reevaluation"],
            schedules=[DeploymentScheduleCreate(schedule=schedule, active=True)],
        )
        if not created:  # an update keeps the old schedules beside the new one: keep only the new one
            for s in client.read_deployment_schedules(deployment_id):
                if getattr(s.schedule, "cron", None) != cron or getattr(s.schedule, "timezone", None) != timezone:
                    client.delete_deployment_schedule(deployment_id, s.id)
    return Scheduled(f"{reevaluate.name}/{name}", str(deployment_id), cron, pool, created, str(workdir))


def main_message(scheduled: Scheduled, run: Run) -> str:
    verb = "created" if scheduled.created else "updated"
    return (
        f"{scheduled.deployment} {verb}: re-evaluates {run.root} on pool {scheduled.pool} at cron {scheduled.cron!r}; "
        f"a worker of the pool runs it from {scheduled.directory} (`prefect worker start --pool {scheduled.pool}`)"
    )
