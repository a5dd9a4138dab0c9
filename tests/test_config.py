"""The run configuration: defaults from the paper, errors that name the field and the fix."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from discover.backends import BACKENDS, DEFAULT_BACKEND
from discover.config import ConfigError, load_config, parse_config, reference_markdown
from evaluators.registry import problem_names

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_are_the_papers_table_9() -> None:
    c = parse_config({"problem": "erdos"})
    assert (c.steps, c.groups, c.rollouts_per_group, c.rollouts_per_step) == (50, 8, 64, 512)
    assert c.model.lora_rank == 32
    assert (c.train.learning_rate, c.train.adam_betas, c.train.adam_eps) == (4e-5, (0.9, 0.95), 1e-8)
    assert c.train.kl_coef == 0.1 and c.train.gamma == pytest.approx(math.log(2))
    assert c.reuse.puct_c == 1.0 and c.reuse.rule == "puct" and c.train.objective == "entropic-adaptive"
    assert (c.sampling.context_tokens, c.sampling.thinking_budget, c.sampling.temperature) == (32768, 26000, 1.0)
    assert (c.reuse.children_per_parent, c.reuse.archive_size) == (2, 1000)


def test_policy_backend_default_comes_from_the_backend_registry() -> None:
    assert DEFAULT_BACKEND in BACKENDS
    assert parse_config({"problem": "toy"}).model.backend == DEFAULT_BACKEND


@pytest.mark.parametrize(
    "data, field, hint",
    [
        ({"problem": "toy", "reuse": {"rule": "pcut"}}, "reuse.rule", "'puct', 'epsilon-greedy', 'none' or 'chains'"),
        (
            {"problem": "toy", "train": {"objective": "grpo"}},
            "train.objective",
            "'entropic-adaptive', 'entropic-constant', 'expected' or 'none'",
        ),
        ({"problem": "nope"}, "problem", "allowed values: " + ", ".join(problem_names())),
        ({"problem": "toy", "stepz": 3}, "stepz", "unknown field"),
        ({"problem": "toy", "train": {"learning_rate": 0}}, "train.learning_rate", "greater than 0"),
        ({"problem": "toy", "groups": 0}, "groups", "greater than or equal to 1"),
        ({"problem": "toy", "train": {"adam_betas": [0.9, 1.5]}}, "train.adam_betas", "[0, 1)"),
        ({"problem": "toy", "sampling": {"context_tokens": 100, "thinking_budget": 200}}, "thinking_budget", "exceeds"),
        ({}, "problem", "Field required"),
    ],
)
def test_bad_configuration_names_the_field_and_allowed_values(data: dict, field: str, hint: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, source="run.yaml")
    message = str(err.value)
    assert "run.yaml" in message and field in message and hint in message


@pytest.mark.parametrize(
    "data, line",
    [
        (
            {"problem": "toy", "train": {"learnig_rate": 1e-4}},
            "  train.learnig_rate: unknown field; did you mean 'learning_rate'? (docs/configuration.md lists every field)",
        ),
        (
            {"problem": "toy", "rollout_per_group": 4},
            "  rollout_per_group: unknown field; did you mean 'rollouts_per_group'? (docs/configuration.md lists every field)",
        ),
        (
            {"problem": "toy", "sampling": {"context_tokenz": 4096}},
            "  sampling.context_tokenz: unknown field; did you mean 'context_tokens'? (docs/configuration.md lists every field)",
        ),
        ({"problem": "toy", "train": {"zzz": 1}}, "  train.zzz: unknown field; check its spelling against docs/configuration.md"),
    ],
)
def test_a_misspelt_field_names_the_closest_valid_one(data: dict, line: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, source="run.yaml")
    assert str(err.value).splitlines() == ["invalid configuration in run.yaml:", line]


def test_load_config_reports_missing_file_and_bad_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.yaml")
    monkeypatch.chdir(tmp_path)  # a relative path: the message names the folder it was looked for in
    with pytest.raises(ConfigError) as missing:
        load_config("configs/absent.yaml")
    assert f"looked for absent.yaml in {tmp_path / 'configs'}, relative to the working directory {tmp_path}" in str(missing.value)
    bad = tmp_path / "bad.yaml"
    bad.write_text("problem: [toy\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


@pytest.mark.parametrize("name", ["toy.yaml", "erdos.yaml"])
def test_shipped_configs_are_valid(name: str) -> None:
    load_config(ROOT / "configs" / name)


def test_configuration_reference_matches_the_code() -> None:
    assert (ROOT / "docs" / "configuration.md").read_text() == reference_markdown(), (
        "docs/configuration.md is stale: run `discover config-doc > docs/configuration.md`"
    )


def test_overrides_replace_top_level_fields(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"problem": "toy", "run_dir": "a"}))
    assert load_config(path, {"run_dir": str(tmp_path / "b")}).run_dir == tmp_path / "b"


@pytest.mark.parametrize(
    "cluster, extra, fix",
    [
        ({"tensor_parallel_size": 2}, {}, "set cluster.generation_replicas to 2 or more"),
        (
            {"generation_replicas": 2, "tensor_parallel_size": 2, "share_gpus": True},
            {},
            "set tensor_parallel_size to 1 or share_gpus to false",
        ),
        (
            {"address": "10.0.0.1:6379"},
            {},
            "set cluster.generation_replicas or cluster.trainer_world_size to 2 or more, or remove cluster.address",
        ),
        ({"trainer_placement": "ray"}, {}, "set cluster.trainer_world_size to 2 or more, or trainer_placement to 'local'"),
        ({"trainer_world_size": 2, "trainer_resources": {"trainer": 1}}, {}, "set cluster.trainer_placement to 'ray' or remove them"),
        ({"replica_resources": {"generate": 1}}, {}, "set cluster.generation_replicas to 2 or more or remove them"),
        (
            {"generation_replicas": 2, "address": "10.0.0.1:6379"},
            {"evaluation": {"runner": "ray", "address": "10.0.0.2:6379"}},
            "give both the same address, or leave one of them null",
        ),
        ({"generation_replicas": 2, "share_gpus": True}, {"model": {"device": "cpu"}}, "set model.device to 'auto' or 'cuda:N'"),
    ],
)
def test_a_cluster_section_that_cannot_work_names_the_fix(cluster: dict, extra: dict, fix: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"problem": "toy", "cluster": cluster, **extra}, source="run.yaml")
    assert fix in str(err.value)


def test_without_a_cluster_section_generation_stays_in_the_steps_process() -> None:
    config = parse_config({"problem": "toy"})
    assert config.cluster.generation_replicas == 1 and config.cluster.address is None
    ok = parse_config(
        {"problem": "toy", "cluster": {"generation_replicas": 2, "address": "10.0.0.1:6379"}, "evaluation": {"runner": "ray"}}
    )
    assert ok.cluster.generation_replicas == 2


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_configuration_loads(path: Path) -> None:
    """What the README and docs tell users to run validates as it stands (a misspelt or retired field fails here)."""
    config = load_config(path)
    assert config.problem and config.steps >= 1
