"""Where each step's outputs live inside a run directory.

run_dir/
  run.json                     run id and creation time
  config.yaml                  the resolved configuration, every default written out
  manifest.json                finished tasks: step, task, output path and hash, timings
  archive/0000.parquet         the archive entering step 0 (the seeds); archive/0001 after step 0, ...
  steps/0003/parents.json      select_parents: the chosen start states and their contexts
  steps/0003/rollouts.parquet  generate: tokens, sampler log-probabilities, text
  steps/0003/generated/<group>-<index>.json  one finished rollout each while generate runs (resume keeps them)
  steps/0003/generate.json     generate: rollouts reused from an interrupted attempt and generated, tokens, seconds
  steps/0003/evaluations.parquet  evaluate: reward, validity, reason, child state per rollout
  steps/0003/candidates/<key>.json  one evaluated candidate each, as it finishes (resume keeps them)
  steps/0003/train.json        train: loss, beta and advantage statistics
  checkpoints/0003/            the policy used at step 3: LoRA adapter, optimizer state, RNG state
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunLayout:
    root: Path

    @property
    def run_info(self) -> Path:
        return self.root / "run.json"

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    def archive(self, step: int) -> Path:
        """The archive entering `step` (step 0: the seeds)."""
        return self.root / "archive" / f"{step:04d}.parquet"

    def step_dir(self, step: int) -> Path:
        return self.root / "steps" / f"{step:04d}"

    def parents(self, step: int) -> Path:
        return self.step_dir(step) / "parents.json"

    def rollouts(self, step: int) -> Path:
        return self.step_dir(step) / "rollouts.parquet"

    def generated(self, step: int) -> Path:
        """One record per finished rollout while `generate` runs (storage/rollout_parts.py)."""
        return self.step_dir(step) / "generated"

    def generate_stats(self, step: int) -> Path:
        return self.step_dir(step) / "generate.json"

    def evaluations(self, step: int) -> Path:
        return self.step_dir(step) / "evaluations.parquet"

    def candidates(self, step: int) -> Path:
        """One result file per distinct candidate of the step (storage/candidates.py)."""
        return self.step_dir(step) / "candidates"

    def train_stats(self, step: int) -> Path:
        return self.step_dir(step) / "train.json"

    def checkpoint(self, step: int) -> Path:
        """The policy used at `step` (step 0: the freshly initialised adapter)."""
        return self.root / "checkpoints" / f"{step:04d}"

    def relative(self, path: Path) -> str:
        return str(Path(path).relative_to(self.root))
