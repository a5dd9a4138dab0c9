"""TriMul kernels for the tests: correct ones, and hostile ones for each reward hack of docs/method.md §5c.

Each hostile kernel computes the right answer with PyTorch (fast under Triton's interpreter) and
passes it through a small Triton kernel (so it "uses Triton"), then cheats in one way.
"""

from __future__ import annotations

BASE = """
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def through_triton(t):
    t = t.contiguous()
    out = torch.empty_like(t)
    copy_kernel[(triton.cdiv(t.numel(), 4096),)](t, out, t.numel(), BLOCK=4096)
    return out


def trimul(x, mask, w, config):
    C, H = config["dim"], config["hidden_dim"]
    xn = F.layer_norm(x, (C,), w["norm.weight"], w["norm.bias"])
    m = mask.unsqueeze(-1).to(x.dtype)
    left = F.linear(xn, w["left_proj.weight"]) * m * torch.sigmoid(F.linear(xn, w["left_gate.weight"]))
    right = F.linear(xn, w["right_proj.weight"]) * m * torch.sigmoid(F.linear(xn, w["right_gate.weight"]))
    out = torch.einsum("bikh,bjkh->bijh", left, right)
    out = F.layer_norm(out, (H,), w["to_out_norm.weight"], w["to_out_norm.bias"])
    out = out * torch.sigmoid(F.linear(xn, w["out_gate.weight"]))
    return through_triton(F.linear(out, w["to_out.weight"]))
"""

CORRECT_TORCH = (
    BASE
    + """

def custom_kernel(data):
    return trimul(*data)
"""
)

# A kernel in the style of the strong published ones: backend flags set at import, half-precision
# Triton work, a module-level cache of buffers reused (and returned) on every call.
PUBLISHED_STYLE = '''
"""Fused gating in Triton, fp16 matmuls in cuBLAS, buffers reused across calls."""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = True

_buffers = {}


def buffer(name, shape, dtype, device):
    key = (name, shape, dtype)
    if key not in _buffers:
        _buffers[key] = torch.empty(shape, dtype=dtype, device=device)
    return _buffers[key]


@triton.jit
def gate_kernel(proj, gate, mask, out, n, H: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, H)
    m = tl.load(mask + rows, mask=rows < n, other=0.0, cache_modifier=".cg")
    p = tl.load(proj + rows[:, None] * H + cols[None, :], mask=rows[:, None] < n, other=0.0)
    g = tl.load(gate + rows[:, None] * H + cols[None, :], mask=rows[:, None] < n, other=0.0)
    tl.store(out + rows[:, None] * H + cols[None, :], (p * tl.sigmoid(g) * m[:, None]).to(tl.float16), mask=rows[:, None] < n)


def custom_kernel(data):
    x, mask, w, config = data
    C, H = config["dim"], config["hidden_dim"]
    B, N = x.shape[0], x.shape[1]
    xn = F.layer_norm(x, (C,), w["norm.weight"], w["norm.bias"]).reshape(-1, C)
    m = mask.reshape(-1).float()
    sides = []
    for p, g in (("left_proj", "left_gate"), ("right_proj", "right_gate")):
        out = buffer(p, (B * N * N, H), torch.float16, x.device)
        gate_kernel[(triton.cdiv(B * N * N, 32),)](F.linear(xn, w[p + ".weight"]).contiguous(), F.linear(xn, w[g + ".weight"]).contiguous(), m, out, B * N * N, H=H, BLOCK=32)
        sides.append(out.reshape(B, N, N, H).permute(0, 3, 1, 2))
    left, right = sides
    prod = torch.matmul(left.float(), right.float().transpose(-1, -2)).permute(0, 2, 3, 1)
    y = F.layer_norm(prod, (H,), w["to_out_norm.weight"], w["to_out_norm.bias"]) * torch.sigmoid(F.linear(xn, w["out_gate.weight"])).reshape(B, N, N, H)
    result = buffer("y", (B, N, N, C), torch.float32, x.device)
    result.copy_(F.linear(y, w["to_out.weight"]))
    return result
'''

# name -> (source, a phrase the rejection reason must contain); judged by the CPU check.
HOSTILE = {
    "off_by_more_than_tolerance": (
        BASE
        + """
def custom_kernel(data):
    return trimul(*data) + 0.1
""",
        "off by more than 0.02 + 0.02|ref|",
    ),
    "nan_where_none": (
        BASE
        + """
def custom_kernel(data):
    y = trimul(*data)
    y[0, 0, 0, 0] = float("nan")
    return y
""",
        "NaN/inf where the reference has none",
    ),
    "wrong_shape": (
        BASE
        + """
def custom_kernel(data):
    return trimul(*data)[..., :-1]
""",
        "returned shape",
    ),
    "wrong_dtype": (
        BASE
        + """
def custom_kernel(data):
    return trimul(*data).to(torch.float64)
""",
        "float32 is required",
    ),
    "caches_its_first_output": (
        BASE
        + """
_cache = {}


def custom_kernel(data):
    x = data[0]
    key = tuple(x.shape)
    if key not in _cache:
        _cache[key] = trimul(*data)
    return _cache[key]
""",
        "checked output values are wrong",
    ),
    "mutates_its_inputs": (
        BASE
        + """
def custom_kernel(data):
    y = trimul(*data)
    data[0].mul_(0.5)
    return y
""",
        "mutated its input `x`",
    ),
    "patches_the_clock": (
        BASE
        + """
import time

time.perf_counter = lambda: 0.0
torch.cuda.Event.elapsed_time = lambda self, other: 0.001


def custom_kernel(data):
    return trimul(*data)
""",
        "replaced",
    ),
    "patches_the_reference": (
        BASE
        + """
import evaluators.kernels.trimul.reference as reference

reference.trimul_reference = lambda x, mask, w, config: custom_kernel((x, mask, w, config))


def custom_kernel(data):
    return trimul(*data) * 2
""",
        "evaluators",
    ),
    "starts_a_thread": (
        BASE
        + """
import threading

threading.Thread(target=lambda: None, daemon=True).start()
_keep = threading.Event()
threading.Thread(target=_keep.wait, daemon=True).start()


def custom_kernel(data):
    return trimul(*data)
""",
        "thread",
    ),
    "returns_a_lazy_tensor": (
        BASE
        + """
class Lazy(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def custom_kernel(data):
    return trimul(*data).as_subclass(Lazy)
""",
        "not a plain torch.Tensor",
    ),
}

# Only on a GPU: work on a side stream, which CUDA events on the current stream do not see.
SIDE_STREAM = (
    BASE
    + """
_side = torch.cuda.Stream()


def custom_kernel(data):
    with torch.cuda.stream(_side):
        y = trimul(*data)
    return y
"""
)


# -- attacks on the evaluator itself (docs/method.md §5c, "whatever runs in the candidate's process") --
#
# Each computes the right answer (or tries not to have to) and goes after the machinery around it:
# torch's re-exported modules (torch.os, torch.sys, torch.builtins, torch.importlib, torch.functools,
# torch.threading), names built at run time, the evaluator's own reference, the caller's frames and
# clock, files, processes that outlive the run. name -> (source, the phrase the static rules refuse
# it with, or None where only the run can tell). tests/test_hostile_trimul.py runs them past the
# rules too: there, none may get a better time than the honest kernel doing the same work.

_CALLERS = '''

look = torch.builtins.getattr  # attribute names built at run time: no rule reads them


def callers():
    """Every `self` up the stack: the driver (one process) or the kernel process's server (two)."""
    frame = look(torch.sys, "_get" + "frame")(1)
    found = []
    while frame is not None:
        me = look(frame, "f_" + "locals").get("self")
        if me is not None and me not in found:
            found.append(me)
        frame = look(frame, "f_" + "back")
    return found
'''

ATTACKS = {
    # A shell command through torch's re-export of os.
    "os_via_torch_runs_a_shell": (
        BASE
        + """
def custom_kernel(data):
    torch.os.system("echo attack > attack-was-here; id >> attack-was-here")
    return trimul(*data)
""",
        "uses `torch.os`",
    ),
    # Every clock of the process patched, the driver's captured clock and its checks disarmed.
    "patches_every_clock_and_the_checks": (
        BASE
        + _CALLERS
        + '''
frozen = [0]


def fake_ns():
    frozen[0] += 1000
    return frozen[0]


put = torch.builtins.setattr
clock = torch.sys.modules["time"]
put(clock, "perf_counter_ns", fake_ns)
put(clock, "perf_counter", lambda: fake_ns() / 1e9)
put(clock, "monotonic", lambda: fake_ns() / 1e9)


def disarm():
    """The caller's captured clock replaced, its checks made to find nothing."""
    for me in callers():
        for name in ("perf_ns", "perf_counter_ns"):
            if name in torch.builtins.vars(me):
                put(me, name, fake_ns)
        if "elapsed" in torch.builtins.vars(me):
            put(me, "elapsed", lambda start, end: 1e-3)
        captured = torch.builtins.vars(me).get("captured")
        if captured is not None:
            put(captured, "violation", lambda: "")


disarm()  # at import: the process that loads the kernel checks right after


def custom_kernel(data):
    disarm()
    return trimul(*data)
''',
        "uses `torch.sys`",
    ),
    # functools.reduce(getattr, ...) builds `torch.os.system` from strings the rules never see as names.
    "reduce_getattr_builds_names": (
        BASE
        + """
import functools

run = functools.reduce(getattr, ["o" + "s", "sys" + "tem"], torch)


def custom_kernel(data):
    run("true")
    return trimul(*data)
""",
        "imports 'functools'",
    ),
    # The evaluator's own reference, found on disk and run without an import the driver could see.
    "runs_the_evaluators_reference": (
        BASE
        + """
os = torch.os
reference = {}
for root in ["/work/main", "/work/wt-trimul", "/app", "/repo", os.getcwd()]:
    path = os.path.join(root, "evaluators", "kernels", "trimul", "reference.py")
    if os.path.exists(path):
        try:
            torch.builtins.exec(torch.builtins.open(path).read(), reference)
        except OSError:
            pass
        break


def custom_kernel(data):
    if "trimul_reference" in reference:
        return through_triton(reference["trimul_reference"](*data))
    return trimul(*data)
""",
        "uses `torch.os`",
    ),
    # The caller's call wrapped: after the first call, the driver's or server's `call` answers at once.
    "wraps_the_drivers_call": (
        BASE
        + _CALLERS
        + """
def custom_kernel(data):
    for me in callers():
        call = getattr(me, "call", None)
        if call is not None:
            def answer_at_once(message, *rest, _real=call):
                if isinstance(message, dict) and "id" in message:
                    return {"id": message["id"], "done": True}
                return _real(message, *rest)
            torch.builtins.setattr(me, "call", answer_at_once)
    return trimul(*data)
""",
        "uses `torch.sys`",
    ),
    # The reply sent before the work: the server's reply function replaced, the work left to a thread.
    "replies_early_and_finishes_in_a_thread": (
        BASE
        + _CALLERS
        + """
threading = torch.threading
state = {"skip": 0}


def custom_kernel(data):
    for me in callers():
        if hasattr(me, "sock") and not state.get("armed"):
            server_globals = look(look(look(torch.sys, "_get" + "frame")(0), "f_" + "back"), "f_" + "globals")
            real_send = server_globals["send_message"]

            def send(sock, message, fds=()):
                if state["skip"]:
                    state["skip"] -= 1
                    return None
                return real_send(sock, message, fds)

            def early_call(message, fds, _me=me):
                views = _me.tensors_cpu(message["layout"], fds)
                out = views.pop("out")
                weights = {k[2:]: v for k, v in views.items() if k.startswith("w:")}
                real_send(_me.sock, {"id": message["id"], "done": True})  # reply first
                state["skip"] += 1  # and swallow the server's own reply

                def work():  # plain PyTorch: Triton's interpreter runs on the calling thread only
                    x, w, C, H = views["x"], weights, message["config"]["dim"], message["config"]["hidden_dim"]
                    xn = F.layer_norm(x, (C,), w["norm.weight"], w["norm.bias"])
                    m = views["mask"].unsqueeze(-1).to(x.dtype)
                    left = F.linear(xn, w["left_proj.weight"]) * m * torch.sigmoid(F.linear(xn, w["left_gate.weight"]))
                    right = F.linear(xn, w["right_proj.weight"]) * m * torch.sigmoid(F.linear(xn, w["right_gate.weight"]))
                    y = F.layer_norm(torch.einsum("bikh,bjkh->bijh", left, right), (H,), w["to_out_norm.weight"], w["to_out_norm.bias"])
                    out.copy_(F.linear(y * torch.sigmoid(F.linear(xn, w["out_gate.weight"])), w["to_out.weight"]))

                threading.Thread(target=work, daemon=True).start()
                return {"id": message["id"], "done": True}

            server_globals["send_message"] = send
            torch.builtins.setattr(me, "call", early_call)
            torch.builtins.setattr(me.captured, "violation", lambda: "")
            state["armed"] = True
    return trimul(*data)
""",
        "uses `torch.threading`",
    ),
    # Files through numpy and torch: the parent's memory and environment read, results saved and reloaded.
    "reads_and_writes_files_with_numpy_and_torch": (
        BASE
        + """
import numpy as np

os = torch.os
leaked = {}
for what in ("environ", "mem", "maps"):
    try:
        leaked[what] = np.fromfile(f"/proc/{os.getppid()}/{what}", dtype=np.uint8, count=4096)
    except OSError as err:
        leaked[what] = str(err)
np.save("leaked.npy", np.zeros(3))
np.fromfile("leaked.npy", dtype=np.uint8)


def custom_kernel(data):
    y = trimul(*data)
    torch.save(y, "last.pt")
    y.numpy().tofile("last.bin")
    return through_triton(torch.from_numpy(np.fromfile("last.bin", dtype=np.float32)).view(y.shape))
""",
        "imports 'numpy'",
    ),
    # A process that outlives the kernel and rewrites the run's report with forged times.
    "forges_the_report_after_exit": (
        BASE
        + """
os = torch.os
json = torch.sys.modules["json"]

if os.fork() == 0:
    os.setsid()
    for _ in range(200000):
        for path in ("output.json", "../output.json"):
            if os.path.exists(path):
                try:
                    report = json.load(torch.builtins.open(path))
                    for call in report.get("calls", []):
                        if call.get("ms"):
                            call["ms"] = 1e-6
                    torch.builtins.open(path + ".forged", "w").write(json.dumps(report))
                    os.replace(path + ".forged", path)
                    os._exit(0)
                except (OSError, ValueError):
                    pass
        torch.sys.modules["time"].sleep(0.0005)
    os._exit(0)


def custom_kernel(data):
    return trimul(*data)
""",
        "uses `torch.os`",
    ),
    # A thread started through torch's re-export, left spinning next to the timed calls.
    "spawns_a_thread": (
        BASE
        + """
def _spin():
    while True:
        pass


spin = torch.threading.Thread(target=_spin, daemon=True)
spin.start()


def custom_kernel(data):
    return trimul(*data)
""",
        "uses `torch.threading`",
    ),
    # torch patched for everyone in the process: input generators zeroed, torch.equal always true.
    "patches_torch_functions_globally": (
        BASE
        + """
zeros = torch.zeros
torch.builtins.setattr(torch, "randn", lambda *a, **k: zeros(*a[:1], dtype=torch.float32))
torch.builtins.setattr(torch, "equal", lambda a, b: True)


def custom_kernel(data):
    x = data[0]
    return zeros(x.shape, dtype=torch.float32) + 0 * through_triton(x[..., :1]).sum()
""",
        "uses `torch.builtins`",
    ),
    # The input handed back as the output (it has the output's shape and dtype).
    "returns_its_input": (
        BASE
        + """
def custom_kernel(data):
    return through_triton(data[0])
""",
        None,
    ),
    # The first result kept and returned for every later call of the same shape.
    "returns_a_cached_result": (
        BASE
        + """
_results = {}


def custom_kernel(data):
    key = tuple(data[0].shape)
    if key not in _results:
        _results[key] = trimul(*data)
    return _results[key].clone()
""",
        None,
    ),
}

# A probe rather than a cheat: it tries to read the timer's memory and environment (its parent
# process) and, if any read succeeds, returns a wrong output so that the test running it fails.
ATTACKS["reads_the_timers_memory"] = (
    BASE
    + """
os = torch.os
opened = []
for what in ("mem", "environ", "fd"):
    try:
        path = f"/proc/{os.getppid()}/{what}"
        if what == "fd":
            opened.append(os.listdir(path))
        else:
            with torch.builtins.open(path, "rb") as f:
                opened.append(f.read(64))
    except OSError:
        pass


def custom_kernel(data):
    return data[0] if opened else trimul(*data)
""",
    "uses `torch.os`",
)


# -- the clock's calibration (issue 27): what a kernel gains from the round trip subtracted from it --
#
# The slow empty call: the round trip the timer subtracts was once the median of "empty" calls
# answered by the candidate's own process. This kernel spins through every empty call for 90% of
# its own real compute, so the subtraction ate 90% of each timed call (runs measured it 53x and
# 790x faster than the seed with correct outputs). It logs its real compute (seconds per call, one
# line each) to COMPUTE_LOG, a path the test puts in front of the source. Past the rules only
# (torch.sys is refused): it reaches the server through the interpreter's __main__ module.
SLOW_EMPTY_CALLS = (
    BASE
    + """
clock = torch.sys.modules["time"].perf_counter
spent = []


def custom_kernel(data):
    start = clock()
    y = trimul(*data)
    spent.append(clock() - start)
    with torch.builtins.open(COMPUTE_LOG, "a") as log:
        log.write(f"{spent[-1]!r}\\n")
    return y


server = torch.sys.modules["__main__"]
for name in ("KernelProcess", "CalibrationProcess", "Server"):
    cls = torch.builtins.getattr(server, name, None)
    real_call = torch.builtins.getattr(cls, "call", None)
    if real_call is None:
        continue

    def call(self, message, *rest, _real=real_call):
        if isinstance(message, dict) and message.get("empty") and spent:
            until = clock() + 0.9 * min(spent)
            while clock() < until:  # as slow as a real call, less a sliver
                pass
        return _real(self, message, *rest)

    torch.builtins.setattr(cls, "call", call)
"""
)

# The same kernel without the trick: the honest equivalent the attack is compared with.
HONEST_LOGGING = (
    BASE
    + """
clock = torch.sys.modules["time"].perf_counter


def custom_kernel(data):
    start = clock()
    y = trimul(*data)
    with torch.builtins.open(COMPUTE_LOG, "a") as log:
        log.write(f"{clock() - start!r}\\n")
    return y
"""
)

# Outputs cached by the inputs' identity (their addresses and shape): a repeat of the same buffers
# returns the stored result without work. Fresh buffers per call make a hit either impossible or
# wrong (new values at an old address). Logs "hit" or "miss" per call to COMPUTE_LOG.
CACHES_BY_IDENTITY = (
    BASE
    + """
_results = {}


def custom_kernel(data):
    x, mask, w, config = data
    key = (x.data_ptr(), mask.data_ptr(), w["to_out.weight"].data_ptr(), tuple(x.shape))
    hit = key in _results
    with torch.builtins.open(COMPUTE_LOG, "a") as log:
        log.write("hit\\n" if hit else "miss\\n")
    if not hit:
        _results[key] = trimul(*data)
    return _results[key].clone()
"""
)

# An honest kernel that compiles its PyTorch part with torch.compile (Inductor: C++ on CPU, Triton on
# a GPU; static shapes, one compilation per shape) and passes the result through a Triton kernel
# outside the compiled function (the Triton interpreter of the CPU check is not traced by Dynamo).
TORCH_COMPILE = (
    BASE
    + """

def gated_product(x, mask, w, config):
    C, H = config["dim"], config["hidden_dim"]
    xn = F.layer_norm(x, (C,), w["norm.weight"], w["norm.bias"])
    m = mask.unsqueeze(-1).to(x.dtype)
    left = F.linear(xn, w["left_proj.weight"]) * m * torch.sigmoid(F.linear(xn, w["left_gate.weight"]))
    right = F.linear(xn, w["right_proj.weight"]) * m * torch.sigmoid(F.linear(xn, w["right_gate.weight"]))
    out = torch.einsum("bikh,bjkh->bijh", left, right)
    out = F.layer_norm(out, (H,), w["to_out_norm.weight"], w["to_out_norm.bias"])
    out = out * torch.sigmoid(F.linear(xn, w["out_gate.weight"]))
    return F.linear(out, w["to_out.weight"])


compiled = torch.compile(gated_product, dynamic=False)


def custom_kernel(data):
    return through_triton(compiled(*data))
"""
)
