"""The trusted runner of compiled programs: compiles one source once, then runs the binary on the
cases the host sends it, one at a time, and reports each case's raw result. Standard library only.

Started by the host (evaluators/sandbox/native.py) as `python3 -I -S <this file>` for the process
backend, and inside a container of the docker backend as `python3 -I -S -c <this file's text>`
executed by the container's root (with only the capabilities CHOWN, DAC_OVERRIDE, FOWNER, SETUID,
SETGID and KILL). The candidate never runs as the runner's user: when the runner is root, every
child (the compiler, the program, the clean-up helpers) drops to the unprivileged `uid` the host
chose, so the program cannot signal, trace or read the runner, its other cases' inputs (kept in a
0700 directory) or its report (the runner's stdout). The work directory, bin/ and the binary are the
runner's with group access for the program's gid alone (0710, 0750): a program of another
evaluation (another uid and gid) cannot reach them. A runner that is not root (the process backend
run by a normal user) cannot protect itself that way; under the process backend the sandbox's view
holds none of its files anyway (see Child).

Protocol: the host writes messages, each a line with a byte count and then that many bytes of
JSON; the runner answers each with one line "<token> <JSON>". Messages: "setup" (limits, and the
source to compile or the binary to use), then any number of "case" (index and input text), then
"end". Every case is run with: its input as stdin; stdout and stderr to files of the runner that
the program holds only as file descriptors; a new session; RLIMIT_CPU (a little above the time
limit: SIGXCPU, then SIGKILL one second later), RLIMIT_AS (the memory limit plus 512 MB), RLIMIT_STACK
(the memory limit, as at AtCoder), RLIMIT_FSIZE (the output cap plus one byte), RLIMIT_NPROC, no
POSIX message queues (RLIMIT_MSGQUEUE 0) and no core dumps; umask 077; one CPU (sched_setaffinity)
when the host names one; oom_score_adj 1000, so that an out-of-memory kill takes the program
first; and a wall-clock backstop after which the whole session is killed. Under the process
backend each case also gets a cgroup made by the host (the message's `cgroup_procs`, joined
before anything starts, so the program's whole tree is bounded and its CPU counted, reaped or
not) and a private directory (`case_dir`: its cwd, HOME and TMPDIR), and the compiler and each case
start in a bubblewrap sandbox of their own (the setup's `sandbox`: see Child), where the launcher
sets the limits above, drops to `uid` and installs the seccomp filter before it executes them. The
runner waits on a pidfd (answering the filter's listener meanwhile), kills the program's process
group while its leader is still unreaped, then reaps it with wait4 for its CPU time (less the
launcher's own) and peak resident memory. Without a sandbox (a container of the docker backend, or
sandbox.isolation: none) it finally kills every process of `uid` (or, when not root, every process
carrying the run's environment marker), removes the System V IPC objects and POSIX message queues
of `uid` and wipes what `uid` owns in the scratch directories the host names.
Inside a container it also reads the container's cgroup: CPU used while the case ran (covering
processes the program left unreaped) and the out-of-memory kill counter.
"""

import base64
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import time

MB = 1024 * 1024
AS_SLACK = 512 * MB  # address space allowed on top of the memory limit (libraries, untouched reservations)
STDERR_TAIL = 4096
COMPILE_LOG = 8192
CGROUP_CPU = ("/sys/fs/cgroup/cpu.stat", "/sys/fs/cgroup/cpuacct/cpuacct.usage", "/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage")
CGROUP_OOM = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
MARKER = "DISCOVER_NATIVE_RUN"


def read_message(stream):
    line = stream.readline()
    if not line:
        return None
    return json.loads(stream.read(int(line)))


def reply(token, payload):
    sys.stdout.write(token + " " + json.dumps(payload) + "\n")
    sys.stdout.flush()


# -- measuring -----------------------------------------------------------------------------------


def cgroup_cpu_s(paths=CGROUP_CPU):
    """CPU seconds used by this container's cgroup so far (or by the cgroup of `paths`: its cpu.stat
    or cpuacct.usage files), or None outside one."""
    for path in paths:
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            continue
        if path.endswith("cpu.stat"):
            for line in text.splitlines():
                if line.startswith("usage_usec"):
                    return int(line.split()[1]) / 1e6
            continue
        return int(text.strip()) / 1e9
    return None


def case_cpu_counter(cgroup_procs, container_cpu0):
    """A function giving the CPU seconds a case has used so far, by its cgroup: the process
    backend's per-case group (the directories of `cgroup_procs`), else the container's counted
    from `container_cpu0`; None where there is neither."""
    paths = [os.path.join(os.path.dirname(p), name) for p in cgroup_procs for name in ("cpu.stat", "cpuacct.usage")]
    if paths and cgroup_cpu_s(paths) is not None:
        return lambda: cgroup_cpu_s(paths)
    if container_cpu0 is not None:
        return lambda: (cgroup_cpu_s() or container_cpu0) - container_cpu0
    return None


def cgroup_oom_kills():
    for path in CGROUP_OOM:
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except OSError:
            continue
    return None


def tail(path, cap):
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - cap))
            return f.read(cap), size
    except OSError:
        return b"", 0


# -- processes -----------------------------------------------------------------------------------


class Child:
    """How children of this runner are started and cleaned up after.

    With the setup's `sandbox` (the process backend), every child starts in a bubblewrap sandbox
    whose command line the host built (`prefix` by kind: "compiler", "program"; the descriptors of
    its generated files, `fds`, rewound before each start), under the launcher (confine.py in the
    sandbox at `launcher`, or confine.c built, when the setup names no `python`; with the kind's
    seccomp filter), which drops to `uid`, sets the limits
    and reports on a channel of ours (supervisor.py, loaded by its path) before it executes the
    compiler or the program. The sandbox's PID namespace dies with it, so nothing is left to find.
    Without it (inside a container of the docker backend) the child drops to `uid` itself and
    `clean` kills and removes what the uid left in the container.
    """

    def __init__(self, job):
        self.root = os.geteuid() == 0
        self.uid = job.get("uid") if self.root else None
        self.gid = job.get("gid", self.uid) if self.root else None
        self.cpu = job.get("cpu")
        self.scratch = job.get("scratch", [])
        self.marker = job["marker"]  # not the reply token: the program can read its environment
        self.env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", MARKER: self.marker}
        self.sandbox = job.get("sandbox")
        self.supervisor = None
        if self.sandbox:
            import importlib.util

            path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervisor.py")
            spec = importlib.util.spec_from_file_location("_discover_supervisor", path)
            self.supervisor = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(self.supervisor)
        self.channel = self.listener = None
        self.launcher_cpu_s = 0.0
        self.flooded = False  # the last child was stopped for too many refused system calls
        self.starved_s = 0.0  # how long the last child, killed at the backstop, had waited for a CPU

    def popen(self, argv, limits, cgroup_procs=(), kind="program", chdir=None, **kw):
        """Start `argv` under `limits` ({name: (soft, hard)}) as the unprivileged uid, inside the
        cgroup whose `cgroup.procs` files are `cgroup_procs` (the process backend's per-case group),
        in the sandbox of `kind` when there is one."""

        def prepare():  # runs in the child before exec (we are single-threaded)
            for path in cgroup_procs:  # joined while still privileged: the whole tree is born inside
                with open(path, "w") as f:
                    f.write(str(os.getpid()))
            if self.sandbox is None:
                if self.uid is not None:
                    os.setgroups([])
                    os.setgid(self.gid)
                    os.setuid(self.uid)
                os.umask(0o077)  # what it creates (in /tmp too) is unreadable by other cases' uids
                for name, (soft, hard) in limits.items():
                    which = getattr(resource, name)
                    current = resource.getrlimit(which)[1]  # an unprivileged child cannot raise it
                    if current != resource.RLIM_INFINITY:
                        hard = min(hard, current)
                    try:
                        resource.setrlimit(which, (min(soft, hard), hard))
                    except ValueError:
                        # gVisor refuses this one; its message queues live in its own kernel, and
                        # the container's seccomp profile has no call to make one anyway
                        if name != "RLIMIT_MSGQUEUE":
                            raise
            if self.cpu is not None:
                try:
                    os.sched_setaffinity(0, {self.cpu})
                except OSError:
                    pass
            try:
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("1000")
            except OSError:
                pass

        if self.sandbox is None:
            return subprocess.Popen(argv, env=self.env, start_new_session=True, close_fds=True, preexec_fn=prepare, **kw)
        box = self.sandbox
        self.channel = self.supervisor.Channel()
        spec = {
            "uid": self.uid,
            "gid": self.gid,
            "rlimits": {name: list(value) for name, value in limits.items()},
            "chdir": chdir or kw.get("cwd") or "/",
            "seccomp": box["seccomp"][kind],
            "listener": bool(box["listener"]),
        }
        for fd in box["fds"][kind]:
            os.lseek(fd, 0, os.SEEK_SET)
        if box["python"]:  # confine.py
            launch = [box["python"], "-I", "-S", box["launcher"], json.dumps(spec), str(self.channel.child_fd)]
        else:  # confine.c: the same spec as its arguments
            launch = [box["launcher"], str(self.channel.child_fd), "-" if self.uid is None else str(self.uid)]
            launch += ["-" if self.gid is None else str(self.gid), spec["chdir"], "1" if spec["listener"] else "0", spec["seccomp"]]
            for name, (soft, hard) in limits.items():
                launch += [name, "inf" if soft < 0 else str(soft), "inf" if hard < 0 else str(hard)]
            launch.append("--")
        command = box["prefix"][kind] + launch + argv
        kw["cwd"] = "/"
        try:
            return subprocess.Popen(
                command,
                env=self.env,
                start_new_session=True,
                close_fds=True,
                preexec_fn=prepare,
                pass_fds=[self.channel.child_fd, *box["fds"][kind]],
                **kw,
            )
        finally:
            self.channel.after_spawn()

    def started(self, proc, timeout):
        """In the sandbox: wait for the launcher's report (its listener, its own CPU time); a report
        of why it could not start when it failed (no program code ran), else None."""
        self.listener, self.launcher_cpu_s = None, 0.0
        if self.channel is None:
            return None
        try:
            report, fd = self.channel.wait_ready(timeout)
        except self.supervisor.SetupFailed as failed:
            return str(failed)
        finally:
            self.channel.close()
            self.channel = None
        self.launcher_cpu_s = float(report.get("cpu_s", 0.0))
        if fd is not None:
            self.listener = self.supervisor.Listener(fd, learn=bool(self.sandbox.get("learn")))
        return None

    def denied(self):
        """[[arch, nr, count], ...] of the calls the last child's filter refused; closes the listener."""
        if self.listener is None:
            return []
        counts = self.listener.counts()
        self.listener.close()
        self.listener = None
        return [[arch, nr, n] for (arch, nr), n in sorted(counts.items())]

    def wait(self, proc, wall_s, start, starved_wall_s=0.0, counted=None):
        """(timed_out, exit code, signal, rusage, wall seconds since `start`): waits on a pidfd while
        answering the seccomp listener, kills the process group while its leader is unreaped (its
        pgid cannot be reused), then reaps it. Bubblewrap exits with 128 + the signal that killed
        the program: read as that signal. The wall-clock backstop `wall_s` is moved later by the
        time the program waited for a CPU while it had less than its one CPU (a busy host:
        `starved_deadline`, with `counted()` the CPU seconds of its cgroup since `start`), up to
        `starved_wall_s`; a program still short of `wall_s` of such time then sets `starved_s`
        (how long it waited)."""
        flooded = False
        try:
            fd = os.pidfd_open(proc.pid)
        except OSError:  # no pidfd (gVisor of 2022): poll for the exit instead, without reaping
            ready = _poll_exit(proc.pid, start + wall_s)
            fd = None
        else:
            ready = False
        deadline, self.starved_s = start + wall_s, 0.0
        try:
            while not ready and fd is not None:
                watch = [fd] + ([self.listener.fd] if self.listener is not None and self.listener.fd is not None else [])
                left = deadline - time.monotonic()
                if left <= 0:
                    # The backstop counts the time the program could have run: the time its tasks
                    # waited for a CPU on a busy host is added, up to `starved_wall_s` in all.
                    later, starved_s = starved_deadline(proc.pid, start, wall_s, starved_wall_s, deadline, 1.0, counted)
                    if later is not None:
                        deadline = later
                        continue
                    self.starved_s = starved_s  # > 0: it would have needed more than the cap
                    break
                readable, _, _ = select.select(watch, [], [], left)
                if fd in readable:
                    ready = True
                elif readable and not self.listener.handle():
                    if self.listener.flooded:
                        flooded = True
                        break  # too many refused calls: the run is stopped below
                    self.listener.close()
                    self.listener = None
        finally:
            if fd is not None:
                os.close(fd)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0  # reaped here; keep subprocess from waiting again
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        if self.sandbox is not None and code is not None and code > 128:
            code, sig = None, code - 128
        self.flooded = flooded
        return not ready and not flooded, code, sig, usage, time.monotonic() - start

    def clean(self):
        """Kill everything the child left and remove what it owns; True when nothing is left (in a
        sandbox: nothing can be, its PID namespace and scratch filesystems died with it)."""
        if self.sandbox is not None:
            return True
        if self.uid is None:
            return self._kill_marked()
        ok = False
        for _ in range(400):
            # a helper of the uid sends SIGKILL to every process it may signal: all of the uid's
            # but itself (kill(-1) cannot tell whether there were any, so /proc is checked after)
            self._as_uid(_kill_all)
            if not self._uid_pids():
                ok = True
                break
            time.sleep(0.002)
        if self._owns_something():
            self._as_uid(self._remove_owned)
        return ok

    def _as_uid(self, action):
        """Run `action()` in a forked helper that became the uid; its exit status (1: it raised)."""
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setgroups([])
                os.setgid(self.gid)
                os.setuid(self.uid)
                code = action() or 0
            except BaseException:
                pass
            os._exit(code)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    def _owns_something(self):
        """Whether the uid owns System V IPC objects, message queues or scratch files (looked up as
        ourselves, so that a helper is forked only when there is something to remove)."""
        for kind in ("shm", "msg", "sem"):
            try:
                with open("/proc/sysvipc/" + kind) as f:
                    header = f.readline().split()
                    column = header.index("uid")
                    if any(int(line.split()[column]) == self.uid for line in f if line.strip()):
                        return True
            except (OSError, ValueError, IndexError):
                continue
        for top in ["/dev/mqueue", *self.scratch]:
            try:
                with os.scandir(top) as entries:
                    if any(e.stat(follow_symlinks=False).st_uid == self.uid for e in entries):
                        return True
            except OSError:
                continue
        return False

    def _remove_owned(self):
        """Runs as uid: its System V IPC objects, message queues and scratch files go."""
        for tool in ("/usr/bin/ipcrm", "/bin/ipcrm"):
            if os.path.exists(tool):
                subprocess.run([tool, "--all"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env, check=False)
                break
        for top in ["/dev/mqueue", *self.scratch]:
            try:
                names = os.listdir(top)
            except OSError:
                continue
            for name in names:
                path = os.path.join(top, name)
                try:
                    if os.lstat(path).st_uid != self.uid:
                        continue
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        os.unlink(path)
                except OSError:
                    pass

    def _uid_pids(self):
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open("/proc/%s/status" % name) as f:
                    text = f.read()
                state = text.split("State:", 1)[1].split()[0]
                uids = [int(u) for u in text.split("Uid:", 1)[1].split()[:4]]
            except (OSError, IndexError, ValueError):
                continue
            if state != "Z" and self.uid in uids:
                found.append(int(name))
        return found

    def _kill_marked(self):
        """Not root: processes that left the session are found by the environment marker."""
        marker = ("%s=%s" % (MARKER, self.marker)).encode()
        me = os.getpid()
        for _ in range(20):
            found = False
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) == me:
                    continue
                try:
                    with open("/proc/%s/environ" % name, "rb") as f:
                        environ = f.read().split(b"\0")
                except OSError:
                    continue
                if marker in environ:
                    found = True
                    try:
                        os.kill(int(name), signal.SIGKILL)
                    except OSError:
                        pass
            if not found:
                return True
            time.sleep(0.005)
        return False


def tree_usage(root):
    """(wait, cpu) of `root`'s process tree: the time its tasks spent runnable but waiting for a CPU
    (the kernel's schedstat run_delay), summed over them, and the CPU seconds its processes used
    (their own and that of the children they reaped), both in seconds; waits are 0.0 where the
    kernel does not say (gVisor). Summed, not the longest: the processes of a chain (bubblewrap's,
    the launcher, the program) wait one after the other, and the longest of them alone undercounts
    a program that was starved before it started as well; tasks that waited at once are bounded by
    the CPU the tree did not get (`starved_deadline`)."""
    tick = os.sysconf("SC_CLK_TCK")
    children, cpu_of = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2 :].split()
            ppid = int(fields[1])
            cpu_of[int(name)] = sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    waited, used, todo, seen = 0, 0.0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, ()))
        used += cpu_of.get(pid, 0.0)
        try:
            tasks = os.listdir("/proc/%d/task" % pid)
        except OSError:
            continue
        for tid in tasks:
            try:
                with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                    waited += int(f.read().split()[1])
            except (OSError, ValueError, IndexError):
                pass
    return waited / 1e9, used


def starved_deadline(pid, start, limit_s, cap_s, deadline, cpus=1.0, counted=None):
    """At `deadline`, for a program started at `start` with a wall-clock limit of `limit_s` and
    entitled to `cpus` CPUs: (a later deadline, 0.0) when it was starved by the host, else (None,
    s): its limit is reached, and s > 0 when it was still starved then (for s seconds: the host's
    load, not the program). Starved: its tasks waited for a CPU (`tree_usage`) while the tree got
    less than its `cpus` per second; that time is added to the limit, up to `cap_s` after the
    start. A program whose own tasks queue behind each other (a fork bomb, more threads than its
    CPUs or its quota) had its CPUs and is not starved. `counted()`, when given and not None, is the
    CPU time of everything the program started since `start` (its cgroup's: also the processes
    that left the tree or were never waited for)."""
    waited, used = tree_usage(pid)
    more = counted() if counted is not None else None
    if more is not None:
        used = max(used, more)
    short = max(0.0, cpus * (time.monotonic() - start) - used)  # CPU time it could have had and did not get
    waited = min(waited, short)
    later = min(start + limit_s + waited, start + max(cap_s, limit_s))
    if later > deadline + 0.01:
        return later, 0.0
    return None, waited if start + limit_s + waited > deadline + 0.01 else 0.0


def _poll_exit(pid, deadline):
    """Whether `pid` exited before `deadline` (monotonic), without reaping it."""
    delay = 0.001
    while True:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is not None and info.si_pid == pid:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.02)


def _kill_all():
    """In a helper of the uid: SIGKILL every process of the uid (and of nobody else)."""
    os.kill(-1, signal.SIGKILL)


# -- the two jobs --------------------------------------------------------------------------------


def owned_dir(path, child, mode=0o700):
    os.mkdir(path, mode)
    if child.uid is not None:
        os.chown(path, child.uid, child.gid)


def compile_source(setup, child, work):
    """Compile once as the unprivileged uid; the binary goes to work/bin/main (ours, 0750, group: the
    program's gid)."""
    build = os.path.join(work, "build")
    owned_dir(build, child)
    src = os.path.join(build, "main.cpp")
    with open(src, "w", encoding="utf-8") as f:
        f.write(setup["source"])
    if child.uid is not None:
        os.chown(src, child.uid, child.gid)
    out = os.path.join(build, "a.out")
    argv = [a.replace("{src}", src).replace("{out}", out) for a in setup["command"]]
    log_path = os.path.join(work, "io", "compile.log")
    timeout = float(setup["compile_timeout_s"])
    limits = {
        "RLIMIT_CPU": (int(timeout) + 1, int(timeout) + 2),
        "RLIMIT_AS": (setup["compile_memory_mb"] * MB,) * 2,
        "RLIMIT_FSIZE": (setup["binary_mb"] * MB,) * 2,
        "RLIMIT_CORE": (0, 0),
        "RLIMIT_MSGQUEUE": (0, 0),
    }
    start = time.monotonic()
    if shutil.which(argv[0], path=child.env["PATH"]) is None:
        shutil.rmtree(build, ignore_errors=True)
        return {"ok": False, "seconds": 0.0, "log": "the sandbox has no compiler: %s is not installed" % argv[0], "missing": True}
    with open(log_path, "wb") as log:
        child.env["TMPDIR"] = build
        proc = child.popen(
            argv,
            limits,
            setup.get("cgroup_procs", ()),
            kind="compiler",
            cwd=build,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        failed = child.started(proc, timeout)
        timed_out, code, sig, _, _ = child.wait(proc, timeout, start)
        del child.env["TMPDIR"]
    denied = child.denied()
    child.clean()
    if failed is not None:
        shutil.rmtree(build, ignore_errors=True)
        return {"ok": False, "seconds": 0.0, "log": "the sandbox could not start the compiler: %s" % failed, "missing": True}
    text, _ = tail(log_path, COMPILE_LOG)
    result = {"seconds": time.monotonic() - start, "log": text.decode("utf-8", "replace"), "denied": denied, "flooded": child.flooded}
    ok = not timed_out and code == 0 and os.path.isfile(out)
    if timed_out:
        result["log"] += "\ncompilation timed out after %g s" % timeout
    elif sig is not None:
        result["log"] += "\ncompiler killed by signal %d" % sig
    if ok:
        with open(out, "rb") as f:
            binary = f.read()
        install_binary(binary, work, child)
        result["binary"] = base64.b64encode(binary).decode() if setup.get("return_binary") else None
    shutil.rmtree(build, ignore_errors=True)
    result["ok"] = ok
    return result


def install_binary(binary, work, child):
    path = os.path.join(work, "bin", "main")
    with open(path, "wb") as f:
        f.write(binary)
    program_may_enter(path, child, 0o750)


def program_may_enter(path, child, mode):
    """`path` stays ours, and only the program's own gid gets the group bits of `mode` (no world
    bits): a program of another evaluation (another uid and gid) cannot enter, read or run it, even
    knowing its name (names under /tmp can be listed). Not root: the program is us; owner bits only."""
    if child.uid is None:
        os.chmod(path, mode & 0o700)
        return
    os.chown(path, -1, child.gid)
    os.chmod(path, mode & 0o770)


def run_case(case, setup, child, work):
    """Run the binary on one input; the raw result, judged by the host."""
    io = os.path.join(work, "io")
    paths = {name: os.path.join(io, name) for name in ("input", "stdout", "stderr")}
    with open(paths["input"], "w", encoding="utf-8") as f:
        f.write(case["input"])
    cap = int(setup["output_bytes"])
    memory = int(setup["memory_mb"]) * MB
    cpu_hard = int(float(setup["cpu_s"])) + 1  # SIGXCPU at this many CPU seconds, SIGKILL one later
    limits = {
        "RLIMIT_CPU": (cpu_hard, cpu_hard + 1),
        "RLIMIT_AS": (memory + AS_SLACK, memory + AS_SLACK),
        "RLIMIT_STACK": (memory, memory),
        "RLIMIT_FSIZE": (cap + 1, cap + 1),
        "RLIMIT_NPROC": (int(setup["nproc"]), int(setup["nproc"])),
        "RLIMIT_CORE": (0, 0),
        "RLIMIT_MSGQUEUE": (0, 0),  # no POSIX message queues: they would outlive the case
    }
    # The process backend gives each case its own directory (its cwd, HOME and TMPDIR): 0700, the
    # uid's, gone after the case. In a container the program writes nowhere: its cwd is bin/.
    private = os.path.join(work, "case") if setup.get("case_dir") else None
    if private is not None:
        owned_dir(private, child)
        child.env.update(HOME=private, TMPDIR=private)
    cpu0, oom0 = (cgroup_cpu_s(), cgroup_oom_kills()) if setup.get("cgroup") else (None, None)
    with open(paths["input"], "rb") as stdin, open(paths["stdout"], "wb") as stdout, open(paths["stderr"], "wb") as stderr:
        start = time.monotonic()
        proc = child.popen(
            [os.path.join(work, "bin", "main")],
            limits,
            case.get("cgroup_procs", ()),
            kind="program",
            cwd=private or os.path.join(work, "bin"),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
        )
        failed = child.started(proc, float(setup["wall_s"]))
        counted = case_cpu_counter(case.get("cgroup_procs", ()), cpu0)
        starved_wall_s = float(setup.get("starved_wall_s", 0.0))
        timed_out, code, sig, usage, wall = child.wait(proc, float(setup["wall_s"]), start, starved_wall_s, counted)
    cpu1, oom1 = (cgroup_cpu_s(), cgroup_oom_kills()) if setup.get("cgroup") else (None, None)
    denied = child.denied()
    clean = child.clean()
    if private is not None:
        del child.env["HOME"], child.env["TMPDIR"]
        shutil.rmtree(private, ignore_errors=True)
    out, out_size = tail(paths["stdout"], cap)
    err, _ = tail(paths["stderr"], STDERR_TAIL)
    for path in paths.values():
        os.unlink(path)
    return {
        "kind": "case",
        "index": case["index"],
        "setup_failed": failed,  # the sandbox could not start the program: ours to fix, not a verdict
        "exit_code": code,
        "signal": sig,
        "timed_out": timed_out,
        # the launcher's own start (a Python interpreter) is not the program's time
        "cpu_s": max(0.0, usage.ru_utime + usage.ru_stime - child.launcher_cpu_s),
        "launcher_cpu_s": child.launcher_cpu_s,
        "denied": denied,
        "flooded": child.flooded,  # stopped for too many refused system calls
        "starved_s": child.starved_s if timed_out else 0.0,  # killed while still short of CPU: the host's load, not the program
        "wall_s": wall,
        "peak_kb": usage.ru_maxrss,
        "cgroup_cpu_s": None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
        "oom_kills": None if oom0 is None or oom1 is None else oom1 - oom0,
        "stdout": base64.b64encode(out).decode(),
        "stdout_bytes": out_size,
        "stderr": err.decode("utf-8", "replace"),
        "clean": clean,
    }


def main():
    stdin = sys.stdin.buffer
    setup = read_message(stdin)
    token = setup["token"]
    child = Child(setup)
    for path in setup.get("private_dirs", []):  # inside a container: the program writes no file
        os.chmod(path, 0o755)
    work = setup["workdir"]
    os.makedirs(work, exist_ok=True)
    program_may_enter(work, child, 0o710)  # the program (its gid alone) may enter bin/, nothing else
    os.mkdir(os.path.join(work, "bin"), 0o700)
    program_may_enter(os.path.join(work, "bin"), child, 0o710)
    os.mkdir(os.path.join(work, "io"), 0o700)
    if "source" in setup:
        ready = compile_source(setup, child, work)
    else:
        install_binary(base64.b64decode(setup["binary"]), work, child)
        ready = {"ok": True}
    reply(token, {"kind": "ready", **ready})
    clean = True
    while True:  # the host sends no case after a failed compilation, only "end"
        message = read_message(stdin)
        if message is None or message.get("kind") == "end":
            break
        result = run_case(message, setup, child, work)
        clean = clean and result["clean"]
        reply(token, result)
    clean = child.clean() and clean
    shutil.rmtree(work, ignore_errors=True)
    reply(token, {"kind": "end", "clean": clean})


if __name__ == "__main__":
    main()
