"""A cgroup per run: the process backend's bound on a candidate's whole process tree.

Rlimits bind one process at a time: a program that forks children each under RLIMIT_AS can
still take the machine's memory, and CPU burnt by children nobody waits for shows in no rusage.
A cgroup counts the whole tree, reaped or not: `RunCgroup` makes one child cgroup per run
under a parent we may write, sets its memory limit (no swap), its task limit and, where the
CPU controller is there, a CPU quota; the candidate's first process joins it before any
candidate code runs (`procs_files`: the harness or the native runner writes its own pid there),
and everything it starts is born inside. Afterwards the group tells the CPU time of everything
that ran in it and whether the out-of-memory killer fired, is killed as a whole, and is removed.

Two layouts are understood:
- cgroup v2 (one hierarchy): the parent is `DISCOVER_CGROUP_PARENT` when set (a delegated
  cgroup: systemd's `Delegate=yes`, a user's `user@UID.service`), else our own cgroup; its
  children must get the memory and pids controllers (enabled in its `cgroup.subtree_control`,
  or enabled by us when the kernel allows it), and get the cpu controller where it can be enabled
  (`cpu_quota_missing` says when it cannot: the backend then warns that runs have no CPU quota).
- cgroup v1 (a hierarchy per controller, as on hosts in "hybrid" mode): a child under our own
  cgroup in the memory and pids hierarchies (required) and in cpu / cpuacct (optional), plus
  the v2 "unified" hierarchy when it is mounted (for `cgroup.kill` and `cpu.stat`).

`available()` says which, or why none can be used; it is probed once per process.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from dataclasses import dataclass, field

from evaluators.sandbox.reaping import sigkill

PARENT_ENV = "DISCOVER_CGROUP_PARENT"  # a delegated cgroup v2 directory to create run groups in
PREFIX = "discover-run-"
MB = 1024 * 1024


@dataclass(frozen=True)
class Layout:
    """Where run cgroups are created: the parent directory of each hierarchy we use."""

    version: int  # 2: one unified hierarchy; 1: per-controller hierarchies
    parents: dict[str, str] = field(default_factory=dict)  # "unified" | "memory" | "pids" | "cpu" | "cpuacct" -> dir


_probe_lock = threading.Lock()
_probed: tuple[Layout | None, str] | None = None


def available() -> tuple[Layout | None, str]:
    """(layout, "") when run cgroups can be made here, else (None, why not); probed once."""
    global _probed
    with _probe_lock:
        if _probed is None:
            _probed = _probe()
        return _probed


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, root inside the hierarchy, options) of every cgroup / cgroup2 mount."""
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, rest = left.split(), right.split()
                if len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
                    continue
                options = set(rest[2].split(",")) | ({"cgroup2"} if rest[0] == "cgroup2" else set())
                found.append((fields[4], fields[3], options))
    except OSError:
        pass
    return found


def _own_paths() -> dict[str, str]:
    """Our cgroup in each hierarchy: controller name (or "unified") -> path inside it."""
    own = {}
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            for line in f:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) != 3:
                    continue
                _, controllers, path = parts
                if controllers == "":
                    own["unified"] = path
                for name in controllers.split(","):
                    if name:
                        own[name] = path
    except OSError:
        pass
    return own


def _join(mount: str, root: str, path: str) -> str | None:
    """The directory of cgroup `path` in a hierarchy mounted at `mount` (showing `root`)."""
    root = root.rstrip("/")
    if root and not (path == root or path.startswith(root + "/")):
        return None  # our cgroup is outside what this mount shows
    directory = os.path.join(mount, path[len(root) :].lstrip("/"))
    return directory if os.path.isdir(directory) else None


def _read(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


def _probe() -> tuple[Layout | None, str]:
    mounts = _mounts()
    own = _own_paths()
    v2 = [(m, r) for m, r, o in mounts if "cgroup2" in o]
    v1 = {name: (m, r) for m, r, o in mounts if "cgroup2" not in o for name in o if name in ("memory", "pids", "cpu", "cpuacct")}
    unified = None
    if v2 and "unified" in own:
        unified = _join(v2[0][0], v2[0][1], own["unified"])
    if os.environ.get(PARENT_ENV):
        unified = os.environ[PARENT_ENV]
    # cgroup v2 with the controllers we need
    if unified is not None:
        try:
            controllers = _read(os.path.join(unified, "cgroup.controllers")).split()
        except OSError:
            controllers = []
        if "memory" in controllers and "pids" in controllers:
            why = _enable_v2(unified, controllers)
            if not why:
                layout = Layout(2, {"unified": unified})
                why = _try(layout)
                if not why:
                    return layout, ""
            return None, why
        if os.environ.get(PARENT_ENV):
            return None, f"{PARENT_ENV}={unified} has no memory and pids controllers"
    # cgroup v1 hierarchies (a hybrid host, or an old one)
    if "memory" in v1 and "pids" in v1:
        parents = {}
        for name in ("memory", "pids", "cpu", "cpuacct"):
            if name in v1 and name in own:
                directory = _join(*v1[name], own[name])
                if directory is not None:
                    parents[name] = directory
        if "memory" in parents and "pids" in parents:
            if unified is not None:
                parents["unified"] = unified
            layout = Layout(1, parents)
            why = _try(layout)
            # the unified and cpu hierarchies are bonuses: do without one we cannot use (without
            # cpu, cpu_quota_missing says runs get no CPU quota)
            for drop in (("cpu",), ("unified",), ("cpu", "unified")):
                if not why or not any(d in parents for d in drop):
                    continue
                fewer = Layout(1, {k: v for k, v in parents.items() if k not in drop})
                if not _try(fewer):
                    layout, why = fewer, ""
            return (layout, "") if not why else (None, why)
    if not mounts:
        return None, "no cgroup filesystem is mounted"
    return None, "no cgroup hierarchy with the memory and pids controllers is available to us"


def _enable_v2(parent: str, controllers: list[str]) -> str:
    """Make sure children of `parent` get memory, pids (and cpu when there); "" or why not."""
    try:
        enabled = _read(os.path.join(parent, "cgroup.subtree_control")).split()
    except OSError as err:
        return f"cannot read {parent}/cgroup.subtree_control: {err}"
    wanted = [c for c in ("memory", "pids", "cpu") if c in controllers and c not in enabled]
    for name in wanted:
        try:
            _write(os.path.join(parent, "cgroup.subtree_control"), "+" + name)
        except OSError as err:
            if name != "cpu":
                return (
                    f"cannot enable the {name} controller for children of {parent} ({err.strerror}); "
                    f"point {PARENT_ENV} at a delegated cgroup"
                )
    return ""


def cpu_quota_missing(layout: Layout) -> str:
    """ "" when run groups of `layout` get a CPU quota, else why not (and what would fix it). Without
    one, a candidate spinning on every core slows the runs beside it; pinning to a core (the native
    runner's) is all that is left, and the program can undo that."""
    if layout.version == 1:
        if "cpu" in layout.parents:
            return ""
        return "no cgroup v1 cpu hierarchy is mounted where we may make groups, so runs get no CPU quota"
    parent = layout.parents["unified"]
    try:
        enabled = _read(os.path.join(parent, "cgroup.subtree_control")).split()
    except OSError as err:
        return f"cannot read {parent}/cgroup.subtree_control ({err.strerror}), so runs get no CPU quota"
    if "cpu" in enabled:
        return ""
    return (
        f"the cpu controller is not enabled for children of {parent} (and we could not enable it), so runs "
        f"get no CPU quota; enable it there (+cpu in its cgroup.subtree_control) or point {PARENT_ENV} at a "
        "delegated cgroup that has it"
    )


def _try(layout: Layout) -> str:
    """Create, limit and remove a probe group; "" when all of that works."""
    try:
        group = RunCgroup(layout, memory_mb=64, max_processes=8, cpus=1)
    except OSError as err:
        return f"cannot create a cgroup ({err})"
    group.remove()
    return ""


class RunCgroup:
    """One run's cgroup (one directory per hierarchy of the layout)."""

    def __init__(self, layout: Layout, memory_mb: int, max_processes: int, cpus: float | None = None, name: str | None = None):
        self.layout = layout
        self.name = name or PREFIX + secrets.token_hex(8)
        self.memory_mb = int(memory_mb)
        self.dirs: dict[str, str] = {}
        try:
            for hierarchy, parent in layout.parents.items():
                directory = os.path.join(parent, self.name)
                os.mkdir(directory)
                self.dirs[hierarchy] = directory
            self._limit(int(memory_mb) * MB, int(max_processes), cpus)
        except OSError:
            self.remove()
            raise

    def _limit(self, memory: int, tasks: int, cpus: float | None) -> None:
        d = self.dirs
        if self.layout.version == 2:
            u = d["unified"]
            _write(f"{u}/memory.max", str(memory))
            _optional(f"{u}/memory.swap.max", "0")
            _optional(f"{u}/memory.oom.group", "1")  # an OOM kill takes the whole tree
            _write(f"{u}/pids.max", str(tasks))
            if cpus and os.path.exists(f"{u}/cpu.max"):
                _write(f"{u}/cpu.max", f"{int(cpus * 100_000)} 100000")
            return
        _write(f"{d['memory']}/memory.limit_in_bytes", str(memory))
        _optional(f"{d['memory']}/memory.memsw.limit_in_bytes", str(memory))  # no swap (with swap accounting)
        _optional(f"{d['memory']}/memory.swappiness", "0")
        _write(f"{d['pids']}/pids.max", str(tasks))
        if cpus and "cpu" in d:  # a layout with the cpu hierarchy promises the quota (_probe checks it)
            _optional(f"{d['cpu']}/cpu.cfs_period_us", "100000")
            _write(f"{d['cpu']}/cpu.cfs_quota_us", str(int(cpus * 100_000)))

    @property
    def procs_files(self) -> list[str]:
        """Where a process writes its own pid to join this group (every hierarchy)."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def chown(self, uid: int) -> None:
        """Let `uid` (the run's user) move itself in: its procs files only, never the limits."""
        for path in self.procs_files:
            os.chown(path, uid, -1)

    def pids(self) -> list[int]:
        directory = self.dirs.get("unified") or self.dirs.get("memory")
        try:
            return [int(p) for p in _read(os.path.join(directory, "cgroup.procs")).split()]
        except (OSError, ValueError, TypeError):
            return []

    def cpu_s(self) -> float | None:
        """CPU seconds used in this group so far, by every process that ran in it."""
        for hierarchy, file in (("unified", "cpu.stat"), ("cpuacct", "cpuacct.usage")):
            if hierarchy not in self.dirs:
                continue
            try:
                text = _read(os.path.join(self.dirs[hierarchy], file))
            except OSError:
                continue
            if file == "cpu.stat":
                for line in text.splitlines():
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
                continue
            return int(text.strip()) / 1e9
        return None

    def oom_kills(self) -> int:
        """How many processes the out-of-memory killer took in this group (its limit was hit)."""
        files = ["memory.events"] if self.layout.version == 2 else ["memory.oom_control"]
        directory = self.dirs["unified"] if self.layout.version == 2 else self.dirs["memory"]
        for file in files:
            try:
                for line in _read(os.path.join(directory, file)).splitlines():
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
            except (OSError, ValueError):
                continue
        return 0

    def peak_mb(self) -> float | None:
        """The group's peak memory (page cache included), where the kernel tells it."""
        file = ("unified", "memory.peak") if self.layout.version == 2 else ("memory", "memory.max_usage_in_bytes")
        try:
            return int(_read(os.path.join(self.dirs[file[0]], file[1])).strip()) / MB
        except (OSError, ValueError, KeyError):
            return None

    def kill(self) -> bool:
        """SIGKILL everything in the group; True when it is empty."""
        unified = self.dirs.get("unified")
        if unified and os.path.exists(os.path.join(unified, "cgroup.kill")):
            try:
                _write(os.path.join(unified, "cgroup.kill"), "1")
            except OSError:
                pass
        for _ in range(500):  # without cgroup.kill: until no fork outruns us (pids.max bounds them)
            pids = self.pids()
            if not pids:
                return True
            sigkill(pids)
            time.sleep(0.002)
        return not self.pids()

    def remove(self) -> None:
        """Kill what is left and remove the group's directories (a group is removable once its
        last process has been reaped; zombies waiting for us are reaped by our caller first)."""
        if self.dirs:
            self.kill()
        for hierarchy, directory in list(self.dirs.items()):
            for _ in range(200):
                try:
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.005)  # processes just killed are still leaving
            self.dirs.pop(hierarchy, None)


def _optional(path: str, value: str) -> None:
    """Write a setting the kernel may lack (no swap accounting, an older kernel)."""
    try:
        _write(path, value)
    except OSError:
        pass
