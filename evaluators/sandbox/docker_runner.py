"""The runner of the docker backend, run as `python3 -I -c <this file's text>` by RUN_UID inside
the container for each candidate (see docker.py). Standard library only; never imported.

It reads the job from stdin (a length line, then JSON), kills every process of its uid and wipes
/tmp and /dev/shm, writes the job's files into a fresh directory, runs harness.py under the
job's environment with a wall-clock timeout, kills everything again, and prints one line: the
job's token and a JSON report (exit status, the return value's bytes, the tails of the logs).
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


def oom_first():
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def main():
    n = int(sys.stdin.buffer.readline())
    job = json.loads(sys.stdin.buffer.read(n))
    cap = job["cap"]
    killall()
    wipe("/tmp")
    wipe("/dev/shm")
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
    timed_out = False
    try:
        rc = proc.wait(timeout=job["timeout"])
    except subprocess.TimeoutExpired:
        timed_out = True
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
    wipe("/tmp")
    wipe("/dev/shm")
    report = {
        "rc": rc,
        "timed_out": timed_out,
        "elapsed": time.monotonic() - start,
        "clean": clean,
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
