"""Atomic writes: whole files or none, readable by the other users of a shared run directory."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from storage.atomic import atomic_dir, atomic_path, atomic_write_json, atomic_write_text, content_hash


def test_written_files_and_folders_are_readable_by_others(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "a.txt", "x")
    with atomic_path(tmp_path / "b.bin") as tmp:
        tmp.write_bytes(b"y")
    with atomic_dir(tmp_path / "d") as tmp:
        (tmp / "f").write_text("z")
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.bin").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    atomic_write_json(target, {"step": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert target.read_text().strip().startswith("{") and '"step": 1' in target.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_atomic_dir_replaces_a_folder_whole_and_hashes_its_content(tmp_path: Path) -> None:
    for value in ("1", "2"):
        with atomic_dir(tmp_path / "ckpt") as tmp:
            (tmp / "weights").write_text(value)
    assert (tmp_path / "ckpt" / "weights").read_text() == "2"
    before = content_hash(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "weights").write_text("3")
    assert content_hash(tmp_path / "ckpt") != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_writes_are_flushed_to_disk_files_folders_and_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import storage.atomic as atomic

    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    with atomic_dir(tmp_path / "adapter") as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "weights").write_text("w")
        (tmp / "config.json").write_text("{}")
    names = {Path(p).name for p in synced}
    assert {"weights", "config.json", "sub"} <= names  # the files and the folders inside it, before the rename
    assert str(tmp_path) in synced  # and the folder whose entry the rename changed, after it
    synced.clear()
    with atomic_path(tmp_path / "optimizer.pt") as tmp:
        tmp.write_bytes(b"adam")
    assert any(p.startswith(str(tmp_path / ".optimizer.pt.")) for p in synced) and str(tmp_path) in synced


# Renames outside storage/atomic.py, each with why it cannot use it; anything else must.
NOT_THROUGH_ATOMIC = {
    "evaluators/sandbox/harness.py": "runs inside the sandbox, where the project is not importable",
    "evaluators/bio/denoising/driver.py": "runs inside the sandbox, where the project is not importable",
    "benchmarks/gpu_check.py": "runs on a lent GPU machine from the standard library alone",
    "benchmarks/rehearsal_site/sitecustomize.py": "runs at every rehearsed process's start, before the project is importable",
    "images/build.py": "a build cache's tarball, outside any run",
    "evaluators/sandbox/compiled_launcher.py": "the C launcher, built by the compiler beside its cache entry and renamed, outside any run",
}


def test_every_atomic_write_of_the_project_goes_through_storage_atomic() -> None:
    import re

    root = Path(__file__).resolve().parents[1]
    found = set()
    for package in ("cli", "flows", "discover", "evaluators", "storage", "benchmarks", "images"):
        for path in (root / package).rglob("*.py"):
            rel = str(path.relative_to(root))
            if rel != "storage/atomic.py" and re.search(r"os\.replace\(|os\.rename\(|\.rename\(|mkstemp\(", path.read_text()):
                found.add(rel)
    assert found == set(NOT_THROUGH_ATOMIC), f"use storage/atomic.py in {sorted(found - set(NOT_THROUGH_ATOMIC))}"
