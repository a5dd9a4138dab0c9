"""Durable atomic writes, the only ones in the project: every file and folder of a run appears whole or
not at all, and once written survives a power cut (docs/architecture.md, "Retry, cache, resume").

Each writer puts its data under a temporary name in the destination's folder, flushes it to disk
(fsync of the file, or of every file and folder of a folder), renames it over the destination and
flushes the folder that holds the name, so the rename itself is on disk when the call returns."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# tempfile creates private files (0600) and folders (0700); a run directory on shared storage must
# stay readable by the workers, the report viewer and the re-evaluation of other users.
FILE_MODE, DIR_MODE = 0o644, 0o755


class DiskFull(OSError):
    """A run's file could not be written for want of space (ENOSPC, or EDQUOT: a quota): the message
    is one line naming the directory, what was being written, the free space and the fix. Not an
    infrastructure failure to retry at once: nothing changes until space is freed."""

    def __str__(self) -> str:
        return str(self.strerror)


def _full(err: BaseException) -> bool:
    return isinstance(err, OSError) and (err.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(err))


def free_bytes(path: Path) -> int | None:
    """Bytes free to us on the file system holding `path` (its nearest existing folder)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_full(err: BaseException, path: Path) -> DiskFull:
    """The one-line DiskFull for `err`, raised while writing `path`."""
    path = Path(path)
    free = free_bytes(path.parent)
    room = "unknown" if free is None else f"{free / 2**20:.1f} MiB"
    return DiskFull(
        errno.ENOSPC,
        f"no space left in {path.parent} while writing {path.name} ({room} free there); free some space "
        "(or move the run directory), then resume the run: `discover resume RUN_DIR`",
    )


@contextmanager
def _space_checked(path: Path) -> Iterator[None]:
    """Turn running out of space while writing `path` into DiskFull (module docstring)."""
    try:
        yield
    except DiskFull:
        raise
    except OSError as err:
        if _full(err):
            raise disk_full(err, path) from None
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary name in the same folder, fsync, then rename over `path`."""
    path = Path(path)
    with _space_checked(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, FILE_MODE)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_dir(path.parent)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=True) + "\n")


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` for a writer that wants a filename; rename on success."""
    path = Path(path)
    with _space_checked(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, FILE_MODE)
        os.close(fd)
        try:
            yield Path(tmp)
            fsync_tree(Path(tmp))
            os.replace(tmp, path)
            fsync_dir(path.parent)
        finally:
            Path(tmp).unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; on success it replaces `path` whole."""
    path = Path(path)
    with _space_checked(path):
        with _atomic_dir(path) as tmp:
            yield tmp


@contextmanager
def _atomic_dir(path: Path) -> Iterator[Path]:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp.chmod(DIR_MODE)
    try:
        yield tmp
        tmp.chmod(DIR_MODE)  # a writer that replaced the folder's contents (copytree) may have changed it
        fsync_tree(tmp)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            fsync_dir(path.parent)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
            fsync_dir(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def atomic_dir_once(path: Path) -> Iterator[Path]:
    """`atomic_dir` for a folder that several processes may build at once and that never changes once
    built (a cache): the first one renamed into place stays, a later one is discarded."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        tmp.chmod(DIR_MODE)
        fsync_tree(tmp)
        try:
            os.rename(tmp, path)  # refused when another process's folder is there already
        except OSError:
            if not path.is_dir():
                raise
        fsync_dir(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fsync_tree(path: Path) -> None:
    """Flush a file, or every file and folder below a folder (the folder included), to disk."""
    path = Path(path)
    if path.is_file():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        return
    for folder, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(folder))


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (names created, renamed or removed in it) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def content_hash(path: Path) -> str:
    """sha256 of a file, or of every file in a folder (names and contents, in sorted order)."""
    path = Path(path)
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        if path.is_dir():
            h.update(str(f.relative_to(path)).encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
