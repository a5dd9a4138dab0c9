"""Bubblewrap (`bwrap`, Flatpak's sandbox; Debian's package `bubblewrap`) carries out a View.

`command(view, ...)` is the bwrap command line and the descriptors it reads its generated files
from. Every sandbox gets new mount, PID, network (a loopback and nothing else), IPC, UTS and, where
the kernel has it, cgroup namespaces, `--die-with-parent` (the sandbox dies with the process that
started it) and `--new-session` (no terminal to inject into). Started by root, bwrap makes no user
namespace and hands the launcher only CAP_SETUID and CAP_SETGID, which it gives up as it drops to the
run's uid (confine.py): the candidate is an unprivileged uid of the host, not root in a namespace.
Started by a normal user, bwrap makes a user namespace (unprivileged user namespaces must be
enabled) that maps only that user, and no further one can be made inside.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from evaluators.sandbox.view import ELF_INTERPRETERS, LIBRARY_DIRS, SYSTEM_PATH, View

TASKS = 2  # bubblewrap's own processes beside the sandboxed one (its monitor, the PID namespace's init): room in a cgroup's task limit
BWRAP_ENV = "DISCOVER_BWRAP"  # a bwrap binary to use instead of the one on PATH
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"


def executable() -> str | None:
    """The bwrap binary: $DISCOVER_BWRAP, else the first on PATH or in /usr/bin."""
    configured = os.environ.get(BWRAP_ENV)
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("bwrap") or shutil.which("bwrap", path=SYSTEM_PATH)


def _memfd(text: str) -> int:
    fd = os.memfd_create("sandbox-file", 0)
    os.write(fd, text.encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def command(view: View, chdir: str, root: bool | None = None) -> tuple[list[str], list[int]]:
    """(bwrap's argv up to and including "--", descriptors to pass to it and close after the start).

    `root`: whether bwrap starts as root (default: whether we are root)."""
    binary = executable()
    if binary is None:
        raise FileNotFoundError(f"bubblewrap (bwrap) is not installed: {INSTALL_HINT}")
    root = os.geteuid() == 0 if root is None else root
    argv = [binary, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if root:
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--disable-userns"]
    argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    fds: list[int] = []
    for m in view.mounts:
        if m.kind in ("ro", "rw", "dev"):
            option = {"ro": "--ro-bind", "rw": "--bind", "dev": "--dev-bind"}[m.kind]
            argv += [option, m.source, m.target]
        elif m.kind == "tmpfs":
            argv += ["--perms", f"{m.mode:04o}", "--size", str(max(1, m.size_mb) << 20), "--tmpfs", m.target]
        elif m.kind == "dir":
            argv += ["--perms", f"{m.mode:04o}", "--dir", m.target]
        elif m.kind == "symlink":
            argv += ["--symlink", m.source, m.target]
        elif m.kind == "file":
            fd = _memfd(m.source)
            fds.append(fd)
            argv += ["--perms", f"{m.mode:04o}", "--ro-bind-data", str(fd), m.target]
        elif m.kind == "proc":
            argv += ["--proc", m.target]
        elif m.kind == "devfs":
            argv += ["--dev", m.target]
        elif m.kind == "mqueue":
            argv += ["--mqueue", m.target]
        else:
            raise ValueError(f"unknown mount kind {m.kind!r}")
    # The root bwrap builds the view on is a tmpfs of its own, unbounded and, for a normal user's
    # bwrap (a user namespace mapping that user), the candidate's to write: read-only once the view
    # is in place, so a candidate writes only in the view's sized scratch filesystems and binds.
    argv += ["--remount-ro", "/", "--chdir", chdir, "--"]
    return argv, fds


def problem() -> str:
    """Why bubblewrap cannot set up a sandbox here ("" when it can): tried once with /bin/true."""
    binary = executable()
    if binary is None:
        return f"bubblewrap (bwrap) is not installed: {INSTALL_HINT}"
    view = View()
    view.expose("/usr/bin/true")
    for path in (*LIBRARY_DIRS, *ELF_INTERPRETERS):
        view.expose(path)
    argv, fds = command(view, "/")
    try:
        done = subprocess.run([*argv, "/usr/bin/true"], capture_output=True, text=True, timeout=60, pass_fds=fds, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        return f"bubblewrap could not start: {err}"
    finally:
        for fd in fds:
            os.close(fd)
    if done.returncode == 0:
        return ""
    why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    if os.geteuid() != 0:
        why += f" (as a normal user bwrap needs unprivileged user namespaces: {userns_knob()})"
    return f"bubblewrap cannot set up a sandbox here: {why}"


def userns_knob(proc_sys: str = "/proc/sys") -> str:
    """The setting that allows a normal user's user namespaces on this kernel, named as sysctl takes it."""
    fixes = []
    for path, name, allowed in (
        ("kernel/unprivileged_userns_clone", "kernel.unprivileged_userns_clone", "1"),  # Debian's and Ubuntu's older kernels
        ("user/max_user_namespaces", "user.max_user_namespaces", "15000"),  # every kernel: 0 refuses them
        ("kernel/apparmor_restrict_unprivileged_userns", "kernel.apparmor_restrict_unprivileged_userns", "0"),  # Ubuntu 24.04+
    ):
        try:
            with open(os.path.join(proc_sys, path)) as f:
                value = f.read().strip()
        except OSError:
            continue  # not on this kernel
        if (name == "user.max_user_namespaces" and value == "0") or (name != "user.max_user_namespaces" and value != allowed):
            fixes.append(f"sysctl -w {name}={allowed} (it is {value})")
    if not fixes:
        return "they look allowed here (user.max_user_namespaces > 0); a security module (AppArmor, SELinux) or a container may refuse them"
    return "; ".join(fixes) + (", or an AppArmor profile that allows them for bwrap" if any("apparmor" in f for f in fixes) else "")
