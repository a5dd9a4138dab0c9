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
