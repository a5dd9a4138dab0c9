"""The runner of the docker backend, run as `python3 -I -c <this file's text>` by RUN_UID inside
the container for each candidate (see docker.py). Standard library only; never imported.

It makes itself non-dumpable first (`not_dumpable`: the candidate runs as the same uid and could
otherwise open /proc/<runner>/mem or its fds and forge the report), reads the job from stdin (a
length line, then JSON), kills every process of its uid and
removes what a candidate could leave (`sweep`), writes the job's files into a fresh directory, runs
harness.py under the job's environment with a wall-clock timeout (moved later by the time the
candidate waited for a CPU: `wait_unstarved`), kills everything again, sweeps
again, checks that nothing is left (`residue`), and prints one line: the job's token and a JSON
report (exit status, the return value's bytes, the tails of the logs, whether the container is
clean). A container whose report is not clean is replaced, never reused.

What a candidate can leave in a warm container, all of it created as this uid (the container has
no capability, so no uid can make or take over another's objects): files in /tmp, /dev/shm,
/var/tmp, /run/lock and /var/lock (the last three are on the read-only root unless an image makes
them writable); System V shared memory, semaphores and message queues (they outlive their
processes, and shared memory stays charged to the container's memory limit); POSIX message queues
in /dev/mqueue. Their creator may always remove System V objects (even after giving them to
another owner with IPC_SET), and the owner of an entry of a sticky directory may always delete it.
"""

import base64
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time


def tail(path, cap):
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - cap))
            return f.read(cap), size > cap
    except OSError:
        return b"", False


def others():
    me, uid, found = os.getpid(), os.getuid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/status" % name) as f:
                text = f.read()
        except OSError:
            continue
        state = text.split("State:", 1)[1].split()[0]
        if state != "Z" and int(text.split("Uid:", 1)[1].split()[0]) == uid:
            found.append(name)
    return found


def killall():
    for _ in range(500):
        try:
            os.kill(-1, signal.SIGKILL)  # every process of our uid but ourselves
        except ProcessLookupError:
            pass
        if not others():
            return True
        time.sleep(0.002)
    return False


def wipe(top):
    def retry(func, p, exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            func(p)
        except OSError:
            pass

    try:
        names = os.listdir(top)
    except OSError:
        return
    for name in names:
        p = os.path.join(top, name)
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
                shutil.rmtree(p, onerror=retry)
            else:
                os.unlink(p)
        except OSError:
            pass


SCRATCH = ("/tmp", "/dev/shm", "/var/tmp", "/run/lock", "/var/lock", "/dev/mqueue")
SYSV = ("shm", "sem", "msg")
IPC_RMID = 0


def sysv_objects():
    """(kind, id, creator uid, owner uid) of every System V IPC object of the container's private
    IPC namespace (/proc/sysvipc)."""
    found = []
    for kind in SYSV:
        try:
            with open("/proc/sysvipc/" + kind) as f:
                header = f.readline().split()
                key = {"shm": "shmid", "sem": "semid", "msg": "msqid"}[kind]
                at = [header.index(name) for name in (key, "cuid", "uid")]
                for line in f:
                    cols = line.split()
                    if cols:
                        found.append((kind, int(cols[at[0]]), int(cols[at[1]]), int(cols[at[2]])))
        except (OSError, ValueError, IndexError):
            continue
    return found


def remove_sysv():
    """Remove every System V object this uid created or owns (IPC_RMID); once no process is
    attached, shared memory is freed at once."""
    try:  # an image without ctypes (libffi) falls back to ipcrm
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        libc = None
    me = os.getuid()
    for kind, ident, cuid, uid in sysv_objects():
        if me not in (cuid, uid):
            continue
        done = False
        if libc is not None:
            if kind == "shm":
                done = libc.shmctl(ident, IPC_RMID, None) == 0
            elif kind == "sem":
                done = libc.semctl(ident, 0, IPC_RMID) == 0
            else:
                done = libc.msgctl(ident, IPC_RMID, None) == 0
        if not done:
            for tool in ("/usr/bin/ipcrm", "/bin/ipcrm"):
                if os.path.exists(tool):
                    flag = {"shm": "-m", "sem": "-s", "msg": "-q"}[kind]
                    subprocess.run([tool, flag, str(ident)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
                    break


def sweep():
    """After every process of this uid is dead: its System V IPC objects, its POSIX message queues
    and everything it may have left in the scratch directories go."""
    remove_sysv()
    for top in SCRATCH:
        wipe(top)


def residue(keep=()):
    """What is still there after a sweep, as short descriptions ([] when the container is clean):
    any System V object, any message queue, any entry of /tmp or /dev/shm but `keep`, and any
    entry of this uid in the other scratch directories."""
    left = ["System V %s %d (creator uid %d)" % (kind, ident, cuid) for kind, ident, cuid, _ in sysv_objects()]
    me = os.getuid()
    for top in SCRATCH:
        try:
            names = os.listdir(top)
        except OSError:
            continue
        for name in names:
            path = os.path.join(top, name)
            if path in keep:
                continue
            if top in ("/tmp", "/dev/shm", "/dev/mqueue"):
                left.append(path)
                continue
            try:
                if os.lstat(path).st_uid == me:
                    left.append(path)
            except OSError:
                continue
    return left


def oom_first():
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


PR_SET_DUMPABLE = 4


def not_dumpable():
    """Close this process to the candidate, which runs as the same uid (it must: only a process of
    that uid can kill all of the candidate's, and no process in the container has a capability): a
    non-dumpable process's /proc/PID entries (mem, fd, environ, ...) belong to root and ptrace needs
    CAP_SYS_PTRACE, so the candidate can neither read nor write this runner's memory nor write to
    its report's stream. "" when done, else why not (the run is then not started)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return "prctl(PR_SET_DUMPABLE, 0) failed: %s" % os.strerror(ctypes.get_errno())
    return ""


def wait_unstarved(proc, timeout_s, cap_s, cpus):
    """(exit status or None at the time limit, seconds starved): the limit counts the time the
    candidate could run; the time its processes waited for a CPU while the container got less than
    its `cpus` moves it later, up to `cap_s` after the start (`starved_deadline` of native_runner.py,
    sent ahead of this file by the host, the container's CPU counted by its cgroup; nothing moves
    where the kernel does not say, as under gVisor). Starved > 0: stopped while still short of CPU,
    the host's load."""
    start = time.monotonic()
    cpu0 = cgroup_cpu_s()  # noqa: F821 - sent ahead (docker.py RUNNER)
    counted = None if cpu0 is None else (lambda: (cgroup_cpu_s() or cpu0) - cpu0)  # noqa: F821
    deadline = start + timeout_s
    while deadline is not None:
        try:
            return proc.wait(timeout=max(0.0, deadline - time.monotonic())), 0.0
        except subprocess.TimeoutExpired:
            pass
        deadline, starved_s = starved_deadline(proc.pid, start, timeout_s, cap_s, deadline, cpus, counted)  # noqa: F821 - sent ahead
    return None, starved_s


def main():
    why = not_dumpable()
    n = int(sys.stdin.buffer.readline())
    job = json.loads(sys.stdin.buffer.read(n))
    if why:  # fail closed: the host reports the infrastructure's failure, no candidate code ran
        sys.stdout.write("\n" + job["token"] + " " + json.dumps({"setup_error": why}) + "\n")
        sys.stdout.flush()
        return
    cap = job["cap"]
    killall()
    sweep()
    d = "/tmp/run-" + job["token"]
    os.mkdir(d, 0o700)
    for name, text in job["files"].items():
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(text)
    out, err = open(os.path.join(d, "stdout.txt"), "wb"), open(os.path.join(d, "stderr.txt"), "wb")
    start = time.monotonic()
    proc = subprocess.Popen(
        ["python3", "-s", "-B", "-P", "harness.py", "job.json"],
        cwd=d,
        env=job["env"],
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        start_new_session=True,
        close_fds=True,
        preexec_fn=oom_first,
    )
    out.close()
    err.close()
    rc, starved_s = wait_unstarved(proc, job["timeout"], job.get("starved_cap", job["timeout"]), job.get("cpus", 1.0))
    timed_out = rc is None
    clean = killall()
    if timed_out:
        rc = proc.wait()
    out_b, out_cut = tail(os.path.join(d, "stdout.txt"), cap)
    err_b, err_cut = tail(os.path.join(d, "stderr.txt"), cap)
    output, output_error = None, ""
    if rc == 0 and not timed_out:
        try:
            fd = os.open(os.path.join(d, "output.json"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    output_error = "output.json is not a regular file"
                elif st.st_size > cap:
                    output_error = "return value too large: %d bytes > max_output_bytes=%d" % (st.st_size, cap)
                else:
                    output = base64.b64encode(f.read(cap + 1)).decode()
        except FileNotFoundError:
            output_error = "program exited without returning a value (no output.json)"
        except OSError as e:
            output_error = "output.json is a symbolic link" if e.errno == 40 else "could not read the return value: %s" % e
    clean = killall() and clean
    sweep()
    left = residue()
    report = {
        "rc": rc,
        "timed_out": timed_out,
        "starved_s": starved_s,
        "elapsed": time.monotonic() - start,
        "clean": clean and not left,
        "residue": left[:20],
        "output": output,
        "output_error": output_error,
        "stdout": base64.b64encode(out_b).decode(),
        "stdout_cut": out_cut,
        "stderr": base64.b64encode(err_b).decode(),
        "stderr_cut": err_cut,
    }
    sys.stdout.write("\n" + job["token"] + " " + json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
