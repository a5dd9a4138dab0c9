"""TriMul, plain and unoptimised: PyTorch for the norms, projections and gates, and a textbook
tiled Triton matmul for the triangle product out[b,i,j,h] = sum_k left[b,i,k,h] right[b,j,k,h],
one (batch, channel) pair per program row, in full float32."""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def triangle_matmul_kernel(
    left_ptr, right_ptr, out_ptr, N, H,
    s_lb, s_li, s_lk, s_lh,
    s_rb, s_rj, s_rk, s_rh,
    s_ob, s_oi, s_oj, s_oh,
    BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr,
):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    j = tl.program_id(2) * BLOCK_J + tl.arange(0, BLOCK_J)
    acc = tl.zeros((BLOCK_I, BLOCK_J), dtype=tl.float32)
    for k0 in range(0, N, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(left_ptr + b * s_lb + h * s_lh + i[:, None] * s_li + k[None, :] * s_lk,
                    mask=(i[:, None] < N) & (k[None, :] < N), other=0.0)
        c = tl.load(right_ptr + b * s_rb + h * s_rh + j[None, :] * s_rj + k[:, None] * s_rk,
                    mask=(j[None, :] < N) & (k[:, None] < N), other=0.0)
        acc += tl.dot(a, c, input_precision="ieee")
    tl.store(out_ptr + b * s_ob + h * s_oh + i[:, None] * s_oi + j[None, :] * s_oj, acc,
             mask=(i[:, None] < N) & (j[None, :] < N))


def triangle_product(left, right):
    bs, n, _, h = left.shape
    out = torch.empty_like(left)
    block = 32
    grid = (bs * h, triton.cdiv(n, block), triton.cdiv(n, block))
    triangle_matmul_kernel[grid](
        left, right, out, n, h,
        *left.stride(), *right.stride(), *out.stride(),
        BLOCK_I=block, BLOCK_J=block, BLOCK_K=block,
    )
    return out


def custom_kernel(data):
    x, mask, w, config = data
    dim, hidden = config["dim"], config["hidden_dim"]
    xn = F.layer_norm(x, (dim,), w["norm.weight"], w["norm.bias"])
    m = mask.unsqueeze(-1).to(x.dtype)
    left = F.linear(xn, w["left_proj.weight"]) * m * torch.sigmoid(F.linear(xn, w["left_gate.weight"]))
    right = F.linear(xn, w["right_proj.weight"]) * m * torch.sigmoid(F.linear(xn, w["right_gate.weight"]))
    out = triangle_product(left.contiguous(), right.contiguous())
    out = F.layer_norm(out, (hidden,), w["to_out_norm.weight"], w["to_out_norm.bias"])
    out = out * torch.sigmoid(F.linear(xn, w["out_gate.weight"]))
    return F.linear(out, w["to_out.weight"])
