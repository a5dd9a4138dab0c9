"""The documentation a user relies on: a short README that starts with the two set-up commands, and
links between README.md and docs/ that lead somewhere (the file exists and, for `#anchor` links, so
does the heading). Reads files only: no network, no flow."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`+[^`\n]*`+")
# [text](target) and ![alt](target); the target may carry a title after a space
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = ("http://", "https://", "mailto:")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(CODE_SPAN.sub("", line))
    return lines


def _links(page: Path) -> list[str]:
    return [m.group(1) for line in _prose_lines(page.read_text(encoding="utf-8")) for m in LINK.finditer(line)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text without Markdown, lowercased, every character that
    is not a letter, a digit, '-', '_' or a space dropped, spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts by its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub gives the headings of `page` (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose_lines(page.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2).replace("`", ""))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines; move detail into docs/"
    head = "\n".join(lines[:40])
    assert "make demo" in head and "make test" in head


def test_slugs_follow_githubs_rules() -> None:
    assert slug("Evaluation on a cluster") == "evaluation-on-a-cluster"
    assert slug("The paper's ablations on the toy problem") == "the-papers-ablations-on-the-toy-problem"
    assert slug("§3. Reuse: PUCT over the archive") == "3-reuse-puct-over-the-archive"
    assert slug("evaluation: — Where candidates are evaluated") == "evaluation--where-candidates-are-evaluated"
    assert slug("Mathematics: Erdős, circle packing") == "mathematics-erdős-circle-packing"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(page: Path) -> None:
    broken = []
    for target in _links(page):
        if target.startswith(EXTERNAL):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_pages_link_to_each_other() -> None:
    """Every page of docs/ is reachable from the README, directly or through another page."""
    reached, todo = {README.resolve()}, [README]
    while todo:
        page = todo.pop()
        for target in _links(page):
            path = target.partition("#")[0]
            if not path or target.startswith(EXTERNAL):
                continue
            dest = (page.parent / path).resolve()
            if dest.suffix == ".md" and dest.is_file() and dest not in reached:
                reached.add(dest)
                todo.append(dest)
    unreached = [str(p.relative_to(ROOT)) for p in PAGES if p.resolve() not in reached]
    assert not unreached, f"pages no link leads to: {unreached}"
