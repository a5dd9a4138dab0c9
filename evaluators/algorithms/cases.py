"""The contests' public inputs, vendored in data/ as the tar.gz files they were published in, and
the `cases` option that picks some of them ("0-9", "0,5,7-9", a list of numbers, or all 150).

The archives hold `<contest>_<seed:06d>_input.txt` for seeds 0..149 (data/README.md says where they
come from); they are read once per process and kept in memory as text.
"""

from __future__ import annotations

import functools
import re
import tarfile
from collections.abc import Iterable
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
_MEMBER = re.compile(r"(?:.*/)?(ahc\d+)_(\d{6})_input\.txt")


def archive_path(contest: str) -> Path:
    return DATA / f"{contest}_public_inputs_seed0-149.tar.gz"


@functools.cache
def public_inputs(contest: str) -> dict[int, str]:
    """Seed -> input text of a contest's vendored public cases."""
    path = archive_path(contest)
    if not path.is_file():
        raise FileNotFoundError(f"the public inputs of {contest} are missing: expected {path}")
    inputs = {}
    with tarfile.open(path, "r:gz") as tar:
        for member in tar:
            m = _MEMBER.fullmatch(member.name)
            if member.isfile() and m and m.group(1) == contest:
                inputs[int(m.group(2))] = tar.extractfile(member).read().decode("ascii")
    if not inputs:
        raise ValueError(f"{path} holds no {contest}_NNNNNN_input.txt file")
    return dict(sorted(inputs.items()))


def select_cases(spec: str | int | Iterable[int] | None, available: Iterable[int]) -> list[int]:
    """The case numbers named by `spec` ("0-9", "3,5,10-12", 7, [1, 2]); None means all.

    ValueError names the bad part and the cases there are.
    """
    have = sorted(available)
    if spec is None:
        return have
    wanted: list[int] = []
    if isinstance(spec, int):
        wanted = [spec]
    elif isinstance(spec, str):
        for part in (p.strip() for p in spec.split(",")):
            m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
            if not m:
                raise ValueError(f"cases: {part!r} is neither a number nor a range like 0-9")
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            if hi < lo:
                raise ValueError(f"cases: the range {part!r} is empty")
            wanted.extend(range(lo, hi + 1))
    else:
        wanted = [int(c) for c in spec]
    missing = sorted(set(wanted) - set(have))
    if missing:
        raise ValueError(f"cases: no case {missing[0]}; the cases are {have[0]}-{have[-1]}")
    if not wanted:
        raise ValueError("cases: the selection is empty")
    return sorted(set(wanted))
