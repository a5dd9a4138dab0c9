"""OS-level isolation of a candidate process for the process backend: namespaces, a read-only view
of the host, fresh scratch filesystems, Landlock and seccomp. Standard library only: harness.py and
native_runner.py load this file by its path (they run with no project source on their import path).

`enter(spec)` is called, as root, in the process that is about to become the candidate (the harness
before it drops to the run's uid; the native runner's child before it execs the compiler or the
program). It
1. unshares new mount, network, IPC, UTS and PID namespaces;
2. in the new mount namespace: makes every mount private (nothing propagates back to the host) and
   read-only (mount_setattr, recursively), mounts a fresh tmpfs (mode 1777, `tmpfs_mb`) on /tmp,
   /var/tmp, /dev/shm and /run/lock (/var/lock points there), binds the run's own directories at
   their own paths (`binds`: read-write or read-only), and binds a generated /etc/passwd and
   /etc/group naming the run's uid (`user`), so getpwuid() works;
3. brings the new network namespace's loopback up (nothing else exists: no route out of it; the
   host's loopback is another namespace's) and names the host "sandbox";
4. forks the namespace's init (PID 1), which mounts a /proc of the new PID namespace, applies
   Landlock (execve only of the paths in `exec`: the toolchain the domain needs and the run's own
   directories) and the seccomp filter (`seccomp`: BPF built on the host by libseccomp, see
   `seccomp_filter`), and forks the candidate (PID 2), which returns from `enter` and goes on
   (drops to its uid, execs). Init waits for it, reaps orphans, and exits with it: the kernel
   then kills whatever else runs in the namespace.
The calling process stays outside the PID namespace (unshare cannot move it) and becomes a waiter:
it exits with the candidate's wait status (a signal as that signal), so its parent sees the
candidate's exit, and wait4's rusage (CPU time, peak memory) covers the candidate.

A failure before the candidate exists raises IsolationError in the caller (never a candidate's
verdict). What this kernel does not offer is found once by `probe()`; a spec names only what is
available, and the sandbox says what is missing (ProcessSandbox.isolation_missing).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import struct
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUSER, CLONE_NEWCGROUP = 0x20000000, 0x40000000, 0x10000000, 0x02000000
NAMESPACES = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added in Linux 5.12)
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH, LANDLOCK_ACCESS_FS_EXECUTE = 1, 1, 1
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock")  # fresh tmpfs each (symlinks: once)
HOSTNAME = b"sandbox"
EXTRA_TASKS = 2  # the waiter outside the PID namespace and its init, in the run's cgroup beside the candidate
EXIT_ISOLATION_FAILED = 121  # a waiter whose isolation failed after it forked (not reached normally)

# Denied with EPERM by the seccomp filter (where the kernel and this architecture have them): kernel
# keyrings, tracing and reading other processes, mounts and namespaces, loading code into the kernel,
# eBPF, perf events, userfaultfd, io_uring, kexec and other administration.
DENIED_SYSCALLS = (
    "keyctl", "add_key", "request_key",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount", "umount2", "pivot_root", "chroot", "unshare", "setns",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    "open_by_handle_at", "name_to_handle_at",
    "bpf", "perf_event_open", "userfaultfd", "fanotify_init",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "create_module",
    "reboot", "swapon", "swapoff", "syslog", "acct", "quotactl", "quotactl_fd", "lookup_dcookie",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "stime",
    "iopl", "ioperm", "vhangup", "nfsservctl", "uselib", "sysfs", "_sysctl",
)  # fmt: skip
PERSONALITY_QUERY = 0xFFFFFFFF  # personality(2) may only be read, never changed (ASLR off, say)


class IsolationError(RuntimeError):
    """The sandbox could not isolate a candidate (before any candidate code ran): ours to fix."""


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(number: int, *args) -> int:
    return int(_libc.syscall(ctypes.c_long(number), *args))


def _check(result: int, what: str) -> None:
    if result < 0:
        err = ctypes.get_errno()
        raise IsolationError(f"{what}: {os.strerror(err)} (errno {err})")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


class _MountAttr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]


def _all_read_only() -> None:
    """Every mount of this (new) mount namespace read-only and nosuid, recursively."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    size = ctypes.c_size_t(ctypes.sizeof(attr))
    _check(
        _syscall(SYS_MOUNT_SETATTR, ctypes.c_int(AT_FDCWD), b"/", ctypes.c_uint(AT_RECURSIVE), ctypes.byref(attr), size), "mount_setattr"
    )


def _loopback_up() -> None:
    """IFF_UP on `lo` (SIOCGIFFLAGS / SIOCSIFFLAGS): the namespace's own 127.0.0.1 works."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), 0x8913, ifreq))[1]
        fcntl.ioctl(s.fileno(), 0x8914, struct.pack("16sH14x", b"lo", flags | 0x1))


def _user_files(user: dict) -> dict[str, str]:
    """/etc/passwd and /etc/group: the host's entries plus one for the run's uid and gid."""
    uid, gid, home = int(user["uid"]), int(user["gid"]), str(user["home"])
    out = {}
    for path, line in (
        ("/etc/passwd", f"sandbox:x:{uid}:{gid}:discover sandbox:{home}:/usr/sbin/nologin\n"),
        ("/etc/group", f"sandbox:x:{gid}:\n"),
    ):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            text = ""
        if text and not text.endswith("\n"):
            text += "\n"
        out[path] = text + line
    return out


def _scratch_targets() -> list[str]:
    seen, targets = set(), []
    for path in SCRATCH:
        real = os.path.realpath(path)
        if real not in seen and os.path.isdir(real):
            seen.add(real)
            targets.append(real)
    return targets


def _set_up_mounts(spec: dict) -> None:
    """Steps 2 of the module docstring, in the caller's new mount namespace."""
    binds = [(os.path.realpath(p), bool(w)) for p, w in spec.get("binds", [])]
    cwd = os.getcwd()  # found again through the new mounts at the end (it may lie under a fresh tmpfs)
    handles = [os.open(p, os.O_PATH | os.O_CLOEXEC) for p, _ in binds]  # before tmpfs hides them
    try:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        _all_read_only()
        size = "size=%dm" % int(spec.get("tmpfs_mb", 64))
        scratch = _scratch_targets()
        for target in scratch:
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777," + size)
        if os.path.isdir("/dev/mqueue"):
            _mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        for (path, writable), fd in zip(binds, handles, strict=True):
            if any(path == t or path.startswith(t + "/") for t in scratch):  # hidden by a fresh tmpfs
                os.makedirs(path, exist_ok=True)  # root's, in the tmpfs; the bind mount covers it
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | (0 if writable else MS_RDONLY)
            _mount(None, path, None, flags)
        user = spec.get("user")
        if user is not None:
            staging = os.path.join(scratch[0], ".discover-etc") if scratch else None
            if staging is None:
                raise IsolationError("no tmpfs to hold the sandbox's /etc/passwd")
            os.mkdir(staging, 0o755)
            for path, text in _user_files(user).items():
                if not os.path.isfile(path):
                    continue
                source = os.path.join(staging, os.path.basename(path))
                with open(source, "w", encoding="utf-8") as f:
                    f.write(text)
                os.chmod(source, 0o644)
                _mount(source, path, None, MS_BIND)
                _mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
                os.unlink(source)  # the bind mount keeps the file
            os.rmdir(staging)
        os.chdir(cwd)
    finally:
        for fd in handles:
            os.close(fd)


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when there is none."""
    version = _syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, version)


def _restrict_exec(paths: list[str]) -> None:
    """Landlock: execve (and the ELF interpreter) only of files at or beneath `paths`."""
    handled = ctypes.c_uint64(LANDLOCK_ACCESS_FS_EXECUTE)
    ruleset = _syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(handled), ctypes.c_size_t(8), ctypes.c_uint32(0))
    _check(ruleset, "landlock_create_ruleset")
    try:
        for path in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # gone (a tool that is not installed)
            try:
                rule = _PathBeneath(LANDLOCK_ACCESS_FS_EXECUTE, fd)
                added = _syscall(
                    SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule), 0
                )
                _check(added, f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        _check(_syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install_seccomp(bpf: bytes) -> None:
    """Load a seccomp filter (raw BPF, 8 bytes an instruction) for this process and its children."""
    buffer = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(len(bpf) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")


def _confine(spec: dict) -> None:
    """no_new_privs, then Landlock and seccomp: inherited by everything the candidate starts."""
    if spec.get("exec") is not None or spec.get("seccomp"):
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if spec.get("exec") is not None:
        _restrict_exec(list(spec["exec"]))
    if spec.get("seccomp"):
        import base64

        _install_seccomp(base64.b64decode(spec["seccomp"]))


def _close_fds_but(keep: int) -> None:
    os.closerange(0, keep)
    os.closerange(keep + 1, 1 << 16)


def _mirror(status: int) -> None:
    """Exit as the wait status `status` says (a signal by that signal), from a waiter outside."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        _libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no core dump of this copy of our process
        try:
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(os.getpid(), sig)
        except (OSError, ValueError):
            pass
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else EXIT_ISOLATION_FAILED)


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except InterruptedError:
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def enter(spec: dict) -> None:
    """Isolate the calling process (module docstring); returns in the candidate (PID 2 of a new PID
    namespace) only. Raises IsolationError when isolation fails (nothing of the candidate ran)."""
    if not spec.get("namespaces"):
        try:
            _confine(spec)
        except OSError as err:
            raise IsolationError(str(err)) from None
        return
    _check(_libc.unshare(ctypes.c_int(NAMESPACES)), "unshare")
    try:
        _set_up_mounts(spec)
        _loopback_up()
    except OSError as err:  # a bind's path that is gone, no loopback device, ...
        raise IsolationError(f"setting up the namespaces: {err}") from None
    _check(_libc.sethostname(HOSTNAME, ctypes.c_size_t(len(HOSTNAME))), "sethostname")
    read_end, write_end = os.pipe()  # init -> us: "ok" (or why not), then the candidate's wait status
    init = os.fork()
    if init == 0:
        _init(spec, read_end, write_end)  # never returns in init; returns in the candidate
        return
    os.close(write_end)
    report = b""
    while not report.endswith(b"\n"):
        chunk = os.read(read_end, 1)
        if not chunk:
            break
        report += chunk
    if report != b"ok\n":
        os.close(read_end)
        os.waitpid(init, 0)
        raise IsolationError(report.decode("utf-8", "replace").strip() or "the namespace's init died")
    # From here on we are only the candidate's stand-in outside the PID namespace.
    _close_fds_but(read_end)
    status = _read_all(read_end)
    _, init_status = os.waitpid(init, 0)
    _mirror(int(status) if status.strip().isdigit() else init_status)


def _init(spec: dict, read_end: int, write_end: int) -> None:
    """PID 1 of the new namespace: /proc, Landlock, seccomp, then fork the candidate and wait."""
    os.close(read_end)
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        _confine(spec)
    except (IsolationError, OSError) as err:
        os.write(write_end, f"{err}\n".encode())
        os._exit(EXIT_ISOLATION_FAILED)
    candidate = os.fork()
    if candidate == 0:
        os.close(write_end)
        return
    os.write(write_end, b"ok\n")
    _close_fds_but(write_end)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(EXIT_ISOLATION_FAILED)
        except InterruptedError:
            continue
        if pid == candidate:
            os.write(write_end, b"%d" % status)
            os._exit(0)  # the kernel kills what is left in the namespace


# -- what the host prepares ----------------------------------------------------------------------

TOOLS = ("gcc", "g++", "cc", "c++", "cpp", "as", "ld", "ld.bfd", "ld.gold", "x86_64-linux-gnu-gcc", "x86_64-linux-gnu-g++")
TOOL_DIRS = ("/usr/lib/gcc", "/usr/libexec/gcc", "/usr/lib/gcc-cross")
# Inductor hashes its precompiled header with `openssl sha512` and may `objcopy` constants into objects
PYTHON_EXTRA_TOOLS = ("openssl", "objcopy")
ELF_INTERPRETERS = ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1", "/lib/ld-linux-x86-64.so.2")


def hidden_by_scratch(paths) -> list[str]:
    """Those of `paths` (directories that exist) that a fresh scratch tmpfs would hide (a virtual
    environment under /tmp, say): to be bound read-only at their own paths. A scratch directory
    itself (/tmp on the import path of a script started from /tmp) is never one: binding it would
    show the host's /tmp to the candidate in place of its own fresh, writable one."""
    tops = [os.path.realpath(t) for t in SCRATCH]
    found = set()
    for path in paths:
        real = os.path.realpath(path)
        if os.path.isdir(real) and any(real.startswith(t + "/") for t in tops):
            found.add(real)
    return sorted(found)


def loaders() -> list[str]:
    """The dynamic loaders (execve opens them with the program): needed by every dynamic binary."""
    return sorted({os.path.realpath(p) for p in ELF_INTERPRETERS if os.path.exists(p)})


def toolchain(path: str = "/usr/local/bin:/usr/bin:/bin") -> list[str]:
    """The C/C++ toolchain (compiler drivers, their cc1plus/collect2 directories, assembler, linker)."""
    found = {os.path.realpath(w) for w in (shutil.which(t, path=path) for t in TOOLS) if w}
    found |= {d for d in TOOL_DIRS if os.path.isdir(d)}
    return sorted(found)


def python_tools() -> list[str]:
    """What a Python candidate may execute besides its own files: this interpreter (multiprocessing
    re-executes it), /bin/sh, ldconfig (ctypes.util and Triton look libraries up with it), the C/C++
    toolchain (torch.compile builds C++ on the CPU; Triton builds its launchers), PYTHON_EXTRA_TOOLS
    and Triton's own binaries (ptxas), plus the dynamic loaders."""
    import importlib.util

    found = {os.path.realpath(sys.executable), os.path.realpath("/bin/sh")}
    for tool in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if os.path.exists(tool):
            found.add(os.path.realpath(tool))
    for tool in PYTHON_EXTRA_TOOLS:
        where = shutil.which(tool, path="/usr/local/bin:/usr/bin:/bin")
        if where:
            found.add(os.path.realpath(where))
    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        found |= {os.path.realpath(p) for p in spec.submodule_search_locations}
    return sorted(found | set(toolchain()) | set(loaders()))


def seccomp_filter() -> bytes:
    """The deny-list filter as raw BPF, built by libseccomp (pyseccomp): default allow; EPERM for
    DENIED_SYSCALLS, for personality() other than a query, and for clone() with namespace flags;
    ENOSYS for clone3; any foreign architecture (32-bit syscalls on a 64-bit kernel) is killed."""
    import tempfile

    import pyseccomp as seccomp

    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            f.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (RuntimeError, ValueError, OSError):
            continue  # not a system call of this architecture
    f.add_rule(seccomp.ERRNO(errno.EPERM), "personality", seccomp.Arg(0, seccomp.NE, PERSONALITY_QUERY))
    for flag in (CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUSER, CLONE_NEWCGROUP):
        f.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    # clone3's flags are in memory, out of a filter's sight: it answers ENOSYS and libc falls back to clone
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def probe(spec: dict) -> dict[str, str]:
    """What of `spec` fails here, {mechanism: why}, found by isolating a child that exits at once.
    Mechanisms: "namespaces" (with the mounts), "landlock", "seccomp"."""
    missing: dict[str, str] = {}
    trials = [("namespaces", {**spec, "exec": None, "seccomp": None})]
    trials += [("landlock", {"exec": spec.get("exec")}), ("seccomp", {"seccomp": spec.get("seccomp")})]
    for name, trial in trials:
        if name == "namespaces" and not trial.get("namespaces"):
            missing[name] = "not root" if os.geteuid() != 0 else "not asked for"
            continue
        if name == "landlock" and trial.get("exec") is not None and not landlock_abi():
            missing[name] = "the kernel has no Landlock"
            continue
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            try:
                enter(trial)
                os.write(write_end, b"ok")
            except BaseException as err:  # noqa: BLE001
                os.write(write_end, str(err).encode()[:500])
            os._exit(0)
        os.close(write_end)
        answer = _read_all(read_end).decode("utf-8", "replace")
        os.close(read_end)
        os.waitpid(pid, 0)
        if answer != "ok":
            missing[name] = answer or "the probe died"
    return missing


def _main() -> int:  # `python isolation.py '<spec JSON>'`: the probe, in a fresh single-threaded process
    print(json.dumps(probe(json.loads(sys.argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
