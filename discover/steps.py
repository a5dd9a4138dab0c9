"""The five tasks of one training step (docs/method.md §1) and the run's initialisation, as plain functions.

Each function takes the opened run (discover/run.py), reads exactly the files `Run.reads` declares
for it, writes its one output atomically and returns a reference (`{"path": relative path, "sha256":
content hash}`), so Prefect tasks pass small references, never tensors. Every function
is deterministic given the run's seed, the step and its inputs: a killed-and-resumed run repeats
a task with the same result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from discover.archive import Archive
from discover.archive import update_archive as apply_archive_update
from discover.config import RunConfig, TrainConfig
from discover.evaluation import StepEvaluation, judge_candidate, thread_pool
from discover.mixed import best_past_rollouts, mixed_stream, slot_counts
from discover.objectives import group_advantages
from discover.preflight import preflight
from discover.prompts import build_context
from discover.records import Evaluation, Rollout, State
from discover.reuse import select_parents as choose_parents
from discover.run import (
    EVALUATE,
    GENERATE,
    SELECT_PARENTS,
    STEP_TASKS,
    TRAIN,
    UPDATE_ARCHIVE,
    Ref,
    Run,
    StepTask,
    draw_seeds,
    load_archive,
    read_evaluations,
    read_rollouts,
    save_archive,
)
from evaluators.base import EvalResult
from evaluators.sandbox import sandbox_for
from storage.atomic import atomic_dir, atomic_write_json
from storage.rollout_parts import RolloutParts
from storage.tables import read_records, write_records

log = logging.getLogger("discover")

# The function of each step task (discover/run.py `STEP_TASKS`), by the task's name: bound by `runs`.
STEP_FUNCTIONS: dict[str, Callable[..., Ref]] = {}


def runs(task: StepTask) -> Callable[[Callable[..., Ref]], Callable[..., Ref]]:
    """Bind the decorated function to the step task `task` declares: it is what that task runs."""

    def bind(fn: Callable[..., Ref]) -> Callable[..., Ref]:
        if task.name in STEP_FUNCTIONS:
            raise RuntimeError(f"step task {task.name} is bound twice")
        STEP_FUNCTIONS[task.name] = fn
        return fn

    return bind


def step_function(task: StepTask) -> Callable[..., Ref]:
    """The function `task` runs (looked up at call time, so a test's wrapper of it is used)."""
    return STEP_FUNCTIONS[task.name]


# ---------------------------------------------------------------------------------------------
# Initialisation: run directory, seeds (archive 0) and the initial adapter (checkpoint 0).


def create_run(config: RunConfig) -> Run:
    """Check what can be checked, then create the run directory (or open the same run again).

    The one place a run is pre-flighted (`discover run` calls it before Prefect starts; the run flow
    when a deployment passes a configuration), once, and only for a run not created yet.
    """
    if not (Path(config.run_dir) / "config.yaml").is_file():
        preflight(config)  # nothing is written for a configuration that cannot work
    return Run.create(config)


def initialise(run: Run) -> dict[str, Ref]:
    """The seeds (archive 0) and the initial adapter (checkpoint 0), each written once.

    Idempotent, and called on every start and resume, so a run killed during its initialisation
    resumes where it stopped.
    """
    archive0 = run.layout.archive(0)
    if not archive0.is_file():
        save_archive(archive0, Archive.from_seeds(_seed_states(run)))
    checkpoint0 = run.layout.checkpoint(0)
    if not (checkpoint0 / "adapter").is_dir():
        from discover.policy import load_policy

        policy = load_policy(run.config.model, None, seed=run.seed("policy_init", 0))
        with atomic_dir(checkpoint0) as tmp:
            policy.save(tmp / "adapter")
    return {"archive": run.ref(archive0), "checkpoint": run.ref(checkpoint0)}


def _seed_states(run: Run) -> list[State]:
    """docs/method.md §1: the initial states with their rewards; an invalid seed enters with reward 0."""
    problem = run.problem()
    seeds = draw_seeds(problem, run.config)  # docs/method.md §5a: one seed per group
    sandbox = sandbox_for(
        problem,
        run.config.sandbox.backend,
        run.config.sandbox.concurrency,
        run.config.sandbox.allow_unbounded_process_tree,
        run.config.sandbox.isolation,
    )
    states = []
    scored: dict[str, EvalResult] = {}  # a seed program drawn for several groups is run once
    invalid: dict[str, list[int]] = {}  # reason -> the seeds it rejects, logged once per reason
    for i, seed in enumerate(seeds):
        if seed.code.strip() and problem.needs_sandbox and seed.construction is None:
            if seed.code not in scored:
                scored[seed.code] = judge_candidate(problem, seed.code, None, sandbox, f"seed {i}")  # a program: run it to score it
            verdict = scored[seed.code]
        else:
            verdict = dataclasses.replace(problem.verify(seed.construction), construction=seed.construction)
        if not verdict.valid:
            invalid.setdefault(verdict.reason, []).append(i)
        states.append(State.seed(i, seed.code, verdict, problem.archive_key(seed.code, verdict.construction)))
    for reason, ids in invalid.items():
        which = f"seed {ids[0]} of {problem.name} is" if len(ids) == 1 else f"seeds {', '.join(map(str, ids))} of {problem.name} are"
        log.warning("%s invalid (reward 0): %s", which, reason)
    return states


# ---------------------------------------------------------------------------------------------
# The five tasks of a step.


@runs(SELECT_PARENTS)
def select_parents(run: Run, step: int) -> Ref:
    """docs/method.md §1.1 and §3: choose G start states from the archive and build one context per group."""
    config, inputs = run.config, run.reads(SELECT_PARENTS, step)
    archive = load_archive(inputs["archive"])
    problem = run.problem()
    rng = np.random.default_rng(run.seed(SELECT_PARENTS.name, step))
    chosen = choose_parents(archive, config.reuse.rule, config.groups, rng, c=config.reuse.puct_c, epsilon=config.reuse.epsilon)
    groups = []
    for g, parent_id in enumerate(chosen):
        s = archive[parent_id]
        context = build_context(
            problem.description,
            problem.render_state(s.code, s.construction),
            s.reward,
            s.observation,
            previous_reward=s.parent_reward,
            target=problem.target,
            answer_format=config.sampling.answer_format,
        )
        groups.append({"group": g, "parent_id": parent_id, "parent_reward": s.reward, "context": context})
    out = run.writes(SELECT_PARENTS, step)
    atomic_write_json(out, {"step": step, "rule": config.reuse.rule, "groups": groups})
    log.info("step %d select_parents: %s", step, ", ".join(f"{g['parent_id']} ({g['parent_reward']:.4f})" for g in groups))
    return run.ref(out)


@runs(GENERATE)
def generate(run: Run, step: int, on_rollout: Callable[[Rollout], None] | None = None) -> Ref:
    """docs/method.md §1.2 and §4: K rollouts per context from the policy of this step, with log-probs.

    `on_rollout` sees each rollout as soon as the policy finishes it (discover/evaluation.py starts
    evaluating it there); the file written is the same with or without it, in (group, index) order.

    Resumable per rollout (docs/runs.md, "A generate killed midway"): each finished rollout is stored
    at once (storage/rollout_parts.py), and a generate run again (a Prefect retry, `discover resume`)
    takes the stored ones, hands them to `on_rollout` too (the evaluation keeps one result per
    candidate, so nothing is evaluated twice) and generates only the missing (group, index) keys,
    each from the seed it has in the full batch. How many were reused and generated goes to the
    log line and to steps/NNNN/generate.json. Mixed groups (MIGRATE) resume their on-policy slots
    only: the greedy and neighbourhood slots are made again and re-scored as one batch, as in an
    uninterrupted step.
    """
    config, inputs = run.config, run.reads(GENERATE, step)
    parents = json.loads(inputs["parents"].read_text())["groups"]
    k, m = config.rollouts_per_group, config.mixed
    past = best_past_rollouts(load_archive(inputs["archive"]), run.layout.rollouts, max(m.greedy, 1)) if m.greedy or m.neighbourhood else []
    resumable = slot_counts(k, m.greedy, m.neighbourhood, len(past))[0] if m.greedy or m.neighbourhood else k  # slots stored as they come
    parts = RolloutParts(run.layout.generated(step), Rollout)
    digest = _generate_digest(run, step)
    stored = _stored_rollouts(run, step, parts, digest)
    if len(stored) < len(parents) * k:  # an interrupted attempt: its on-policy slots only
        stored = {key: r for key, r in stored.items() if key[1] < resumable}
    rollouts = list(stored.values())
    for r in rollouts:
        if on_rollout is not None:
            on_rollout(r)
    context_of = {g["group"]: i for i, g in enumerate(parents)}  # a rollout's group -> its context's index in the batch
    skip = frozenset((context_of[group], index) for group, index in stored)
    t0 = time.time()

    def store(r: Rollout) -> None:
        if r.index < resumable:
            parts.put(r.group, r.index, r, digest)

    if len(stored) < len(parents) * k:
        prompts = {context_of[r.group]: r.prompt_ids for r in rollouts}  # what mixed groups re-attach their other slots to
        rollouts += _sample(run, step, parents, inputs["checkpoint"], past, skip, prompts, store, on_rollout)
    rollouts.sort(key=lambda r: (r.group, r.index))
    tokens = sum(len(r.completion_ids) for r in rollouts)
    seconds = time.time() - t0
    atomic_write_json(
        run.layout.generate_stats(step),
        {"rollouts_reused": len(stored), "rollouts_generated": len(rollouts) - len(stored), "tokens": tokens, "seconds": seconds},
    )
    out = run.writes(GENERATE, step)
    write_records(out, rollouts, Rollout, {_GENERATE_INPUTS: digest})
    parts.remove()  # the output holds them all now
    log.info(
        "step %d generate: %d rollouts (%d reused from an interrupted attempt, %d generated), %d tokens in %.1f s",
        step,
        len(rollouts),
        len(stored),
        len(rollouts) - len(stored),
        tokens,
        seconds,
    )
    return run.ref(out)


_GENERATE_INPUTS = "generate_inputs"  # the output file's metadata: the digest of what it was generated from


def _generate_digest(run: Run, step: int) -> str:
    """What a stored rollout must have been generated from to be reused: the content of every
    file generate reads (parents, checkpoint, archive, past rollouts) and the step's seeds."""
    what = {"inputs": run.input_hashes(GENERATE, step), "seeds": [run.seed(GENERATE.name, step), run.seed("neighbourhood", step)]}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def _stored_rollouts(run: Run, step: int, parts: RolloutParts[Rollout], digest: str) -> dict[tuple[int, int], Rollout]:
    """The rollouts of `step` a previous attempt finished, by (group, index): the stored records,
    or every row of an output file already written from the same inputs (an attempt killed after
    writing it, before the manifest recorded it)."""
    out = run.writes(GENERATE, step)
    if out.is_file():
        rows, meta = read_records(out, Rollout)
        if meta.get(_GENERATE_INPUTS) == digest:
            return {(r.group, r.index): r for r in rows}
    return parts.load(digest)


def _sample(
    run: Run,
    step: int,
    parents: list[dict[str, Any]],
    checkpoint: Path,
    past: list[Rollout],
    skip: frozenset[tuple[int, int]],
    prompts: dict[int, list[int]],
    store: Callable[[Rollout], None],
    on_rollout: Callable[[Rollout], None] | None,
) -> list[Rollout]:
    """The rollouts of every (context index, index) key but those in `skip`, each stored (`store`)
    and handed to `on_rollout` as soon as the policy finishes it. `past` and `prompts` (a context's
    prompt tokens, from its stored rollouts) are for mixed groups."""
    from discover.policy.replicas import generation_policy

    config = run.config
    policy = generation_policy(run, checkpoint / "adapter")  # in this process, or on the replicas (docs/cluster.md)
    sampling = config.sampling
    contexts = [g["context"] for g in parents]
    m = config.mixed
    if m.greedy or m.neighbourhood:  # docs/method.md §6, MIGRATE: slots from the best past completions and a neighbourhood prompt
        stream = mixed_stream(
            policy,
            contexts,
            config.rollouts_per_group,
            sampling,
            run.seed(GENERATE.name, step),
            run.seed("neighbourhood", step),
            past,
            m.greedy,
            m.neighbourhood,
            skip=skip,
            prompt_ids=prompts,
        )
    else:
        stream = policy.sample_stream(contexts, config.rollouts_per_group, sampling, run.seed(GENERATE.name, step), skip)
    rollouts = []
    for g, k, completion in stream:
        rollout = Rollout.of(completion, group=parents[g]["group"], index=k, parent_id=parents[g]["parent_id"])
        store(rollout)  # before anything else sees it: a kill from here on keeps it
        rollouts.append(rollout)
        if on_rollout is not None:
            on_rollout(rollout)
    return rollouts


@runs(EVALUATE)
def evaluate(run: Run, step: int, evaluation: StepEvaluation | None = None) -> Ref:
    """docs/method.md §1.3: parse each rollout into a candidate and score it in the problem's sandbox.

    `evaluation` is the step's evaluation already under way (candidates submitted while they were
    generated, on the engine the flow chose); without it, the candidates run on a thread pool here.
    Either way each distinct candidate is evaluated once and stored as it finishes, so this task,
    run again, evaluates only what had not finished (discover/evaluation.py).
    """
    rollouts = read_rollouts(run.reads(EVALUATE, step)["rollouts"])
    t0 = time.time()
    if evaluation is None:
        with thread_pool(run.config.sandbox.concurrency) as submit:
            evaluations = StepEvaluation(run, step, submit).collect(rollouts)
    else:
        evaluations = evaluation.collect(rollouts)
    out = run.writes(EVALUATE, step)
    write_records(out, evaluations, Evaluation)
    rewards = [e.reward for e in evaluations]
    log.info(
        "step %d evaluate: %d/%d valid, best %.6f, mean %.6f in %.1f s",
        step,
        sum(e.valid for e in evaluations),
        len(evaluations),
        max(rewards),
        float(np.mean(rewards)),
        time.time() - t0,
    )
    return run.ref(out)


@runs(UPDATE_ARCHIVE)
def update_archive(run: Run, step: int) -> Ref:
    """docs/method.md §1.4 and §3: expansion statistics, top children per parent, the size cap."""
    config, inputs = run.config, run.reads(UPDATE_ARCHIVE, step)
    archive = load_archive(inputs["archive"])
    parents = [g["parent_id"] for g in json.loads(inputs["parents"].read_text())["groups"]]
    problem = run.problem()
    children = read_evaluations(inputs["evaluations"])
    new = apply_archive_update(archive, step, parents, children, lambda e: problem.archive_key(e.code, e.construction), config.reuse)
    out = run.writes(UPDATE_ARCHIVE, step)
    save_archive(out, new)
    best = new.best()
    log.info("step %d update_archive: %d states, best %s (%.6f)", step, len(new), best.id, best.reward)
    return run.ref(out)


@runs(TRAIN)
def train(run: Run, step: int) -> Ref:
    """docs/method.md §1.5 and §2: one optimizer step of the LoRA policy on all G x K rollouts."""
    config, inputs = run.config, run.reads(TRAIN, step)
    rollouts = read_rollouts(inputs["rollouts"])
    evaluations = read_evaluations(inputs["evaluations"])
    rewards, lazy = training_rewards(run, evaluations, inputs["archive"])
    advantages, stats = step_advantages(rollouts, rewards, config.train)
    stats["lazy_children"] = lazy
    src, dst = inputs["checkpoint"], run.writes(TRAIN, step)
    t0 = time.time()
    stats["optimizer_step"] = config.train.objective != "none" and not _nothing_to_learn(stats, src)
    if stats["optimizer_step"]:
        stats |= _optimizer_step(run, rollouts, advantages, src, dst)
    else:
        with atomic_dir(dst) as tmp:  # the policy stays as it was
            shutil.copytree(src, tmp, dirs_exist_ok=True)
    stats["seconds"] = time.time() - t0
    atomic_write_json(run.layout.train_stats(step), stats)
    beta = f"{stats['beta_mean']:.3g}" if stats["beta_mean"] is not None else "n/a"
    if stats["optimizer_step"]:
        log.info(
            "step %d train: loss %.4g, beta %s, %d groups with signal, sampler/learner log-prob gap %.3g",
            step,
            stats.get("loss", float("nan")),
            beta,
            stats["groups_with_signal"],
            stats.get("logprob_gap", float("nan")),
        )
    else:  # no loss was computed: saying "loss nan" would read as a failure
        log.info("step %d train: nothing to learn (%d groups with signal): the policy is kept as it was", step, stats["groups_with_signal"])
    return run.ref(dst)


def training_rewards(run: Run, evaluations: list[Evaluation], archive_path: Path) -> tuple[dict[tuple[int, int], float], int]:
    """The reward each rollout trains with, by (group, index): its evaluation's, or the lazy
    penalty where `train.lazy_penalty` is set and the child repeats a state of the archive it was
    drawn from (ThetaEvolve, docs/method.md §6); and how many children got the penalty."""
    rewards = {(e.group, e.index): e.reward for e in evaluations}
    penalty = run.config.train.lazy_penalty
    if penalty is None:
        return rewards, 0
    archive = load_archive(archive_path)
    return lazy_rewards(rewards, evaluations, {s.key for s in archive.states.values() if s.key}, run.problem().archive_key, penalty)


def step_advantages(
    rollouts: list[Rollout], rewards: dict[tuple[int, int], float], train: TrainConfig
) -> tuple[dict[int, np.ndarray], dict[str, Any]]:
    """docs/method.md §2: each group's advantages under the objective, and the step's beta and
    signal statistics (beta_mean/min/max over the groups with a finite beta, groups_with_signal)."""
    rewards_by_group: dict[int, list[float]] = {}
    for r in rollouts:
        rewards_by_group.setdefault(r.group, []).append(rewards[(r.group, r.index)])
    advantages: dict[int, np.ndarray] = {}
    betas = []
    for g, group_rewards in rewards_by_group.items():
        ga = group_advantages(group_rewards, train.objective, gamma=train.gamma, constant_beta=train.constant_beta)
        advantages[g] = ga.advantages
        betas.append(ga.beta)
    finite = [b for b in betas if np.isfinite(b)]
    stats: dict[str, Any] = {
        "objective": train.objective,
        "beta_mean": float(np.mean(finite)) if finite else None,
        "beta_min": float(np.min(finite)) if finite else None,
        "beta_max": float(np.max(finite)) if finite else None,
        "groups_with_signal": int(sum(np.any(a != 0) for a in advantages.values())),
    }
    return advantages, stats


def _nothing_to_learn(stats: dict[str, Any], checkpoint: Path) -> bool:
    """No group has a non-zero advantage and the policy is still the base model: the loss is then
    the KL term alone, whose gradient at the base model is zero, so what a step would compute is
    rounding noise, which Adam scales up to a full learning-rate step in a random direction
    (docs/method.md §2, "Not in the paper"). Such a step is not taken."""
    from discover.policy.trainer import adapter_is_identity

    return stats["groups_with_signal"] == 0 and adapter_is_identity(checkpoint / "adapter")


def _optimizer_step(run: Run, rollouts: list[Rollout], advantages: dict[int, np.ndarray], src: Path, dst: Path) -> dict[str, Any]:
    """Load the policy of checkpoint `src`, take one optimizer step on the rollouts and write the
    adapter and the optimizer state to checkpoint `dst` (atomically); the trainer's statistics."""
    from discover.policy import TrainBatch

    config = run.config
    batch = TrainBatch(
        completions=[r.completion() for r in rollouts],
        advantages=[float(advantages[r.group][r.index]) for r in rollouts],
    )
    optimizer = src / "optimizer.pt"
    trainer = _step_trainer(run, src / "adapter")
    stats = trainer.train_step(
        batch, config.train, temperature=config.sampling.temperature, optimizer_state=optimizer if optimizer.is_file() else None
    )
    with atomic_dir(dst) as tmp:
        trainer.save(tmp / "adapter", tmp / "optimizer.pt")
    return stats


def _step_trainer(run: Run, adapter: Path) -> Any:
    """What trains the step: the policy of `adapter` in this process (its sampler making room on the
    GPU while it trains), or, with `cluster.trainer_world_size` > 1, the run's resident trainer group
    (docs/cluster.md), which loads no model in this process."""
    from discover.policy import load_policy

    config = run.config
    if config.cluster.trainer_world_size == 1:
        return load_policy(config.model, adapter)
    from discover.policy.trainer_group import ShardedTrainer, TrainerGroup

    sleep_held_engine()  # a vLLM engine of this process on the ranks' GPU sleeps while they train
    return ShardedTrainer(TrainerGroup.of_run(run), adapter)


def sleep_held_engine() -> None:
    """Send a vLLM engine held by this process to sleep (it wakes for the next generation), if vLLM was
    ever imported here; nothing otherwise."""
    if "discover.policy.vllm_engine" in sys.modules:
        sys.modules["discover.policy.vllm_engine"].sleep_if_held()


def lazy_rewards(
    rewards: dict[tuple[int, int], float],
    evaluations: list[Evaluation],
    archive_keys: set[str],
    key_of: Callable[[str, Any], str],
    penalty: float,
) -> tuple[dict[tuple[int, int], float], int]:
    """ThetaEvolve's lazy penalty: a valid child equal to a state of the archive it was drawn from
    trains with reward `penalty` instead of its own; returns the new rewards and how many changed."""
    out, changed = dict(rewards), 0
    for e in evaluations:
        if e.valid and key_of(e.code, e.construction) in archive_keys:
            out[(e.group, e.index)] = float(penalty)  # ThetaEvolve §3.3: penalise repeating a program in the database
            changed += 1
    return out, changed


def best_state(run: Run) -> State:
    """The best state of the newest archive of a run."""
    return load_archive(run.newest_archive()).best()


if {t.name for t in STEP_TASKS} != set(STEP_FUNCTIONS):  # every declared task runs exactly one function of this module
    raise RuntimeError(f"step tasks without a function: {sorted({t.name for t in STEP_TASKS} - set(STEP_FUNCTIONS))}")
