"""Runs that look after themselves (docs/operations.md): names and artifact keys that tell runs
apart, the project's log lines on the server, the recovery automations and their guard, the end of
superseded flow runs, `discover crashed` and `discover schedule`. Against the session's Prefect
server; tests/test_prefect_server.py does the same with workers, a kill and a schedule that fires."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from discover import steps
from discover.config import parse_config
from discover.run import Run
from flows import naming, recovery
from storage.manifest import record_task
from tests.conftest import REPO, tiny_toy_config

pytestmark = pytest.mark.slow


def test_names_and_keys_tell_runs_apart(tmp_path: Path) -> None:
    run = Run.create(parse_config(tiny_toy_config(tmp_path / "Erdos 8B!", steps=1)))
    assert naming.run_name(run.root) == "Erdos 8B!" and naming.step_run_name(run, 3) == "Erdos 8B!-step-3"
    key = naming.artifact_key(run, "steps")
    assert key == f"discover-erdos-8b-{run.run_id[:8]}-steps"  # lowercase letters, digits and dashes
    assert naming.reevaluation_key(run, "gpu-h100") == f"reevaluation-erdos-8b-{run.run_id[:8]}-gpu-h100"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"problem": "toy", "run_dir": "runs/from-file"}))
    assert naming.discovery_run_name({"run_dir": "runs/toy-1"}) == "toy-1"
    assert naming.discovery_run_name({"config": run.config}) == "Erdos 8B!"
    assert naming.discovery_run_name({"config_path": str(tmp_path / "c.yaml")}) == "from-file"


def test_restarts_without_progress_stop_and_say_where(tmp_path: Path) -> None:
    run = Run.create(parse_config(tiny_toy_config(tmp_path / "run", steps=2)))
    flow_run = str(uuid.uuid4())
    recovery.guard_restarts(run, flow_run, 1)
    for count in range(2, recovery.MAX_RESTARTS_WITHOUT_PROGRESS + 1):  # restarts that found nothing new: allowed so far
        recovery.guard_restarts(run, flow_run, count)
    stalled = rf"3 restarts in a row .* \(stuck in step 0\).*discover resume.*prefect flow-run retry {flow_run}"
    with pytest.raises(recovery.RunStalled, match=stalled):
        recovery.guard_restarts(run, flow_run, recovery.MAX_RESTARTS_WITHOUT_PROGRESS + 1)
    # a task finished since: the next restart goes on; a new flow run (discover resume) always starts
    record_task(run.layout.manifest, 0, "select_parents", {"path": "x", "sha256": "y"}, 0.0, 1.0)
    recovery.guard_restarts(run, flow_run, recovery.MAX_RESTARTS_WITHOUT_PROGRESS + 2)
    for _ in range(5):
        recovery.guard_restarts(run, str(uuid.uuid4()), 1)
    assert len(json.loads((run.root / recovery.ATTEMPTS_FILE).read_text())[flow_run]) == recovery.MAX_RESTARTS_WITHOUT_PROGRESS + 2


def test_the_automations_watch_heartbeats_and_restart_only_discovery_runs() -> None:
    from prefect.automations import Posture
    from prefect.client.schemas.objects import StateType

    silent, restart = recovery.automations(90)
    assert silent.trigger.posture == Posture.Proactive and silent.trigger.within.total_seconds() == 90
    assert "prefect.flow-run.heartbeat" in silent.trigger.after and silent.actions[0].state == StateType.CRASHED
    assert restart.actions[0].state == StateType.SCHEDULED
    # a crash reported twice restarts once: the restart waits for silence after a CRASHED report,
    # and a heartbeat or a new state of the flow run meanwhile (a live attempt) cancels it
    assert restart.trigger.after == {"prefect.flow-run.Crashed"} and restart.trigger.posture == Posture.Proactive
    assert {"prefect.flow-run.heartbeat", "prefect.flow-run.Running"} <= restart.trigger.expect
    # a later Crashed report starts a new window from itself (a real crash soon after a false one:
    # tests/test_restart_automation.py), as a heartbeat does for the silence rule
    assert "prefect.flow-run.Crashed" in restart.trigger.expect and restart.trigger.for_each == {"prefect.resource.id"}
    assert restart.trigger.match_related["prefect.resource.name"] in ("discovery-run", ["discovery-run"])
    with pytest.raises(ValueError, match="too close to the 30 s between heartbeats"):
        recovery.automations(31)


def _flow_run(client, flow_name: str, tags: list[str], state) -> object:
    from prefect import flow

    @flow(name=flow_name)
    def f() -> None:  # only its name matters: the flow run is created, never run
        pass

    return client.create_flow_run(f, tags=tags, state=state)


def test_superseded_runs_and_the_task_runs_they_left_end_in_a_final_state(prefect_api: str) -> None:
    from prefect import Task
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Crashed, Running

    tag = f"discover-run:test-{uuid.uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:
        stale = _flow_run(client, "discovery-step", [tag, "step:1"], Running())
        done = _flow_run(client, "discovery-step", [tag, "step:1"], Completed())
        marked = _flow_run(client, "discovery-step", [tag, "step:1"], Crashed())  # by the heartbeat automation
        other_step = _flow_run(client, "discovery-step", [tag, "step:2"], Running())
        task = Task(name="generate", fn=lambda: None)
        task_run = client.create_task_run(task, stale.id, "generate-0", state=Running())
        left = client.create_task_run(task, marked.id, "generate-0", state=Running())
        assert recovery.end_superseded_runs("discovery-step", [tag, "step:1"], None, "its process died") == 1
        assert client.read_flow_run(stale.id).state.type.value == "CRASHED"
        assert client.read_flow_run(stale.id).state.message == "its process died"
        assert client.read_task_run(task_run.id).state.type.value == "CRASHED"
        assert client.read_task_run(left.id).state.type.value == "CRASHED"  # left RUNNING by a run already marked
        assert client.read_flow_run(done.id).state.type.value == "COMPLETED"
        assert client.read_flow_run(other_step.id).state.type.value == "RUNNING"
        parent = _flow_run(client, "discovery-run", [tag], Running())
        me = _flow_run(client, "discovery-run", [tag], Running())
        assert recovery.end_superseded_runs("discovery-run", [tag], str(me.id), "superseded") == 1
        assert client.read_flow_run(parent.id).state.type.value == "CANCELLED"  # not CRASHED: no automatic restart
        assert client.read_flow_run(me.id).state.type.value == "RUNNING"


def test_a_copy_of_a_run_directory_never_ends_the_originals_flow_runs(tmp_path: Path, prefect_api: str) -> None:
    """`cp -a A/toy B/toy` keeps the run's name and id, so its run tag; a writer of the copy ends only
    its own directory's earlier flow runs (issue 44: the copy used to cancel the live original)."""
    import shutil

    from prefect.client.orchestration import get_client
    from prefect.states import Running

    original = Run.create(parse_config(tiny_toy_config(tmp_path / "A" / "toy", steps=1)))
    shutil.copytree(original.root, tmp_path / "B" / "toy", symlinks=True)
    copy = Run.open(tmp_path / "B" / "toy")
    assert naming.run_tag(copy) == naming.run_tag(original) and naming.run_tags(copy) != naming.run_tags(original)
    with get_client(sync_client=True) as client:
        live = _flow_run(client, "discovery-run", naming.run_tags(original), Running())
        live_step = _flow_run(client, "discovery-step", [*naming.run_tags(original), "step:0"], Running())
        me = _flow_run(client, "discovery-run", naming.run_tags(copy), Running())
        assert recovery.end_superseded_runs("discovery-run", naming.run_tags(copy), str(me.id), "superseded") == 0
        assert recovery.end_superseded_runs("discovery-step", [*naming.run_tags(copy), "step:0"], None, "its process died") == 0
        assert client.read_flow_run(live.id).state.type.value == "RUNNING"
        assert client.read_flow_run(live_step.id).state.type.value == "RUNNING"
        # the original's own directory, resumed after its process died: its earlier runs are ended
        again = _flow_run(client, "discovery-run", naming.run_tags(original), Running())
        assert recovery.end_superseded_runs("discovery-run", naming.run_tags(original), str(again.id), "superseded") == 1
        assert client.read_flow_run(live.id).state.type.value == "CANCELLED"


def test_crashed_marks_a_run_whose_worker_died(prefect_api: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Running
    from typer.testing import CliRunner

    from cli.app import app

    with get_client(sync_client=True) as client:
        orphan = _flow_run(client, "discovery-run", [], Running())
        result = CliRunner().invoke(app, ["crashed", str(orphan.id)])
        assert result.exit_code == 0 and "marked CRASHED" in result.output, result.output
        manual = f"no recovery automation restarts it (`discover setup` creates them), so: prefect flow-run retry {orphan.id}"
        assert manual in result.output
        assert client.read_flow_run(orphan.id).state.type.value == "CRASHED"
        again = CliRunner().invoke(app, ["crashed", str(orphan.id)])
        assert "already CRASHED; nothing to do" in again.output
        # with the restart automation on the server, nothing is left to type (a retry would fail)
        automation = client.create_automation(recovery.automations()[1])
        try:
            other = _flow_run(client, "discovery-run", [], Running())
            result = CliRunner().invoke(app, ["crashed", str(other.id)])
            assert "schedules it again within 60 s and a worker of its pool resumes it: nothing to type" in result.output, result.output
            assert "retry" not in result.output
        finally:
            client.delete_automation(automation)


def test_a_discovery_run_is_named_after_its_directory_and_logs_its_progress_on_the_server(
    tmp_path: Path, tiny_model_cache: Path, prefect_api: str
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags, LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    from flows.run_flow import discovery_run

    state = discovery_run(config=parse_config(tiny_toy_config(tmp_path / "named-run", steps=1)), return_state=True)
    assert state.is_completed()
    APILogWorker.drain_all(timeout=60)
    run = Run.open(tmp_path / "named-run")
    with get_client(sync_client=True) as client:
        parent = client.read_flow_run(state.state_details.flow_run_id)
        assert parent.name == "named-run" and naming.run_tag(run) in parent.tags
        steps_ = client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[naming.run_tag(run), "step:0"])))
        assert [(r.name, r.state.type.value) for r in steps_] == [("named-run-step-0", "COMPLETED")]
        assert client.read_task_run(steps_[0].parent_task_run_id).flow_run_id == parent.id  # shown inside the run
        lines = [log.message for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[parent.id])))]
        task_lines = [log.message for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[steps_[0].id])))]
    assert any(line.startswith("step 1/1") for line in lines) and any(line.startswith("best state") for line in lines), lines
    assert any(line.startswith("step 0 train") for line in task_lines), task_lines


def test_schedule_creates_then_updates_the_runs_reevaluation(
    tmp_path: Path, tiny_model_cache: Path, prefect_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from flows.schedules import schedule_reevaluation

    run = steps.create_run(parse_config(tiny_toy_config(tmp_path / "sched", steps=1)))
    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name="gpu-h100", type="process"))
        except Exception:  # noqa: BLE001 - created by another test of the session
            pass
        monkeypatch.chdir(REPO)  # the deployment runs from where the command ran, as `prefect deploy`'s do
        first = schedule_reevaluation(run, "gpu-h100", "0 3 * * *", top_k=2, prefect_yaml=REPO / "prefect.yaml")
        second = schedule_reevaluation(run, "gpu-h100", "*/5 * * * *", top_k=2, prefect_yaml=REPO / "prefect.yaml")
        assert first.created and not second.created and first.deployment == second.deployment == "reevaluate/sched-gpu-h100"
        deployment = client.read_deployment_by_name(second.deployment)
        assert [s.schedule.cron for s in client.read_deployment_schedules(deployment.id)] == ["*/5 * * * *"]
        assert deployment.parameters == {"run_dir": str(run.root.resolve()), "top_k": 2, "gpu_limit": "gpu-h100"}
        assert deployment.job_variables["env"]["DISCOVER_GPU_TYPE"] == "H100"
        assert deployment.entrypoint == "flows/reevaluate_flow.py:reevaluate" and deployment.work_pool_name == "gpu-h100"
        assert deployment.path == str(REPO.resolve()) == second.directory
    with pytest.raises(ValueError, match="declares no work pool 'gpu-z'"):
        schedule_reevaluation(run, "gpu-z", "0 3 * * *", prefect_yaml=REPO / "prefect.yaml")
    monkeypatch.chdir(tmp_path)  # not a checkout: said, before anything is deployed
    with pytest.raises(ValueError, match=r"holds no flows/reevaluate_flow.py: run `discover schedule` from the project's checkout"):
        schedule_reevaluation(run, "gpu-h100", "0 3 * * *", prefect_yaml=REPO / "prefect.yaml")


def test_a_deployment_run_without_parameters_fails_saying_which_to_give(prefect_api: str) -> None:
    from prefect.client.orchestration import get_client

    from flows.run_flow import NO_PARAMETERS, discovery_run

    state = discovery_run(return_state=True)
    assert state.is_failed() and state.message == NO_PARAMETERS and "--param config_path=" in NO_PARAMETERS
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(state.state_details.flow_run_id).state.message == NO_PARAMETERS


def test_every_pool_runs_its_flow_runs_with_the_runs_heartbeats_and_client_retries() -> None:
    """prefect.yaml's pools carry what a CLI run gets (cli/app.py `_run_settings`): heartbeats as often
    as the silence automation assumes, and the client retries that ride through a server restart."""
    from flows.recovery import HEARTBEAT_S
    from flows.server_api import CLIENT_RETRIES

    pools = yaml.safe_load((REPO / "prefect.yaml").read_text())["definitions"]["work_pools"]
    assert pools
    for name, pool in pools.items():
        env = pool["job_variables"]["env"]
        assert env.get("PREFECT_FLOWS_HEARTBEAT_FREQUENCY") == str(HEARTBEAT_S), name
        assert env.get("PREFECT_CLIENT_MAX_RETRIES") == str(CLIENT_RETRIES), name


def test_setup_says_whether_the_server_sends_telemetry_and_how_to_stop_it() -> None:
    from flows.operations import telemetry_line

    assert telemetry_line({"server": {"analytics_enabled": False}}) == "server telemetry: off"
    on = telemetry_line({"server": {"analytics_enabled": True}})
    assert on.startswith("server telemetry: ON") and "PREFECT_SERVER_ANALYTICS_ENABLED=false" in on
    assert telemetry_line({}).startswith("server telemetry: ON")  # a server that does not say: assume Prefect's default, on


def test_setup_reads_the_servers_own_telemetry_setting(prefect_api: str) -> None:
    """The suite's server runs with telemetry off (tests/conftest.py), and the API says so."""
    from flows.operations import _server_settings, telemetry_line

    assert telemetry_line(_server_settings()) == "server telemetry: off"


def test_setup_says_whether_the_server_takes_events_in_an_order_that_survives_its_restart(prefect_api: str) -> None:
    """The suite's server runs with flows.event_ordering (tests/conftest.py, as docs/operations.md
    starts one); a server on Prefect's default is told how to change it."""
    from flows.operations import _server_settings, ordering_line

    assert ordering_line(_server_settings()).startswith("server event ordering: flows.event_ordering")
    default = ordering_line({"server": {"events": {"causal_ordering": "prefect.server.events.ordering.memory"}}})
    assert "never restarted" in default and "PREFECT_SERVER_EVENTS_CAUSAL_ORDERING=flows.event_ordering" in default
