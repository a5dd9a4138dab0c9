"""What a candidate sees: the minimal file system of each kind of sandboxed process (docs/sandbox.md).

A `View` is an ordered list of mounts, built here and carried out by a tool: bubblewrap
(evaluators/sandbox/bwrap.py) or gVisor (evaluators/sandbox/gvisor.py). It starts from an empty
root and adds only what the process needs, at the paths it has on the host (shared libraries and
interpreters find each other by absolute paths), but for the packages, which show at SITE:
- a Python run (`python_view`): the interpreter and its standard library, the distributions its
  problem allows (`PACKAGES`, with what they depend on) at SITE and nothing else of site-packages, the
  system's shared libraries, /bin/sh; a GPU problem adds the C toolchain (torch.compile and Triton
  build code at run time) and the GPU's device nodes;
- the compiler of a compiled program (`compiler_view`): the toolchain and its headers;
- one case of a compiled program (`program_view`): the system's shared libraries, its binary
  (read-only) and its own empty directory.
Every view also gets fresh scratch filesystems (/tmp, /var/tmp, /dev/shm), a minimal /dev, its own
/proc, a generated /etc/passwd, /etc/group and /etc/hosts, and the launcher (confine.py, with the
interpreter it runs under, or for compiled programs confine.c) that sets its limits and seccomp
filter. Not there, whatever the host holds: this repository (its published records, testers,
held-out data), other site-packages, /home, /root, /run, /var, the host's /tmp and its sockets.
Data files that ship inside an allowed package and that a problem must keep from candidates
(scanpy's copy of the denoising dataset: `HIDDEN_SUFFIXES`) are replaced by empty files.
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata
import os
import re
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field

BOX = "/sandbox"  # the sandbox's own files: the launcher, the harness, the run's job (read-only)
WORK = "/sandbox/work"  # a Python run's working directory (a tmpfs of its own; its HOME)
DATA = "/sandbox/data"  # a problem's read-only data directory, when it has one
SITE = "/sandbox/site-packages"  # the problem's distributions (`add_packages`), wherever the host keeps them
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")  # a fresh tmpfs each, per run and per case
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"

# The distributions a Python candidate of each image may import (their dependencies come along):
# the same sets as the Docker images of images/<name>/ (bio: its requirements.in).
PACKAGES = {
    "python-math": ("numpy", "scipy"),
    "bio": ("numpy", "scipy", "scikit-learn", "pandas", "anndata", "scanpy", "graphtools", "scprep", "magic-impute"),
    "gpu": ("torch", "triton", "numpy"),
    "cpp20": (),  # compiled programs: no Python candidate
}
# Files inside allowed packages that no candidate may read: datasets a problem scores against
# (scanpy ships pbmc68k_reduced, from which denoising's held-out counts follow). The bio image
# deletes them (images/bio/Dockerfile); here they are shown empty.
HIDDEN_SUFFIXES = (".h5ad",)
TOOLCHAIN = ("gcc", "g++", "cc", "c++", "cpp", "as", "ld", "ld.bfd")
# Inductor hashes its precompiled header with `openssl`, may `objcopy` constants into objects, and
# ctypes and Triton find libraries with `ldconfig`
GPU_TOOLS = ("openssl", "objcopy", "ldconfig")
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/lib64")
TOOLCHAIN_DIRS = ("/usr/lib/gcc", "/usr/libexec/gcc", "/usr/include", "/usr/lib/bfd-plugins")
GPU_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
ETC_FILES = ("/etc/ld.so.cache",)
ELF_INTERPRETERS = ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1")  # the dynamic loaders, with their links


@dataclass(frozen=True)
class Mount:
    """One step of a view, in order. kind: "ro" / "rw" / "dev" (bind `source` at `target`),
    "tmpfs" (`size_mb`), "dir", "symlink" (`source` is the link's text), "file" (`source` is the
    content, read-only), "proc", "devfs", "mqueue"."""

    kind: str
    target: str
    source: str = ""
    size_mb: int = 0
    mode: int = 0o755


@dataclass
class View:
    """An ordered list of mounts on an empty root; `bound` maps each bound target to its source."""

    mounts: list[Mount] = field(default_factory=list)
    bound: dict[str, str] = field(default_factory=dict)
    made: set[str] = field(default_factory=lambda: {"/"})

    def _covered(self, path: str) -> str | None:
        """The bound directory `path` lies in (or is), if any."""
        probe = path
        while True:
            if probe in self.bound:
                return probe
            if probe == "/":
                return None
            probe = os.path.dirname(probe)

    def _parents(self, path: str) -> None:
        """Directories above `path` that nothing made yet, each 0755 (bubblewrap's own are 0700)."""
        missing = []
        parent = os.path.dirname(path)
        while parent not in self.made and self._covered(parent) is None:
            missing.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(missing):
            self.mounts.append(Mount("dir", directory))
            self.made.add(directory)

    def add(self, mount: Mount) -> None:
        self._parents(mount.target)
        self.mounts.append(mount)
        if mount.kind in ("ro", "rw", "dev"):
            self.bound[mount.target] = mount.source
        else:
            self.made.add(mount.target)

    def bind(self, source: str, target: str, writable: bool = False) -> None:
        self.add(Mount("rw" if writable else "ro", target, source))

    def expose(self, path: str) -> None:
        """`path` read-only at its own path, with every symbolic link on the way to it (so /lib64/x
        works where /lib64 is a link to usr/lib64). Nothing when it does not exist."""
        if not os.path.lexists(path):
            return
        for link, text in _links_on(os.path.abspath(path)):
            if link not in self.made and self._covered(link) is None:
                self.add(Mount("symlink", link, text))
        real = os.path.realpath(path)
        if not os.path.exists(real):
            return
        covered = self._covered(real)
        if covered is not None and os.path.realpath(self.bound[covered]) == os.path.realpath(covered):
            return  # already visible through a directory bound at its own path
        self.bind(real, real)

    def tmpfs(self, target: str, size_mb: int, mode: int = 0o1777) -> None:
        self.add(Mount("tmpfs", target, size_mb=int(size_mb), mode=mode))

    def file(self, target: str, text: str, mode: int = 0o644) -> None:
        self.add(Mount("file", target, text, mode=mode))

    def hide(self, target: str) -> None:
        """An empty, read-only file in place of `target` (a file inside a bound directory)."""
        self.mounts.append(Mount("file", target, "", mode=0o444))


def _links_on(path: str, depth: int = 0) -> list[tuple[str, str]]:
    """(link, its text) for each symbolic link met while resolving `path`, targets' links included."""
    if depth > 20:
        return []
    found: list[tuple[str, str]] = []
    current = "/"
    for part in [p for p in path.split("/") if p]:
        step = os.path.join(current, part)
        if os.path.islink(step):
            text = os.readlink(step)
            found.append((step, text))
            found += _links_on(os.path.join(current, text) if not text.startswith("/") else text, depth + 1)
            step = os.path.realpath(step)
        current = step
    return found


def base(tmpfs_mb: int, uid: int, gid: int, home: str) -> View:
    """What every view holds: /proc, a minimal /dev, scratch filesystems, /etc's generated files and
    the system's shared libraries with the dynamic loader; the launcher is added by the caller."""
    view = View()
    view.add(Mount("proc", "/proc"))
    view.add(Mount("devfs", "/dev"))
    view.add(Mount("mqueue", "/dev/mqueue"))
    for target in SCRATCH:
        view.tmpfs(target, tmpfs_mb)
    view.file("/etc/passwd", f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{gid}:discover sandbox:{home}:/usr/sbin/nologin\n")
    view.file("/etc/group", f"root:x:0:\nsandbox:x:{gid}:\n")
    view.file("/etc/hosts", "127.0.0.1 localhost sandbox\n::1 localhost\n")
    for path in (*ETC_FILES, *LIBRARY_DIRS, *ELF_INTERPRETERS):
        view.expose(path)
    view.expose("/sys/devices/system/cpu")  # CPU counts and caches (os.cpu_count, BLAS, torch)
    return view


def interpreter_paths() -> list[str]:
    """This Python: its executable, its shared library and its standard library (with
    lib-dynload), never the site-packages that sit beneath the standard library."""
    paths = {os.path.realpath(sys.executable)}
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    library = sysconfig.get_config_var("LDLIBRARY") or ""
    if libdir and library:
        for name in os.listdir(libdir) if os.path.isdir(libdir) else []:
            if name.startswith(library):
                paths.add(os.path.join(libdir, name))
    zipped, stdlib, _ = stdlib_path()  # lib-dynload lies in the standard library's directory
    paths.add(stdlib)
    if os.path.exists(zipped):
        paths.add(zipped)
    return sorted(paths)


def stdlib_path() -> list[str]:
    """The standard library's part of a candidate's import path (zip, directory, lib-dynload)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    zipped = os.path.join(os.path.dirname(stdlib), f"python{sys.version_info[0]}{sys.version_info[1]}.zip")
    return [zipped, stdlib, os.path.join(stdlib, "lib-dynload")]


def stdlib_site_packages() -> list[str]:
    """Site-packages directories inside the standard library's tree (hidden in every view)."""
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    found = []
    for name in ("site-packages", "dist-packages"):
        path = os.path.join(stdlib, name)
        if os.path.isdir(path):
            found.append(path)
    return found


def add_interpreter(view: View) -> None:
    for path in interpreter_paths():
        view.expose(path)
    for path in stdlib_site_packages():
        view.tmpfs(path, 1, 0o755)
    view.expose("/bin/sh")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def distribution_closure(names: tuple[str, ...]) -> tuple[metadata.Distribution, ...]:
    """The installed distributions `names` and what they require (unconditional requirements, and
    those whose markers hold here without extras), each once. A name that is not installed is
    left out: the candidate's import fails as it would in the problem's image without it."""
    from packaging.requirements import InvalidRequirement, Requirement

    seen: dict[str, metadata.Distribution] = {}
    todo = [_canonical(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = dist
        for text in dist.requires or []:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            todo.append(_canonical(req.name))
    return tuple(seen[k] for k in sorted(seen))


@functools.cache
def package_entries(names: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(site-packages entries to show, files in them to hide) for distributions `names` and their
    closure: each distribution's top-level files and directories (from its RECORD), its .dist-info
    and its .libs directories, by absolute path."""
    entries: set[str] = set()
    hidden: set[str] = set()
    for dist in distribution_closure(names):
        root = os.path.realpath(str(dist.locate_file("")))
        for file in dist.files or []:
            parts = file.parts
            if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith(".pth"):
                continue
            top = os.path.join(root, parts[0])
            if os.path.exists(top):
                entries.add(top)
            if str(file).endswith(HIDDEN_SUFFIXES):
                hidden.add(os.path.join(root, *parts))
        dist_info = getattr(dist, "_path", None)
        if dist_info is not None:
            entries.add(os.path.realpath(str(dist_info)))
    return tuple(sorted(entries)), tuple(sorted(h for h in hidden if os.path.isfile(h)))


def site_directories(entries: tuple[str, ...]) -> list[str]:
    """The host's site-packages directories the entries live in."""
    return sorted({os.path.dirname(e) for e in entries})


def site_target(index: int) -> str:
    """Where the `index`-th site-packages directory of the host shows in a view: under SITE, never at
    its host path, which would tell a candidate where the host keeps its environment (a virtual
    environment inside the checkout names the checkout, a user's home names the user)."""
    return SITE if index == 0 else f"{SITE}-{index + 1}"


def add_packages(view: View, image: str) -> list[str]:
    """The image's distributions in otherwise empty site-packages directories at SITE (and SITE-2,
    ... when they come from several of the host's); returns those directories (the candidate's import
    path after the standard library). A distribution's entries keep their names and their places
    beside each other, so what a package finds relative to its own files (shared libraries by
    `$ORIGIN`, data by `__file__`) it still finds."""
    entries, hidden = package_entries(PACKAGES.get(image, ()))
    sites = {host: site_target(i) for i, host in enumerate(site_directories(entries))}
    for target in sites.values():
        view.tmpfs(target, 1, 0o755)
    for entry in entries:
        view.bind(entry, os.path.join(sites[os.path.dirname(entry)], os.path.basename(entry)))
    for path in hidden:
        host = next(h for h in sites if path.startswith(h + os.sep))
        view.hide(os.path.join(sites[host], os.path.relpath(path, host)))
    return list(sites.values())


def toolchain_paths(path: str = SYSTEM_PATH) -> list[str]:
    """The C/C++ compiler drivers, assembler and linker (as the PATH finds them) and their
    directories (cc1plus, collect2, the headers, the LTO plugin)."""
    found = [shutil.which(tool, path=path) for tool in TOOLCHAIN]
    return sorted({p for p in found if p} | {d for d in TOOLCHAIN_DIRS if os.path.isdir(d)})


def add_toolchain(view: View) -> None:
    for path in toolchain_paths():
        view.expose(path)
    include = sysconfig.get_paths().get("include")  # Python.h: Triton's launcher, Inductor's C++
    if include:
        view.expose(include)


def python_view(
    image: str, tmpfs_mb: int, uid: int, gid: int, data_dir: str | None, gpu_devices: tuple[str, ...] = ()
) -> tuple[View, list[str]]:
    """The view of a Python run of `image`'s problems and its import path (after the standard
    library): a fresh tmpfs at WORK (its working directory: nothing of it reaches the host's disk,
    and what it writes there counts against its memory), `data_dir` read-only at DATA; a "gpu"
    image adds the toolchain, GPU_TOOLS and `gpu_devices` (/dev/nvidiaN)."""
    view = base(tmpfs_mb, uid, gid, WORK)
    add_interpreter(view)
    sites = add_packages(view, image)
    if image == "gpu":
        add_toolchain(view)
        for tool in GPU_TOOLS:
            where = shutil.which(tool, path=SYSTEM_PATH + ":/usr/sbin:/sbin")
            if where:
                view.expose(where)
        for device in (*GPU_DEVICES, *gpu_devices):
            if os.path.exists(device):
                view.add(Mount("dev", device, device))
        if gpu_devices:
            view.expose("/sys")  # the driver's and the PCI devices' description, read by CUDA
    view.tmpfs(WORK, tmpfs_mb)
    if data_dir is not None:
        view.bind(data_dir, DATA)
    return view, sites


def compiler_view(build: str, uid: int, gid: int, tmpfs_mb: int, interpreter: bool = True) -> View:
    """The compiler's view: the toolchain, the standard library's headers, its build directory
    read-write at its own path; the interpreter when the launcher is confine.py (`interpreter`),
    not for the C launcher."""
    view = base(tmpfs_mb, uid, gid, build)
    add_toolchain(view)
    if interpreter:
        add_interpreter(view)
    view.bind(build, build, writable=True)
    return view


def program_view(binary_dir: str, case_dir: str, uid: int, gid: int, tmpfs_mb: int, interpreter: bool = True) -> View:
    """One case's view: its binary's directory read-only, a fresh tmpfs at `case_dir` (its cwd:
    nothing it writes reaches the host's disk, and it counts against the case's memory); the
    interpreter when the launcher is confine.py (`interpreter`), not for the C launcher."""
    view = base(tmpfs_mb, uid, gid, case_dir)
    if interpreter:
        add_interpreter(view)
    view.bind(binary_dir, binary_dir)
    view.tmpfs(case_dir, tmpfs_mb)
    return view


def nvidia_devices(visible: str | None) -> tuple[str, ...]:
    """The /dev/nvidiaN nodes a run that sees GPU `visible` (an index; None: all) needs."""
    nodes = sorted(p for p in (os.path.join("/dev", n) for n in os.listdir("/dev")) if re.fullmatch(r"/dev/nvidia\d+", p))
    if visible is None or visible == "":
        return tuple(nodes)
    if visible.isdigit():
        node = f"/dev/nvidia{visible}"
        return (node,) if node in nodes else ()
    return tuple(nodes)  # a UUID: CUDA_VISIBLE_DEVICES picks it among all nodes
