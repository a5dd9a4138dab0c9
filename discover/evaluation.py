"""The evaluation of one step (docs/method.md §1.3), one candidate at a time, wherever candidates run.

Each rollout's answer is parsed here, in the flow's process (under `sampling.answer_format: edits`,
its SEARCH/REPLACE blocks are applied to the parent's program instead: `candidate_of`); a
candidate (the parsed program or construction, with the parent it extends) becomes a `CandidateJob` of plain data that any worker of
the evaluation engine can run with `run_job`: it rebuilds the problem from the run's configuration
and scores the candidate in the problem's sandbox on that worker. Nothing here knows the engine:
the caller gives `submit(job) -> future` (a thread pool by default; flows/ gives Prefect's task
runner on Dask or Ray).

One result per candidate (docs/architecture.md, "Retry, cache, resume"): its key is the run id, the
step, the candidate's content hash and the source of its evaluator and sandbox. A result is stored (storage/candidates.py) as
soon as it comes back, so a step killed in the middle of its evaluation resumes with only the
unfinished candidates, and a program seen twice in a step is evaluated once. Rollouts can be added
while they are being generated (`add`), which is how generation and evaluation overlap.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import logging
import queue
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from discover.code_version import module_closure, source_digest
from discover.config import PLACEMENT_TIMEOUT_S
from discover.edits import EDITS_NOT_APPLIED, EditError, apply_edits
from discover.records import Evaluation, Rollout, child_id
from discover.run import Run, load_archive, make_problem
from evaluators.base import EvalResult, ParentView, Problem
from evaluators.sandbox import sandbox_for
from evaluators.sandbox.base import BackendRefused, infrastructure_failure
from storage.candidates import CandidateStore

log = logging.getLogger("discover")

NO_CANDIDATE = "no candidate found in the answer"
UNPLACED_AFTER_S = 60.0  # no candidate back for this long: ask the engine whether it can start one at all


class NoNodeFits(str):
    """An engine's answer to "why can no candidate start" (`unplaceable`) when no live node has what a
    candidate asks in all, free or not: until a node is added, retrying cannot help."""


class Unplaceable(RuntimeError):
    """No live node could start the step's candidates for `PLACEMENT_TIMEOUT_S`: the task fails once,
    not again on each retry (flows/evaluation.py `_NO_RETRY`)."""


EVALUATOR_FAULT = "evaluator fault"  # how the reason of a verdict made from a judge's exception begins


@dataclass(frozen=True)
class Resources:
    """What one candidate needs from the worker that runs it: the engine's resource request."""

    cpus: int
    memory_mb: int
    gpus: int

    @classmethod
    def of(cls, problem: Problem) -> Resources:
        return cls(cpus=int(problem.limits.cpus), memory_mb=int(problem.limits.memory_mb), gpus=1 if problem.needs_gpu else 0)


@dataclass(frozen=True)
class CandidateJob:
    """One distinct candidate of a step, as plain data a worker on another machine can run."""

    key: str  # run id, step, content hash, evaluator source
    step: int
    child_id: str  # the first rollout that proposed it (for names in logs and the UI)
    candidate: str
    parent_code: str
    parent_construction: Any
    config_json: str  # the run's configuration: problem, options, limits, sandbox backend
    resources: Resources


def evaluator_source(problem: Problem) -> str:
    """A hash of what scores a candidate of `problem`: the source of its module and every project
    module that imports (discover/code_version.py), of the sandbox backends (evaluators/sandbox and
    what it imports), of this module, and every file of the problem's domain folder, data included
    (drivers and programs read as text and sent into the sandbox, test cases, published
    constructions; compiled caches left out), so a resumed step never reuses a verdict given by other
    evaluator files."""
    modules = {__name__, *module_closure(type(problem).__module__), *module_closure(sandbox_for.__module__)}
    h = hashlib.sha256(source_digest(modules).encode())
    module = inspect.getmodule(type(problem))
    if module is not None and module.__name__.count(".") >= 2:  # evaluators/<domain>/<module>.py
        h.update(domain_digest(Path(inspect.getfile(module)).parent).encode())
    return h.hexdigest()


@lru_cache(maxsize=16)
def domain_digest(folder: Path) -> str:
    """sha256 over the relative path and bytes of every file under `folder` but Python's compiled
    caches (a few MB at most: AtCoder's public cases are the largest); per process, as the code."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def candidate_key(run_id: str, step: int, candidate: str, parent: ParentView, evaluator: str) -> str:
    """The cache key of one candidate of a step (the same program from the same parent: one key)."""
    content = hashlib.sha256(json.dumps([candidate, parent.code, parent.construction], sort_keys=True, allow_nan=True).encode()).hexdigest()
    return hashlib.sha256(json.dumps([run_id, step, content, evaluator]).encode()).hexdigest()


@lru_cache(maxsize=8)
def _problem(config_json: str) -> Problem:
    from discover.config import RunConfig

    return make_problem(RunConfig.model_validate_json(config_json))


def candidate_of(problem: Problem, answer: str, parent_code: str, answer_format: str) -> tuple[str | None, str]:
    """The candidate of a model's answer, and why there is none (docs/method.md §4 and "Answers as edits").

    `answer_format` "program": the problem's own parse (the last fenced code block); "edits": the
    parent's program with the answer's SEARCH/REPLACE blocks applied (discover/edits.py), a whole
    program evaluated like any other. Returns (candidate, "") or (None, reason).
    """
    if answer_format == "edits":
        try:
            return apply_edits(parent_code, answer), ""
        except EditError as err:
            return None, f"{EDITS_NOT_APPLIED}: {err}"
    candidate = problem.parse(answer)
    return (candidate, "") if candidate is not None else (None, NO_CANDIDATE)


def judge_candidate(problem: Problem, candidate: str, parent: ParentView | None, sandbox: Any, who: str) -> EvalResult:
    """`problem.evaluate(candidate, parent, sandbox)`, where whatever the candidate wrote gets a verdict.

    An exception raised while the problem judges the candidate (its judge choking on the output:
    a number too long for `int()`, a header declaring a petabyte, a recursion too deep) is that
    candidate's verdict: invalid, reward 0, the reason naming the evaluator fault, logged as an
    error with `who` (the candidate's id). It is stored like any result, so a resumed run does not
    judge the candidate again. A failure of the infrastructure (`infrastructure_failure`: no
    Docker engine, a lost container or runner, the operating system refusing) is raised as it is,
    for the engine to retry and the step to fail loudly. A problem refusing the sandbox backend
    (`BackendRefused`, a ValueError: the configuration's fault) is raised as it is too, and is not
    retried: the step fails with its one line.
    """
    try:
        return problem.evaluate(candidate, parent, sandbox)
    except Exception as err:  # noqa: BLE001 - sorted into the infrastructure's and the judge's just below
        if infrastructure_failure(err) or isinstance(err, BackendRefused):
            raise
        what = f"{type(err).__name__}: {err}"
        if len(what) > 500:
            what = what[:500] + "..."
        log.error(
            "candidate %s of %s: the evaluator raised while judging it (%s); it is scored 0 (an evaluator fault, not retried)",
            who,
            problem.name,
            what,
            exc_info=log.isEnabledFor(logging.DEBUG),
        )
        return EvalResult.invalid(f"{EVALUATOR_FAULT}: judging this candidate raised {what}")


def run_job(job: CandidateJob) -> EvalResult:
    """Score one candidate in its problem's sandbox on this machine; its `EvalResult` back, with
    the seconds it took.

    A candidate's own failure (a crash, a timeout, a wrong answer) is a result with reward 0, and so
    is an exception its judging raises (`judge_candidate`: an evaluator fault). An exception out of
    here is the infrastructure's (no sandbox backend, no Docker engine, a lost container) or the
    configuration's, and is retried by the engine (flows/evaluation.py).
    """
    config = json.loads(job.config_json)
    problem = _problem(job.config_json)
    sandbox = sandbox_for(
        problem,
        config["sandbox"]["backend"],
        config["sandbox"]["concurrency"],
        config["sandbox"].get("allow_unbounded_process_tree", False),
        config["sandbox"].get("isolation", "standard"),
    )
    t0 = time.time()
    verdict = judge_candidate(problem, job.candidate, ParentView(job.parent_code, job.parent_construction), sandbox, job.child_id)
    return dataclasses.replace(verdict.verdict(), seconds=time.time() - t0)


Submit = Callable[[CandidateJob], Any]  # returns a future: .result() and .add_done_callback(fn)


@contextmanager
def thread_pool(workers: int) -> Iterator[Submit]:
    """The engine of a step run without Prefect: `workers` threads of this process."""
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="evaluate") as pool:
        yield lambda job: pool.submit(run_job, job)


class StepEvaluation:
    """The candidates of one step: parsed, keyed, each distinct one submitted once, stored on return."""

    def __init__(self, run: Run, step: int, submit: Submit, unplaceable: Callable[[], str | None] = lambda: None) -> None:
        self.run, self.step, self._submit = run, step, submit
        self._unplaceable = unplaceable  # why the engine cannot start one more candidate now (None: it can)
        self.problem = run.problem()
        self._archive = load_archive(run.reads("evaluate", step)["archive"])
        self._config_json = run.config.model_dump_json()
        self._evaluator = evaluator_source(self.problem)
        self._resources = Resources.of(self.problem)
        self.store = CandidateStore(run.layout.candidates(step), EvalResult)
        self._results: dict[str, EvalResult] = {}
        self._pending: dict[str, Any] = {}  # key -> future
        self._returned: queue.SimpleQueue[str] = queue.SimpleQueue()  # keys whose futures finished
        self._errors: dict[str, BaseException] = {}
        self._jobs: dict[str, CandidateJob] = {}
        self.submitted = 0  # candidates this session sent out (the others were stored or repeats)

    def job(self, rollout: Rollout) -> CandidateJob | str:
        """The rollout's candidate as a job, or why its answer holds none (docs/method.md §4: a
        program parsed from the answer; under answer_format edits, the parent's program edited)."""
        parent = self._archive[rollout.parent_id]
        candidate, why = candidate_of(self.problem, rollout.answer, parent.code, self.run.config.sampling.answer_format)
        if candidate is None:
            return why
        view = ParentView(parent.code, parent.construction)
        key = candidate_key(self.run.run_id, self.step, candidate, view, self._evaluator)
        child = child_id(self.step, rollout.group, rollout.index)
        return CandidateJob(key, self.step, child, candidate, view.code, view.construction, self._config_json, self._resources)

    def add(self, rollout: Rollout) -> None:
        """Start evaluating the rollout's candidate unless it is stored, running or has none."""
        self._drain()
        job = self.job(rollout)
        if isinstance(job, str) or job.key in self._results or job.key in self._pending:
            return
        stored = self.store.get(job.key)
        if stored is not None:
            self._results[job.key] = stored
            return
        self._jobs[job.key] = job
        future = self._submit(job)
        self._pending[job.key] = future
        self.submitted += 1
        future.add_done_callback(lambda _f, key=job.key: self._returned.put(key))

    def _drain(self, timeout: float | None = 0.0) -> None:
        """Store every result that has come back (waiting up to `timeout` seconds for the first)."""
        block = timeout is None or timeout > 0
        while True:
            try:
                key = self._returned.get(block=block, timeout=timeout if block else None)
            except queue.Empty:
                return
            block = False
            future = self._pending.pop(key)
            try:
                returned = future.result()
            except Exception as err:  # noqa: BLE001 - infrastructure, after the engine's retries
                self._errors[key] = err
                log.error("step %d: candidate %s failed to evaluate: %s", self.step, self._jobs[key].child_id, err)
                continue
            self.store.put(key, returned)
            stored = self.store.get(key)  # what the store holds: the same whether stored now or before a resume
            assert stored is not None
            self._results[key] = stored

    def collect(self, rollouts: list[Rollout]) -> list[Evaluation]:
        """Every rollout's evaluation, in the rollouts' order, once all candidates have come back."""
        for r in rollouts:
            self.add(r)
        total, t0, shown = len(self._pending), time.time(), 0
        log.info(
            "step %d evaluate: %d distinct candidates stored, %d running",
            self.step,
            len(self._results),
            total,
        )
        progress, stuck = time.time(), None  # when a candidate last came back; since when none can be placed
        while self._pending:
            self._drain(timeout=5.0)
            done = total - len(self._pending)
            if total and (done - shown >= max(1, total // 10) or not self._pending):
                log.info("step %d evaluate: %d/%d candidates back (%.0f s)", self.step, done, total, time.time() - t0)
                shown, progress = done, time.time()
            stuck = self._check_placement(progress, stuck)
        if self._errors:
            key, err = next(iter(self._errors.items()))
            raise RuntimeError(
                f"{len(self._errors)} candidates of step {self.step} could not be evaluated (infrastructure, after "
                f"the engine's retries), e.g. {self._jobs[key].child_id}: {err}; the {len(self._results)} that finished "
                "are stored, and a retry of the step evaluates only the others"
            ) from err
        return [self._evaluation(r) for r in rollouts]

    def _check_placement(self, progress: float, stuck: float | None) -> float | None:
        """While no candidate comes back for `UNPLACED_AFTER_S` and the engine says it cannot start one
        (`unplaceable`), say so once, naming what a candidate asks and what the engine has; after
        `PLACEMENT_TIMEOUT_S` of that, fail the task rather than wait for ever. Returns since when."""
        now = time.time()
        if now - progress < UNPLACED_AFTER_S:
            return None
        why = self._unplaceable()
        if why is None:
            return None
        if stuck is None:
            log.warning(
                "step %d evaluate: no candidate came back for %.0f s and %s; evaluate fails after %.0f s of this",
                self.step,
                now - progress,
                why,
                PLACEMENT_TIMEOUT_S,
            )
            return now
        if now - stuck >= PLACEMENT_TIMEOUT_S:
            said = f"step {self.step} evaluate: {len(self._pending)} candidates could not be started for {now - stuck:.0f} s: {why}."
            if isinstance(why, NoNodeFits):  # a retry would wait as long again for the same answer
                raise Unplaceable(
                    f"{said} Not retried: no live node has that much. The candidates that finished are stored; once a node that "
                    f"has it joins, `discover resume {self.run.root}` evaluates only the others"
                )
            raise RuntimeError(f"{said} The candidates that finished are stored; a retry of the step evaluates only the others")
        return stuck

    def _evaluation(self, rollout: Rollout) -> Evaluation:
        job = self.job(rollout)
        if isinstance(job, str):
            return Evaluation.of(rollout, self.step, EvalResult.invalid(job), "")
        return Evaluation.of(rollout, self.step, self._results[job.key], job.candidate)
