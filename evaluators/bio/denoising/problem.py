"""Single-cell RNA denoising (docs/method.md §5d): the model writes `magic_denoise(X, **kwargs)`, scored by
OpenProblems v1's protocol on held-out molecules.

One evaluation:
1. (once per process) the counts are loaded and filtered, split by the seeded binomial split, the
   baselines of the split computed, and the train half alone written as `train.npy` into a fresh
   world-readable directory: the sandbox's read-only data directory; the split's generator is
   seeded by a key of the configured seed and the full counts (split.py), never shown;
2. the sandbox runs driver.py, which loads `train.npy`, calls the candidate's
   `magic_denoise(X, random_state=0)` (a fixed value unrelated to the split) and returns the
   output as .npy bytes (the limits on the returned value and on file sizes grow to fit the matrix);
3. here, outside the candidate's process: the bytes are decoded without pickle, header first
   (npy.py), checked, scored (metrics.py), accepted if the normalised Poisson is in [0.97, 1] and
   the count-scale, likelihood and dropout rules hold, and rewarded 1 / MSE, the MSE taken no lower
   than the output's flattened to the MAGIC seed's sharpness (the calibration rule). The references of the
   likelihood and calibration rules, the MAGIC seed's count-scale figure and calibration power, are
   computed here once per split (step 1).

The test half lives only in this process's memory. Under either backend the candidate sees the
data directory and the bio packages, nothing else of the host: Docker's bio image deletes the
datasets scanpy ships (pbmc68k_reduced, from which the offline default's held-out counts follow),
and the process sandbox shows them empty (evaluators/sandbox/view.py, HIDDEN_SUFFIXES). Only
`sandbox.isolation: none` shows the host's files, for trusted programs; a warning says so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
import threading
import warnings
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evaluators.base import ArchivedState, BaseProblem, EvalResult, ParentView, ReportSection, SeedState
from evaluators.bio.denoising.counts import OFFLINE_DEFAULT, check_source, load_counts
from evaluators.bio.denoising.metrics import Baselines, judge
from evaluators.bio.denoising.npy import decode_output
from evaluators.bio.denoising.report import report_sections as baseline_sections
from evaluators.bio.denoising.sources import CANDIDATE_ENTRY, CANDIDATE_RANDOM_STATE, PROGRAMS, program  # noqa: F401  (PROGRAMS, program: re-exported)
from evaluators.bio.denoising.split import DEFAULT_SEED, Split, split_molecules
from evaluators.bio.denoising.text import describe
from evaluators.parsing import last_fenced_block, normalize_code
from evaluators.sandbox.base import SandboxLimits

# App. E: "the memory limit is increased to 3GB ... we reduce the time limits for the execution to
# 400 seconds"; 1 CPU as the released launcher's num_cpus_per_task=1.
PAPER_LIMITS = {"timeout_s": 400.0, "memory_mb": 3072, "cpus": 1}
DRIVER_ENTRY = "denoise"  # driver.py's function the sandbox calls
DRIVER = Path(__file__).with_name("driver.py").read_text(encoding="utf-8")
TRAIN_FILE = "train.npy"
_unisolated_warned = False


@dataclasses.dataclass(frozen=True)
class Prepared:
    """One dataset ready to score on: the split, its baselines and the sandbox's data directory."""

    split: Split
    baselines: Baselines
    data_dir: Path  # holds train.npy only
    source: str


class _Dataset:
    """Loads, splits and writes the train half once per process, on first use (thread-safe).

    Shared by the copies `with_limits` makes, so a run's evaluations reuse one split.
    """

    def __init__(self, data: str, layer: str, keep_obs: dict[str, list[Any]] | None, seed: int):
        self.data, self.layer, self.keep_obs, self.seed = data, layer, keep_obs, seed
        self._lock = threading.Lock()
        self._prepared: Prepared | None = None

    def get(self) -> Prepared:
        with self._lock:
            if self._prepared is None:
                self._prepared = self._prepare()
            return self._prepared

    def _prepare(self) -> Prepared:
        counts = load_counts(self.data, self.layer, self.keep_obs)
        split = split_molecules(counts.X, self.seed)
        data_dir = Path(tempfile.mkdtemp(prefix="discover-denoising-", dir=_shared_temp_dir()))
        weakref.finalize(self, shutil.rmtree, data_dir, True)
        train = data_dir / TRAIN_FILE
        np.save(train, split.train, allow_pickle=False)
        # Readable by the sandbox's uid (the process backend runs candidates as another user).
        os.chmod(train, 0o644)
        os.chmod(data_dir, 0o755)
        return Prepared(split=split, baselines=Baselines.of(split), data_dir=data_dir, source=counts.source)


def _shared_temp_dir() -> str:
    """A temporary directory every user can reach: the process backend runs candidates as another uid."""
    for candidate in (tempfile.gettempdir(), "/tmp"):
        path = Path(candidate).resolve()
        if path.is_dir() and all(os.stat(p).st_mode & 0o001 for p in (path, *path.parents)):
            return str(path)
    raise ValueError(
        f"no temporary directory that every user can traverse ({tempfile.gettempdir()} is private): "
        "set TMPDIR to one, so that the sandbox can read the train counts"
    )


class DenoisingProblem(BaseProblem):
    """Write `magic_denoise(X, **kwargs)`; reward 1 / MSE when the normalised Poisson is in [0.97, 1]."""

    name = "denoising"
    image = "bio"

    def __init__(
        self,
        data: str = OFFLINE_DEFAULT,
        layer: str = "X",
        keep_obs: dict[str, list[Any]] | None = None,
        split_seed: int = DEFAULT_SEED,
        allow_process_backend: bool | None = None,
        timeout_s: float = PAPER_LIMITS["timeout_s"],
        memory_mb: int = PAPER_LIMITS["memory_mb"],
        cpus: int = PAPER_LIMITS["cpus"],
    ):
        check_source(data, layer, keep_obs)  # a missing file fails now (pre-flight), not mid-run
        if not isinstance(split_seed, int):
            raise ValueError(f"split_seed must be an integer, got {split_seed!r}")
        self.data = data
        self.limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, cpus=cpus)
        self.split_seed = split_seed
        if allow_process_backend is not None:  # an option of earlier versions: the process sandbox now hides the data
            warnings.warn(
                "problem_options.allow_process_backend is no longer needed and is ignored: the process sandbox shows "
                "candidates the data directory only (docs/sandbox.md); remove it from the configuration",
                DeprecationWarning,
                stacklevel=2,
            )
        self._dataset = _Dataset(data, layer, keep_obs, split_seed)

    @property
    def description(self) -> str:
        dataset = (
            "scanpy's pbmc68k_reduced (700 blood cells x 765 genes)"
            if self.data == OFFLINE_DEFAULT
            else f"the dataset {Path(self.data).name}"
        )
        return describe(dataset, self.limits, CANDIDATE_RANDOM_STATE)

    def prepared(self) -> Prepared:
        """The split, its baselines and the data directory (loaded on first use)."""
        return self._dataset.get()

    def seeds(self, rng: np.random.Generator, count: int) -> list[SeedState]:
        """The one initial state, the MAGIC program, whatever `count` (it is not random)."""
        return [SeedState(code=program("magic"))]

    def parse(self, answer: str) -> str | None:
        return last_fenced_block(answer, languages=("python", "py"))

    def evaluate(self, candidate: str, parent: ParentView | None, sandbox: Any) -> EvalResult:
        """Run the candidate on the train half in `sandbox`; score its output here (docs/method.md §5d)."""
        prepared = self.prepared()
        self._warn_if_unisolated(sandbox)
        job = {"candidate": candidate, "entry": CANDIDATE_ENTRY, "random_state": CANDIDATE_RANDOM_STATE, "train": TRAIN_FILE}
        run = sandbox.run(DRIVER, DRIVER_ENTRY, job, self._run_limits(prepared.split), data_dir=prepared.data_dir)
        logs = run.logs[-self.limits.max_output_bytes :]
        if not run.ok:
            return EvalResult.invalid(run.reason, observation=logs)
        denoised, reason = decode_output(run.output, prepared.split.shape)
        if denoised is None:
            return EvalResult.invalid(reason, observation=logs)
        verdict = judge(prepared.split, prepared.baselines, denoised)
        construction = dict(verdict.metrics) if verdict.valid else None
        return dataclasses.replace(verdict, construction=construction, observation=logs)

    def score_output(self, denoised: Any) -> EvalResult:
        """The verdict on a denoised matrix computed elsewhere (trusted code, e.g. the benchmarks)."""
        prepared = self.prepared()
        verdict = judge(prepared.split, prepared.baselines, denoised)
        return dataclasses.replace(verdict, construction=dict(verdict.metrics) if verdict.valid else None)

    def verify(self, construction: Any) -> EvalResult:
        """A denoised matrix given as data (a list of rows, or {"denoised": rows}), scored on the split."""
        if isinstance(construction, dict) and "denoised" in construction:
            construction = construction["denoised"]
        if not isinstance(construction, list):
            return EvalResult.invalid(
                "a denoising construction is the denoised matrix as a list of rows; a state's metrics "
                "cannot be certified without its program: score a program with `discover evaluate denoising FILE`"
            )
        try:
            denoised = np.asarray(construction, dtype=np.float64)
        except (TypeError, ValueError) as err:
            return EvalResult.invalid(f"the denoised matrix is not a rectangular list of numbers: {err}")
        return self.score_output(denoised)

    def render_state(self, code: str, construction: Any) -> str:
        parts = [f"Code:\n```python\n{code.strip()}\n```" if code.strip() else "No code yet."]
        if isinstance(construction, dict) and "mse" in construction:
            parts.append(
                f"Its output: MSE {construction['mse']:.6f}, Poisson {construction['poisson']:.6f}, "
                f"normalised MSE {construction['mse_normalized']:.4f}, normalised Poisson "
                f"{construction['poisson_normalized']:.4f}, score {construction['score']:.4f}"
                + (
                    f", normalised count-scale Poisson {construction['count_poisson_normalized']:.4f}"
                    if "count_poisson_normalized" in construction
                    else ""
                )
                + (f", dropout AUC {construction['dropout_auc']:.4f}" if "dropout_auc" in construction else "")
                + (
                    f", MSE flattened to the MAGIC seed's sharpness {construction['mse_calibrated']:.6f} (calibration power "
                    f"{construction['calibration_power']:.4f})"
                    if "mse_calibrated" in construction
                    else ""
                )
                + "."
            )
        return "\n\n".join(parts)

    def archive_key(self, code: str, construction: Any) -> str:
        """States are programs: equal up to comments and whitespace (docs/method.md §5a), whatever their metrics."""
        return hashlib.sha256(("code:" + normalize_code(code)).encode()).hexdigest()

    def report_sections(self, states: Sequence[ArchivedState]) -> list[ReportSection]:
        """The best program's MSE, Poisson and score against the baselines (report.py)."""
        return baseline_sections(self.prepared(), states)

    def summary_metrics(self, result: EvalResult) -> dict[str, float]:
        """MSE, Poisson and score of a valid verdict (OpenProblems v1's figures)."""
        return {k: float(result.metrics[k]) for k in ("mse", "poisson", "score") if k in result.metrics}

    def _run_limits(self, split: Split) -> SandboxLimits:
        """The limits, with room for the returned matrix (its .npy bytes in base64, any 8-byte
        dtype) in the return value and in the file that carries it."""
        value_bytes = (split.train.size * 8 + 4096) * 4 // 3 + 4096
        return dataclasses.replace(
            self.limits,
            max_output_bytes=max(self.limits.max_output_bytes, value_bytes),
            max_file_mb=max(self.limits.max_file_mb, -(-value_bytes // 2**20) + 1),
        )

    def _warn_if_unisolated(self, sandbox: Any) -> None:
        global _unisolated_warned
        if getattr(sandbox, "isolation", "") == "none" and not _unisolated_warned:
            _unisolated_warned = True
            warnings.warn(
                "denoising under sandbox.isolation none: a candidate can read every file of the host, "
                + (
                    "including scanpy's copy of pbmc68k_reduced, from which the held-out counts follow; "
                    if self.data == OFFLINE_DEFAULT
                    else "and the dataset file if it is readable by others; "
                )
                + "never train untrusted models so",
                RuntimeWarning,
                stacklevel=2,
            )
