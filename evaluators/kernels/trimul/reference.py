"""The TriMul reference (docs/method.md §5c) and the tolerance check, in float32 with TF32 off.

Standalone (torch only): it is part of the checker program's text and runs only in the checker's
process, which never imports a candidate; no candidate ever sees this function or its outputs.
"""

import torch
import torch.nn.functional as F

ATOL = 2e-2  # docs/method.md §5c: an element is correct when |out - ref| <= ATOL + RTOL |ref|
RTOL = 2e-2
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, as in the competition's reference


def strict_float32() -> None:
    """Full float32 matmuls: TF32 off for cuBLAS and cuDNN (docs/method.md §5c)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


@torch.no_grad()
def trimul_reference(x, mask, weights, config):
    """The outgoing triangle multiplicative update, forward only (docs/method.md §5c)."""
    w = weights
    dim, hidden = config["dim"], config["hidden_dim"]
    xn = F.layer_norm(x, (dim,), w["norm.weight"], w["norm.bias"], LAYER_NORM_EPS)  # x' = LayerNorm(x)
    m = mask.unsqueeze(-1).to(x.dtype)
    left = F.linear(xn, w["left_proj.weight"]) * m * torch.sigmoid(F.linear(xn, w["left_gate.weight"]))
    right = F.linear(xn, w["right_proj.weight"]) * m * torch.sigmoid(F.linear(xn, w["right_gate.weight"]))
    out = torch.einsum("bikh,bjkh->bijh", left, right)  # out[b,i,j,:] = sum_k left[b,i,k,:] right[b,j,k,:]
    del left, right
    gated = F.layer_norm(out, (hidden,), w["to_out_norm.weight"], w["to_out_norm.bias"], LAYER_NORM_EPS)
    gated = gated * torch.sigmoid(F.linear(xn, w["out_gate.weight"]))
    return F.linear(gated, w["to_out.weight"])  # y = (LayerNorm_H(out) * sigmoid(x' Wog^T)) Wout^T


def mismatches(got, ref):
    """(count, first flat index or -1, max error over finite pairs) of elements that fail docs/method.md §5c:
    |got - ref| > ATOL + RTOL |ref|, or NaN/inf where the reference has none (or the reverse)."""
    got = got.to(torch.float32)
    ref = ref.to(torch.float32)
    both_finite = torch.isfinite(got) & torch.isfinite(ref)
    same_nonfinite = (torch.isnan(got) & torch.isnan(ref)) | (torch.isinf(got) & torch.isinf(ref) & (torch.sign(got) == torch.sign(ref)))
    err = torch.where(both_finite, (got - ref).abs(), torch.zeros_like(ref))
    bad = torch.where(both_finite, err > ATOL + RTOL * ref.abs(), ~same_nonfinite)
    count = int(bad.sum())
    first = int(torch.nonzero(bad.reshape(-1))[0, 0]) if count else -1
    return count, first, float(err.max()) if err.numel() else 0.0
