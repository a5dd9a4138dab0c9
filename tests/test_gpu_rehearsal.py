"""The GPU check's first call, checked on CPU (benchmarks/gpu_rehearsal.py, `make gpu-check REHEARSE=1`):
every module its parts import is on the lent machine's image or among the wheels the call carries;
the rehearsal's stop at the first CUDA call; the facts the rehearsal's predictions rest on.

`make test` runs the whole rehearsal too (an environment of the image's packages, every part to its
first CUDA call); these tests are what can be checked without building that environment."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402
import gpu_rehearsal  # noqa: E402


@pytest.mark.parametrize("part", [p.name for p in gpu_check.FIRST_CALL])
def test_every_module_a_part_of_the_first_call_imports_is_on_the_machine_or_carried(part) -> None:
    """An import the image lacks and the call does not carry fails on the lent machine within seconds,
    the call's device time lost: add its wheel to benchmarks/first_call_wheels.txt (or, if the part
    never takes that path, say why in NOT_ON_THE_CHECKS_PATH)."""
    missing = gpu_rehearsal.unprovided_imports(gpu_check.BY_NAME[part])
    assert not missing, "\n".join(f"{s.module} at {s.where}" for s in missing)


def test_the_import_check_fails_on_a_module_the_machine_lacks(tmp_path, monkeypatch) -> None:
    """The check above can fail: a part whose script imports discover.config without pydantic carried,
    or a package no list has, is reported with the line that imports it."""
    script = ROOT / "benchmarks" / "training.py"
    part = gpu_check.Part("probe", ("{python}", str(script.relative_to(ROOT))), 10)
    monkeypatch.setattr(gpu_rehearsal, "carried_packages", lambda: {})
    missing = {s.module for s in gpu_rehearsal.unprovided_imports(part)}
    assert "pydantic" in missing and "torch" not in missing
    stray = tmp_path / "stray.py"
    stray.write_text(
        "import os\nimport json\ntry:\n    import optional_thing\nexcept ImportError:\n    pass\n\ndef f():\n    import made_up_package\n"
    )
    sites = gpu_rehearsal.third_party_imports([stray])
    assert [(s.module, s.guarded) for s in sites] == [("optional_thing", True), ("made_up_package", False)]
    assert sites[1].where.endswith("stray.py:9")


def test_what_is_declared_off_the_checks_path_is_still_imported_by_a_part() -> None:
    """Each NOT_ON_THE_CHECKS_PATH entry names a module some part's code imports (no stale entries),
    and none of them is on the image or carried (else the entry is not needed)."""
    imported = set()
    for part in gpu_check.FIRST_CALL:
        files, modules = gpu_rehearsal.part_entries(part)
        imported |= {s.module for s in gpu_rehearsal.third_party_imports(files, modules)}
    provided = set(gpu_rehearsal.image_packages()) | set(gpu_rehearsal.carried_packages())
    for module in gpu_rehearsal.NOT_ON_THE_CHECKS_PATH:
        assert module in imported, f"{module} is declared off the check's path but no part imports it"
        assert gpu_rehearsal.distribution_of(module) not in provided


def test_the_carried_wheels_are_the_locks_versions_and_what_the_image_lacks() -> None:
    lock = (ROOT / "uv.lock").read_text()
    image = gpu_rehearsal.image_packages()
    for name, version in gpu_rehearsal.carried_packages().items():
        assert version, f"{name} is carried without a version"
        assert f'name = "{name}"\nversion = "{version}"' in lock, f"{name}=={version} is not the lock's version"
        assert name not in image, f"{name} is on the image already: carrying it would shadow the image's"


def test_the_trimul_test_counts_name_every_test_of_the_gpu_tests() -> None:
    """The predictions count TriMul's evaluations per GPU test by a declared table: it names exactly the
    test file's tests, so a new test cannot go uncounted."""
    tree = ast.parse((ROOT / "tests" / "test_trimul_gpu.py").read_text())
    tests = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
    assert tests == set(gpu_rehearsal.TRIMUL_TEST_EVALUATIONS)


def test_the_sandboxed_trimul_processes_answer_as_the_rehearsal_expects_without_a_gpu() -> None:
    for path in ("evaluators/kernels/trimul/driver.py", "evaluators/kernels/trimul/checker.py"):
        assert gpu_rehearsal.SANDBOX_NO_CUDA in (ROOT / path).read_text(), path


def _shimmed(code: str, markers: Path) -> subprocess.CompletedProcess:
    script = markers.parent / "script.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PYTHONPATH": os.pathsep.join([str(gpu_rehearsal.SHIM), str(ROOT)]), "GPU_CHECK_REHEARSAL_DIR": str(markers)}
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_the_shim_stops_a_process_at_its_first_cuda_call_and_says_where(tmp_path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    code = (
        "import torch\n"
        "assert torch.cuda.is_available() and torch.cuda.device_count() == 1\n"
        "def build():\n"
        "    return torch.zeros(4, device='cuda')\n"
        "try:\n"
        "    build()\n"
        "except BaseException:\n"
        "    print('caught')\n"  # nothing can catch it: the process ends there
        "print('went on')\n"
    )
    done = _shimmed(code, markers)
    assert done.returncode == gpu_rehearsal.REACHED_EXIT, done.stderr
    assert "went on" not in done.stdout and "caught" not in done.stdout
    (record,) = [json.loads(p.read_text()) for p in markers.glob("*.json")]
    assert record["reached_cuda"] and record["where"][-1].endswith("in build: return torch.zeros(4, device='cuda')")
    assert record["modules"]["torch"] == "torch" and record["modules"].get("sitecustomize") is None


def test_the_shim_records_a_process_that_never_reaches_cuda_and_is_inert_without_its_variable(tmp_path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    done = _shimmed("import numpy\nprint('done')", markers)
    assert done.returncode == 0 and "done" in done.stdout
    (record,) = [json.loads(p.read_text()) for p in markers.glob("*.json")]
    assert not record["reached_cuda"] and record["modules"]["numpy"] == "numpy"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPU_CHECK_REHEARSAL_DIR")}
    env["PYTHONPATH"] = str(gpu_rehearsal.SHIM)
    plain = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], env=env, capture_output=True, text=True, timeout=300
    )
    assert plain.stdout.strip() == "False"  # this machine has no GPU, and without the variable the shim says nothing


def test_the_training_prediction_shows_its_arithmetic() -> None:
    """The train parts' device time: the time to CUDA measured, then each GPU term with how it was
    computed; the step's FLOPs are those benchmarks/training.py counts for the part's own arguments."""
    part = gpu_check.BY_NAME["train-fp32"]
    prediction = gpu_rehearsal.predict(part, {"seconds": 10.0, "tests": []})
    terms = {t["term"]: t for t in prediction["arithmetic"]}
    assert terms["to the first CUDA call (measured here)"]["seconds"] == 10.0
    step = terms["the timed step"]
    assert "PFLOP /" in step["as"] and f"MFU {gpu_rehearsal.ASSUMED['MFU']}" in step["as"]
    assert "offload and reload" in terms and prediction["limit_s"] == part.timeout_s
    assert prediction["predicted_s"] == pytest.approx(sum(t["seconds"] for t in prediction["arithmetic"]), abs=0.2)


@pytest.mark.slow
def test_the_rehearsal_takes_every_part_of_the_first_call_to_its_first_cuda_call(tmp_path) -> None:
    """`make gpu-check REHEARSE=1` as `make test` runs it: an environment of the lent machine's image's
    packages, every part of the first call run with the real call's arguments to its first CUDA call and
    past it on CPU; it exits 0 only when every part got there (benchmarks/results/gpu-rehearsal.md)."""
    done = subprocess.run(
        ["make", "-s", "gpu-check", "REHEARSE=1", f"GPU_CHECK_OUT={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    report = tmp_path / "gpu-rehearsal.json"
    assert done.returncode == 0 and report.is_file(), (done.stdout + done.stderr)[-6000:]
    doc = json.loads(report.read_text())
    assert doc["ok"] and [p["part"] for p in doc["parts"]] == [p.name for p in gpu_check.FIRST_CALL]
    assert all(p["reached_cuda"] for p in doc["parts"]) and doc["travels"]["fits"]
    assert doc["limits_total_s"] <= gpu_check.ONE_CALL_S
