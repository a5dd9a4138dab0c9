"""benchmarks/ablations.py: every arm is a valid configuration that differs from the method only
where its row of the paper's Table 8 (or the defaults study) says, at the same sampling budget."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from discover.config import parse_config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ablations  # noqa: E402

BASE = yaml.safe_load((ROOT / "configs" / "toy.yaml").read_text())

# Table 8: (train objective, reuse rule) per row, then SimpleTES.
ROWS = [
    ("entropic-adaptive", "puct"),
    ("entropic-constant", "puct"),
    ("expected", "puct"),
    ("none", "puct"),
    ("entropic-adaptive", "epsilon-greedy"),
    ("entropic-adaptive", "none"),
    ("expected", "none"),
    ("none", "none"),
    ("none", "chains"),
]


def _configs(study: dict, tmp_path: Path):
    return {name: parse_config(ablations.arm_config(BASE, arm, name, 7, tmp_path)) for name, arm in study.items()}


def test_table8_arms_are_the_papers_rows_at_one_budget(tmp_path: Path) -> None:
    configs = _configs(ablations.TABLE8, tmp_path)
    assert [(c.train.objective, c.reuse.rule) for c in configs.values()] == ROWS
    assert len({c.rollouts_per_step * c.steps for c in configs.values()}) == 1
    assert len({c.run_dir for c in configs.values()}) == len(configs)
    for c in configs.values():
        assert c.seed == 7 and c.problem_options == ablations.TOY
        assert c.reuse.seed_states is None  # one seed per group in every arm
        assert c.reuse.deduplicate == (c.reuse.rule != "chains")  # SimpleTES's chains do not see each other's states


def test_defaults_study_differs_only_in_the_released_rules(tmp_path: Path) -> None:
    former, released = _configs(ablations.DEFAULTS, tmp_path).values()
    ours = next(iter(_configs(ablations.TABLE8, tmp_path).values()))  # the project's defaults
    assert (former.reuse.seed_states, former.reuse.invalid_children, former.reuse.children_scope, former.reuse.deduplicate) == (
        1,
        "zero",
        "step",
        False,
    )
    assert (ours.reuse.seed_states, ours.reuse.invalid_children, ours.reuse.children_scope, ours.reuse.deduplicate) == (
        None,
        "ignore",
        "archive",
        True,
    )
    assert ours.reuse == released.reuse and not ours.train.kl_center and released.train.kl_center
    assert former.train == ours.train and former.mixed == ours.mixed == released.mixed


def test_migrate_arm_is_the_method_with_mixed_groups(tmp_path: Path) -> None:
    (c,) = _configs(ablations.MIGRATE, tmp_path).values()
    assert (c.train.objective, c.reuse.rule, c.mixed.greedy, c.mixed.neighbourhood) == ("entropic-adaptive", "puct", 2, 2)


def test_table_reports_mean_spread_and_each_seed() -> None:
    results = {"a": {"0": {"best": 0.25}, "1": {"best": 0.75}}}
    assert ablations.table(results, ["a"], [0, 1])[-1] == "| a | 0.500 ± 0.354 | 0.250 | 0.750 | 0.250 0.750 |"


def test_merge_joins_studies_into_one_table(tmp_path: Path) -> None:
    import json

    for name, arm, best in (("a", "x", 0.1), ("b", "y", 0.3)):
        (tmp_path / name).mkdir()
        by_step = [[0.0, best]]
        data = {"header": f"study {name}", "seeds": [0], "results": {arm: {"0": {"best": best, "by_step": by_step, "seconds": 1.0}}}}
        (tmp_path / name / "results.json").write_text(json.dumps(data))
    assert ablations.merge([tmp_path / "a", tmp_path / "b"], tmp_path / "out") == 0
    text = (tmp_path / "out" / "table.md").read_text().splitlines()
    assert text[:2] == ["study a", "study b"] and text[-2].startswith("| x | 0.100") and text[-1].startswith("| y | 0.300")
    assert (tmp_path / "out" / "rewards_by_step.png").stat().st_size > 0
