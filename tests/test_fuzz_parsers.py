"""benchmarks/fuzz_parsers.py in small: every target fuzzed for under a second (a few inputs per function,
no shrinking), its linearity probes at a small size, and the report written. Takes 10-20 s on 2 cores.

A failure outside KNOWN fails the test. KNOWN holds the functions where the benchmark found a real bug
that is not fixed yet (the input is in the benchmark's report); when one is fixed, its line goes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fuzz_parsers  # noqa: E402

# (target, function) -> the exceptions of a bug found there (None: any) and not fixed yet; empty: every
# bug the benchmark found is fixed (tests/test_untrusted_parsers.py holds their minimal inputs)
KNOWN: dict[tuple[str, str], set[str] | None] = {}


def _known(target: str, function: str, error: str) -> bool:
    if (target, function) not in KNOWN:
        return False
    errors = KNOWN[(target, function)]
    return errors is None or error in errors


def test_every_target_runs_and_reports_no_new_failure(tmp_path: Path) -> None:
    doc = fuzz_parsers.run_benchmark(
        seconds_per_target=0.25, examples=10, probe_scale=0.02, shrink=False, storage=tmp_path / "hypothesis", log=lambda line: None
    )
    out = tmp_path / "out"
    fuzz_parsers.report(doc, out)

    assert {p.name for p in out.iterdir()} == {"fuzz_parsers.json", "fuzz_parsers.md"}
    written = json.loads((out / "fuzz_parsers.json").read_text())
    assert list(written["targets"]) == list(fuzz_parsers.TARGETS)
    assert "## atcoder" in (out / "fuzz_parsers.md").read_text()
    for name, target in written["targets"].items():
        assert set(target["inputs_by_function"]) == set(target["functions"]), name  # every function was called
        assert all(p["seconds_n"] >= 0 and p["ratio"] > 0 for p in target["linearity"]), name
    new = [
        f"{name}: {f['case']}: {f['type']} at {f['where']}: {f['message']} on {f['input']}"
        for name, target in written["targets"].items()
        for f in target["failures"]["distinct"]
        if not _known(name, f["case"], f["type"])
    ]
    assert not new, "\n".join(new)
    assert written["targets"]["edits"]["documented_seen"].get("EditError", 0) > 0  # bad edits were refused, as documented


def test_minimal_inputs_are_written_as_expressions() -> None:
    assert fuzz_parsers._expr(("ahc039", "/* " * 1000, None)) == "('ahc039', '/* ' * 1000, None)"
    assert fuzz_parsers._expr("x" + "-" * 50 + "1") == "'x' + '-' * 50 + '1'"
    assert fuzz_parsers._expr([0.5] * 20) == "[0.5] * 20"
    assert fuzz_parsers._expr(b"ab") == "b'ab'"
