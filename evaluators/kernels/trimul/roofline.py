"""Per-shape floors under which a TriMul time is impossible on the GPU found (docs/method.md §5c).

A correct kernel must read x and write y, both float32 [B, N, N, C] (the write may stay in L2 up
to its size), and do the multiply-adds of the five input projections, the triangle product and
the output projection. A mean runtime below max(bytes / peak bandwidth, FLOPs / peak tensor rate),
times SLACK, is rejected as faster than the hardware can go. The peaks are spec-sheet maxima (the
tensor rate at the lowest precision the GPU offers, FP8 or INT8, even though no kernel passes the
tolerance in it everywhere), so the floor never rejects a real kernel; an unknown GPU gets
FALLBACK, larger than any table entry, whose floors are therefore lower still.
"""

from __future__ import annotations

from dataclasses import dataclass

SLACK = 0.8  # a time must be at least 80% of the ideal-hardware time


@dataclass(frozen=True)
class GpuPeak:
    """Spec-sheet peaks of one GPU model."""

    model: str
    bandwidth_gb_s: float  # memory bandwidth, GB/s
    tensor_tflops: float  # dense tensor-core rate at the lowest precision (FP8/INT8), TFLOP/s
    l2_mb: float  # L2 cache, MB


# (substring of torch's device name, peaks), most specific first. Upper bounds, rounded up.
KNOWN_GPUS: tuple[tuple[str, GpuPeak], ...] = (
    ("H100 NVL", GpuPeak("H100 NVL", 3900, 1980, 50)),
    ("H100 PCIe", GpuPeak("H100 PCIe", 2000, 1520, 50)),
    ("H100", GpuPeak("H100 SXM", 3350, 1980, 50)),
    ("H200", GpuPeak("H200", 4800, 1980, 50)),
    ("H800", GpuPeak("H800", 3350, 1980, 50)),
    ("GH200", GpuPeak("GH200", 4900, 1980, 50)),
    ("B200", GpuPeak("B200", 8000, 4500, 126)),
    ("B100", GpuPeak("B100", 8000, 3500, 126)),
    ("A100-SXM4-80GB", GpuPeak("A100 SXM 80GB", 2040, 624, 40)),
    ("A100 80GB PCIe", GpuPeak("A100 PCIe 80GB", 1940, 624, 40)),
    ("A100", GpuPeak("A100 40GB", 1560, 624, 40)),
    ("A800", GpuPeak("A800", 2040, 624, 40)),
    ("L40S", GpuPeak("L40S", 870, 1470, 96)),
    ("L40", GpuPeak("L40", 870, 730, 96)),
    ("L4", GpuPeak("L4", 300, 490, 48)),
    ("A10", GpuPeak("A10/A10G", 600, 500, 6)),
    ("RTX 4090", GpuPeak("RTX 4090", 1010, 1330, 72)),
    ("RTX 6000 Ada", GpuPeak("RTX 6000 Ada", 960, 1460, 96)),
    ("V100", GpuPeak("V100", 900, 130, 6)),
    ("T4", GpuPeak("T4", 320, 130, 4)),
)
FALLBACK = GpuPeak("unknown GPU (conservative peaks)", 10000, 10000, 256)


def peaks_for(device_name: str) -> GpuPeak:
    """The table entry whose key occurs in `device_name`, else FALLBACK."""
    for key, peak in KNOWN_GPUS:
        if key.lower() in device_name.lower():
            return peak
    return FALLBACK


def min_bytes(shape: dict, l2_mb: float) -> float:
    """Bytes a correct kernel must move: read x, write y beyond what L2 can hold."""
    elements = shape["bs"] * shape["seqlen"] ** 2 * shape["dim"]
    return 4.0 * elements + max(0.0, 4.0 * elements - l2_mb * 1e6)


def min_flops(shape: dict) -> float:
    """FLOPs of the work: 2 B N^2 H (5 C) projections + 2 B N^3 H triangle product + 2 B N^2 H C output."""
    b, n, c, h = shape["bs"], shape["seqlen"], shape["dim"], shape["hiddendim"]
    return 2.0 * b * n * n * h * (6 * c + n)


def floor_us(shape: dict, peak: GpuPeak) -> float:
    """The fastest believable mean runtime of `shape` on `peak`'s GPU, in microseconds."""
    seconds = max(min_bytes(shape, peak.l2_mb) / (peak.bandwidth_gb_s * 1e9), min_flops(shape) / (peak.tensor_tflops * 1e12))
    return SLACK * seconds * 1e6
