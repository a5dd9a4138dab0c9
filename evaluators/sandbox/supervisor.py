"""The host's end of a sandbox's launcher (confine.py): its status report, and the seccomp listener
that answers every system call outside the candidate's profile. Standard library only (the native
runner loads this file by its path).

`Channel` is a socket pair: the host keeps one end, the sandbox inherits the other (`child_fd`),
which the launcher closes before any candidate code runs. `Channel.wait_ready` reads the launcher's
one report: {"ok": true, ...} with the listener's fd, or {"ok": false, "why": ...}, or nothing at
all when the sandbox could not be set up (bubblewrap failed before the launcher ran). Only the
launcher ever held that end, so whatever a candidate does afterwards (exits with any status,
prints anything, renames files) cannot make the host think that set-up failed.

`Listener.handle()` answers one pending call: EPERM (`learn`: let it run, for deriving profiles),
and counts it by (architecture, number), in bounded space: a run's first DISTINCT_MAX numbers one
by one, the rest together; past REFUSED_MAX refused calls the run is stopped (`flooded`). The host
names the calls with libseccomp (evaluators/sandbox/syscalls.py) in the verdict.
"""

import errno
import fcntl
import json
import os
import select
import socket
import struct
import threading
import time

# struct seccomp_notif: id (u64), pid (u32), flags (u32), data: nr (s32), arch (u32), ip (u64), args (6 x u64)
NOTIF = struct.Struct("=QIIiIQ6Q")
# struct seccomp_notif_resp: id (u64), val (s64), error (s32), flags (u32)
NOTIF_RESP = struct.Struct("=QqiI")
NOTIF_RECV = (3 << 30) | (NOTIF.size << 16) | (ord("!") << 8) | 0  # SECCOMP_IOWR(0, struct seccomp_notif)
NOTIF_SEND = (3 << 30) | (NOTIF_RESP.size << 16) | (ord("!") << 8) | 1  # SECCOMP_IOWR(1, struct seccomp_notif_resp)
FLAG_CONTINUE = 1  # SECCOMP_USER_NOTIF_FLAG_CONTINUE


class SetupFailed(RuntimeError):
    """The sandbox could not be set up (no candidate code ran): the infrastructure's to fix."""


# What one run's refused calls may cost the host (the listener runs in the host's process, outside
# the run's cgroup): distinct (architecture, number) pairs counted one by one, the rest counted
# together; and refused calls in all, past which the run is stopped (its verdict says so).
DISTINCT_MAX = 64
REFUSED_MAX = 10000
LEARN_DISTINCT_MAX = 4096  # learn mode (deriving profiles from honest programs): every call made is counted


class Listener:
    """A seccomp listener: answers the calls the filter sends it and counts them, in bounded space and
    time (DISTINCT_MAX, REFUSED_MAX): at the REFUSED_MAX + 1st refused call it stops answering, sets
    `flooded` and calls `on_flood` (which stops the run)."""

    def __init__(self, fd, learn=False, on_flood=None, distinct_max=None, refused_max=REFUSED_MAX):
        self.fd = fd
        self.learn = learn
        self.on_flood = on_flood
        self.distinct_max = distinct_max or (LEARN_DISTINCT_MAX if learn else DISTINCT_MAX)
        self.refused_max = refused_max
        self.denied = {}  # (arch, nr) -> count, at most distinct_max keys
        self.other = 0  # calls of numbers past the first distinct_max
        self.total = 0
        self.flooded = False
        self._lock = threading.Lock()

    def handle(self):
        """Answer one pending call (after poll said the fd is readable); False when the filtered
        processes are gone (nothing more will come) or the run made too many refused calls."""
        buffer = bytearray(NOTIF.size)
        try:
            fcntl.ioctl(self.fd, NOTIF_RECV, buffer, True)
        except OSError as err:
            return err.errno in (errno.EINTR, errno.ENOENT)  # interrupted, or the caller died meanwhile
        ident, _, _, nr, arch = NOTIF.unpack(bytes(buffer))[:5]
        with self._lock:
            self.total += 1
            key = (arch, nr)
            if key in self.denied or len(self.denied) < self.distinct_max:
                self.denied[key] = self.denied.get(key, 0) + 1
            else:
                self.other += 1
            flooded = not self.learn and self.total > self.refused_max
            if flooded:
                self.flooded = True
        if flooded:  # unanswered: the caller waits until the run is stopped
            if self.on_flood is not None:
                self.on_flood()
            return False
        reply = NOTIF_RESP.pack(ident, 0, 0, FLAG_CONTINUE) if self.learn else NOTIF_RESP.pack(ident, 0, -errno.EPERM, 0)
        try:
            fcntl.ioctl(self.fd, NOTIF_SEND, bytearray(reply), True)
        except OSError:
            pass  # the caller died or was interrupted: its call fails anyway
        return True

    def serve(self, stop):
        """Answer calls until the filtered processes are gone, the run floods, or `stop` (an Event) is set."""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while not stop.is_set():
            events = poller.poll(100)
            for _, event in events:
                if event & select.POLLIN:
                    if not self.handle():
                        return
                elif event & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    return

    def counts(self):
        """{(arch, nr): count} of the first DISTINCT_MAX numbers, with (-1, -1) for the calls of all others."""
        with self._lock:
            out = dict(self.denied)
            if self.other:
                out[OTHER] = self.other
            return out

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


OTHER = (-1, -1)  # in counts(): the refused calls of numbers past the first DISTINCT_MAX


class Channel:
    """The launcher's status channel (module docstring)."""

    def __init__(self):
        self.host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.child_fd = child.detach()
        os.set_inheritable(self.child_fd, True)

    def after_spawn(self):
        """The host's copy of the sandbox's end goes once the sandbox holds it."""
        if self.child_fd is not None:
            os.close(self.child_fd)
            self.child_fd = None

    def wait_ready(self, timeout):
        """The launcher's report, with its listener (or None); SetupFailed when it failed or the
        sandbox ended (or `timeout` passed) before it reported."""
        self.after_spawn()
        deadline = time.monotonic() + timeout
        data, fds = b"", []
        while not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SetupFailed("the sandbox did not start within %g s" % timeout)
            ready, _, _ = select.select([self.host], [], [], remaining)
            if not ready:
                continue  # the deadline passed: said above
            chunk, got, _, _ = socket.recv_fds(self.host, 65536, 1)
            fds += got
            if not chunk:
                break
            data += chunk
        try:
            report = json.loads(data) if data.endswith(b"\n") else None
        except ValueError:
            report = None
        if not isinstance(report, dict) or not report.get("ok"):
            for fd in fds:
                os.close(fd)
            why = report.get("why") if isinstance(report, dict) else None
            raise SetupFailed(why or "the sandbox ended before its launcher ran")
        return report, (fds[0] if fds else None)

    def close(self):
        self.after_spawn()
        self.host.close()
