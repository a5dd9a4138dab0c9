"""Soak: a long toy run on a Prefect server, killed every N steps and restarted by the automations.

    python benchmarks/soak.py [--steps 200] [--kill-every 20] [--kills flow,worker+flow,server] [--out benchmarks/results]

What a user leaves running for days, in small: a PostgreSQL-backed Prefect server on loopback (a
throwaway cluster of Debian's PostgreSQL, as tests/test_prefect_server.py starts one), `discover
setup`, the deployments of prefect.yaml, one process worker, and a toy run of `--steps` steps on
the tiny model. Every `--kill-every` steps something is SIGKILLed and nothing is typed, each kill the
next kind of `--kills` in turn: `flow`, the flow process (as the OOM killer would: the recovery
automations restart it, flows/recovery.py); `worker+flow`, the worker and the flow process (a machine
lost: the worker is started again, as systemd would, and the automations restart the run); `server`,
the Prefect server, for `--outage` seconds, then started again on the same database (the run rides
through it: flows/server_api.py). With `--compare` the same configuration is then run once more,
uninterrupted, and the two final archives compared. After each step it
records the step's wall time, the flow process's resident memory, the run directory's size and the
Prefect database's size, and at the end writes soak.json, soak.md and soak.png to `--out`, with the
growth of each per step over the first and second half of the run (flat or not). Takes about half
an hour on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flows.recovery import SERVER_ORDERING  # noqa: E402
from storage.lease import read_writers  # noqa: E402
from storage.manifest import read_manifest  # noqa: E402
from tests.conftest import archive_records, free_port, tiny_toy_config  # noqa: E402
from tests.postgres import postgres_database  # noqa: E402

TASKS_PER_STEP = 5
KILLS = ("flow", "worker+flow", "server")  # what a kill ends (see the module)
RESTARTING = ("flow", "worker+flow")  # kills after which the automations restart the run
COLOURS = {"flow": "red", "worker+flow": "purple", "server": "orange"}
BIN = Path(sys.executable).parent


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _db_mb(url: str) -> float:
    dsn = url.replace("postgresql+asyncpg://", "postgresql://")
    out = subprocess.run(["psql", dsn, "-tAc", "select pg_database_size(current_database())"], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) / 2**20


def _finished_steps(run_dir: Path) -> int:
    done = read_manifest(run_dir / "manifest.json")["tasks"] if (run_dir / "manifest.json").is_file() else {}
    return sum(1 for k in done if k.endswith("/train"))


def _writer_pid(run_dir: Path) -> int | None:
    writers = [w for w in read_writers(run_dir) if w["outcome"] == "writer"]
    return writers[-1]["pid"] if writers else None


def _restart_steps(rows: list[dict]) -> set[int]:
    """The steps that began after a kill (a restart of the run, or a server outage ridden through):
    their time holds it."""
    return {r["step"] + 1 for r in rows if r["killed_after"]}


def _ends_a_life(kind: str | bool) -> bool:
    """Whether a kill ended the flow process (older results hold True: the flow process)."""
    return kind is True or kind in RESTARTING


def _executions_per_task(executions: list[dict]) -> dict[str, int]:
    """How often each task of each step ran ({count: how many tasks ran that often})."""
    counts: dict[tuple[int, str], int] = {}
    for e in executions:
        counts[(e["step"], e["task"])] = counts.get((e["step"], e["task"]), 0) + 1
    histogram: dict[str, int] = {}
    for n in counts.values():
        histogram[str(n)] = histogram.get(str(n), 0) + 1
    return histogram


def _growth(rows: list[dict], key: str) -> dict[str, float]:
    """Per-step growth of `key` (least squares slope) over the first and the second half of the run;
    step times without the steps that began with a restart."""
    import numpy as np

    skip = _restart_steps(rows) if key == "seconds" else set()
    half = len(rows) // 2
    out = {}
    for name, part in (("first_half", rows[:half]), ("second_half", rows[half:])):
        pts = [(r["step"], r[key]) for r in part if r[key] is not None and r["step"] not in skip]
        out[name] = float(np.polyfit(*zip(*pts, strict=True), 1)[0]) if len(pts) > 2 else float("nan")
    return out


def _processes(rows: list[dict]) -> list[dict]:
    """The flow process's memory over each of its lives (from one kill to the next): first and last
    RSS and the growth per step inside it, so a leak shows even though every kill resets it."""
    import numpy as np

    lives, current = [], []
    for r in rows:
        if r["flow_rss_mb"] is not None:
            current.append(r)
        if _ends_a_life(r["killed_after"]):
            lives.append(current)
            current = []
    lives.append(current)
    out = []
    for life in lives:
        if len(life) > 2:
            slope = float(np.polyfit([r["step"] for r in life], [r["flow_rss_mb"] for r in life], 1)[0])
            out.append(
                {
                    "steps": [life[0]["step"], life[-1]["step"]],
                    "first_mb": life[0]["flow_rss_mb"],
                    "last_mb": life[-1]["flow_rss_mb"],
                    "mb_per_step": slope,
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--kill-every", type=int, default=20)
    ap.add_argument("--kills", default="flow", help="what each kill ends, in turn: flow, worker+flow, server (comma-separated)")
    ap.add_argument("--outage", type=float, default=60.0, help="seconds the Prefect server stays down at a `server` kill")
    ap.add_argument("--compare", action="store_true", help="then run it uninterrupted and compare the final archives")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--timeout", type=float, default=3 * 3600, help="give up after this many seconds")
    ap.add_argument("--name", default="soak", help="the files' stem: NAME.json, NAME.md, NAME.png")
    ap.add_argument("--from-json", type=Path, default=None, help="write the .md and .png again from a .json this wrote")
    args = ap.parse_args(argv)
    kinds = args.kills.split(",")
    if not set(kinds) <= set(KILLS):
        ap.error(f"--kills: each of {', '.join(KILLS)}, got {args.kills!r}")
    if args.from_json is not None:
        doc = json.loads(args.from_json.read_text())
        _report(doc, args.out, args.name)
        return 0

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `kill` still stops the server, worker and PostgreSQL below
    work = Path(tempfile.mkdtemp(prefix="discover-soak-"))
    procs: list[subprocess.Popen] = []
    rows: list[dict] = []
    kills: list[int] = []
    kinds_done: list[str] = []
    same_archive: bool | None = None
    with postgres_database() as database:
        port = free_port()
        api = f"http://127.0.0.1:{port}/api"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DISCOVER_"))}
        env.update(
            PREFECT_HOME=str(work / "prefect-home"),
            PREFECT_API_URL=api,
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_WORKER_QUERY_SECONDS="2",
            DISCOVER_CACHE=str(work / "cache"),
            OMP_NUM_THREADS="1",
        )

        def start(name: str, cmd: list[str], extra: dict[str, str] | None = None) -> subprocess.Popen:
            log = open(work / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
            full = {**env, **(extra or {})}
            proc = subprocess.Popen(cmd, cwd=REPO, env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(proc)
            return proc

        def command(*cmd: str) -> str:
            done = subprocess.run(list(cmd), cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
            return done.stdout + done.stderr

        def start_server() -> subprocess.Popen:
            server = start(
                f"server-{len(procs)}",
                [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                {"PREFECT_UI_ENABLED": "false", "PREFECT_API_DATABASE_CONNECTION_URL": database, SERVER_ORDERING[0]: SERVER_ORDERING[1]},
            )
            deadline = time.monotonic() + 600
            while True:
                try:
                    if httpx.get(f"{api}/health", timeout=10).status_code == 200:
                        return server
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the Prefect server did not start")
                time.sleep(1)

        def start_worker() -> subprocess.Popen:
            return start(
                f"worker-{len(procs)}", [str(BIN / "prefect"), "worker", "start", "--pool", "discover-process", "--type", "process"]
            )

        def kill(proc: subprocess.Popen | int) -> None:
            try:
                os.killpg(proc if isinstance(proc, int) else proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        try:
            server = start_server()
            command(sys.executable, "-m", "cli", "setup", "--silence", "60")
            command(str(BIN / "prefect"), "--no-prompt", "deploy", "--all")
            worker = start_worker()
            run_dir = work / "soak"
            (work / "soak.yaml").write_text(yaml.safe_dump(tiny_toy_config(run_dir, seed=5, steps=args.steps)))
            out = command(
                str(BIN / "prefect"),
                "--no-prompt",
                "deployment",
                "run",
                "discovery-run/process",
                "--params",
                json.dumps({"config_path": str(work / "soak.yaml")}),
            )
            print(out.strip().splitlines()[-1], flush=True)
            t0, seen = time.monotonic(), 0
            while seen < args.steps:
                if time.monotonic() - t0 > args.timeout:
                    raise SystemExit(f"gave up after {args.timeout:.0f} s at step {seen}")
                done = _finished_steps(run_dir)
                if done > seen:
                    pid = _writer_pid(run_dir)
                    finished = read_manifest(run_dir / "manifest.json")["tasks"]
                    for step in range(seen, done):
                        end = finished[f"{step}/train"]["finished"]
                        start_ = finished[f"{step - 1}/train"]["finished"] if step else finished["0/select_parents"]["started"]
                        rows.append(
                            {
                                "step": step,
                                "seconds": end - start_,  # from the previous step's end: a restart's time counts
                                "flow_rss_mb": _rss_mb(pid) if pid else None,
                                "run_dir_mb": _du(run_dir) / 2**20,
                                "database_mb": _db_mb(database),
                                "killed_after": step + 1 in kills,
                            }
                        )
                    seen = done
                    print(f"step {seen}/{args.steps}: {rows[-1]}", flush=True)
                    if seen % args.kill_every == 0 and seen < args.steps and pid:
                        kind = kinds[len(kills) % len(kinds)]
                        if kind in RESTARTING:
                            kill(os.getpgid(pid))  # the flow process (its own session, started by the worker)
                        if kind == "worker+flow":
                            kill(worker)
                            worker = start_worker()  # as systemd's Restart=always would
                        if kind == "server":
                            kill(server)
                            time.sleep(args.outage)
                            server = start_server()  # the same database and port
                        kills.append(seen)
                        kinds_done.append(kind)
                        rows[-1]["killed_after"] = kind
                        print(f"killed {kind} (flow process {pid}) after step {seen}", flush=True)
                time.sleep(1)
            writers = read_writers(run_dir)
            executions = read_manifest(run_dir / "manifest.json")["executions"]
            if args.compare:  # the same configuration, uninterrupted, in a process of its own
                ref_dir = work / "uninterrupted"
                (work / "uninterrupted.yaml").write_text(yaml.safe_dump(tiny_toy_config(ref_dir, seed=5, steps=args.steps)))
                command(sys.executable, "-m", "cli", "run", str(work / "uninterrupted.yaml"))
                final = f"archive/{args.steps:04d}.parquet"
                same_archive = archive_records(run_dir / final) == archive_records(ref_dir / final)
        finally:
            for proc in procs:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    doc = {
        "steps": args.steps,
        "kills": kills,
        "kill_kinds": kinds_done,
        "same_archive_as_uninterrupted": same_archive,
        "task_executions_by_task": _executions_per_task(executions),
        "writers": len([w for w in writers if w["outcome"] == "writer"]),
        "refused_or_duplicate": len([w for w in writers if w["outcome"] != "writer"]),
        "task_executions": len(executions),
        "tasks": args.steps * TASKS_PER_STEP,
        "rows": rows,
    }
    _report(doc, args.out, args.name)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _report(doc: dict, out: Path, name: str = "soak") -> None:
    """NAME.json (with the figures derived from its rows), NAME.png and NAME.md in `out`."""
    rows = doc["rows"]
    restarts = _restart_steps(rows)
    doc["growth_per_step"] = {k: _growth(rows, k) for k in ("seconds", "flow_rss_mb", "run_dir_mb", "database_mb")}
    steady = sorted(r["seconds"] for r in rows if r["step"] not in restarts)
    doc["median_step_s"] = steady[len(steady) // 2] if steady else None
    doc["steps_after_a_kill_s"] = [round(r["seconds"], 1) for r in rows if r["step"] in restarts]
    doc["flow_process_lives"] = _processes(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    _plot(rows, doc["kills"], doc.get("kill_kinds") or ["flow"] * len(doc["kills"]), out / f"{name}.png")
    (out / f"{name}.md").write_text(_markdown(doc, name))
    print((out / f"{name}.md").read_text())


def _plot(rows: list[dict], kills: list[int], kinds: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(8, 10), sharex=True)
    for ax, key, label in zip(
        axes,
        ("seconds", "flow_rss_mb", "run_dir_mb", "database_mb"),
        ("step time (s)", "flow process RSS (MiB)", "run directory (MiB)", "Prefect database (MiB)"),
        strict=True,
    ):
        ax.plot([r["step"] for r in rows], [r[key] if r[key] is not None else float("nan") for r in rows], lw=1)
        for k, kind in zip(kills, kinds, strict=True):
            ax.axvline(k + 0.5, color=COLOURS[kind], lw=0.8, alpha=0.7)
        ax.set_ylabel(label)
    axes[-1].set_xlabel(
        "step (after it, SIGKILLed: red the flow process, purple the worker and the flow process, restarted by the automations; "
        "orange the Prefect server, down for the outage)",
        wrap=True,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _markdown(doc: dict, name: str = "soak") -> str:
    g, kills = doc["growth_per_step"], doc["kills"]
    kinds = doc.get("kill_kinds") or ["flow"] * len(kills)
    if kills:
        every = kills[1] - kills[0] if len(kills) > 1 else kills[0]
        what = "its flow process" if set(kinds) == {"flow"} else " / ".join(dict.fromkeys(kinds))
        title = f"# Soak: a toy run on a Prefect server (PostgreSQL), {what} killed every {every} steps"
        restarted = sum(1 for k in kinds if k in RESTARTING)
        killed = [
            f"- {doc['steps']} steps, {len(kills)} kills, with no command typed: "
            + ", ".join(f"{kind} after step {k}" for k, kind in zip(kills, kinds, strict=True)),
            f"- writers of the run directory: {doc['writers']} (1 + one per restart: {restarted} kills ended the flow process, "
            f"each restarted by the automations; a server outage is ridden through by the live process); "
            f"refused or duplicate attempts: {doc['refused_or_duplicate']}",
        ]
        restarts = f"; the steps that began after a kill: {', '.join(map(str, doc['steps_after_a_kill_s']))} s"
    else:
        title = "# Soak: a toy run on a Prefect server (PostgreSQL), never killed"
        killed = [f"- {doc['steps']} steps in one flow process; writers of the run directory: {doc['writers']}"]
        restarts = ""
    lines = [
        title,
        "",
        "`python benchmarks/soak.py` (benchmarks/soak.py says what it does). Figures of one machine (2 cores), one run.",
        "",
        *killed,
        f"- task executions: {doc['task_executions']} for {doc['tasks']} tasks"
        + (f" (tasks by how often each ran: {doc['task_executions_by_task']})" if doc.get("task_executions_by_task") else ""),
        *(
            [f"- final archive equal to an uninterrupted run's of the same configuration: {doc['same_archive_as_uninterrupted']}"]
            if doc.get("same_archive_as_uninterrupted") is not None
            else []
        ),
        f"- median step time {doc['median_step_s']:.2f} s{restarts}",
        "",
        "| per step | growth over the first half | over the second half |",
        "|---|---|---|",
    ]
    for key, label in (
        ("seconds", "step time (s), restarts left out"),
        ("flow_rss_mb", "flow process RSS (MiB)"),
        ("run_dir_mb", "run directory (MiB)"),
        ("database_mb", "Prefect database (MiB)"),
    ):
        lines.append(f"| {label} | {g[key]['first_half']:+.4f} | {g[key]['second_half']:+.4f} |")
    lines += ["", "The flow process's resident memory over each of its lives (a kill ends one):", ""]
    lines += ["| steps | first (MiB) | last (MiB) | growth per step (MiB) |", "|---|---|---|---|"]
    for life in doc["flow_process_lives"]:
        lines.append(
            f"| {life['steps'][0]}-{life['steps'][1]} | {life['first_mb']:.0f} | {life['last_mb']:.0f} | {life['mb_per_step']:+.2f} |"
        )
    lines += ["", f"![{name}]({name}.png)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
