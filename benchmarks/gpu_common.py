"""Shared pieces of the GPU benchmarks (generation.py, training.py, step_time.py).

* `random_model(shape)`: a randomly initialised Qwen3-architecture model of a published shape
  (`discover/policy/qwen3_model.py`), built on the GPU on first use and cached under
  `$DISCOVER_CACHE/models` (the 8B shape is 16 GB on disk; weights are never committed).
* `peak_bf16_tflops()`: the GPU's dense bf16 peak from its data sheet, for model FLOPs utilisation.
* `table()`: a plain text table.
* `write_figures()`: the figures of a run as JSON, for benchmarks/gpu_check.py to collect (`--json`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, TFLOP/s.
PEAK_BF16_TFLOPS = {
    "H200": 989.4,
    "H100 SXM": 989.4,
    "H100 80GB HBM3": 989.4,  # the SXM part's device name
    "H100 NVL": 835.0,
    "H100 PCIe": 756.0,
    "A100": 312.0,
    "L40S": 362.1,
    "B200": 2250.0,
}

NEEDS_GPU = "needs a CUDA GPU (and, for vLLM, the gpu extra: `uv sync --extra gpu`); no GPU figures were measured on this machine"


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def peak_bf16_tflops(override: float | None = None) -> float | None:
    """The data-sheet peak for this GPU (longest matching name), `override` if given, else None."""
    if override:
        return override
    name = gpu_name()
    matches = [k for k in PEAK_BF16_TFLOPS if all(part in name for part in k.split())]
    return PEAK_BF16_TFLOPS[max(matches, key=len)] if matches else None


def random_model(shape: str, model: str | None = None) -> Path:
    """`model` if given, else the cached random Qwen3-architecture model of `shape` (built on the GPU)."""
    if model:
        return Path(model)
    from discover.policy.qwen3_model import build_qwen3_model
    from discover.policy.tiny_model import cached_model

    device = "cuda" if has_cuda() else "cpu"
    dtype = "bfloat16" if device == "cuda" else "float32"
    print(f"building (once) a random Qwen3-architecture model, shape {shape}, on {device} ...", flush=True)
    return cached_model(f"qwen3-{shape}-random-{dtype}-v1", lambda d: build_qwen3_model(d, shape, seed=0, device=device, dtype=dtype))


def table(headers: list[str], rows: list[list[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])


def write_figures(path: str | None, figures: dict[str, Any]) -> None:
    """Write `figures` (JSON-serialisable, NaN allowed) to `path` when one was given."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(figures, indent=2, default=str) + "\n")
