"""The problem text `d` of TriMul, in our words (docs/method.md §5c); problem.py fills in the live values."""

TEMPLATE = """\
Write a fast GPU kernel, in Python with Triton, for the "outgoing" triangle multiplicative update of
AlphaFold3 (forward pass only). Your module must define

    custom_kernel(data) -> torch.Tensor,   data = (x, mask, weights, config)

- x: float32 [B, N, N, C] on the GPU, contiguous
- mask: [B, N, N] of 0/1 values (float32 ones when there is no mask, int64 otherwise)
- weights: a dict of float32 tensors: "norm.weight", "norm.bias" [C]; "left_proj.weight",
  "right_proj.weight", "left_gate.weight", "right_gate.weight", "out_gate.weight" [H, C];
  "to_out_norm.weight", "to_out_norm.bias" [H]; "to_out.weight" [C, H]
- config: {{"dim": C, "hidden_dim": H}}

and return y, float32 [B, N, N, C], equal to this PyTorch reference (LayerNorm eps 1e-5):

```python
def reference(x, mask, w, config):
    C, H = config["dim"], config["hidden_dim"]
    xn = F.layer_norm(x, (C,), w["norm.weight"], w["norm.bias"])
    m = mask.unsqueeze(-1).float()
    left = F.linear(xn, w["left_proj.weight"]) * m * torch.sigmoid(F.linear(xn, w["left_gate.weight"]))
    right = F.linear(xn, w["right_proj.weight"]) * m * torch.sigmoid(F.linear(xn, w["right_gate.weight"]))
    out = torch.einsum("bikh,bjkh->bijh", left, right)   # sum over k of left[b,i,k,:] * right[b,j,k,:]
    out = F.layer_norm(out, (H,), w["to_out_norm.weight"], w["to_out_norm.bias"])
    out = out * torch.sigmoid(F.linear(xn, w["out_gate.weight"]))
    return F.linear(out, w["to_out.weight"])
```

Correctness: on each of {tests} test shapes (N from 32 to 1024, B 1 or 2, C from 128 to 768, H = 128;
x drawn from a normal or a heavy-tailed Cauchy distribution; with and without a mask) and on every
timed call, every element of y must be within 2e-2 + 2e-2 * |reference| of the float32 reference
(computed with TF32 off), and NaN or inf may appear only where the reference has them.
Speed: each of the {benchmarks} benchmark shapes below is called many times, each time on new inputs
and after the L2 cache is flushed, and timed from outside the kernel's process (less the harness's
own round trip, measured with a kernel that does nothing); its runtime is the mean.
Benchmark shapes (B, N, C, H, distribution, mask):
{benchmark_list}
Reward: {scale:g} / (geometric mean of the {benchmarks} runtimes in microseconds); higher is better, and
0 for a kernel that fails any check. For scale: the best human kernel on an H100 took 1371.1 us
(reward {human:.3f}), and the aim is under 1000 us (reward {target:.2f}).

Environment: {gpu}, PyTorch {torch}, Triton {triton}. You may compute in lower precision inside (fp16,
bf16, tf32), fuse freely and call PyTorch for parts of the work, but at least part of it must run in
a @triton.jit kernel, and the result must be float32. Every evaluation starts with empty Triton and
Inductor caches, so compilation and autotuning happen again each time (they are not timed).

Rules; a kernel that breaks one gets 0:
- import only torch, torch.nn, torch.nn.functional, triton, triton.language, math and typing, and
  use only their tensor-programming names (torch.empty, torch.einsum, F.layer_norm, tl.load,
  tl.dot, triton.cdiv, ...; not torch.os, torch.sys or other modules they happen to hold);
- name modules only at the start of an attribute chain (`torch.einsum`, never `m = torch`);
- no names or attributes starting with "_", no getattr/setattr/eval/exec/compile/open/globals/vars,
  no other CUDA streams, threads, processes, events or clocks, no tensor subclasses or special
  methods such as __torch_function__, no files, no native extensions or unpickling;
- torch.compile is allowed with its function and the keywords fullgraph, dynamic, disable, mode and
  backend ("inductor", "eager" or "aot_eager"); not with options=;
- do not change attributes of modules or library objects; setting the flags of
  torch.backends.cuda.matmul and torch.backends.cudnn is allowed;
- leave the inputs unchanged (no in-place writes to x, mask or the weights), return a plain tensor
  (not a view of some lazy computation), and do not reuse results across calls: every call gets
  fresh inputs and is checked;
- a runtime faster than the GPU's memory bandwidth or peak compute allows is rejected.
The evaluation of one kernel may take at most {timeout:g} s.

Answer with one ```python block holding the whole module, starting with a short docstring that says
how the kernel works."""
