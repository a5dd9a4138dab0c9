"""The GPUs of this machine and which evaluation holds which: one GPU per concurrent run.

Found without creating a CUDA context in this process (a Prefect worker need not touch a GPU):
`nvidia-smi` (index, UUID, model, total memory, driver version), else the NVIDIA driver's /proc
entries (index, UUID, model and the driver version; no memory). DISCOVER_GPUS (comma-separated indices)
restricts the set, as does CUDA_VISIBLE_DEVICES (indices or UUIDs). `GPU_LEASES.lease()` hands
out one free GPU at a time and blocks while all are held, so two candidates are never timed on the
same GPU at once, even from different processes on the machine (Prefect starts one per flow run):
a lease is an exclusive flock on the GPU's lock file in DISCOVER_GPU_LOCKS (default
~/.cache/ttt-discover/gpu-locks), which the kernel releases if the holder dies. The pool-wide count
of GPUs in use is Prefect's concurrency limit (flows/tasks.py).

A GPU pool declares the model its machines hold in DISCOVER_GPU_TYPE (prefect.yaml); a timing
counts only on a GPU whose model contains the declared type (`is_declared_type`, the one rule the
kernels and re-evaluation both apply).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

SELECT_ENV = "DISCOVER_GPUS"
LOCKS_ENV = "DISCOVER_GPU_LOCKS"
GPU_TYPE_ENV = "DISCOVER_GPU_TYPE"  # a GPU pool's declared GPU model, e.g. H100 (prefect.yaml job variables)
NVIDIA_SMI_QUERY = "--query-gpu=index,uuid,name,memory.total,driver_version"


def lock_dir() -> Path:
    return Path(os.environ.get(LOCKS_ENV) or Path.home() / ".cache" / "ttt-discover" / "gpu-locks")


@dataclass(frozen=True)
class Gpu:
    """One GPU as the device reports it."""

    index: str  # the driver's index, what a device request and CUDA_VISIBLE_DEVICES take
    name: str  # the model, e.g. "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    memory_mib: int = 0  # total memory in MiB; 0 when not reported (the /proc fallback)
    driver: str = ""  # the NVIDIA driver's version, e.g. "550.54.15"; "" when not reported

    def describe(self) -> str:
        """The model, its total memory and the driver, e.g. "NVIDIA H100 80GB HBM3, 81559 MiB, driver 550.54.15"."""
        memory = f"{self.memory_mib} MiB" if self.memory_mib else "memory not reported"
        return f"{self.name}, {memory}, driver {self.driver or 'not reported'}"


def is_declared_type(declared: str, device_name: str) -> bool:
    """Whether a GPU named `device_name` is of the `declared` type: the type occurs in the name,
    case-insensitively ("H100" in "NVIDIA H100 80GB HBM3")."""
    return declared.strip().lower() in device_name.lower()


def wrong_gpu_reason(declared: str, gpus: Sequence[Gpu], declared_by: str) -> str:
    """'' when every GPU of `gpus` is of the `declared` type, else one sentence naming what was
    declared (and where: `declared_by`), what was found and the fix."""
    found = sorted({g.name for g in gpus if not is_declared_type(declared, g.name)})
    if not found:
        return ""
    return (
        f"the GPU here is {' and '.join(found)}, but {declared} is declared ({declared_by}); nothing was timed: "
        f"run on a {declared} or correct the declaration"
    )


def declared_gpu_type() -> str | None:
    """The GPU model this machine's pool declares (DISCOVER_GPU_TYPE), or None when it declares none."""
    return (os.environ.get(GPU_TYPE_ENV) or "").strip() or None


def _nvidia_smi_csv() -> str | None:
    """nvidia-smi's answer to NVIDIA_SMI_QUERY, one GPU a line; None without nvidia-smi, "" when it fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        done = subprocess.run([exe, NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else ""


def _parse_nvidia_smi(text: str) -> list[Gpu]:
    """GPUs from lines of `index, uuid, name, memory.total (MiB), driver_version` (a name may hold commas)."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        memory = parts[-2]
        gpus.append(Gpu(parts[0], ", ".join(parts[2:-2]), parts[1], int(memory) if memory.isdigit() else 0, parts[-1]))
    return gpus


def _from_nvidia_smi() -> list[Gpu] | None:
    text = _nvidia_smi_csv()
    return None if text is None else _parse_nvidia_smi(text)


def _proc_driver_version(version_file: Path) -> str:
    """The driver's version from /proc/driver/nvidia/version ("NVRM version: ... Kernel Module  550.54.15  ...")."""
    try:
        text = version_file.read_text()
    except OSError:
        return ""
    found = re.search(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s", text + " ")
    return found.group(1) if found else ""


def _from_proc(root: Path = Path("/proc/driver/nvidia/gpus")) -> list[Gpu]:
    gpus: list[Gpu] = []
    if not root.is_dir():
        return gpus
    driver = _proc_driver_version(root.parent / "version")
    for entry in sorted(root.iterdir()):
        try:
            fields = dict(line.split(":", 1) for line in (entry / "information").read_text().splitlines() if ":" in line)
        except OSError:
            continue
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        minor = fields.get("Device Minor", str(len(gpus)))
        gpus.append(Gpu(minor, fields.get("Model", "NVIDIA GPU"), fields.get("GPU UUID", ""), driver=driver))
    return sorted(gpus, key=lambda g: int(g.index) if g.index.isdigit() else 0)


def _selected(gpus: list[Gpu]) -> list[Gpu]:
    for var in (SELECT_ENV, "CUDA_VISIBLE_DEVICES"):
        value = os.environ.get(var)
        if value is None:
            continue
        wanted = [v.strip() for v in value.split(",") if v.strip()]
        gpus = [g for g in gpus if g.index in wanted or (g.uuid and g.uuid in wanted)]
    return gpus


@lru_cache(maxsize=1)
def local_gpus() -> tuple[Gpu, ...]:
    """The GPUs this process may hand out (cached for the life of the process)."""
    found = _from_nvidia_smi()
    if found is None:
        found = _from_proc()
    return tuple(_selected(found))


class GpuLeases:
    """Hands out the local GPUs one run at a time, across processes; `lease()` blocks while all are held."""

    def __init__(self, gpus: tuple[Gpu, ...] | None = None, locks: Path | None = None):
        self._gpus = gpus
        self._locks = locks
        self._busy: set[str] = set()
        self._cond = threading.Condition()

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        return local_gpus() if self._gpus is None else self._gpus

    def _try_lock(self, gpu: Gpu) -> int | None:
        """An open descriptor holding the GPU's lock file exclusively, or None if another holds it."""
        folder = self._locks or lock_dir()
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / f"gpu-{gpu.uuid or gpu.index}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            os.close(fd)
            return None

    @contextmanager
    def lease(self) -> Iterator[Gpu]:
        if not self.gpus:
            raise RuntimeError("no GPU on this machine (nvidia-smi finds none)")
        with self._cond:
            while True:
                held = None
                for g in self.gpus:
                    if g.index not in self._busy:
                        fd = self._try_lock(g)
                        if fd is not None:
                            held = (g, fd)
                            break
                if held:
                    gpu, fd = held
                    self._busy.add(gpu.index)
                    break
                self._cond.wait(timeout=0.5)  # another process's release notifies nobody here
        try:
            yield gpu
        finally:
            with self._cond:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                self._busy.discard(gpu.index)
                self._cond.notify_all()


GPU_LEASES = GpuLeases()
