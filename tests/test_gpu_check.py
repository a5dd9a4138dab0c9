"""benchmarks/gpu_check.py (`make gpu-check`) on CPU: the fail-fast without a CUDA device, running a
part in a child process, and writing and merging the results file from fake part outputs. What it
measures on a GPU is not tested here (there is none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402

NO_GPU_ENV = os.environ | {"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
H100 = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.95.05", "versions": {"torch": "2.11.0", "vllm": "0.20.2"}, "commit": "abc"}
H200 = {"gpu": "NVIDIA H200", "driver": "580.95.05", "versions": {"torch": "2.11.0", "vllm": "0.20.2"}, "commit": "def"}


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_without_a_cuda_device_it_fails_fast_and_writes_nothing(tmp_path):
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--out", str(out)],
        cwd=ROOT,
        env=NO_GPU_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "no CUDA device" in done.stderr and not out.exists()
    make = subprocess.run(
        ["make", "-s", "gpu-check", f"GPU_PYTHON={sys.executable}", f"GPU_CHECK_OUT={out}"],
        cwd=ROOT,
        env=NO_GPU_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert make.returncode != 0 and "no CUDA device" in make.stderr and not out.exists()


def _junit(path: Path) -> Path:
    path.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="3" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.test_gpu_vllm" name="test_a" time="1.5"/>'
        '<testcase classname="tests.test_gpu_vllm" name="test_b" time="2.0"><failure message="x">boom</failure></testcase>'
        '<testcase classname="tests.test_gpu_vllm" name="test_c" time="0.0"><skipped message="no"/></testcase>'
        "</testsuite></testsuites>"
    )
    return path


def test_results_file_merges_parts_from_several_calls(tmp_path):
    train = gpu_check.BY_NAME["train-fp32"]
    tests = gpu_check.BY_NAME["vllm-tests"]
    first = {
        "environment": H100,
        "parts": {
            "train-fp32": gpu_check.part_record(train, "python benchmarks/training.py ...", 1, 12.0, "out of memory", {}, H100),
        },
    }
    junit = gpu_check.junit_figures(_junit(tmp_path / "junit.xml"))
    assert junit["counts"] == {"tests": 3, "failures": 1, "errors": 0, "skipped": 1, "passed": 1}
    assert junit["tests"]["tests.test_gpu_vllm::test_b"]["outcome"] == "failed"
    figures = {"MFU": 0.4123, "tokens_per_s": 5000.0, "offload": [{"cycle": 0, "park": {"seconds": 1.25}}]}
    second = {
        "environment": H100,
        "parts": {
            "vllm-tests": gpu_check.part_record(tests, "python -m pytest ...", 1, 300.0, "1 failed", {"junit": junit}, H100),
            "train-fp32": gpu_check.part_record(train, "python benchmarks/training.py ...", 0, 95.0, "ok", figures, H100),  # a re-run
        },
    }
    doc = gpu_check.merge(first, second)
    assert list(doc["parts"]) == ["train-fp32", "vllm-tests"]  # the parts' order, not the calls'
    assert doc["parts"]["train-fp32"]["status"] == "passed" and doc["parts"]["train-fp32"]["figures"]["MFU"] == 0.4123
    json_path, md_path = gpu_check.write_results(tmp_path / "out", doc, date="2026-11-24")
    assert json_path.name == "gpu-2026-11-24-nvidia-h100-80gb-hbm3.json" and md_path.suffix == ".md"
    assert json.loads(json_path.read_text()) == json.loads(json.dumps(doc))
    md = md_path.read_text()
    assert "# GPU check: NVIDIA H100 80GB HBM3" in md and "| driver | 580.95.05 |" in md and "| vllm | 0.20.2 |" in md
    assert "`python benchmarks/training.py ...`" in md and "| MFU | 0.4123 |" in md and "| offload[0].park.seconds | 1.25 |" in md
    assert "Tests: 1 passed, 1 failed, 0 errors, 1 skipped." in md and "test_b: failed" in md
    assert "Not run: train-bf16, resident, trimul-bench, trimul-tests, generation, one-gpu, step-time." in md

    # a third call on another machine, merged from the files alone (no GPU needed)
    one = {
        "environment": H200,
        "parts": {
            "one-gpu": gpu_check.part_record(
                gpu_check.BY_NAME["one-gpu"], "python benchmarks/one_gpu.py ...", None, 570.0, "killed", {}, H200
            )
        },
    }
    (tmp_path / "third.json").write_text(json.dumps(one))
    assert gpu_check.main(["--merge-only", "--merge", str(json_path), str(tmp_path / "third.json"), "--out", str(tmp_path / "merged")]) == 0
    (merged,) = (tmp_path / "merged").glob("gpu-*-nvidia-h200.json")  # the latest environment names the file
    doc3 = json.loads(merged.read_text())
    assert list(doc3["parts"]) == ["train-fp32", "vllm-tests", "one-gpu"]
    assert doc3["parts"]["one-gpu"]["status"] == "timeout" and doc3["parts"]["one-gpu"]["gpu"] == "NVIDIA H200"
    assert doc3["parts"]["train-fp32"]["gpu"] == "NVIDIA H100 80GB HBM3"  # every part keeps its own GPU
    with pytest.raises(ValueError, match="not a gpu-check"):
        gpu_check.merge(None, {"kind": "something else"})


def test_a_part_runs_in_a_child_and_its_figures_and_timeout_are_recorded():
    writes = gpu_check.Part(
        "fake",
        ("{python}", "-c", "import json,sys; json.dump({'x': 1.5}, open(sys.argv[1], 'w')); print('made')", "{json}"),
        60,
        env={"FAKE": "1"},
        what="a fake part",
    )
    record = gpu_check.run_part(writes, H100, 60, sys.executable)
    assert record["status"] == "passed" and record["figures"] == {"x": 1.5} and "made" in record["output_tail"]
    assert record["command"].startswith("FAKE=1 python -c ") and record["command"].endswith("FIGURES.json")
    sleeps = gpu_check.Part("slow", ("{python}", "-c", "import time; print('started', flush=True); time.sleep(30)"), 60)
    record = gpu_check.run_part(sleeps, H100, 2, sys.executable)
    assert record["status"] == "timeout" and record["returncode"] is None and "interrupted at its limit of 2 s" in record["output_tail"]
    # interrupted at its limit (SIGINT), a part still writes what it finished, as pytest writes its JUnit file
    partial = (
        "import json, sys, time\n"
        "try:\n    print('started', flush=True); time.sleep(30)\n"
        "except KeyboardInterrupt:\n    json.dump({'finished': 3}, open(sys.argv[1], 'w'))\n"
    )
    record = gpu_check.run_part(gpu_check.Part("partial", ("{python}", "-c", partial, "{json}"), 60), H100, 2, sys.executable)
    assert record["status"] == "timeout" and record["figures"] == {"finished": 3}
    stubborn = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('started', flush=True); time.sleep(60)"
    started = time.monotonic()
    record = gpu_check.run_part(gpu_check.Part("stubborn", ("{python}", "-c", stubborn), 60), H100, 1, sys.executable)
    assert record["status"] == "timeout" and "killed at its limit" in record["output_tail"]
    assert time.monotonic() - started < 1 + gpu_check.INTERRUPT_GRACE_S + 20  # killed, not waited for
    fails = gpu_check.Part("fails", ("{python}", "-c", "raise SystemExit(3)"), 60)
    assert gpu_check.run_part(fails, H100, 60, sys.executable)["status"] == "failed"


def test_the_parts_a_bare_gpu_machine_can_run_fit_one_ten_minute_call() -> None:
    """A lent GPU machine has torch and Triton, pydantic's wheels carried, for one call of at most 10
    minutes: the parts that need no vLLM come first and their limits add up to at most 540 s
    (`ONE_CALL_S`, the default of --max-seconds: 60 s left for the machine's probe, the wheels and the
    results), so `make gpu-check` there gets the trainer's figures (fp32 and bf16 LoRA), the resident
    trainer against a cold worker, and TriMul's timings and tests in one run."""
    bare = [p for p in gpu_check.PARTS if not p.needs_vllm]
    assert [p.name for p in gpu_check.PARTS[: len(bare)]] == [p.name for p in bare] == [p.name for p in gpu_check.FIRST_CALL]
    assert {"train-fp32", "train-bf16", "resident", "trimul-tests", "trimul-bench"} <= {p.name for p in bare}
    assert sum(p.timeout_s for p in bare) <= gpu_check.ONE_CALL_S <= 540


def test_a_part_may_use_the_time_earlier_parts_left_but_not_the_later_parts_reserve() -> None:
    a, b, c = (gpu_check.Part(n, ("{python}",), t) for n, t in (("a", 100), ("b", 50), ("c", 80)))
    assert gpu_check.part_limit(a, 230, [b, c]) == 100  # on time: its own limit
    assert gpu_check.part_limit(b, 200, [c]) == 120  # a left 30 s unused: b may use them
    assert gpu_check.part_limit(c, 100, []) == 100  # the last part gets what is left
    assert gpu_check.part_limit(c, 40, []) == 40  # never past the call's end
    assert gpu_check.part_limit(b, 100, [c]) == 50  # late: its own limit, the call's end permitting
