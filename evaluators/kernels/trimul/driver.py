"""The driver: the program that runs one TriMul candidate inside the sandbox, in the candidate's process.

Sent into the sandbox as source text after inputs.py (never imported by the host); the sandbox's
harness calls `main(job)`. It never holds the reference: outputs leave this process as samples and
are judged by the checker, another process (checker.py). What it does, in order:

1. Before any candidate code exists: a fresh Triton and Inductor cache inside the run's own
   directory (no compiled kernel or autotuning result survives from another candidate), the GPU's
   model checked against the pool's declared type (nothing is timed on the wrong GPU), and every
   function it relies on captured (the clock, CUDA events, synchronise, os.urandom, the input
   generators), with the Python threads that exist.
2. The candidate imported from `submission.py`, as module `submission` (the driver's own module is
   out of `sys.modules`). Then, around every call: the captured functions must be unchanged (no
   patched clock, event, generator or tensor method), no evaluator module imported, no torch
   function or dispatch mode active, no new Python thread, the same current CUDA stream; the inputs
   must be unchanged afterwards; the output a plain strided float32 torch.Tensor of the right shape
   on the right device (no subclass, no lazy or functional wrapper).
3. Every call gets fresh inputs (new values from a new seed, new storage). After each call the
   output is sampled at positions drawn from the OS's random source after the call returned (the
   whole output where it is small), and x at other drawn positions; the samples go to the checker.
4. On a GPU, per benchmark shape: a warm-up call, then timed calls, each after an L2 flush (a write
   of twice the L2 size), timed with CUDA events on the stream current before the import and a
   synchronise after, and by the host clock around the same region; the host time, less the cost
   of an empty timed region, must agree with the events (work on another stream or thread shows in
   the host time only). Then a batch of calls with one synchronise at its end, timed by the host
   clock only, must agree with the events too. Calls stop after MAX_CALLS, or once the standard
   error of the mean is under 0.1% of it, or after the shape's time budget (as the competition's
   harness does).

A candidate that subverts this process can forge what it reports about itself; that is why the
rules are also checked before it runs (static_rules.py) and its outputs are judged elsewhere.
"""

import base64
import os
import sys
import threading
import time
import traceback

ENTRY = "custom_kernel"
HARNESS_PACKAGES = ("evaluators", "discover", "flows", "storage", "cli", "candidate")


def _b64(array):
    return base64.b64encode(array.astype("<f4").tobytes()).decode("ascii")


class Captured:
    """What the driver relies on, taken before the candidate exists, and a check that none changed."""

    def __init__(self, torch, numpy):
        self.torch = torch
        watched = {
            "time.perf_counter": (time, "perf_counter"), "time.perf_counter_ns": (time, "perf_counter_ns"),
            "time.time": (time, "time"), "time.monotonic": (time, "monotonic"), "os.urandom": (os, "urandom"),
            "threading.enumerate": (threading, "enumerate"),
            "numpy.random.default_rng": (numpy.random, "default_rng"),
            "torch.Tensor": (torch, "Tensor"), "torch.Generator": (torch, "Generator"),
            "torch.randn": (torch, "randn"), "torch.rand": (torch, "rand"), "torch.randint": (torch, "randint"),
            "torch.ones": (torch, "ones"), "torch.tan": (torch, "tan"), "torch.equal": (torch, "equal"),
            "torch.empty": (torch, "empty"), "torch.as_tensor": (torch, "as_tensor"),
            "torch.cuda.synchronize": (torch.cuda, "synchronize"), "torch.cuda.Event": (torch.cuda, "Event"),
            "torch.cuda.current_stream": (torch.cuda, "current_stream"), "torch.cuda.Stream": (torch.cuda, "Stream"),
            "torch.cuda.Event.record": (torch.cuda.Event, "record"),
            "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
            "torch.cuda.Event.synchronize": (torch.cuda.Event, "synchronize"),
        }
        for method in ("__getitem__", "cpu", "numpy", "clone", "reshape", "contiguous", "to", "zero_", "detach",
                       "view", "sum", "__mul__", "__add__", "__sub__", "__truediv__", "unsqueeze"):
            watched[f"torch.Tensor.{method}"] = (torch.Tensor, method)
        self.watched = watched
        self.snapshot = {name: getattr(owner, attr) for name, (owner, attr) in watched.items()}
        self.code = {name: getattr(obj, "__code__", None) for name, obj in self.snapshot.items()}
        self.threads = {t.ident for t in threading.enumerate()}
        self.enumerate_threads = threading.enumerate
        self.modes = (getattr(torch._C, "_len_torch_function_stack", None), getattr(torch._C, "_len_torch_dispatch_stack", None))

    def violation(self):
        """Why the process is no longer the one the driver set up, or ""."""
        for name, (owner, attr) in self.watched.items():
            now = getattr(owner, attr, None)
            if now is not self.snapshot[name] or getattr(now, "__code__", None) is not self.code[name]:
                return f"it replaced {name} (patching the clock, the events, the input generators or tensors is not allowed)"
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in HARNESS_PACKAGES)
        if loaded:
            return f"it imported {loaded[0]}, a module of the evaluator (the reference and the harness are off limits)"
        for count in self.modes:
            if count is not None and count() != 0:
                return "a torch function or dispatch mode is active after the call (lazy evaluation is not allowed)"
        new = [t.name for t in self.enumerate_threads() if t.ident not in self.threads and t.is_alive()]
        if new:
            return f"it started a thread ({new[0]}); work on other threads escapes the timing and is not allowed"
        return ""


def _os_threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


class Driver:
    def __init__(self, job, torch, numpy, inputs):
        self.job, self.torch, self.np, self.generate = job, torch, numpy, inputs
        self.device = job["device"]
        self.calls = []
        self.captured = Captured(torch, numpy)
        self.urandom = os.urandom
        self.perf_ns = time.perf_counter_ns
        self.equal = torch.equal
        if self.device == "cuda":
            C = torch._C
            self.sync = C._cuda_synchronize
            self.stream = torch.cuda.current_stream()
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.record = C._CudaEventBase.record
            self.elapsed = C._CudaEventBase.elapsed_time
            l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 0)
            self.flush_buffer = torch.empty(max(2 * l2, 256 << 20) // 4, dtype=torch.float32, device="cuda")
        else:
            self.sync = lambda: None

    # -- one call ------------------------------------------------------------------------------

    def fresh_seed(self):
        return int.from_bytes(self.urandom(6), "little")

    def snapshot(self, data):
        x, mask, weights, config = data
        return (x.clone(), mask.clone(), {k: v.clone() for k, v in weights.items()}, dict(config), dict(weights))

    def mutated(self, data, snap):
        x, mask, weights, config = data
        sx, smask, sw, sconfig, sitems = snap
        if dict(config) != sconfig or set(weights) != set(sitems) or any(weights[k] is not v for k, v in sitems.items()):
            return "it changed its inputs (the config or weights dictionary)"
        for name, now, before in [("x", x, sx), ("mask", mask, smask)] + [(k, weights[k], sw[k]) for k in sw]:
            if now.shape != before.shape or not self.equal(now, before):
                return f"it mutated its input `{name}` in place (inputs must be left as they were given)"
        return ""

    def validate_output(self, out, shape):
        torch = self.torch
        if type(out) is not torch.Tensor:
            return f"it returned a {type(out).__module__}.{type(out).__qualname__}, not a plain torch.Tensor (tensor subclasses and lazy tensors are rejected)"
        if out.layout != torch.strided or out.is_meta:
            return f"it returned a tensor with layout {out.layout}{' on meta' if out.is_meta else ''}; a strided tensor with its values is required"
        functorch = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)
        functional = getattr(torch, "_is_functional_tensor", None)
        if (functorch is not None and functorch(out)) or (functional is not None and functional(out)):
            return "it returned a functional or functorch-wrapped tensor (lazy tensors are rejected)"
        if out.device.type != self.device:
            return f"it returned a tensor on {out.device}; the output must be on {self.device}"
        if out.dtype != torch.float32:
            return f"it returned dtype {str(out.dtype).replace('torch.', '')}; float32 is required"
        expected = (shape["bs"], shape["seqlen"], shape["seqlen"], shape["dim"])
        if tuple(out.shape) != expected:
            return f"it returned shape {list(out.shape)}; expected {list(expected)}"
        return ""

    def sample(self, out, x, test):
        """(pos_seed, full, values, x_values): positions drawn now, after the call returned."""
        torch, np = self.torch, self.np
        pos_seed = self.fresh_seed()
        rng = np.random.default_rng(pos_seed)
        numel = out.numel()
        full = numel <= self.job["full_check_elements"]
        with torch.no_grad():
            if full:
                values = out.detach().reshape(-1).cpu().numpy()
            else:
                flat = rng.integers(0, numel, self.job["sample_elements"]["test" if test else "timed"])
                idx = [torch.as_tensor(a, device=out.device) for a in np.unravel_index(flat, tuple(out.shape))]
                values = out.detach()[tuple(idx)].cpu().numpy()
            x_flat = rng.integers(0, x.numel(), self.job["x_sample_elements"])
            x_idx = [torch.as_tensor(a, device=x.device) for a in np.unravel_index(x_flat, tuple(x.shape))]
            x_values = x[tuple(x_idx)].cpu().numpy()
        return pos_seed, full, _b64(values), _b64(x_values)

    def call(self, fn, where, shape, seed, kind, timed=False):
        """One call on fresh inputs (a fresh seed when `seed` is None); returns its record, or raises Rejected."""
        set_name, shape_index = where
        seed = self.fresh_seed() if seed is None else int(seed)
        data = self.generate(**{**shape, "seed": seed}, device=self.device)
        snap = self.snapshot(data)
        stream_before = self.torch.cuda.current_stream() if self.device == "cuda" else None
        host_ms = ms = None
        if timed:
            self.flush_buffer.zero_()  # evict L2: the inputs come from memory, as in real use
            self.sync()
            h0 = self.perf_ns()
            self.record(self.start, self.stream)
            out = fn(data)
            self.record(self.end, self.stream)
            self.sync()
            host_ms = (self.perf_ns() - h0) / 1e6
            ms = self.elapsed(self.start, self.end)
        else:
            self.sync()
            out = fn(data)
            self.sync()
        why = self.captured.violation() or self.validate_output(out, shape)
        if not why and stream_before is not None and self.torch.cuda.current_stream() != stream_before:
            why = "it changed the current CUDA stream (work on other streams escapes the timing)"
        if why:
            raise Rejected(f"{kind} call on {set_name} shape {shape_index}: {why}")
        pos_seed, full, values, x_values = self.sample(out, data[0], kind in ("test", "check"))
        why = self.mutated(data, snap)
        if why:
            raise Rejected(f"{kind} call on {set_name} shape {shape_index}: {why}")
        record = {"kind": kind, "set": set_name, "shape": shape_index, "seed": seed, "pos_seed": pos_seed, "full": full,
                  "values": values, "x_values": x_values, "ms": ms, "host_ms": host_ms}
        self.calls.append(record)
        return record

    # -- timing of one benchmark shape ----------------------------------------------------------

    def empty_region_ms(self):
        """The host clock's overhead around an empty event-timed region (median of 21)."""
        gaps = []
        for _ in range(21):
            self.sync()
            h0 = self.perf_ns()
            self.record(self.start, self.stream)
            self.record(self.end, self.stream)
            self.sync()
            gaps.append((self.perf_ns() - h0) / 1e6 - self.elapsed(self.start, self.end))
        return sorted(gaps)[len(gaps) // 2]

    def flush_ms(self):
        times = []
        for _ in range(5):
            self.sync()
            self.record(self.start, self.stream)
            self.flush_buffer.zero_()
            self.record(self.end, self.stream)
            self.sync()
            times.append(self.elapsed(self.start, self.end))
        return sorted(times)[2]

    def benchmark(self, fn, index, shape):
        t = self.job["timing"]
        where = ("benchmarks", index)
        self.call(fn, where, shape, shape["seed"], "warmup")
        overhead = self.empty_region_ms()
        threads = _os_threads()
        times, host = [], []
        started = time.monotonic()
        while len(times) < t["max_calls"]:
            rec = self.call(fn, where, shape, None, "timed", timed=True)
            if _os_threads() > threads:
                raise Rejected(f"timed call on benchmarks shape {index}: it started a thread during the call")
            times.append(rec["ms"])
            host.append(rec["host_ms"])
            n = len(times)
            if n >= t["min_calls"]:
                mean = sum(times) / n
                std = (sum((v - mean) ** 2 for v in times) / (n - 1)) ** 0.5
                if std / n ** 0.5 < t["rel_err"] * mean or sum(times) > 1e3 * t["kernel_budget_s"] or time.monotonic() - started > t["wall_budget_s"]:
                    break
        n = len(times)
        mean = sum(times) / n
        host_mean = sum(host) / n - overhead
        limit = t["host_ratio"] * mean + t["host_slack_ms"]
        if host_mean > limit:
            raise Rejected(
                f"benchmarks shape {index}: the host clock saw {host_mean:.4f} ms per call around a synchronise, the CUDA "
                f"events {mean:.4f} ms: work ran outside the timed stream (another stream or thread)")
        batch_ms, flush = self.batch(fn, index, shape, t["batch_calls"])
        if batch_ms - flush > limit:
            raise Rejected(
                f"benchmarks shape {index}: a synchronised batch took {batch_ms - flush:.4f} ms per call by the host clock, "
                f"the CUDA events {mean:.4f} ms per call: work escaped the timed stream")
        std = (sum((v - mean) ** 2 for v in times) / (n - 1)) ** 0.5 if n > 1 else 0.0
        return {"shape": index, "calls": n, "mean_ms": mean, "std_ms": std, "best_ms": min(times),
                "worst_ms": max(times), "host_ms": host_mean, "empty_region_ms": overhead,
                "batch_ms": batch_ms, "flush_ms": flush}

    def batch(self, fn, index, shape, count):
        """Host-clock time per call of `count` calls on fresh inputs with one synchronise at the end."""
        seeds = [self.fresh_seed() for _ in range(count)]
        datas = [self.generate(**{**shape, "seed": seed}, device=self.device) for seed in seeds]
        flush = self.flush_ms()
        self.sync()
        h0 = self.perf_ns()
        out = None
        for data in datas:
            self.flush_buffer.zero_()
            out = fn(data)
        self.sync()
        per_call = (self.perf_ns() - h0) / 1e6 / count
        why = self.captured.violation() or self.validate_output(out, shape)
        if why:
            raise Rejected(f"batch call on benchmarks shape {index}: {why}")
        # Only the last output is checked: a kernel may legitimately reuse its output buffer.
        pos_seed, full, values, x_values = self.sample(out, datas[-1][0], False)
        self.calls.append({"kind": "batch", "set": "benchmarks", "shape": index, "seed": seeds[-1], "pos_seed": pos_seed, "full": full,
                           "values": values, "x_values": x_values, "ms": None, "host_ms": per_call})
        return per_call, flush


class Rejected(Exception):
    """A rule the candidate broke while it ran; the message is its reason."""


def _load_submission(source, workdir):
    import importlib.util

    path = os.path.join(workdir, "submission.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("submission", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = module
    spec.loader.exec_module(module)
    return module


def _error(prefix, err):
    tb = "".join(traceback.format_exception(type(err), err, err.__traceback__)[-6:])
    print(tb, file=sys.stderr, flush=True)
    lines = [line for line in tb.strip().splitlines() if line.strip()]
    return {"error": f"{prefix}: {lines[-1][:400] if lines else type(err).__name__}"}


def main(job):
    workdir = os.getcwd()
    os.environ.update({
        "TRITON_CACHE_DIR": os.path.join(workdir, "triton-cache"),  # fresh per candidate: nothing reused
        "TRITON_HOME": workdir,
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(workdir, "inductor-cache"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "CUDA_CACHE_DISABLE": "1",
    })
    if job["device"] == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # Triton's interpreter runs the kernels on CPU tensors
    sys.modules.pop("candidate", None)  # this module: out of the candidate's reach by import
    import numpy
    import torch
    import triton

    report = {"versions": {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0]},
              "triton_cache_dir": os.environ["TRITON_CACHE_DIR"], "calls": [], "benchmarks": []}
    if job["device"] == "cuda":
        if not torch.cuda.is_available():
            return {**report, "error": "no CUDA device is visible inside the sandbox (is the GPU device request working?)"}
        props = torch.cuda.get_device_properties(0)
        report["gpu"] = {"name": props.name, "memory_bytes": int(props.total_memory),
                         "sm_count": int(props.multi_processor_count), "capability": f"{props.major}.{props.minor}"}
        declared = job.get("gpu_type")
        if declared and declared.lower() not in props.name.lower():
            return {**report, "wrong_gpu": True,
                    "error": f"the GPU is {props.name}, but the pool declares {declared}; nothing was timed"}
    driver = Driver(job, torch, numpy, generate_input)  # noqa: F821  (inputs.py precedes this text)
    try:
        module = _load_submission(job["source"], workdir)
        fn = getattr(module, ENTRY, None)
        if not callable(fn):
            return {**report, "error": f"the kernel defines no function `{ENTRY}(data)`"}
    except BaseException as err:  # noqa: BLE001  (SystemExit too: the module never finished loading)
        return {**report, **_error("the kernel failed to import", err)}
    report["calls"] = driver.calls
    why = driver.captured.violation()
    if why:
        return {**report, "rejected": f"at import: {why}"}
    try:
        for i, shape in enumerate(job["tests"]):
            for j, seed in enumerate(job["test_seeds"][i]):  # None: a fresh seed (a repeat on new inputs)
                driver.call(fn, ("tests", i), shape, seed, "test" if j == 0 else "check")
        for i, shape in enumerate(job["benchmarks"]):
            report["benchmarks"].append(driver.benchmark(fn, i, shape))
    except Rejected as err:
        return {**report, "rejected": str(err)}
    except BaseException as err:  # noqa: BLE001
        return {**report, **_error("the kernel raised", err)}
    return report
