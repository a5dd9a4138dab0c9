"""TriMul's pieces that need neither a sandbox nor a GPU: the rules read from the source, the
inputs and the reference against docs/method.md §5c, the tolerance, the roofline floors, the verdict on
forged or impossible reports, the GPU leases and the problem's contract."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import pytest
import torch

from evaluators.kernels.trimul import roofline, verdict
from evaluators.kernels.trimul.inputs import generate_input
from evaluators.kernels.trimul.problem import INITIAL_KERNEL, SHAPES, TIMING, TriMulProblem
from evaluators.kernels.trimul.reference import mismatches, strict_float32, trimul_reference
from evaluators.kernels.trimul.static_rules import check_source
from evaluators.sandbox.gpus import Gpu, GpuLeases, _from_proc, _selected
from tests.trimul_kernels import BASE, CORRECT_TORCH, PUBLISHED_STYLE, SIDE_STREAM

REPO = Path(__file__).resolve().parents[1]


def test_the_vendored_shapes_are_the_competitions() -> None:
    assert len(SHAPES["tests"]) == 18 and len(SHAPES["benchmarks"]) == 7
    assert SHAPES["leaderboard_us"]["H100"] == {"1st_human": 1371.1, "ttt_discover": 1161.2}
    shared = REPO.parent / "shared" / "reference" / "kernels" / "trimul" / "shapes.json"
    if shared.is_file():
        assert json.loads(shared.read_text()) == SHAPES


# -- the rules read before a kernel runs ----------------------------------------------------------


@pytest.mark.parametrize("source", [INITIAL_KERNEL, CORRECT_TORCH, PUBLISHED_STYLE])
def test_legitimate_kernels_keep_every_rule(source: str) -> None:
    assert check_source(source) == []


@pytest.mark.parametrize(
    "snippet, phrase",
    [
        ("import time\ntime.perf_counter = lambda: 0.0", "imports 'time'"),
        ("torch.cuda.Event.elapsed_time = lambda a, b: 1e-3", "`.Event`"),
        ("torch.cuda.synchronize = lambda: None", "assigns to `torch.cuda.synchronize`"),
        ("sync = torch.cuda\nsync.synchronize = print", "assigns to `sync.synchronize`"),
        ("F.linear = lambda *a: 0", "assigns to `torch.nn.functional.linear`"),
        ("setattr(torch, 'matmul', print)", "uses `setattr`"),
        ("import sys\nsys.modules['x'] = 1", "imports 'sys'"),
        ("import gc", "imports 'gc'"),
        ("import threading", "imports 'threading'"),
        ("import ctypes", "imports 'ctypes'"),
        ("import evaluators.kernels.trimul.reference", "imports 'evaluators.kernels.trimul.reference'"),
        ("s = torch.cuda.Stream()", "`.Stream`"),
        ("ctx = torch.cuda.stream", "`.stream`"),
        ("class Lazy(torch.Tensor):\n    pass", "subclasses torch.Tensor"),
        ("y = torch.zeros(1).as_subclass(object)", "`.as_subclass`"),
        ("g = custom_kernel.__globals__", "`.__globals__`"),
        ("f = (lambda: 0).__code__", "`.__code__`"),
        ("exec('import os')", "uses `exec`"),
        ("m = getattr(torch, 'cu' + 'da')", "uses `getattr`"),
        ("w = torch.load('weights.pt')", "uses `torch.load`"),
        ("from torch.utils import cpp_extension", "imports 'torch.utils'"),
        ("def f():\n    raise ValueError\ntry:\n    f()\nexcept ValueError as e:\n    fr = e.__traceback__.tb_frame", "`.__traceback__`"),
        ("k = torch._C._cuda_synchronize", "`._C`"),
        ("o = torch.os.system", "uses `torch.os`"),
        ("s = torch.sys.modules", "uses `torch.sys`"),
        ("t = typing.sys", "uses `typing`, which the kernel never defines"),
        ("import typing\nt = typing.sys", "uses `typing.sys`"),
        ("f = F.torch.cuda", "uses `torch.nn.functional.torch`"),
        ("m = torch", "uses the module `torch` (torch) as a value"),
        ("n = torch.nn", "uses the module `torch.nn` as a value"),
        ("import numpy as np", "imports 'numpy'"),
        ("import functools", "imports 'functools'"),
        ("b = __builtins__", "uses `__builtins__`"),
        ("x = torch.zeros(1).numpy().tofile('/tmp/x')", "uses `.tofile`"),
        ("x = torch.zeros(1).untyped_storage()", "uses `.untyped_storage`"),
        ("v = vars(torch.nn)", "uses `vars`"),
        ("d = dir()", "uses `dir`"),
        ("w = tl.core", "uses `triton.language.core`"),
        ("x = print.__self__", "uses `.__self__`"),
        ("x = torch.einsum.__module__", "uses `.__module__` of `torch.einsum`"),
        ("x = id(3)", "uses `id`, which the kernel never defines"),
        ("match 1:\n    case int(real=r):\n        pass", "`match` statements"),
        ("class M:\n    def __getattribute__(self, n):\n        return 1", "defines `__getattribute__`"),
        ("open('/proc/self/mem')", "uses `open`"),
        # torch.compile: only plain settings, never a value (issue 27: opening it must not open Inductor's options)
        ("c = torch.compile(trimul, options={'trace.debug_dir': '/tmp/x'})", "torch.compile with `options=`"),
        ("c = torch.compile(trimul, options={'cpp.cxx': ('sh', '-c', 'id')})", "torch.compile with `options=`"),
        ("c = torch.compile(trimul, **{'options': {}})", "torch.compile with **"),
        ("def b(gm, args):\n    return gm\nc = torch.compile(trimul, backend=b)", "backend= other than one of"),
        ("c = torch.compile(trimul, backend='tvm')", "backend= other than one of"),
        ("c = torch.compile(trimul, mode='m' + 'ax-autotune')", "mode= other than one of"),
        ("c = torch.compile(trimul, 'inductor')", "more than the function positionally"),
        ("c = torch.compile\nd = c(trimul, options={})", "uses torch.compile as a value"),
        ("c = [torch.compile][0]", "uses torch.compile as a value"),
        ("@torch.compile(options={'debug': True})\ndef g(x):\n    return x", "torch.compile with `options=`"),
    ],
)
def test_each_broken_rule_is_named(snippet: str, phrase: str) -> None:
    problems = check_source(BASE + "\n" + snippet + "\n\ndef custom_kernel(data):\n    return trimul(*data)\n")
    assert problems and any(phrase in p for p in problems), problems


def test_the_side_stream_kernel_and_kernels_without_triton_or_entry_are_refused() -> None:
    assert any("`.Stream`" in p for p in check_source(SIDE_STREAM))
    no_triton = "import torch\n\ndef custom_kernel(data):\n    return data[0]\n"
    assert any("no @triton.jit kernel" in p for p in check_source(no_triton))
    assert any("no top-level function `custom_kernel" in p for p in check_source(BASE))
    assert check_source("def f(:\n")[0].startswith("syntax error")
    compiled = BASE + "\ncustom_kernel = torch.compile(lambda data: trimul(*data))\n"
    assert check_source(compiled) == []  # the entry point may be assigned
    settings = (
        BASE + "\ncustom_kernel = torch.compile(lambda data: trimul(*data), dynamic=False, mode='max-autotune', backend='inductor')\n"
    )
    assert check_source(settings) == []
    assert check_source(BASE + "\n@torch.compile\ndef custom_kernel(data):\n    return trimul(*data)\n") == []


# -- inputs, reference, tolerance -----------------------------------------------------------------


def test_inputs_follow_spec_and_are_the_same_for_the_same_seed() -> None:
    shape = {**SHAPES["tests"][1], "seqlen": 8, "dim": 16, "hiddendim": 8}  # masked, normal
    x, mask, w, config = generate_input(**shape, device="cpu")
    x2, mask2, w2, _ = generate_input(**shape, device="cpu")
    assert torch.equal(x, x2) and torch.equal(mask, mask2) and all(torch.equal(w[k], w2[k]) for k in w)
    assert x.shape == (1, 8, 8, 16) and x.dtype == torch.float32 and mask.dtype == torch.int64
    assert set(mask.unique().tolist()) <= {0, 1} and config == {"hidden_dim": 8, "dim": 16}
    assert w["left_proj.weight"].shape == (8, 16) and w["to_out.weight"].shape == (16, 8)
    other = generate_input(**{**shape, "seed": shape["seed"] + 1}, device="cpu")
    assert not torch.equal(x, other[0])  # a new seed gives new values
    nomask = generate_input(**{**shape, "nomask": True}, device="cpu")[1]
    assert nomask.dtype == torch.float32 and bool((nomask == 1).all())
    big = generate_input(**{**shape, "seqlen": 64, "dim": 64, "distribution": "cauchy"}, device="cpu")[0]
    assert torch.isfinite(big).all() and big.abs().max() > 100  # heavy tails: 2 tan(pi (u - 1/2))


def test_reference_matches_the_spec_formula_written_out() -> None:
    strict_float32()
    shape = {**SHAPES["tests"][1], "seqlen": 6, "dim": 8, "hiddendim": 4}
    x, mask, w, config = generate_input(**shape, device="cpu")
    x, mask, w = x.double(), mask.double(), {k: v.double() for k, v in w.items()}

    def ln(t, g, b):
        mu = t.mean(-1, keepdim=True)
        return (t - mu) / torch.sqrt(((t - mu) ** 2).mean(-1, keepdim=True) + 1e-5) * g + b

    xn = ln(x, w["norm.weight"], w["norm.bias"])
    left = (xn @ w["left_proj.weight"].T) * mask[..., None] * torch.sigmoid(xn @ w["left_gate.weight"].T)
    right = (xn @ w["right_proj.weight"].T) * mask[..., None] * torch.sigmoid(xn @ w["right_gate.weight"].T)
    out = torch.zeros_like(left)
    for i in range(6):
        for j in range(6):
            out[:, i, j] = (left[:, i, :, :] * right[:, j, :, :]).sum(1)
    y = (ln(out, w["to_out_norm.weight"], w["to_out_norm.bias"]) * torch.sigmoid(xn @ w["out_gate.weight"].T)) @ w["to_out.weight"].T
    got = trimul_reference(*generate_input(**shape, device="cpu"))
    assert torch.allclose(got.double(), y, rtol=1e-4, atol=1e-5)


def test_the_tolerance_and_nonfinite_rule() -> None:
    ref = torch.tensor([0.0, 1.0, -10.0, float("nan"), float("inf"), 5.0])
    assert mismatches(ref.clone(), ref)[0] == 0
    ok = ref + torch.tensor([0.019, 0.039, -0.219, 0, 0, 0])  # within 2e-2 + 2e-2|ref|
    assert mismatches(ok, ref)[0] == 0
    assert mismatches(ref + torch.tensor([0.021, 0, 0, 0, 0, 0]), ref)[:2] == (1, 0)
    nan_here = ref.clone()
    nan_here[5] = float("nan")
    assert mismatches(nan_here, ref)[:2] == (1, 5)  # NaN where the reference has none
    no_nan = ref.clone()
    no_nan[3] = 0.0
    assert mismatches(no_nan, ref)[:2] == (1, 3)  # a number where the reference has NaN
    wrong_inf = ref.clone()
    wrong_inf[4] = -float("inf")
    assert mismatches(wrong_inf, ref)[:2] == (1, 4)


# -- roofline floors and the verdict ---------------------------------------------------------------


def test_roofline_floors_are_real_bounds_and_below_the_published_kernels() -> None:
    h100 = roofline.peaks_for("NVIDIA H100 80GB HBM3")
    assert h100.model == "H100 SXM" and roofline.peaks_for("NVIDIA H100 PCIe").model == "H100 PCIe"
    assert roofline.peaks_for("NVIDIA A100-SXM4-80GB").model == "A100 SXM 80GB"
    assert roofline.peaks_for("Some Future GPU") == roofline.FALLBACK
    floors = [roofline.floor_us(s, h100) for s in SHAPES["benchmarks"]]
    # The largest shape moves 3.2 GB at most 3.35 TB/s: about 960 µs before the 0.8 slack.
    big = SHAPES["benchmarks"][-1]
    assert floors[-1] == pytest.approx(0.8 * (2 * 4 * 1024 * 1024 * 384 - 50e6) / 3350e9 * 1e6, rel=1e-9)
    # The fastest published kernel's geometric mean (TTT-Discover, 1161.2 µs) is far above the floors'.
    assert verdict.geometric_mean(floors) < 0.3 * SHAPES["leaderboard_us"]["H100"]["ttt_discover"]
    assert all(roofline.floor_us(s, roofline.FALLBACK) <= f for s, f in zip(SHAPES["benchmarks"], floors))
    assert roofline.min_flops(big) == 2 * 1024 * 1024 * 128 * (6 * 384 + 1024)


def _report(means_ms: list[float], seeds_repeat: bool = False) -> tuple[dict, dict]:
    job = {"tests": SHAPES["tests"][:1], "test_seeds": [[1]], "benchmarks": SHAPES["benchmarks"], "timing": TIMING}
    calls = [{"kind": "test", "set": "tests", "shape": 0, "seed": 1, "ms": None}]
    for i, ms in enumerate(means_ms):
        calls.append({"kind": "warmup", "set": "benchmarks", "shape": i, "seed": 5, "ms": None})
        calls += [
            {"kind": "timed", "set": "benchmarks", "shape": i, "seed": 7 if seeds_repeat else 100 * i + k, "ms": ms} for k in range(3)
        ]
    report = {"calls": calls, "versions": {"torch": "t", "triton": "tr"}, "benchmarks": [{"calls": 3}] * 7}
    return job, report


def test_the_verdict_scores_1500_over_the_geometric_mean_and_rejects_what_cannot_be() -> None:
    job, report = _report([1.3711] * 7)  # 1371.1 µs on every shape
    ok = verdict.timed_verdict(job, report, {"checked": len(report["calls"]), "gpu": "NVIDIA H100 80GB HBM3"}, "")
    assert ok.valid and ok.reward == pytest.approx(1500 / 1371.1) and ok.metrics["geomean_us"] == pytest.approx(1371.1)
    assert ok.construction["gpu"] == "NVIDIA H100 80GB HBM3" and "geometric mean 1371.1" in ok.observation
    fast = verdict.timed_verdict(*_report([0.001] * 7), {"checked": 29, "gpu": "NVIDIA H100 80GB HBM3"}, "")
    assert not fast.valid and "faster than the hardware" in fast.reason
    repeat = verdict.timed_verdict(*_report([1.0] * 7, seeds_repeat=True), {"checked": 29, "gpu": "H100"}, "")
    assert not repeat.valid and "repeated an input seed" in repeat.reason
    job, report = _report([1.0] * 7)
    report["calls"] = [c for c in report["calls"] if c["kind"] != "warmup"]
    assert "incomplete" in verdict.timed_verdict(job, report, {"checked": 22}, "").reason
    job, report = _report([1.0] * 7)
    wrong = verdict.timed_verdict(job, report, {"checked": 3, "failure": "timed call ... wrong"}, "")
    assert wrong.reason == "timed call ... wrong"
    assert "judged 2 of" in verdict.timed_verdict(job, report, {"checked": 2}, "").reason


# -- GPUs, leases, the problem's contract ----------------------------------------------------------


def test_gpus_are_found_from_the_driver_and_selected(tmp_path: Path, monkeypatch) -> None:
    for minor, model in ((0, "NVIDIA H100 80GB HBM3"), (1, "NVIDIA H100 80GB HBM3")):
        d = tmp_path / f"0000:0{minor}:00.0"
        d.mkdir()
        (d / "information").write_text(f"Model: \t\t {model}\nGPU UUID: \t GPU-{minor}\nDevice Minor: \t {minor}\n")
    found = _from_proc(tmp_path)
    assert found == [Gpu("0", "NVIDIA H100 80GB HBM3", "GPU-0"), Gpu("1", "NVIDIA H100 80GB HBM3", "GPU-1")]
    monkeypatch.setenv("DISCOVER_GPUS", "1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [g.index for g in _selected(found)] == ["1"]


def test_a_gpu_is_leased_to_one_run_at_a_time_across_processes(tmp_path: Path) -> None:
    gpus = (Gpu("0", "A"), Gpu("1", "B"))
    # Two lease holders with their own lock files open stand for two worker processes of one machine.
    holders = [GpuLeases(gpus, tmp_path), GpuLeases(gpus, tmp_path)]
    held, order, errors = [], [], []
    lock = threading.Lock()
    # The first two leases are each held until the other is taken, so two runs certainly hold GPUs at
    # once (however late a thread starts on a loaded machine): the second must get the other GPU.
    first_two = threading.Barrier(2, timeout=120)

    def work(k: int) -> None:
        try:
            with holders[k % 2].lease() as gpu:
                with lock:
                    assert gpu.index not in held, (gpu.index, held)
                    held.append(gpu.index)
                    order.append(gpu.index)
                    among_first_two = len(order) <= 2
                if among_first_two:
                    first_two.wait()
                time.sleep(0.01)
                with lock:
                    held.remove(gpu.index)
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(order) == 6 and set(order[:2]) == {"0", "1"}
    with pytest.raises(RuntimeError, match="no GPU"):
        with GpuLeases((), tmp_path).lease():
            pass


def test_the_problem_text_states_the_live_values_and_the_contract_holds(monkeypatch) -> None:
    p = TriMulProblem(gpu_type="H100")
    text = p.with_limits(timeout_s=99).description
    import triton

    assert f"Triton {triton.__version__}" in text and f"PyTorch {torch.__version__.split('+')[0]}" in text and "99 s" in text
    assert "an NVIDIA H100" in text and "1500 / (geometric mean" in text and "custom_kernel(data)" in text
    assert p.needs_gpu and p.image == "gpu" and p.limits.timeout_s == 530 and p.target == pytest.approx(1.5)
    assert p.seeds(None, 2)[0].code == INITIAL_KERNEL
    assert p.parse("text\n```python\nprint(1)\n```\n") == "print(1)"
    assert p.archive_key("x = 1", {"runtimes_us": [1.0]}) == p.archive_key("x=1", {"runtimes_us": [2.0]})
    assert not p.verify([1, 2]).valid
    monkeypatch.setenv("DISCOVER_GPU_TYPE", "A100")
    assert p.declared_gpu_type() == "A100"  # the pool's declaration wins, so re-timing elsewhere works
    with pytest.raises(ValueError, match="device must be"):
        TriMulProblem(device="tpu")


def test_the_wrong_gpu_type_is_refused_before_anything_runs(tmp_path: Path) -> None:
    class NoSandbox:
        def run(self, *a, **k):
            raise AssertionError("nothing may run on the wrong GPU")

    p = TriMulProblem(gpu_type="H100", leases=GpuLeases((Gpu("0", "NVIDIA A100-SXM4-80GB"),), tmp_path))
    v = p.evaluate(CORRECT_TORCH, None, NoSandbox())
    assert not v.valid and "A100-SXM4-80GB" in v.reason and "H100 is declared" in v.reason


def test_the_geometric_mean() -> None:
    assert verdict.geometric_mean([1.0, 100.0]) == pytest.approx(10.0)
    assert math.isclose(verdict.reward_for(1000.0), 1.5)


class _ScriptedSandbox:
    """Stands in for the GPU sandbox: answers each run from a script and records what ran where."""

    def __init__(self, checker_failure: str = "", means_ms: float = 1.2):
        self.runs: list[tuple[str, str, str]] = []
        self.checker_failure, self.means_ms = checker_failure, means_ms

    def run(self, program, entry, job, limits, data_dir=None, device=None):
        from evaluators.sandbox.base import SandboxResult

        what = "checker" if "def check_call" in program else "driver"
        phase = "tests" if job["tests"] else "benchmarks"
        self.runs.append((what, phase, device))
        if what == "checker":
            return SandboxResult(
                ok=True, output={"checked": len(job["calls"]), "failure": self.checker_failure, "gpu": "NVIDIA H100 80GB HBM3"}
            )
        calls = [{"kind": "test", "set": "tests", "shape": i, "seed": s[0], "ms": None} for i, s in enumerate(job["test_seeds"])]
        for i, _ in enumerate(job["benchmarks"]):
            calls.append({"kind": "warmup", "set": "benchmarks", "shape": i, "seed": 1, "ms": None})
            calls += [{"kind": "timed", "set": "benchmarks", "shape": i, "seed": 10 * i + k, "ms": self.means_ms} for k in range(3)]
        report = {"calls": calls, "versions": {"torch": "2.11.0", "triton": "3.6.0"}, "benchmarks": [{"calls": 3}] * len(job["benchmarks"])}
        return SandboxResult(ok=True, output=report, logs="driver log")


def test_a_kernel_is_timed_only_after_every_test_shape_passed_on_its_leased_gpu(tmp_path: Path) -> None:
    leases = GpuLeases((Gpu("3", "NVIDIA H100 80GB HBM3"),), tmp_path)
    wrong = _ScriptedSandbox(checker_failure="test call on tests shape 4: 7 of 262144 checked output values are wrong")
    v = TriMulProblem(leases=leases).evaluate(CORRECT_TORCH, None, wrong)
    assert not v.valid and "tests shape 4" in v.reason
    assert wrong.runs == [("driver", "tests", "3"), ("checker", "tests", "3")]  # never timed
    good = _ScriptedSandbox(means_ms=1.3711)
    v = TriMulProblem(leases=leases).evaluate(CORRECT_TORCH, None, good)
    assert v.valid and v.reward == pytest.approx(1500 / 1371.1)
    assert [r[:2] for r in good.runs] == [("driver", "tests"), ("checker", "tests"), ("driver", "benchmarks"), ("checker", "benchmarks")]
    assert {r[2] for r in good.runs} == {"3"}  # every run on the one leased GPU
    assert "us B1 N1024 C384 normal" in v.metrics and v.observation.startswith("driver log")


def test_the_gpu_image_runs_the_torch_triton_and_numpy_the_project_locks() -> None:
    import importlib.util
    from importlib.metadata import version

    spec = importlib.util.spec_from_file_location("image_build", REPO / "images" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    args = build.build_args("gpu")
    assert args == {"TORCH_VERSION": version("torch"), "TRITON_VERSION": version("triton"), "NUMPY_VERSION": version("numpy")}
    assert build.build_args("python-math") == {}
    names = __import__("tarfile").open(fileobj=build.build_context("gpu")).getnames()
    assert sorted(names) == ["Dockerfile", "host-ca.pem", "offline-packages.txt"]


def test_each_sandbox_run_sees_only_the_gpu_it_names() -> None:
    from evaluators.sandbox import ProcessSandbox, docker_unavailable
    from evaluators.sandbox.base import SandboxLimits

    limits = SandboxLimits(timeout_s=60)
    show = "import os\ndef show(a):\n    return os.environ.get('CUDA_VISIBLE_DEVICES')\n"
    assert ProcessSandbox(image="gpu").run(show, "show", None, limits, device="2").output == "2"
    assert ProcessSandbox(image="gpu").run(show, "show", None, limits, device="cpu").output == ""
    assert ProcessSandbox(image="gpu").run(show, "show", None, limits).output is None  # the default: unchanged
    if docker_unavailable("python-math"):
        pytest.skip("no Docker engine or python-math image: the docker half is not checked here")
    from evaluators.sandbox.docker import DockerSandbox

    with DockerSandbox(image="python-math", concurrency=1, gpu=True) as box:
        assert box.exec_tmp  # Triton loads what it compiles from /tmp
        assert [box._key(limits, None, d)[-1] for d in ("3", None, "cpu")] == ["3", "all", ""]
        run = box.run("def f(a):\n    return 7\n", "f", None, limits, device="cpu")  # no device request at all
        assert run.ok and run.output == 7, run.reason


def test_the_checker_finds_an_input_changed_behind_the_drivers_back_and_names_the_element() -> None:
    """A driver subverted into reporting an in-place write as clean still fails at the checker, which
    regenerates x itself; its reason names a changed element and both values."""
    import base64

    import numpy

    checker: dict = {}
    exec(compile(TriMulProblem(device="cpu").checker_program, "checker", "exec"), checker)  # noqa: S102 (our own source)
    shape = next(s for s in SHAPES["tests"] if s["seqlen"] == 32 and s["distribution"] == "cauchy")
    job = {"device": "cpu", "tests": [shape], "full_check_elements": 1 << 20, "sample_elements": {"test": 64}, "x_sample_elements": 256}
    x, mask, weights, config = generate_input(**shape, device="cpu")
    out = trimul_reference(x, mask, weights, config).reshape(-1).numpy()
    rng = numpy.random.default_rng(11)
    x_flat = rng.integers(0, x.numel(), job["x_sample_elements"])  # out is whole (under full_check_elements): no draw before
    seen = x.reshape(-1)[torch.as_tensor(x_flat)].numpy().copy()

    def b64(a):
        return base64.b64encode(a.astype("<f4").tobytes()).decode("ascii")

    call = {"kind": "test", "set": "tests", "shape": 0, "seed": shape["seed"], "pos_seed": 11, "full": True, "values": b64(out)}
    assert checker["check_call"]({**call, "x_values": b64(seen)}, shape, job, torch, numpy, {}) == ""
    seen[7] *= 0.5  # what `data[0].mul_(0.5)` left at one sampled position
    why = checker["check_call"]({**call, "x_values": b64(seen)}, shape, job, torch, numpy, {})
    assert "the input x was changed in place" in why and "1 of 256 checked values differ" in why, why
    b, i, j, c = numpy.unravel_index(int(x_flat[7]), tuple(x.shape))
    assert f"[b, i, j, c] = {[int(b), int(i), int(j), int(c)]}" in why, why
