"""The launcher: the first code that runs inside a sandbox, before anything a candidate wrote.
Standard library only (it runs under the bare interpreter, with no site-packages).

`enter(spec, status_fd)` makes the calling process what the candidate may be, in this order:
1. drops to the run's uid and gid (`uid`, `gid`) when it starts as root (bubblewrap started by root
   gives it CAP_SETUID and CAP_SETGID and nothing else; the drop clears them), and checks that
   no_new_privs is set (bubblewrap sets it; it is set here otherwise);
2. sets the resource limits (`rlimits`, {name: [soft, hard]}), umask 077 and the working
   directory (`chdir`, entered as the run's uid: it is that uid's alone);
3. installs the seccomp filter (`seccomp`: BPF built on the host by libseccomp, base64), asking
   the kernel for a listener when `listener` is true (a call outside the profile then waits for
   the host, which answers EPERM and writes down which call it was);
4. reports on `status_fd` (a socket only the host holds the other end of) one JSON line
   {"ok": true, "cpu_s": CPU used so far} with the listener passed along (SCM_RIGHTS), then closes
   it: from here on nothing in the sandbox can reach the host's channel, so a candidate can neither
   forge a set-up failure nor hide one. On any failure before that it reports {"ok": false, "why":
   ...} and exits with EXIT_NOT_CONFINED: no candidate code has run.

As a program (`python3 -I -S confine.py SPEC_JSON STATUS_FD PROGRAM [ARGS...]`) it does the same and
then executes PROGRAM (the compiler, a compiled program): the launcher's own CPU time is in the
report so that the host can take it out of the program's.
"""

import base64
import ctypes
import json
import os
import resource
import signal
import socket
import sys

EXIT_NOT_CONFINED = 121
PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS = 38, 39
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}


class NotConfined(RuntimeError):
    """The launcher could not make the process what the candidate may be (nothing of it ran)."""


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _drop_privileges(uid, gid):
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid or os.getegid() != gid:
        raise NotConfined("could not become uid %d" % uid)
    with open("/proc/self/status") as f:
        status = f.read()
    capabilities = status.split("CapEff:", 1)[1].split()[0]
    if int(capabilities, 16):
        raise NotConfined("capabilities left after the uid drop: %s" % capabilities)


def _install_filter(libc, bpf, listener):
    """The filter (raw BPF); the listener's fd when asked for, else None."""
    machine = os.uname().machine
    if machine not in SYS_SECCOMP:
        raise NotConfined("no seccomp system call number known for %s" % machine)
    buffer = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(len(bpf) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    flags = SECCOMP_FILTER_FLAG_NEW_LISTENER if listener else 0
    fd = libc.syscall(ctypes.c_long(SYS_SECCOMP[machine]), ctypes.c_long(SECCOMP_SET_MODE_FILTER), ctypes.c_long(flags), ctypes.byref(prog))
    if fd < 0:
        err = ctypes.get_errno()
        raise NotConfined("seccomp: %s (errno %d)" % (os.strerror(err), err))
    return int(fd) if listener else None


def _report(status_fd, payload, fds=()):
    if status_fd is None:  # no host channel (Docker's runner reads the harness's exit instead)
        return
    with socket.socket(fileno=status_fd) as channel:
        data = (json.dumps(payload) + "\n").encode()
        if fds:
            socket.send_fds(channel, [data], list(fds))
        else:
            channel.sendall(data)


def enter(spec, status_fd):
    """Steps 1-4 of the module docstring; raises NotConfined (after reporting it) on failure."""
    try:
        libc = _libc()
        if spec.get("uid") is not None and os.geteuid() == 0:
            _drop_privileges(int(spec["uid"]), int(spec["gid"]))
        if libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1 and libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise NotConfined("no_new_privs: %s" % os.strerror(ctypes.get_errno()))
        for name, (soft, hard) in (spec.get("rlimits") or {}).items():
            which = getattr(resource, name)
            current = resource.getrlimit(which)[1]
            if current != resource.RLIM_INFINITY:
                hard = current if hard == resource.RLIM_INFINITY else min(hard, current)
            resource.setrlimit(which, (min(soft, hard) if soft != resource.RLIM_INFINITY else hard, hard))
        os.umask(0o077)
        if spec.get("chdir"):  # after the drop: the run's directory is its uid's alone
            os.chdir(spec["chdir"])
        listener = None
        if spec.get("seccomp"):
            listener = _install_filter(libc, base64.b64decode(spec["seccomp"]), bool(spec.get("listener")) and status_fd is not None)
        elif spec.get("require_seccomp", True):
            raise NotConfined("no seccomp filter was given")
    except (NotConfined, OSError, ValueError, KeyError, AttributeError) as err:
        why = str(err) if isinstance(err, NotConfined) else "%s: %s" % (type(err).__name__, err)
        try:
            _report(status_fd, {"ok": False, "why": why})
        except OSError:
            pass
        raise NotConfined(why) from None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _report(status_fd, {"ok": True, "cpu_s": usage.ru_utime + usage.ru_stime}, [listener] if listener is not None else [])
    if listener is not None:
        os.close(listener)


def main():
    spec, status_fd, argv = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    try:
        enter(spec, status_fd)
    except NotConfined:
        os._exit(EXIT_NOT_CONFINED)
    os.closerange(3, 1 << 16)
    for name in ("SIGPIPE", "SIGXFSZ"):  # Python ignores them, and an ignored signal stays ignored across exec
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvp(argv[0], argv)
    except OSError as err:  # the program's own failure (a binary that cannot run): exit 127
        sys.stderr.write("cannot execute %s: %s\n" % (argv[0], err))
        sys.stderr.flush()
        os._exit(127)


if __name__ == "__main__":
    main()
