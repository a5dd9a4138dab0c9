"""Operations around the Prefect server (docs/operations.md), run as `discover` commands:

    discover setup [--file prefect.yaml]   # work pools, GPU limits, recovery automations
    discover crashed FLOW_RUN_ID           # mark a run whose worker died as crashed
    discover schedule RUN_DIR --pool POOL --cron CRON   # flows/schedules.py

`setup` is idempotent: an existing pool is updated (`prefect work-pool create --overwrite`), an
existing limit gets the new slot count, the automations of automatic recovery (flows/recovery.py)
are replaced by their current definition. Each GPU pool gets a global concurrency limit of the same
name with one slot per GPU (prefect.yaml and flows/tasks.py say who holds the slots).

`crashed`: a flow run whose worker died stays RUNNING on the server until the heartbeat automation
notices; this sets it CRASHED at once. With the recovery automations (`discover setup`) a discovery
run is then restarted by itself, and the command says so; without them it names `prefect flow-run
retry`, which only takes runs in a terminal state. Check first that its worker is really gone.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from flows.recovery import RESTART_CRASHED, RESTART_DELAY_S, RESTARTED_FLOW


def infrastructure(path: Path) -> list[dict]:
    """The `definitions.infrastructure` entries of a prefect.yaml: pool, type and optional gpus."""
    return yaml.safe_load(Path(path).read_text())["definitions"]["infrastructure"]


async def _set_limit(name: str, slots: int) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectNotFound

    async with get_client() as client:
        try:
            await client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=slots))
            return "created"
        await client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=slots))
        return "updated"


async def _mark_crashed(flow_run_id: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
        if run.state is not None and run.state.is_final():
            return f"flow run {flow_run_id} is already {run.state.type.value}; nothing to do"
        await client.set_flow_run_state(flow_run_id, Crashed(message="worker lost (marked by `discover crashed`)"), force=True)
        restarts = run.flow_id is not None and await _restarted_automatically(client, run.flow_id)
        if restarts:
            return (
                f"flow run {flow_run_id} marked CRASHED; the automation {RESTART_CRASHED} schedules it again within "
                f"{RESTART_DELAY_S} s and a worker of its pool resumes it: nothing to type (`prefect flow-run logs {flow_run_id}`)"
            )
        return (
            f"flow run {flow_run_id} marked CRASHED; no recovery automation restarts it (`discover setup` creates them), "
            f"so: prefect flow-run retry {flow_run_id}"
        )


async def _restarted_automatically(client, flow_id) -> bool:  # noqa: ANN001
    """Whether the restart automation of flows/recovery.py exists, is on, and restarts this flow."""
    flow = await client.read_flow(flow_id)
    if flow.name != RESTARTED_FLOW:
        return False
    return any(a.enabled for a in await client.read_automations_by_name(RESTART_CRASHED))


def setup(file: Path, silence_s: int) -> int:
    prefect = shutil.which("prefect", path=str(Path(sys.executable).parent)) or "prefect"
    for item in infrastructure(file):
        cmd = [prefect, "work-pool", "create", item["pool"], "--type", item["type"], "--overwrite"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"work pool {item['pool']} ({item['type']}): FAILED\n{proc.stdout}{proc.stderr}", file=sys.stderr)
            return 1
        print(f"work pool {item['pool']} ({item['type']}): ok")
        if item.get("gpus"):
            verb = asyncio.run(_set_limit(item["pool"], int(item["gpus"])))
            print(f"concurrency limit {item['pool']}: {item['gpus']} slots ({verb})")
    from flows.recovery import ensure_automations

    for line in ensure_automations(silence_s):
        print(f"automation {line}")
    settings = _server_settings()
    print(telemetry_line(settings))
    print(ordering_line(settings))
    return 0


def _server_settings() -> dict:
    """The settings the Prefect server runs with, as its API reports them (GET /admin/settings)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        answer = client.request("GET", "/admin/settings")
        answer.raise_for_status()
        return answer.json()


def telemetry_line(settings: dict) -> str:
    """What `discover setup` says of the server's telemetry (anonymous usage events sent to Prefect),
    which only the server's own environment can turn off."""
    if settings.get("server", {}).get("analytics_enabled") is False:
        return "server telemetry: off"
    return (
        "server telemetry: ON: this Prefect server sends anonymous usage events to Prefect; restart it with "
        "PREFECT_SERVER_ANALYTICS_ENABLED=false in its environment (or `prefect config set PREFECT_SERVER_ANALYTICS_ENABLED=false` "
        "in the profile it starts from): docs/operations.md, Telemetry"
    )


def ordering_line(settings: dict) -> str:
    """What `discover setup` says of the order in which the server's automations take events: with
    Prefect's default, a run's state changes just after a restart of the server reach the recovery
    automations 15 minutes late, too late to act on (flows/event_ordering.py)."""
    from flows.recovery import SERVER_ORDERING

    name, ours = SERVER_ORDERING
    if settings.get("server", {}).get("events", {}).get("causal_ordering") == ours:
        return f"server event ordering: {ours} (crashes just after a server restart are restarted on time)"
    return (
        f"server event ordering: Prefect's default: a run that crashes within minutes of a restart of the server is never "
        f"restarted (its state changes reach the automations 15 minutes late); restart the server with {name}={ours} "
        f"in its environment (or `prefect config set {name}={ours}` in "
        "the profile it starts from, with this project installed where it runs): docs/operations.md, Start a server"
    )


def mark_crashed(flow_run_id: str) -> str:
    return asyncio.run(_mark_crashed(flow_run_id))
