"""MIGRATE's mixed groups (docs/method.md §6; the MIGRATE paper's §3 and Algorithm 1), an option of `generate`.

A group of K slots is filled with alpha on-policy completions of the group's context, beta "greedy"
completions (the best past completions of the run: the rollouts that produced the archive's best
non-seed states) and gamma "neighbourhood" completions, sampled from a prompt that shows the group's
context with the best past answers and asks for a variation of one of them. As in MIGRATE, every
completion trains as an answer to the group's own prompt: greedy and neighbourhood completions are
re-attached to it and their sampler log-probabilities recomputed under the current policy there, so
the importance ratio of docs/method.md §2 stays near 1. Their answers are evaluated from the group's parent
like any other. Slots that have no past completion to draw on (step 0) are sampled on-policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

from discover.archive import Archive
from discover.config import SamplingConfig
from discover.policy.base import Completion, Policy
from discover.records import Rollout, child_id
from discover.run import read_rollouts

NEIGHBOURHOOD_INSTRUCTION = (
    "Here are the best answers found so far, best first. Write a new answer that is a small variation "
    "of one of them: keep what makes it good and change a detail."
)


def best_past_rollouts(archive: Archive, rollouts_path: Callable[[int], Path], count: int) -> list[Rollout]:
    """The rollouts that produced the `count` best non-seed states of `archive` (reward descending,
    ties by insertion order). `rollouts_path(step)` names a step's rollouts file; `Run.reads`
    declares the same files."""
    best = archive.best_non_seeds(count)
    by_step: dict[int, dict[str, Rollout]] = {}
    out = []
    for s in best:
        if s.step not in by_step:
            path = Path(rollouts_path(s.step))
            rows = read_rollouts(path) if path.is_file() else []
            by_step[s.step] = {child_id(s.step, r.group, r.index): r for r in rows}
        if s.id in by_step[s.step]:
            out.append(by_step[s.step][s.id])
    return out


def neighbourhood_prompt(context: str, answers: list[str]) -> str:
    """MIGRATE's neighbourhood prompt P_NS: the group's context, the best past answers, the request."""
    shown = "\n\n".join(f"Answer {i + 1}:\n{a.strip()}" for i, a in enumerate(answers))
    return f"{context.rstrip()}\n\n{NEIGHBOURHOOD_INSTRUCTION}\n\n{shown}\n"


def reattach(completion: Completion, prompt_ids: list[int]) -> Completion:
    """The completion as an answer to `prompt_ids`; its sampler log-probs are recomputed by the caller."""
    return dataclasses.replace(completion, prompt_ids=list(prompt_ids), sampler_logprobs=[0.0] * len(completion.completion_ids))


def slot_counts(k: int, greedy: int, neighbourhood: int, past: int) -> tuple[int, int, int]:
    """(alpha, beta, gamma) for one group of k: beta and gamma only as far as past completions exist."""
    beta = min(greedy, past)
    gamma = neighbourhood if past else 0
    return k - beta - gamma, beta, gamma


def mixed_stream(
    policy: Policy,
    contexts: list[str],
    k: int,
    sampling: SamplingConfig,
    seed: int,
    neighbourhood_seed: int,
    past: list[Rollout],
    greedy: int,
    neighbourhood: int,
    skip: frozenset[tuple[int, int]] = frozenset(),
    prompt_ids: dict[int, list[int]] | None = None,
) -> Iterator[tuple[int, int, Completion]]:
    """(group, index, completion) for K slots a group: indices [0, alpha) on-policy, then beta greedy,
    then gamma neighbourhood completions (docs/method.md §6, MIGRATE's Algorithm 1), each yielded when ready.

    A resumed step passes the on-policy keys it has already in `skip` (each other key keeps its
    seed) and their groups' prompt tokens in `prompt_ids`; the greedy and neighbourhood slots are
    always made, and re-scored together, so their log-probs are those of an uninterrupted step."""
    import torch

    alpha, beta, gamma = slot_counts(k, greedy, neighbourhood, len(past))
    if any(j >= alpha for _, j in skip):
        raise ValueError(f"only on-policy slots (index < {alpha}) can be skipped, got {sorted(skip)}")
    prompt_ids = dict(prompt_ids or {})
    for g, j, completion in policy.sample_stream(contexts, alpha, sampling, seed, skip):
        prompt_ids.setdefault(g, completion.prompt_ids)
        yield g, j, completion
    extra: list[tuple[int, int, Completion]] = []
    for g in range(len(contexts)):
        extra += [(g, alpha + b, reattach(past[b].completion(), prompt_ids[g])) for b in range(beta)]
    if gamma:
        prompts = [neighbourhood_prompt(c, [r.answer for r in past[: max(greedy, 1)]]) for c in contexts]
        for g, j, completion in policy.sample_stream(prompts, gamma, sampling, neighbourhood_seed):
            extra.append((g, alpha + beta + j, reattach(completion, prompt_ids[g])))
    if not extra:
        return
    with torch.no_grad():  # the current policy's log-probs of each re-attached completion under the group's prompt
        logprobs = policy.sequence_logprobs([c for _, _, c in extra], temperature=sampling.temperature)
    for (g, j, c), lp in zip(extra, logprobs, strict=True):
        c.sampler_logprobs = [float(x) if m else 0.0 for x, m in zip(lp.tolist(), c.loss_mask, strict=True)]
        yield g, j, c
