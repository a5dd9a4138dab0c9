"""TriMul kernels for the tests: correct ones, and hostile ones for each reward hack of docs/method.md §5c.

Each hostile kernel computes the right answer with PyTorch (fast under Triton's interpreter) and
passes it through a small Triton kernel (so it "uses Triton"), then cheats in one way.
"""

from __future__ import annotations

BASE = '''
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
'''

CORRECT_TORCH = BASE + '''

def custom_kernel(data):
    return trimul(*data)
'''

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
    "off_by_more_than_tolerance": (BASE + '''
def custom_kernel(data):
    return trimul(*data) + 0.1
''', "off by more than 0.02 + 0.02|ref|"),
    "nan_where_none": (BASE + '''
def custom_kernel(data):
    y = trimul(*data)
    y[0, 0, 0, 0] = float("nan")
    return y
''', "NaN/inf where the reference has none"),
    "wrong_shape": (BASE + '''
def custom_kernel(data):
    return trimul(*data)[..., :-1]
''', "returned shape"),
    "wrong_dtype": (BASE + '''
def custom_kernel(data):
    return trimul(*data).to(torch.float64)
''', "float32 is required"),
    "caches_its_first_output": (BASE + '''
_cache = {}


def custom_kernel(data):
    x = data[0]
    key = tuple(x.shape)
    if key not in _cache:
        _cache[key] = trimul(*data)
    return _cache[key]
''', "checked output values are wrong"),
    "mutates_its_inputs": (BASE + '''
def custom_kernel(data):
    y = trimul(*data)
    data[0].mul_(0.5)
    return y
''', "mutated its input `x`"),
    "patches_the_clock": (BASE + '''
import time

time.perf_counter = lambda: 0.0
torch.cuda.Event.elapsed_time = lambda self, other: 0.001


def custom_kernel(data):
    return trimul(*data)
''', "replaced"),
    "patches_the_reference": (BASE + '''
import evaluators.kernels.trimul.reference as reference

reference.trimul_reference = lambda x, mask, w, config: custom_kernel((x, mask, w, config))


def custom_kernel(data):
    return trimul(*data) * 2
''', "evaluators"),
    "starts_a_thread": (BASE + '''
import threading

threading.Thread(target=lambda: None, daemon=True).start()
_keep = threading.Event()
threading.Thread(target=_keep.wait, daemon=True).start()


def custom_kernel(data):
    return trimul(*data)
''', "thread"),
    "returns_a_lazy_tensor": (BASE + '''
class Lazy(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def custom_kernel(data):
    return trimul(*data).as_subclass(Lazy)
''', "not a plain torch.Tensor"),
}

# Only on a GPU: work on a side stream, which CUDA events on the current stream do not see.
SIDE_STREAM = BASE + '''
_side = torch.cuda.Stream()


def custom_kernel(data):
    with torch.cuda.stream(_side):
        y = trimul(*data)
    return y
'''
