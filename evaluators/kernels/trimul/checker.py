"""The checker: judges the samples a driver sent out, in a process that never imports a candidate.

Sent into the sandbox as source text after inputs.py and reference.py (trusted code, run the same
way as a candidate for the same image, torch and GPU); the sandbox's harness calls `main(job)`.
For every call the driver made, it regenerates the inputs from the call's seed on the same device,
computes the reference (float32, TF32 off), draws the same positions from the call's position seed
and compares: the output within 2e-2 + 2e-2 |ref| with NaN/inf exactly where the reference has
them (reference.py), and x bit for bit (an input the candidate changed in place shows here even if
the driver was subverted). It answers with the first failure and the count of calls checked.
"""

import base64


def _decode(text, numpy):
    return numpy.frombuffer(base64.b64decode(text), dtype="<f4")


def _where(shape, flat_index):
    """[b, i, j, c] of a flat index into an output of `shape`."""
    dims = (shape["bs"], shape["seqlen"], shape["seqlen"], shape["dim"])
    out = []
    for d in reversed(dims):
        out.append(flat_index % d)
        flat_index //= d
    return list(reversed(out))


def check_call(call, shape, job, torch, numpy, cache):
    """ "" when the call's samples agree with the reference, else why not."""
    key = (call["set"], call["shape"], call["seed"])
    if key not in cache:
        cache.clear()  # one reference at a time: the largest outputs take gigabytes
        data = generate_input(**{**shape, "seed": call["seed"]}, device=job["device"])  # noqa: F821 (inputs.py)
        cache[key] = (data[0].reshape(-1), trimul_reference(*data).reshape(-1))  # noqa: F821 (reference.py)
    x, ref = cache[key]
    label = f"{call['kind']} call on {call['set']} shape {call['shape']} (seed {call['seed']})"
    rng = numpy.random.default_rng(call["pos_seed"])
    got = torch.from_numpy(_decode(call["values"], numpy).copy()).to(ref.device)
    if call["full"]:
        flat = None
        expected = ref
    else:
        kind = "test" if call["kind"] in ("test", "check") else "timed"
        flat = rng.integers(0, ref.numel(), job["sample_elements"][kind])
        expected = ref[torch.as_tensor(flat, device=ref.device)]
    if got.numel() != expected.numel():
        return f"{label}: {got.numel()} output values came back, {expected.numel()} were due"
    count, first, max_err = mismatches(got, expected)  # noqa: F821 (reference.py)
    if count:
        index = first if flat is None else int(flat[first])
        g, r = float(got[first]), float(expected[first])
        what = (
            "NaN/inf where the reference has none (or the reverse)"
            if (g != g or r != r or abs(g) == float("inf") or abs(r) == float("inf"))
            else f"off by more than {ATOL:g} + {RTOL:g}|ref|"  # noqa: F821 (defined in reference.py, sent before this file)
        )
        return (
            f"{label}: {count} of {got.numel()} checked output values are wrong, {what}; first at "
            f"[b, i, j, c] = {_where(shape, index)}: got {g!r}, expected {r!r} (largest finite error {max_err:.4g})"
        )
    x_flat = rng.integers(0, x.numel(), job["x_sample_elements"])
    x_got = _decode(call["x_values"], numpy)
    x_expected = x[torch.as_tensor(x_flat, device=x.device)].cpu().numpy()
    if x_got.shape != x_expected.shape:
        return f"{label}: {x_got.size} values of the input x came back, {x_expected.size} were due"
    differ = numpy.flatnonzero(x_got.view("<i4") != x_expected.astype("<f4").view("<i4"))
    if differ.size:
        k = int(differ[0])
        return (
            f"{label}: the input x was changed in place by the kernel (inputs must be left as they were given): "
            f"{differ.size} of {x_got.size} checked values differ; first at [b, i, j, c] = "
            f"{_where(shape, int(x_flat[k]))}: {float(x_got[k])!r}, given {float(x_expected[k])!r}"
        )
    return ""


def main(job):
    import numpy
    import torch

    strict_float32()  # noqa: F821 (reference.py)
    report = {"versions": {"torch": torch.__version__}, "checked": 0, "failure": ""}
    if job["device"] == "cuda":
        if not torch.cuda.is_available():
            return {**report, "error": "no CUDA device is visible to the checker"}
        report["gpu"] = torch.cuda.get_device_properties(0).name
    cache = {}
    for call in job["calls"]:
        shape = job[call["set"]][call["shape"]]
        why = check_call(call, shape, job, torch, numpy, cache)
        report["checked"] += 1
        if why:
            report["failure"] = why
            break
    return report
