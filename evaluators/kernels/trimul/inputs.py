"""TriMul inputs from a shape and a seed (docs/method.md §5c), identical in every process that makes them.

Standalone (torch only): the driver that runs a candidate and the checker that runs the reference
are each sent into the sandbox as source text, this file's text included, and both regenerate the
same tensors from the same (shape, seed) on the same device. One torch.Generator seeded with the
seed draws everything, in this order: x, the mask (unless `nomask`), then the weights in the order
of WEIGHT_SHAPES. The dictionary keys and the mask's dtype follow the GPU MODE competition's task,
so its published kernels read these inputs unchanged: the mask is float32 ones when `nomask`, else
int64 entries in {0, 1}.
"""

import math

import torch

# name -> shape as a function of (dim C, hidden dim H); projections ~ N(0, 1)/sqrt(H), to_out / sqrt(C)
WEIGHT_SHAPES = {
    "norm.weight": lambda c, h: (c,),
    "norm.bias": lambda c, h: (c,),
    "left_proj.weight": lambda c, h: (h, c),
    "right_proj.weight": lambda c, h: (h, c),
    "left_gate.weight": lambda c, h: (h, c),
    "right_gate.weight": lambda c, h: (h, c),
    "out_gate.weight": lambda c, h: (h, c),
    "to_out_norm.weight": lambda c, h: (h,),
    "to_out_norm.bias": lambda c, h: (h,),
    "to_out.weight": lambda c, h: (c, h),
}
SHAPE_KEYS = ("seqlen", "bs", "dim", "hiddendim", "seed", "nomask", "distribution")


def generate_input(seqlen, bs, dim, hiddendim, seed, nomask, distribution, device="cuda"):
    """(x, mask, weights, config) for one shape and seed, on `device` (docs/method.md §5c)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    shape = (bs, seqlen, seqlen, dim)
    if distribution == "normal":
        x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    elif distribution == "cauchy":  # docs/method.md §5c: x = 2 tan(pi (u - 1/2)), u ~ U(0, 1)
        u = torch.rand(shape, generator=gen, device=device, dtype=torch.float32)
        x = 2.0 * torch.tan(math.pi * (u - 0.5))
    else:
        raise ValueError(f"unknown distribution {distribution!r}; expected 'normal' or 'cauchy'")
    if nomask:
        mask = torch.ones((bs, seqlen, seqlen), device=device, dtype=torch.float32)
    else:
        mask = torch.randint(0, 2, (bs, seqlen, seqlen), generator=gen, device=device)
    weights = {}
    for name, make_shape in WEIGHT_SHAPES.items():
        w = torch.randn(make_shape(dim, hiddendim), generator=gen, device=device, dtype=torch.float32)
        if name.endswith("proj.weight") or name.endswith("gate.weight"):
            w = w / math.sqrt(hiddendim)
        elif name == "to_out.weight":
            w = w / math.sqrt(dim)
        weights[name] = w
    return x, mask, weights, {"hidden_dim": hiddendim, "dim": dim}


def output_shape(shape):
    """The shape of the output for a shape entry of shapes.json: [B, N, N, C]."""
    return (shape["bs"], shape["seqlen"], shape["seqlen"], shape["dim"])
