"""What the two AtCoder problems share (docs/method.md §5b): a C++ program compiled once and run on the
contest's public cases in the sandbox, each case's raw output judged on the host by the contest's
judge, and the reward = mean case score / scale when every case passes, else 0.

A case's verdict: AC (judged valid), WA (the judge's reason, or more output than the cap), TLE,
MLE, RE (evaluators/sandbox/native.py says how each is measured). A program that does not compile
is CE, with the compiler's messages as the reason. By default the evaluation stops handing out
cases at the first one that fails (the reward is 0 whatever the rest do); `stop_at_first_failure:
false` runs them all.

A state's construction is its per-case table ({"cases": [[case, verdict, score, cpu_s, peak_mb],
...]}), kept in the archive for every state (seeds included) so that a report can show the best
program's cases; the evaluation's metrics hold the same per case plus totals. Two programs are the
same state when their code is equal up to comments and whitespace (docs/method.md §5a), whatever their
results.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import shutil
import string
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evaluators.algorithms.cases import public_inputs, select_cases
from evaluators.algorithms.judging import MAX_OUTPUT_BYTES
from evaluators.base import DETAIL_CHARS, ArchivedState, BaseProblem, EvalResult, Judgement, ParentView, ReportSection, SeedState, clip
from evaluators.options import missing_file
from evaluators.parsing import last_fenced_block, normalize_code
from evaluators.sandbox.base import SandboxLimits
from evaluators.sandbox.native import CaseRun, NativeLimits

log = logging.getLogger("discover.algorithms")
HERE = Path(__file__).resolve().parent
PROGRESS_EVERY_S = 30.0  # an INFO progress line per evaluation at most this often (every case: DEBUG)
CPP_TAGS = ("cpp", "c++", "cc", "cxx", "c")
# docs/method.md §5b: 2 s and 1024 MB per case; §5a: an evaluation may take 530 s; 2 cases at once by default.
PAPER_LIMITS = {"timeout_s": 530.0, "memory_mb": 1024, "cpus": 2}
OUTPUT_CAP = MAX_OUTPUT_BYTES  # bytes of stdout per case: the sandbox stops a program there, the judges read no more


class AtCoderProblem(BaseProblem):
    """Base of the AHC problems; a subclass names its contest, judge, scale, target and seed."""

    image = "cpp20"
    code_language = "cpp"
    has_cases = True  # the contest's 150 public cases (`cases`, `with_cases`)
    can_judge = True  # `discover judge`: the contest's judge on one output
    progress_logger = log.name  # a line per finished case (DEBUG), one at most every PROGRESS_EVERY_S (INFO)
    contest = ""  # "ahc039": its statement (statements/), public inputs (data/) and name
    scale = 1.0  # reward = mean case score / scale
    time_limit_s = 2.0  # CPU seconds per case (the contest's)
    builtin_program: str | None = None  # the seed's file in programs/; None: start from scratch

    def __init__(
        self,
        cases: str | int | list[int] | None = None,
        stop_at_first_failure: bool = True,
        initial_program: str | None = None,
        timeout_s: float = PAPER_LIMITS["timeout_s"],
        memory_mb: int = PAPER_LIMITS["memory_mb"],
        cpus: int = PAPER_LIMITS["cpus"],
    ):
        self.cases = select_cases(cases, range(150))
        self.stop_at_first_failure = bool(stop_at_first_failure)
        # A C++ file to start from instead of the built-in seed (e.g. the published program the paper
        # started AHC039 from); read only when seeds are drawn, when a run starts.
        self.initial_program = initial_program
        self.limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, cpus=cpus, max_output_bytes=OUTPUT_CAP, max_processes=64)
        self._parsed: dict[int, Any] = {}
        self._lock = threading.Lock()

    # -- what the model reads ----------------------------------------------------------------------

    @property
    def description(self) -> str:
        """The statement in our own words (statements/<contest>.md), stating the live limits."""
        n = len(self.cases)
        text = (HERE / "statements" / f"{self.contest}.md").read_text(encoding="utf-8")
        return string.Template(text).substitute(
            cases="all 150" if n == 150 else f"{n} ({_ranges(self.cases)})",
            time_limit_s=f"{self.time_limit_s:g}",
            memory_mb=self.limits.memory_mb,
            scale=f"{self.scale:g}",
        )

    def render_state(self, code: str, construction: Any) -> str:
        if not code.strip():
            return "No program yet: write one from scratch."
        return f"Program:\n```cpp\n{code.strip()}\n```"

    def archive_key(self, code: str, construction: Any) -> str:
        """The program up to comments and whitespace (docs/method.md §5a); its results do not matter."""
        return hashlib.sha256(("code:" + normalize_code(code, "cpp")).encode()).hexdigest()

    # -- states ------------------------------------------------------------------------------------

    def seeds(self, rng: np.random.Generator, count: int) -> list[SeedState]:
        """`count` copies of the initial program (the option's file, else the built-in one, else none)."""
        if self.initial_program:
            missing = missing_file("initial_program", self.initial_program)
            if missing:
                raise ValueError(missing[0])
            code = Path(self.initial_program).expanduser().read_text(encoding="utf-8")
        elif self.builtin_program:
            code = (HERE / "programs" / self.builtin_program).read_text(encoding="utf-8")
        else:
            code = ""
        return [SeedState(code=code) for _ in range(count)]

    def parse(self, answer: str) -> str | None:
        return last_fenced_block(answer, languages=CPP_TAGS)

    def verify(self, construction: Any) -> EvalResult:
        """Only the empty state (no program: reward 0) is data; a program must run to be scored."""
        if construction is None:
            return EvalResult(reward=0.0, valid=True, observation="no program yet")
        return EvalResult.invalid(
            f"{self.name} states are C++ programs and their results cannot be checked from data; "
            f"score one with `discover evaluate {self.name} PROGRAM.cpp`"
        )

    # -- what the run and the CLI ask ---------------------------------------------------------------

    def with_cases(self, cases: str | None, stop_at_first_failure: bool) -> AtCoderProblem:
        """The same problem on the selected public cases (None: all 150), stopping at the first failure or not."""
        clone = copy.copy(self)
        clone.cases = select_cases(cases, range(150))
        clone.stop_at_first_failure = bool(stop_at_first_failure)
        return clone

    def case_input(self, case: int) -> str:
        """The input of public case `case` (0-149)."""
        inputs = public_inputs(self.contest)
        if case not in inputs:
            raise KeyError(f"no case {case}; the public cases are {_ranges(sorted(inputs))}")
        return inputs[case]

    def judge(self, input_text: str, output: bytes) -> Judgement:
        """The contest judge's verdict on one output for an input given as text."""
        return self.judge_output(self.parse_input(input_text), output)

    def preflight(self, sandbox_backend: str) -> list[str]:
        """The initial program's file exists; the process backend (or 'auto' without the cpp20
        image) has a C++ compiler here."""
        problems = missing_file("initial_program", self.initial_program)
        if sandbox_backend != "docker" and shutil.which("g++") is None:
            from evaluators.sandbox import docker_unavailable

            if sandbox_backend == "process" or docker_unavailable(self.image):
                problems.append(
                    f"{self.name} compiles C++ and the process backend needs g++ here: install it, "
                    f"or use sandbox.backend: docker with the {self.image} image"
                )
        return problems

    def summary_metrics(self, result: EvalResult) -> dict[str, float]:
        """Cases accepted, cases selected, and the mean case score (0 unless every case passed)."""
        m = result.metrics
        if "cases_total" not in m:
            return {}  # a program that did not compile
        return {"cases_passed": float(m["cases_passed"]), "cases_total": float(m["cases_total"]), "mean_score": float(m["mean_score"])}

    def report_sections(self, states: Sequence[ArchivedState]) -> list[ReportSection]:
        """The best state's results case by case (its construction {"cases": [[case, verdict,
        score, cpu_s, peak_mb], ...]})."""
        if not states:
            return []
        best = states[0]
        table = best.construction.get("cases") if isinstance(best.construction, dict) else None
        if not table:
            return []
        columns = ("case", "verdict", "score", "cpu_s", "peak_mb")
        rows = [dict(zip(columns, r)) for r in table]
        scores = [r["score"] for r in rows]
        text = (
            f"State `{best.id}` (reward {best.reward:.6g}{', a seed' if best.is_seed else f', step {best.step}'}): "
            f"{sum(r['verdict'] == 'AC' for r in rows)}/{len(rows)} cases accepted, mean case score "
            f"{float(np.mean(scores)):.1f} (min {min(scores)}, max {max(scores)}); cpu_s is CPU seconds, peak_mb the peak "
            "resident memory."
        )
        return [ReportSection(title="Per-case results of the best program", text=text, rows=rows, columns=columns)]

    # -- judging -----------------------------------------------------------------------------------

    def parse_input(self, text: str) -> Any:
        """The contest's input file, parsed for its judge (ValueError when it is not one)."""
        raise NotImplementedError

    def judge_output(self, parsed_input: Any, output: bytes | str) -> Judgement:
        """The contest judge's verdict on one output for a parsed input."""
        raise NotImplementedError

    def inputs(self) -> list[tuple[int, str]]:
        texts = public_inputs(self.contest)
        return [(c, texts[c]) for c in self.cases]

    def judge_case(self, case: int, output: bytes | str) -> Judgement:
        """The contest judge's verdict on one output for public case `case`."""
        with self._lock:
            parsed = self._parsed.get(case)
        if parsed is None:
            parsed = self.parse_input(public_inputs(self.contest)[case])
            with self._lock:
                self._parsed[case] = parsed
        return self.judge_output(parsed, output)

    def native_limits(self) -> NativeLimits:
        return NativeLimits(
            cpu_s=self.time_limit_s,
            memory_mb=self.limits.memory_mb,
            parallel=max(1, int(self.limits.cpus)),
            deadline_s=self.limits.timeout_s,
            output_bytes=self.limits.max_output_bytes,
            max_processes=self.limits.max_processes,
        )

    def evaluate(self, candidate: str, parent: ParentView | None, sandbox: Any) -> EvalResult:
        """Compile, run every selected case, judge each output on the host (docs/method.md §5b)."""
        tag = hashlib.sha256(candidate.encode()).hexdigest()[:8]
        start = time.monotonic()
        rows: dict[int, dict[str, Any]] = {}
        stderr_tails: dict[int, str] = {}
        lock = threading.Lock()
        last_line = [start]

        def on_case(run: CaseRun) -> bool:
            row = _row(run, self.judge_case(run.case, run.stdout) if run.status == "OK" else None)
            with lock:
                rows[run.case] = row
                stderr_tails[run.case] = run.stderr
                done, passed = len(rows), sum(r["verdict"] == "AC" for r in rows.values())
                now = time.monotonic()
                periodic = now - last_line[0] >= PROGRESS_EVERY_S
                if periodic:
                    last_line[0] = now
            text = (
                f"{self.name} {tag}: case {run.case} {row['verdict']} score {row['score']} "
                f"cpu {row['cpu_s']:.2f} s mem {row['peak_mb']:.0f} MB"
                + (f" ({row['reason']})" if row["reason"] else "")
                + f" [{done}/{len(self.cases)} done, {passed} AC, {now - start:.0f} s]"
            )
            log.log(logging.INFO if periodic else logging.DEBUG, text)
            return row["verdict"] == "AC" or not self.stop_at_first_failure

        run = sandbox.run_native(candidate, self.inputs(), self.native_limits(), on_case)
        if not run.compiled:
            why = run.error.strip() or "compile error"
            log.debug("%s %s: %s", self.name, tag, why)
            return EvalResult.invalid(
                f"{why}:\n{_tail(run.compile_log, 1500)}" if run.compile_log else why,
                observation=_tail(run.compile_log, 2000),
            )
        return self._verdict(run, rows, stderr_tails, time.monotonic() - start)

    def _verdict(self, run: Any, rows: dict[int, dict[str, Any]], stderr_tails: dict[int, str], seconds: float) -> EvalResult:
        ordered = [rows[c] for c in sorted(rows)]
        failed = [r for r in ordered if r["verdict"] != "AC"]
        passed = len(ordered) - len(failed)
        complete = len(ordered) == len(self.cases) and not failed
        scores = [r["score"] for r in ordered if r["verdict"] == "AC"]
        mean = float(np.mean(scores)) if scores else 0.0
        metrics: dict[str, Any] = {
            "cases_passed": passed,
            "cases_run": len(ordered),
            "cases_total": len(self.cases),
            "mean_score": mean if complete else 0.0,
            "max_cpu_s": max((r["cpu_s"] for r in ordered), default=0.0),
            "max_peak_mb": max((r["peak_mb"] for r in ordered), default=0.0),
            "compile_s": run.compile_s,
            "seconds": seconds,
            "cases": ordered,  # per case: case, verdict, score, cpu_s, peak_mb, reason
        }
        construction = {"cases": [[r["case"], r["verdict"], r["score"], r["cpu_s"], r["peak_mb"]] for r in ordered]}
        if failed:
            first = failed[0]
            reason = f"case {first['case']}: {first['verdict']}: {first['reason']}"
        elif not complete:
            reason = run.error.strip() or f"only {len(ordered)} of {len(self.cases)} cases ran"
        else:
            reason = ""
        summary = (
            f"{passed}/{len(self.cases)} cases accepted"
            + (f"; mean score {mean:.1f} (min {min(scores)}, max {max(scores)})" if scores else "")
            + f"; CPU max {metrics['max_cpu_s']:.2f} s; memory max {metrics['max_peak_mb']:.0f} MB"
            + (f"\nfirst failure: {reason}" if reason else "")
        )
        shown = failed[0]["case"] if failed else (ordered[0]["case"] if ordered else None)
        stderr = stderr_tails.get(shown, "").strip() if shown is not None else ""
        logs = (f"stderr of case {shown} (tail):\n{_tail(stderr, 800)}\n" if stderr else "") + summary
        log.debug("%s: %s", self.name, summary.replace("\n", "; "))
        if reason:
            return EvalResult(reward=0.0, valid=False, reason=reason, construction=construction, metrics=metrics, observation=logs)
        return EvalResult(reward=mean / self.scale, valid=True, construction=construction, metrics=metrics, observation=logs)


def _row(run: CaseRun, judgement: Judgement | None) -> dict[str, Any]:
    """One case's summary: the sandbox's status, or the judge's verdict on an output."""
    if judgement is None:
        verdict = {"OLE": "WA"}.get(run.status, run.status)
        reason = run.detail if run.status != "OLE" else f"output too large: {run.detail}"
        score = 0
    else:
        verdict = "AC" if judgement.valid else "WA"
        reason, score = judgement.reason, judgement.score
    return {
        "case": run.case,
        "verdict": verdict,
        "score": int(score),
        "cpu_s": round(run.cpu_s, 3),
        "peak_mb": round(run.peak_mb, 1),
        "reason": clip(reason, DETAIL_CHARS),  # a case's detail is bounded (a candidate fills it)
    }


def _ranges(cases: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    runs: list[list[int]] = []
    for c in cases:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def _tail(text: str, chars: int) -> str:
    return text if len(text) <= chars else "..." + text[-chars:]
