"""benchmarks/cluster.py --cost-model: the table in docs/cluster.md is the script's output, and a GPU
check's measured figures replace the assumptions they measure (docs/cluster.md, "Cost model")."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cluster  # noqa: E402


def _block(text: str) -> str:
    m = re.search(r"<!-- cost-model:start -->\n(.*?)<!-- cost-model:end -->", text, re.S)
    assert m, "docs/cluster.md has no cost-model block"
    return m.group(1)


def test_the_docs_table_is_the_scripts_output(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Regenerate with: python benchmarks/cluster.py --cost-model (docs/cluster.md says so)."""
    assert cluster.main(["--cost-model", "--results-dir", str(tmp_path)]) == 0  # no results file: assumptions only
    printed = capsys.readouterr().out
    assert printed.startswith("No GPU check results file")
    assert _block((ROOT / "docs" / "cluster.md").read_text()) == printed


def _results(tmp_path: Path, decode: float, train: float, status: str = "passed") -> None:
    doc = {
        "kind": "gpu-check",
        "parts": {
            "generation": {"status": status, "figures": {"vllm": {"tokens_per_s": decode}}},
            "train-bf16": {"status": "passed", "figures": {"tokens_per_s": train}},
        },
    }
    (tmp_path / "gpu-20260101-h100.json").write_text(json.dumps(doc))


def test_measured_figures_replace_the_assumptions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = cluster.DEFAULTS["Qwen3-8B"]
    _results(tmp_path, decode=2 * base.decode_tps_per_gpu.value, train=3 * base.train_tps_per_gpu.value)
    models = cluster.with_measurements(cluster.DEFAULTS, cluster.newest_results(tmp_path))
    m = models["Qwen3-8B"]
    assert m.decode_tps_per_gpu.source.startswith("measured: gpu-20260101-h100.json")
    assert m.train_tps_per_gpu.value == 3 * base.train_tps_per_gpu.value
    assert models["gpt-oss-120b"] == cluster.DEFAULTS["gpt-oss-120b"]  # the check measures the 8B shape only
    before, after = cluster.step_seconds(base, 1), cluster.step_seconds(m, 1)
    assert before is not None and after is not None
    assert after["generate"] == pytest.approx(before["generate"] / 2)  # one GPU: throughput bound
    assert after["train"] == pytest.approx(before["train"] / 3)

    cluster.main(["--cost-model", "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.startswith("GPU check results: gpu-20260101-h100.json") and "| decode_tps_per_gpu | 4,000 | measured" in out


def test_a_failed_part_is_not_a_measurement(tmp_path: Path) -> None:
    _results(tmp_path, decode=123.0, train=456.0, status="failed")
    m = cluster.with_measurements(cluster.DEFAULTS, cluster.newest_results(tmp_path))["Qwen3-8B"]
    assert m.decode_tps_per_gpu == cluster.DEFAULTS["Qwen3-8B"].decode_tps_per_gpu
    assert m.train_tps_per_gpu.value == 456.0


def test_many_gpus_wait_on_single_sequences_and_a_model_too_big_does_not_fit() -> None:
    m = cluster.DEFAULTS["Qwen3-8B"]
    many = cluster.step_seconds(m, 4096)
    assert many is not None and many["generate"] == pytest.approx(cluster.THINKING_BUDGET / m.sequence_tps.value)
    assert cluster.step_seconds(cluster.DEFAULTS["gpt-oss-120b"], 1) is None


def test_bad_gpu_counts_name_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cluster.main(["--cost-model", "--gpus", "8,lots"])
    assert "--gpus takes comma-separated whole numbers" in capsys.readouterr().err
