"""Pre-flight of the prompt's length (discover/preflight.py `check_prompt_length`): a seed's context,
tokenized as the policy will tokenize it, must fit the context and the thinking budget, and a run
whose prompt does not fit fails in one line before any weights load and before anything is written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from discover import steps
from discover.config import parse_config
from discover.policy.two_phase import check_prompts
from discover.preflight import PreflightError, preflight, seed_contexts

REPO = Path(__file__).resolve().parents[1]
TOO_LONG = re.compile(r"the prompt of problem (\S+) is (\d+) tokens, more than (.+) leaves room for")


def _config(tmp_path: Path, problem: str = "toy", model: str = "tiny", **sampling: object):
    return parse_config(
        {
            "problem": problem,
            "run_dir": str(tmp_path / "run"),
            "groups": 2,
            "rollouts_per_group": 2,
            "model": {"name": model, "lora_rank": 4, "device": "cpu"},
            "sampling": {"context_tokens": 2048, "thinking_budget": 2048, "max_answer_tokens": 6, **sampling},
            "sandbox": {"backend": "process", "allow_unbounded_process_tree": True},
        }
    )


def _refusal(config) -> str:
    with pytest.raises(PreflightError) as err:
        preflight(config)
    return str(err.value)


def test_the_checked_contexts_are_the_ones_select_parents_builds(tmp_path: Path, tiny_model_cache: Path) -> None:
    config = _config(tmp_path)
    run = steps.create_run(config)
    steps.initialise(run)
    steps.select_parents(run, 0)
    built = {g["context"] for g in json.loads(run.layout.parents(0).read_text())["groups"]}
    assert built and built <= set(seed_contexts(config))


def test_a_prompt_longer_than_the_context_is_refused_with_the_generators_rule(tmp_path: Path, tiny_model_cache: Path) -> None:
    message = _refusal(_config(tmp_path, context_tokens=64, thinking_budget=64))
    problem, tokens, limit = TOO_LONG.match(message).groups()
    assert (problem, limit) == ("toy", "sampling.context_tokens (64)") and "raise sampling.context_tokens" in message
    assert "\n" not in message
    n = int(tokens)
    # the generator's own check on a prompt of that many tokens says the same
    with pytest.raises(ValueError, match=f"is {n} tokens, more than sampling.context_tokens"):
        check_prompts([[0] * n], _config(tmp_path, context_tokens=64, thinking_budget=64).sampling, 64)
    assert f"({n})" in _refusal(_config(tmp_path, context_tokens=n, thinking_budget=n))  # no token left to generate
    preflight(_config(tmp_path, context_tokens=n + 1, thinking_budget=n + 1))  # one token left: it passes
    # the answer's first words are prompt too
    assert f"is {n + 1} tokens" in _refusal(_config(tmp_path, context_tokens=n + 1, thinking_budget=n + 1, answer_prefix="```"))


def test_the_prompt_must_leave_room_to_think(tmp_path: Path, tiny_model_cache: Path) -> None:
    message = _refusal(_config(tmp_path, thinking_budget=100, think_end="</answer-now>"))
    assert TOO_LONG.match(message).group(3) == "sampling.thinking_budget (100)" and "raise sampling.thinking_budget" in message


def test_the_models_own_positions_bound_the_context(tmp_path: Path, tiny_model_cache: Path) -> None:
    # TriMul's prompt (about 4,700 tokens of the tiny tokenizer) fits 8,192 context tokens, not the tiny model's 2,048 positions
    message = _refusal(_config(tmp_path, problem="trimul", context_tokens=8192, thinking_budget=8192))
    assert TOO_LONG.match(message).group(3) == "the model's context of 2048 positions" and "longer context" in message


def test_a_think_end_the_chat_format_cannot_close_is_refused_before_loading(tmp_path: Path, tiny_model_cache: Path) -> None:
    message = _refusal(_config(tmp_path, model="tiny-qwen3", think_end="<|end|>"))
    assert "sampling.think_end is '<|end|>'" in message and "set sampling.think_end: '</think>'" in message


def test_a_hub_model_not_downloaded_is_not_checked(tmp_path: Path) -> None:
    preflight(_config(tmp_path, model="someorg/not-downloaded", context_tokens=16, thinking_budget=16))  # no network: skipped


def test_discover_run_with_too_small_a_context_fails_in_one_line_and_writes_nothing(tmp_path: Path, tiny_model_cache: Path) -> None:
    config = _config(tmp_path, context_tokens=64, thinking_budget=64).model_dump(mode="json")
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DISCOVER_CACHE": str(tiny_model_cache), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "cli", "run", str(path)], env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert TOO_LONG.match(proc.stderr.removeprefix("error: ")), proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_gguf_model_not_converted_yet_is_not_converted_by_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("DISCOVER_CACHE", str(cache))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(64))  # converting this would fail: the check must not try
    preflight(_config(tmp_path, model=str(model), context_tokens=16, thinking_budget=16))
    assert not (cache / "models").exists()
