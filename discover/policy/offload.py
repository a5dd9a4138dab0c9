"""The trainer's weights off the GPU while vLLM generates, and back for training (`model.offload_while_generating`).

The one-GPU plan keeps one copy of the weights on the GPU at a time: while vLLM generates, the
trainer's tensors (the resident base model of every `resident.BASE_CACHE` entry, each live
trainer's LoRA parameters and its Adam state) live in CPU memory; while the trainer trains, vLLM
sleeps (`vllm_engine.sleep_if_held`, level 1: its weights to CPU, its KV cache dropped).

* `park_all()` copies each tensor to CPU memory (pinned when it comes from a GPU) and replaces its
  storage by an empty CPU tensor (`tensor.data = ...`): the device memory is freed, and every module
  sharing the tensor (the base model's structural copies in `resident.share_weights_copy`) sees the
  change, because the tensor objects themselves are kept. Frozen tensors (the base weights) never
  change, so their CPU copy is made once and kept: parking them again costs no copy.
* `unpark_all()` copies every parked tensor back to the device it came from; the CPU copies of
  trainable tensors are dropped then.
* Both are no-ops on tensors already where they should be, so the trainer calls `unpark_all()`
  at the start of everything that computes, and the vLLM sampler calls `park_all()` before the
  engine wakes.

Parked tensors have 0 elements: anything that would compute with them fails loudly instead of
reading stale or missing weights. Tested on CPU (tests/test_trainer.py): parking and restoring
between training steps leaves the LoRA training results bit-identical. The times on a GPU are
measured by `benchmarks/gpu_check.py`, not here.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

__all__ = ["park_all", "unpark_all", "parked_count", "register", "OffloadStats"]


@dataclass
class _Slot:
    ref: weakref.ref[torch.Tensor]
    device: torch.device
    host: torch.Tensor
    frozen: bool


@dataclass
class OffloadStats:
    """What one park or unpark moved: tensors, bytes copied, bytes freed or filled on the device, seconds."""

    tensors: int = 0
    copied_bytes: int = 0
    device_bytes: int = 0
    seconds: float = 0.0
    devices: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, float]:
        return {
            "tensors": float(self.tensors),
            "copied_GiB": self.copied_bytes / 2**30,
            "device_GiB": self.device_bytes / 2**30,
            "seconds": self.seconds,
        }


_LOCK = threading.RLock()
_PARKED: dict[int, _Slot] = {}  # id(tensor) -> where it was, its CPU copy
_FROZEN_HOST: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}  # kept CPU copies of frozen tensors
_SOURCES: weakref.WeakSet[object] = weakref.WeakSet()  # objects with a `parkable_tensors()` method (live trainers)


def register(owner: object) -> None:
    """Park `owner.parkable_tensors()` (an iterable of (tensor, frozen)) with everything else."""
    with _LOCK:
        _SOURCES.add(owner)


def _all_tensors() -> list[tuple[torch.Tensor, bool]]:
    from discover.policy.resident import BASE_CACHE

    out: list[tuple[torch.Tensor, bool]] = []
    for _, model in list(BASE_CACHE.values()):
        out += [(p, not p.requires_grad) for p in model.parameters()]
        out += [(b, True) for b in model.buffers()]
    for owner in list(_SOURCES):
        out += list(owner.parkable_tensors())  # type: ignore[attr-defined]
    seen: set[int] = set()
    unique = []
    for t, frozen in out:
        if id(t) not in seen:
            seen.add(id(t))
            unique.append((t, frozen))
    return unique


def _sync(devices: Iterable[str]) -> None:
    for d in devices:
        dev = torch.device(d)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)


def park(tensors: Iterable[tuple[torch.Tensor, bool]]) -> OffloadStats:
    """Move `tensors` ((tensor, frozen) pairs) to CPU memory, freeing their device storage."""
    stats = OffloadStats()
    t0 = time.perf_counter()
    with _LOCK:
        todo: list[tuple[torch.Tensor, bool, torch.Tensor]] = []
        for t, frozen in tensors:
            if id(t) in _PARKED or t.numel() == 0:
                continue
            kept = _FROZEN_HOST.get(id(t)) if frozen else None
            if kept is not None and kept[0]() is t and kept[1].shape == t.shape and kept[1].dtype == t.dtype:
                host = kept[1]
            else:
                pin = t.device.type == "cuda"
                host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
                host.copy_(t.detach(), non_blocking=pin)
                stats.copied_bytes += t.numel() * t.element_size()
                if frozen:
                    _FROZEN_HOST[id(t)] = (weakref.ref(t), host)
            todo.append((t, frozen, host))
            stats.devices.add(str(t.device))
        _sync(stats.devices)  # every copy done before a device storage is released
        for t, frozen, host in todo:
            stats.device_bytes += t.numel() * t.element_size()
            _PARKED[id(t)] = _Slot(weakref.ref(t), t.device, host, frozen)
            t.data = torch.empty(0, dtype=t.dtype, device="cpu")
            stats.tensors += 1
        if any(torch.device(d).type == "cuda" for d in stats.devices):
            torch.cuda.empty_cache()  # hand the freed memory back to the driver, for vLLM
    stats.seconds = time.perf_counter() - t0
    return stats


def park_all() -> OffloadStats:
    """Park the resident base models and every registered trainer's LoRA parameters and optimizer state."""
    with _LOCK:
        return park(_all_tensors())


def unpark_all() -> OffloadStats:
    """Bring every parked tensor back to its device (a no-op when nothing is parked)."""
    stats = OffloadStats()
    if not _PARKED:
        return stats
    t0 = time.perf_counter()
    with _LOCK:
        for key, slot in list(_PARKED.items()):
            t = slot.ref()
            if t is not None:
                if slot.device.type == "cpu":
                    t.data = slot.host  # the CPU copy becomes the tensor's storage (a frozen one is never written)
                else:
                    t.data = slot.host.to(slot.device, non_blocking=True)
                stats.tensors += 1
                stats.device_bytes += slot.host.numel() * slot.host.element_size()
                stats.copied_bytes += slot.host.numel() * slot.host.element_size()
                stats.devices.add(str(slot.device))
            del _PARKED[key]
        _sync(stats.devices)
        for key, (ref, _) in list(_FROZEN_HOST.items()):  # copies of tensors that are gone
            if ref() is None:
                del _FROZEN_HOST[key]
    stats.seconds = time.perf_counter() - t0
    return stats


def parked_count() -> int:
    """How many tensors are parked now."""
    return len(_PARKED)
