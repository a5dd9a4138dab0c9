"""The five tasks of one training step (SPEC §1) and the run's initialisation, as plain functions.

Each function reads its inputs from the run directory, writes its output atomically under it and
returns a reference (`{"path": relative path, "sha256": content hash}`), so Prefect tasks pass
small references, never tensors (DESIGN.md). Every function is deterministic given the run's seed,
the step and its inputs: a killed-and-resumed run repeats a task with the same result.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from discover.archive import Archive, Child, State, update_archive as apply_archive_update
from discover.config import RunConfig, dump_config, load_config
from discover.objectives import group_advantages
from discover.prompts import build_context
from discover.reuse import select_parents as choose_parents
from evaluators.base import EvalResult, ParentView, Problem
from evaluators.registry import get_problem
from evaluators.sandbox import sandbox_for
from storage.atomic import atomic_write_json, atomic_write_text, content_hash
from storage.layout import RunLayout
from storage.tables import (
    EVALUATION_SCHEMA,
    ROLLOUT_SCHEMA,
    read_archive,
    read_rows,
    write_archive,
    write_rows,
)

log = logging.getLogger("discover")

Ref = dict[str, str]
_TASK_STREAMS = {"seeds": 0, "select_parents": 1, "generate": 2, "train": 3, "policy_init": 4}


class RunDirError(RuntimeError):
    """A run directory that cannot be started or resumed as asked."""


def make_ref(layout: RunLayout, path: Path) -> Ref:
    return {"path": layout.relative(path), "sha256": content_hash(path)}


def task_seed(config: RunConfig, task: str, step: int) -> int:
    """A seed for one task of one step, derived from the run seed (same run seed, same streams)."""
    return int(np.random.SeedSequence([config.seed, _TASK_STREAMS[task], step]).generate_state(1)[0])


def open_run(run_dir: Path) -> tuple[RunConfig, RunLayout]:
    layout = RunLayout(Path(run_dir))
    if not layout.config.is_file():
        raise RunDirError(f"{run_dir} is not a run directory (no config.yaml); start one with `discover run CONFIG`")
    return load_config(layout.config), layout


def make_problem(config: RunConfig) -> Problem:
    """The run's problem, with the configuration's sandbox limits where they are set."""
    s = config.sandbox
    return get_problem(config.problem, **config.problem_options).with_limits(
        timeout_s=s.timeout_s,
        memory_mb=s.memory_mb,
        cpus=s.cpus,
        max_output_bytes=s.max_output_bytes,
        max_processes=s.max_processes,
    )


def load_archive(path: Path) -> Archive:
    records, total = read_archive(path)
    return Archive.from_records(records, total)


def save_archive(path: Path, archive: Archive) -> None:
    write_archive(path, archive.to_records(), archive.total_expansions)


# ---------------------------------------------------------------------------------------------
# Initialisation: run directory, seeds (archive 0) and the initial adapter (checkpoint 0).


def init_run(config: RunConfig) -> dict[str, Ref]:
    """Create the run directory with its seeds and initial policy; idempotent for the same config."""
    layout = RunLayout(config.run_dir)
    if layout.config.is_file():
        existing = load_config(layout.config)
        if existing.model_dump(exclude={"run_dir"}) != config.model_dump(exclude={"run_dir"}):
            raise RunDirError(
                f"{config.run_dir} already holds a run with another configuration; "
                "resume it with `discover resume`, or choose a new run_dir"
            )
    else:
        layout.root.mkdir(parents=True, exist_ok=True)
        atomic_write_json(layout.run_info, {"run_id": uuid.uuid4().hex, "created": time.time()})
        atomic_write_text(layout.config, dump_config(config))

    if not layout.archive(0).is_file():
        problem = make_problem(config)
        rng = np.random.default_rng(task_seed(config, "seeds", 0))
        seeds = []
        for i, seed in enumerate(problem.seeds(rng, config.reuse.seed_states)):
            verdict = problem.verify(seed.construction)  # an invalid seed still enters, with reward 0
            seeds.append(
                State(
                    id=f"seed-{i}",
                    parent_id=None,
                    step=-1,
                    reward=verdict.reward if verdict.valid else 0.0,
                    code=seed.code,
                    construction=seed.construction,
                    is_seed=True,
                )
            )
        save_archive(layout.archive(0), Archive.from_seeds(seeds))

    if not (layout.checkpoint(0) / "adapter").is_dir():
        from discover.policy import load_policy

        policy = load_policy(config.model, None, seed=task_seed(config, "policy_init", 0))
        policy.save(layout.checkpoint(0) / "adapter")
    return {"archive": make_ref(layout, layout.archive(0)), "checkpoint": make_ref(layout, layout.checkpoint(0))}


def run_id(layout: RunLayout) -> str:
    return json.loads(layout.run_info.read_text())["run_id"]


# ---------------------------------------------------------------------------------------------
# The five tasks of a step.


def select_parents(run_dir: Path, step: int) -> Ref:
    """SPEC §1.1 and §3: choose G start states from the archive and build one context per group."""
    config, layout = open_run(run_dir)
    archive = load_archive(layout.archive(step))
    problem = make_problem(config)
    rng = np.random.default_rng(task_seed(config, "select_parents", step))
    chosen = choose_parents(
        archive, config.reuse.rule, config.groups, rng, c=config.reuse.puct_c, epsilon=config.reuse.epsilon
    )
    groups = []
    for g, parent_id in enumerate(chosen):
        s = archive[parent_id]
        context = build_context(problem.description, problem.render_state(s.code, s.construction), s.reward, s.observation)
        groups.append({"group": g, "parent_id": parent_id, "parent_reward": s.reward, "context": context})
    out = layout.parents(step)
    atomic_write_json(out, {"step": step, "rule": config.reuse.rule, "groups": groups})
    log.info("step %d select_parents: %s", step, ", ".join(f"{g['parent_id']} ({g['parent_reward']:.4f})" for g in groups))
    return make_ref(layout, out)


def generate(run_dir: Path, step: int) -> Ref:
    """SPEC §1.2 and §4: K rollouts per context from the policy of this step, with log-probs."""
    from discover.policy import GenerationSettings, load_policy

    config, layout = open_run(run_dir)
    parents = json.loads(layout.parents(step).read_text())["groups"]
    policy = load_policy(config.model, layout.checkpoint(step) / "adapter")
    s = config.sampling
    settings = GenerationSettings(
        context_tokens=s.context_tokens,
        thinking_budget=s.thinking_budget,
        max_answer_tokens=s.max_answer_tokens or s.context_tokens,
        temperature=s.temperature,
        think_end=s.think_end,
    )
    t0 = time.time()
    samples = policy.sample([g["context"] for g in parents], config.rollouts_per_group, settings, task_seed(config, "generate", step))
    rows = []
    for g, completions in zip(parents, samples):
        for k, c in enumerate(completions):
            rows.append(
                {
                    "group": g["group"],
                    "index": k,
                    "parent_id": g["parent_id"],
                    "prompt_ids": c.prompt_ids,
                    "completion_ids": c.completion_ids,
                    "sampler_logprobs": c.sampler_logprobs,
                    "loss_mask": c.loss_mask,
                    "text": c.text,
                    "answer": c.answer,
                    "forced": c.forced,
                    "finish_reason": c.finish_reason,
                }
            )
    out = layout.rollouts(step)
    write_rows(out, rows, ROLLOUT_SCHEMA)
    tokens = sum(len(r["completion_ids"]) for r in rows)
    log.info("step %d generate: %d rollouts, %d tokens in %.1f s", step, len(rows), tokens, time.time() - t0)
    return make_ref(layout, out)


def _evaluate_one(problem: Problem, sandbox: Any, answer: str, parent: ParentView) -> tuple[dict[str, Any], float]:
    t0 = time.time()
    candidate = problem.parse(answer)
    if candidate is None:
        result, candidate = EvalResult.invalid("no candidate found in the answer"), ""
    else:
        result = problem.evaluate(candidate, parent, sandbox)
    return dataclasses.asdict(result) | {"code": candidate}, time.time() - t0


def evaluate(run_dir: Path, step: int) -> Ref:
    """SPEC §1.3: parse each rollout into a candidate and score it in the problem's sandbox."""
    config, layout = open_run(run_dir)
    problem = make_problem(config)
    archive = load_archive(layout.archive(step))
    rollouts = read_rows(layout.rollouts(step))
    sandbox = sandbox_for(problem, config.sandbox.backend, config.sandbox.concurrency)
    views = {pid: ParentView(archive[pid].code, archive[pid].construction) for pid in {r["parent_id"] for r in rollouts}}
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=config.sandbox.concurrency) as pool:
        futures = [pool.submit(_evaluate_one, problem, sandbox, r["answer"], views[r["parent_id"]]) for r in rollouts]
        results = []
        for i, f in enumerate(futures):
            results.append(f.result())
            if problem.needs_sandbox and (i + 1) % max(1, len(futures) // 10) == 0:
                log.info("step %d evaluate: %d/%d candidates", step, i + 1, len(futures))
    rows = []
    for r, (res, seconds) in zip(rollouts, results):
        rows.append(
            {
                "group": r["group"],
                "index": r["index"],
                "child_id": f"s{step:04d}-g{r['group']:02d}-r{r['index']:03d}",
                "parent_id": r["parent_id"],
                "reward": float(res["reward"]) if res["valid"] else 0.0,
                "valid": bool(res["valid"]),
                "reason": res["reason"],
                "code": res["code"],
                "construction_json": json.dumps(res["construction"], allow_nan=True),
                "metrics_json": json.dumps(res["metrics"], allow_nan=True),
                "logs": res["logs"],
                "seconds": seconds,
            }
        )
    out = layout.evaluations(step)
    write_rows(out, rows, EVALUATION_SCHEMA)
    rewards = [r["reward"] for r in rows]
    valid = sum(r["valid"] for r in rows)
    log.info(
        "step %d evaluate: %d/%d valid, best %.6f, mean %.6f in %.1f s",
        step, valid, len(rows), max(rewards), float(np.mean(rewards)), time.time() - t0,
    )
    return make_ref(layout, out)


def update_archive(run_dir: Path, step: int) -> Ref:
    """SPEC §1.4 and §3: expansion statistics, top children per parent, the size cap."""
    config, layout = open_run(run_dir)
    archive = load_archive(layout.archive(step))
    parents = [g["parent_id"] for g in json.loads(layout.parents(step).read_text())["groups"]]
    children = [
        Child(
            id=r["child_id"],
            parent_id=r["parent_id"],
            step=step,
            reward=r["reward"],
            valid=r["valid"],
            code=r["code"],
            construction=json.loads(r["construction_json"]),
            observation=r["logs"],
        )
        for r in read_rows(layout.evaluations(step))
    ]
    new = apply_archive_update(
        archive, parents, children, per_parent=config.reuse.children_per_parent, max_size=config.reuse.archive_size
    )
    out = layout.archive(step + 1)
    save_archive(out, new)
    best = new.best()
    log.info("step %d update_archive: %d states, best %s (%.6f)", step, len(new), best.id, best.reward)
    return make_ref(layout, out)


def train(run_dir: Path, step: int) -> Ref:
    """SPEC §1.5 and §2: one optimizer step of the LoRA policy on all G x K rollouts."""
    config, layout = open_run(run_dir)
    rollouts = read_rows(layout.rollouts(step))
    evaluations = {(e["group"], e["index"]): e["reward"] for e in read_rows(layout.evaluations(step))}
    rewards_by_group: dict[int, list[float]] = {}
    for r in rollouts:
        rewards_by_group.setdefault(r["group"], []).append(evaluations[(r["group"], r["index"])])
    advantages: dict[int, np.ndarray] = {}
    betas = []
    for g, rewards in rewards_by_group.items():
        ga = group_advantages(rewards, config.train.objective, gamma=config.train.gamma, constant_beta=config.train.constant_beta)
        advantages[g] = ga.advantages
        betas.append(ga.beta)
    finite = [b for b in betas if np.isfinite(b)]
    stats: dict[str, Any] = {
        "objective": config.train.objective,
        "beta_mean": float(np.mean(finite)) if finite else None,
        "beta_min": float(np.min(finite)) if finite else None,
        "beta_max": float(np.max(finite)) if finite else None,
        "groups_with_signal": int(sum(np.any(a != 0) for a in advantages.values())),
    }
    src, dst = layout.checkpoint(step), layout.checkpoint(step + 1)
    t0 = time.time()
    if config.train.objective == "none":
        _copy_checkpoint(src, dst)  # search only: the policy stays as it was
    else:
        from discover.policy import Completion, TrainBatch, load_policy
        from storage.atomic import atomic_dir

        policy = load_policy(config.model, src / "adapter")
        completions = [
            Completion(
                prompt_ids=r["prompt_ids"],
                completion_ids=r["completion_ids"],
                sampler_logprobs=r["sampler_logprobs"],
                loss_mask=r["loss_mask"],
                text=r["text"],
                answer=r["answer"],
                forced=r["forced"],
                finish_reason=r["finish_reason"],
            )
            for r in rollouts
        ]
        batch = TrainBatch(completions=completions, advantages=[float(advantages[r["group"]][r["index"]]) for r in rollouts])
        optimizer = src / "optimizer.pt"
        stats |= policy.train_step(batch, config.train, temperature=config.sampling.temperature, optimizer_state=optimizer if optimizer.is_file() else None)
        with atomic_dir(dst) as tmp:
            policy.save(tmp / "adapter", tmp / "optimizer.pt")
    stats["seconds"] = time.time() - t0
    atomic_write_json(layout.train_stats(step), stats)
    beta = f"{stats['beta_mean']:.3g}" if stats["beta_mean"] is not None else "n/a"
    log.info("step %d train: loss %s, beta %s, %d groups with signal", step, f"{stats.get('loss', float('nan')):.4g}", beta, stats["groups_with_signal"])
    return make_ref(layout, dst)


def _copy_checkpoint(src: Path, dst: Path) -> None:
    from storage.atomic import atomic_dir

    with atomic_dir(dst) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)


def best_state(run_dir: Path) -> State:
    """The best state of the newest archive of a run."""
    layout = RunLayout(Path(run_dir))
    newest = sorted((layout.root / "archive").glob("*.parquet"))[-1]
    return load_archive(newest).best()
