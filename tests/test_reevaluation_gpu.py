"""Re-evaluation records the GPU it really ran on (discover/reevaluation.py, evaluators/sandbox/gpus.py).

This machine has no GPU: each test puts a fake `nvidia-smi` first on PATH that answers the query
the code makes (and only that query), so the device is whatever the test says it is.
"""

from __future__ import annotations

import dataclasses
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pyarrow.parquet as pq
import pytest

from discover.archive import Archive, State
from discover.config import dump_config, parse_config
from discover.records import Reevaluation
from discover.reevaluation import CPU_ONLY, GpuCheck, reevaluate_run, table_rows
from discover.run import Run, save_archive
from evaluators.base import EvalResult
from evaluators.kernels.trimul.problem import INITIAL_KERNEL
from evaluators.sandbox.gpus import Gpu, _from_proc, local_gpus
from storage.atomic import atomic_write_json, atomic_write_text
from storage.layout import RunLayout
from storage.tables import read_records, write_records

H100 = "0, GPU-5d8e, NVIDIA H100 80GB HBM3, 81559, 550.54.15"
A100 = "0, GPU-77a1, NVIDIA A100-SXM4-80GB, 81920, 535.104.05"
H100_LINE = "NVIDIA H100 80GB HBM3, 81559 MiB, driver 550.54.15"


@pytest.fixture
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """`device(lines)`: this machine's nvidia-smi lists these GPUs (none: it finds no device)."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    for var in ("CUDA_VISIBLE_DEVICES", "DISCOVER_GPUS", "DISCOVER_GPU_TYPE"):
        monkeypatch.delenv(var, raising=False)

    def use(*lines: str) -> None:
        answer = "\n".join(lines)
        script = bin_dir / "nvidia-smi"
        script.write_text(
            "#!/bin/sh\n"
            '[ "$1" = "--query-gpu=index,uuid,name,memory.total,driver_version" ] && [ "$2" = "--format=csv,noheader,nounits" ] || exit 2\n'
            + (f"cat <<'EOF'\n{answer}\nEOF\n" if lines else "echo 'No devices were found'; exit 6\n")
        )
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        local_gpus.cache_clear()

    yield use
    local_gpus.cache_clear()


def _write_run(root: Path, problem: str, children: list[State]) -> Run:
    """A run directory written by hand: a seed, then `children` found at step 0."""
    layout = RunLayout(root)
    atomic_write_text(
        layout.config, dump_config(parse_config({"problem": problem, "run_dir": str(root), "sandbox": {"backend": "process"}}))
    )
    atomic_write_json(layout.run_info, {"run_id": "feedfacefeedface", "created": 0.0})
    seed = State(id="seed-0", parent_id=None, step=-1, reward=0.0, code=children[0].code, is_seed=True)
    save_archive(layout.archive(0), Archive([seed], 0))
    save_archive(layout.archive(1), Archive([seed, *children], 1))
    return Run.open(root)


def _kernel_run(root: Path) -> Run:
    kernels = [
        State(id=f"s0000-g00-r00{i}", parent_id="seed-0", step=0, reward=r, code=INITIAL_KERNEL + f"\n# variant {i}\n", lineage=("seed-0",))
        for i, r in enumerate((0.8, 0.5))
    ]
    return _write_run(root, "trimul", kernels)


@pytest.fixture
def judged(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The states the kernel evaluation was asked to time; it answers as a run on an H100 would."""
    asked: list[str] = []

    def judge(problem, candidate, parent, sandbox, state_id):
        asked.append(state_id)
        return EvalResult(reward=1.2, valid=True, construction={"gpu": "NVIDIA H100 80GB HBM3"}, metrics={"geomean_us": 1250.0})

    monkeypatch.setattr("discover.reevaluation.judge_candidate", judge)
    return asked


def test_nvidia_smi_reports_model_memory_and_driver(device) -> None:
    device(H100, "1, GPU-9f00, NVIDIA H100 80GB HBM3, 81559, 550.54.15")
    assert local_gpus() == (
        Gpu("0", "NVIDIA H100 80GB HBM3", "GPU-5d8e", 81559, "550.54.15"),
        Gpu("1", "NVIDIA H100 80GB HBM3", "GPU-9f00", 81559, "550.54.15"),
    )
    assert local_gpus()[0].describe() == H100_LINE


def test_the_proc_fallback_gives_the_driver_version(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus" / "0000:01:00.0"
    gpus.mkdir(parents=True)
    (gpus / "information").write_text("Model: \t\t NVIDIA A100-SXM4-80GB\nGPU UUID: \t GPU-1\nDevice Minor: \t 0\n")
    (tmp_path / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n")
    [gpu] = _from_proc(tmp_path / "gpus")
    assert (gpu.name, gpu.driver, gpu.memory_mib) == ("NVIDIA A100-SXM4-80GB", "535.104.05", 0)
    assert gpu.describe() == "NVIDIA A100-SXM4-80GB, memory not reported, driver 535.104.05"


def test_a_kernel_run_on_a_machine_without_a_gpu_times_nothing_and_says_so(tmp_path: Path, device, judged, monkeypatch) -> None:
    device()  # nvidia-smi finds no device
    monkeypatch.setenv("DISCOVER_GPU_TYPE", "H100")
    rows, out = reevaluate_run(_kernel_run(tmp_path / "kernels"), 5, "gpu-h100")
    assert judged == []  # nothing ran
    assert out.name.endswith("-no-GPU-gpu-h100.parquet") and "H100" not in out.name  # no GPU claimed by the name
    stored, meta = read_records(out, Reevaluation)
    assert stored == rows and len(rows) == 2
    for r in stored:
        assert not r.valid and r.reward == 0.0 and r.metrics == {}  # no runtime figure at all
        assert "H100 is declared" in r.reason and "no CUDA GPU" in r.reason and "correct the pool's DISCOVER_GPU_TYPE" in r.reason
        assert (r.gpu, r.declared_gpu, r.gpu_memory_mib, r.gpu_driver) == ("none", "H100", 0, "")
    assert "geomean_us" not in pq.read_schema(out).names
    assert meta["gpu"] == "declared H100 (pool gpu-h100); this machine: no GPU"
    markdown = out.with_suffix(".md").read_text()
    assert "GPU: declared H100 (pool gpu-h100); this machine: no GPU.\n" in markdown
    assert f"**{rows[0].reason}.**" in markdown  # the header's one sentence
    assert [r["gpu"] for r in table_rows(rows)] == ["declared H100; this machine: no GPU"] * 2


def test_a_kernel_run_on_another_gpu_than_declared_is_refused_naming_both(tmp_path: Path, device, judged, monkeypatch) -> None:
    device(A100)
    monkeypatch.setenv("DISCOVER_GPU_TYPE", "H100")
    rows, out = reevaluate_run(_kernel_run(tmp_path / "kernels"), 5, "gpu-h100")
    assert judged == []
    assert out.name.endswith("-NVIDIA-A100-SXM4-80GB-gpu-h100.parquet")  # named by the GPU it has
    for r in rows:
        assert not r.valid and r.reward == 0.0 and r.metrics == {}
        assert "NVIDIA A100-SXM4-80GB" in r.reason and "H100 is declared" in r.reason and "run on a H100" in r.reason
        assert (r.gpu, r.gpu_memory_mib, r.gpu_driver, r.declared_gpu) == ("NVIDIA A100-SXM4-80GB", 81920, "535.104.05", "H100")
    markdown = out.with_suffix(".md").read_text()
    assert "GPU: declared H100 (pool gpu-h100); device NVIDIA A100-SXM4-80GB, 81920 MiB, driver 535.104.05." in markdown
    assert f"**{rows[0].reason}.**" in markdown
    # the rule is TriMul's own: the declared type occurs in the model's name, whatever its case
    assert GpuCheck("gpu-a100", True, "a100", local_gpus()).refusal == ""


def test_a_kernel_run_on_the_declared_gpu_records_model_memory_and_driver(tmp_path: Path, device, judged, monkeypatch) -> None:
    device(H100)
    monkeypatch.setenv("DISCOVER_GPU_TYPE", "H100")
    rows, out = reevaluate_run(_kernel_run(tmp_path / "kernels"), 5, "gpu-h100")
    assert judged == ["s0000-g00-r000", "s0000-g00-r001"]  # best first, both timed
    assert out.name.endswith("-NVIDIA-H100-80GB-HBM3-gpu-h100.parquet")
    stored, meta = read_records(out, Reevaluation)
    for r in stored:
        assert r.valid and r.metrics == {"geomean_us": 1250.0}
        assert (r.gpu, r.gpu_memory_mib, r.gpu_driver, r.declared_gpu) == ("NVIDIA H100 80GB HBM3", 81559, "550.54.15", "H100")
    assert meta["gpu"] == f"declared H100 (pool gpu-h100); device {H100_LINE}"
    assert [r["gpu"] for r in table_rows(stored)] == [f"declared H100; device {H100_LINE}"] * 2
    markdown = out.with_suffix(".md").read_text()
    assert f"GPU: declared H100 (pool gpu-h100); device {H100_LINE}.\n" in markdown
    assert f"| declared H100; device {H100_LINE} |" in markdown


def test_a_math_reevaluation_says_why_its_gpu_column_is_empty(tmp_path: Path, device, monkeypatch) -> None:
    device(H100)  # on a GPU worker, still not used
    monkeypatch.setenv("DISCOVER_GPU_TYPE", "H100")
    program = "def construct(parent):\n    return [0.5] * 10\n"
    child = State(id="s0000-g00-r000", parent_id="seed-0", step=0, reward=1.0 / 0.5, code=program, lineage=("seed-0",))
    run = _write_run(tmp_path / "erdos", "erdos", [child])
    rows, out = reevaluate_run(run, 5, "gpu-h100")
    [row] = rows
    assert row.valid, row.reason
    assert (row.gpu, row.gpu_memory_mib, row.gpu_driver, row.declared_gpu) == (CPU_ONLY, 0, "", "H100")
    assert out.name.endswith("Z-gpu-h100.parquet")  # no GPU in the name of a table that used none
    assert table_rows(rows)[0]["gpu"] == "not used (the problem runs on CPU)"
    markdown = out.with_suffix(".md").read_text()
    assert f"GPU: declared H100 (pool gpu-h100); device {H100_LINE}.\n" in markdown  # the device is still recorded
    assert "The problem runs on CPU: no GPU was used" in markdown and "| not used (the problem runs on CPU) |" in markdown


def test_a_version_1_table_reads_with_the_gpu_fields_empty(tmp_path: Path) -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class ReevaluationV1(EvalResult):  # the record as version 1 wrote it
        SCHEMA_VERSION: ClassVar[int] = 1
        metrics: dict[str, Any] = dataclasses.field(default_factory=dict, metadata={"expand": True})
        state_id: str
        step: int
        archived_reward: float
        pool: str
        host: str
        gpu: str

    old = ReevaluationV1(
        reward=1.0, valid=True, metrics={"geomean_us": 900.0}, state_id="s", step=0, archived_reward=1.0, pool="p", host="h", gpu="H100"
    )
    write_records(tmp_path / "v1.parquet", [old], ReevaluationV1)
    [row], _ = read_records(tmp_path / "v1.parquet", Reevaluation)
    assert (row.gpu, row.gpu_memory_mib, row.gpu_driver, row.declared_gpu, row.metrics) == ("H100", 0, "", "", {"geomean_us": 900.0})
