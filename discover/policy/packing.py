"""Rollouts grouped into micro-batches by token count, so any batch fits the trainer's memory.

A micro-batch is a set of sequences laid out as right-padded rows; its cost is rows x longest
row, the tokens the forward and backward passes actually process. Sequences are taken longest
first, and a row is at least half as long as the longest row of its micro-batch, so padding is
less than half of what is processed (in practice far less). The gradient of the
batch is the sum of the micro-batches' gradients (the loss of docs/method.md §2 is a sum over tokens), so
the split changes memory and speed, never the update.
"""

from __future__ import annotations

from collections.abc import Sequence


def pack_by_tokens(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of `lengths` in micro-batches of at most `budget` padded tokens each.

    A sequence longer than `budget` gets a micro-batch of its own (it cannot be split: the
    attention of its last token needs all the others). Deterministic: ties keep index order.
    """
    if budget < 1:
        raise ValueError(f"the token budget of a micro-batch must be >= 1, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = int(lengths[current[0]]) if current else int(lengths[i])  # sorted: the first is longest
        if current and ((len(current) + 1) * longest > budget or 2 * int(lengths[i]) < longest):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def padded_tokens(lengths: Sequence[int], batches: list[list[int]]) -> int:
    """Tokens the passes process for `batches`, padding included (rows x longest row, summed)."""
    return sum(len(b) * max(int(lengths[i]) for i in b) for b in batches)
