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
and counts it by (architecture, number); the host names the calls with libseccomp
(evaluators/sandbox/syscalls.py) in the verdict.
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


class Listener:
    """A seccomp listener: answers the calls the filter sends it and counts them."""

    def __init__(self, fd, learn=False):
        self.fd = fd
        self.learn = learn
        self.denied = {}  # (arch, nr) -> count
        self._lock = threading.Lock()

    def handle(self):
        """Answer one pending call (after poll said the fd is readable); False when the filtered
        processes are gone (nothing more will come)."""
        buffer = bytearray(NOTIF.size)
        try:
            fcntl.ioctl(self.fd, NOTIF_RECV, buffer, True)
        except OSError as err:
            return err.errno in (errno.EINTR, errno.ENOENT)  # interrupted, or the caller died meanwhile
        ident, _, _, nr, arch = NOTIF.unpack(bytes(buffer))[:5]
        with self._lock:
            self.denied[(arch, nr)] = self.denied.get((arch, nr), 0) + 1
        reply = NOTIF_RESP.pack(ident, 0, 0, FLAG_CONTINUE) if self.learn else NOTIF_RESP.pack(ident, 0, -errno.EPERM, 0)
        try:
            fcntl.ioctl(self.fd, NOTIF_SEND, bytearray(reply), True)
        except OSError:
            pass  # the caller died or was interrupted: its call fails anyway
        return True

    def serve(self, stop):
        """Answer calls until the filtered processes are gone or `stop` (an Event) is set."""
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
        with self._lock:
            return dict(self.denied)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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
