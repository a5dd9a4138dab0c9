"""vLLM generation with the resident trainer on a GPU (marked `gpu`; skipped without CUDA or vLLM).

On a GPU machine, after `uv sync --extra gpu --extra dev`:

    .venv/bin/python -m pytest -q -m gpu tests/test_gpu_vllm.py -s

(`-s` prints the measured sampler/learner log-prob gaps). The model is a randomly initialised
Qwen3-architecture model of the `small` shape, built on the GPU at the start (seconds).
"""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch

from discover.config import ModelConfig, SamplingConfig, TrainConfig, parse_config
from discover.policy import load_policy, vllm_engine
from discover.policy.base import TrainBatch
from discover.policy.chat_format import FORCED_PHRASE, chat_format_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs the gpu extra (vllm)"),
]

PROMPTS = ["Find a step function with a small maximum overlap. Write the code.", "Improve the bound. " * 20]
SETTINGS = SamplingConfig(context_tokens=4096, thinking_budget=2048, max_answer_tokens=128)  # one phase


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from discover.policy.qwen3_model import build_qwen3_model

    path = build_qwen3_model(tmp_path_factory.mktemp("model") / "qwen3-small", "small", seed=0, device="cuda")
    yield path
    vllm_engine.shutdown()


def _cfg(model_dir, **kw) -> ModelConfig:
    return ModelConfig(name=str(model_dir), backend="vllm", dtype="bfloat16", lora_rank=8, device="cuda:0", **kw)


def _flat(groups):
    return [c for g in groups for c in g]


def _gap(comps, learner) -> float:
    """Mean |sampler - learner| log-prob over the generated (loss-carrying) tokens."""
    diffs = []
    for c, lp in zip(comps, learner, strict=True):
        keep = torch.tensor(c.loss_mask, dtype=torch.bool)
        diffs.append((lp.detach().float().cpu() - torch.tensor(c.sampler_logprobs))[keep])
    return float(torch.cat(diffs).abs().mean())


def test_sampler_and_learner_logprobs_agree(model_dir):
    policy = load_policy(_cfg(model_dir))
    comps = _flat(policy.sample(PROMPTS, 8, SETTINGS, seed=0))
    assert len(comps) == 16
    for c in comps:
        assert len(c.completion_ids) == len(c.sampler_logprobs) == len(c.loss_mask) > 0
        assert all(lp <= 0.0 for lp in c.sampler_logprobs)
    gap = _gap(comps, policy.trainer.sequence_logprobs(comps, temperature=SETTINGS.temperature))
    print(f"\nbase model: mean |sampler - learner| log-prob gap {gap:.4g}")
    assert gap < 0.1


def test_each_step_adapter_is_hot_loaded_under_a_fresh_id(model_dir, tmp_path):
    cfg = _cfg(model_dir)
    base = load_policy(cfg)
    comps = _flat(base.sample(PROMPTS, 8, SETTINGS, seed=1))
    train = TrainConfig(learning_rate=1e-2, kl_coef=0.0)
    trainer = base.trainer
    for _ in range(5):  # push these completions up: the adapter clearly matters
        trainer.train_step(TrainBatch(comps, [1.0] * len(comps)), train, temperature=SETTINGS.temperature)
    adapter = tmp_path / "adapter"
    trainer.save(adapter)
    shutil.copytree(adapter, tmp_path / "adapter-v1")

    step1 = load_policy(cfg, adapter)
    c1 = _flat(step1.sample(PROMPTS, 8, SETTINGS, seed=2))
    adapted = _gap(c1, step1.trainer.sequence_logprobs(c1, temperature=SETTINGS.temperature))
    against_base = _gap(c1, step1.trainer.sequence_logprobs(c1, with_adapter=False, temperature=SETTINGS.temperature))
    print(f"\nstep 1: gap to the adapted learner {adapted:.4g}, to the base model {against_base:.4g}")
    assert adapted < 0.1 and against_base > 3 * adapted  # vLLM sampled with the adapter

    t2 = step1.trainer
    for _ in range(5):
        t2.train_step(TrainBatch(comps, [-1.0] * len(comps)), train, temperature=SETTINGS.temperature)
    t2.save(adapter)  # the same path, rewritten with the next step's adapter
    step2 = load_policy(cfg, adapter)
    assert step2.sampler.lora_request().lora_int_id != step1.sampler.lora_request().lora_int_id
    assert step2.sampler.lora_request().lora_name != step1.sampler.lora_request().lora_name
    c2 = _flat(step2.sample(PROMPTS, 8, SETTINGS, seed=3))
    from discover.policy.trainer import LoRATrainer

    fresh = _gap(c2, step2.trainer.sequence_logprobs(c2, temperature=SETTINGS.temperature))
    stale = _gap(c2, LoRATrainer.load(cfg, tmp_path / "adapter-v1").sequence_logprobs(c2, temperature=SETTINGS.temperature))
    print(f"step 2: gap to the new adapter {fresh:.4g}, to the previous one {stale:.4g}")
    assert fresh < 0.1 and stale > 3 * fresh  # no stale adapter or prefix cache was served


def test_forced_answer_closes_the_thinking_through_vllm(model_dir):
    policy = load_policy(_cfg(model_dir))
    tok = policy.sampler.tokenizer
    prompt_len = len(chat_format_for(tok, "</think>").render(tok, PROMPTS[0], thinking=True))
    s = SamplingConfig(context_tokens=4096, thinking_budget=prompt_len + 16, max_answer_tokens=32, think_end="</think>")
    comps = policy.sample([PROMPTS[0]], 8, s, seed=4)[0]
    forced_ids = tok.encode(FORCED_PHRASE + "</think>\n\n", add_special_tokens=False)
    forced = [c for c in comps if c.forced]
    assert forced, "a random model does not close its thinking in 16 tokens"
    for c in forced:
        n = c.loss_mask.index(0)
        assert n <= 16
        assert c.completion_ids[n : n + len(forced_ids)] == forced_ids
        assert c.loss_mask[n : n + len(forced_ids)] == [0] * len(forced_ids)
        assert c.sampler_logprobs[n : n + len(forced_ids)] == [0.0] * len(forced_ids)
        assert 1 <= len(c.completion_ids) - n - len(forced_ids) <= 32  # the answer phase ran
    gap = _gap(forced, policy.trainer.sequence_logprobs(forced, temperature=s.temperature))
    print(f"\nforced answers: gap {gap:.4g} (phase 2 conditioned on the forced tokens)")
    assert gap < 0.1


def test_generations_after_sleep_and_wake_are_identical(model_dir):
    """The condition for model.sleep_while_training: run this on your GPU before turning it on."""
    policy = load_policy(_cfg(model_dir, sleep_while_training=True))
    ids = lambda out: [[c.completion_ids for c in g] for g in out]  # noqa: E731
    a = policy.sample(PROMPTS, 4, SETTINGS, seed=9)
    b = policy.sample(PROMPTS, 4, SETTINGS, seed=9)
    assert ids(a) == ids(b), "vLLM does not repeat itself on this GPU even without sleeping"
    assert vllm_engine.sleep_if_held()
    c = policy.sample(PROMPTS, 4, SETTINGS, seed=9)  # wakes the engine first
    assert ids(c) == ids(a)
    # a real training step in between: the engine sleeps inside it, the trainer's memory is freed after
    policy.train_step(TrainBatch(_flat(a), [1.0, -1.0] * 4), TrainConfig(learning_rate=1e-3), temperature=SETTINGS.temperature)
    assert vllm_engine._HELD is not None and vllm_engine._HELD.asleep
    d = policy.sample(PROMPTS, 4, SETTINGS, seed=9)  # still the base model: this policy has no adapter
    assert ids(d) == ids(a)


def _reset_prefix_cache() -> None:
    assert vllm_engine._HELD is not None
    vllm_engine._HELD.llm.reset_prefix_cache()


def test_lora_generations_after_sleep_and_wake_are_identical(model_dir, tmp_path):
    """A trained adapter served before and after sleep/wake (and a training step with the trainer's
    weights reloaded, then offloaded again) gives the same tokens; the prefix cache is reset before
    each sample, so every sample recomputes its KV. Tolerance: token ids identical; sampler log-probs
    within 1e-3 (stated, not expected to be needed: same batch, same kernels)."""
    import time

    from discover.policy import offload

    cfg = _cfg(model_dir, sleep_while_training=True, offload_while_generating=True, generation_memory_fraction=0.45)
    base = load_policy(cfg)
    comps = _flat(base.sample(PROMPTS, 8, SETTINGS, seed=11))
    train = TrainConfig(learning_rate=1e-2, kl_coef=0.0)
    for _ in range(5):
        base.trainer.train_step(TrainBatch(comps, [1.0] * len(comps)), train, temperature=SETTINGS.temperature)
    adapter = tmp_path / "adapter"
    base.trainer.save(adapter)

    policy = load_policy(cfg, adapter)
    ids = lambda out: [[c.completion_ids for c in g] for g in out]  # noqa: E731
    lps = lambda out: torch.tensor([x for g in out for c in g for x in c.sampler_logprobs])  # noqa: E731
    _reset_prefix_cache()
    a = policy.sample(PROMPTS, 4, SETTINGS, seed=9)
    _reset_prefix_cache()
    b = policy.sample(PROMPTS, 4, SETTINGS, seed=9)
    assert ids(a) == ids(b), "vLLM does not repeat itself with this adapter on this GPU even without sleeping"
    adapted = _gap(_flat(a), policy.trainer.sequence_logprobs(_flat(a), temperature=SETTINGS.temperature))
    against_base = _gap(_flat(a), policy.trainer.sequence_logprobs(_flat(a), with_adapter=False, temperature=SETTINGS.temperature))
    assert adapted < 0.1 and against_base > 3 * adapted  # the adapter is what was served

    t0 = time.perf_counter()
    assert vllm_engine.sleep_if_held()
    slept = time.perf_counter() - t0
    t0 = time.perf_counter()
    c = policy.sample(PROMPTS, 4, SETTINGS, seed=9)  # the engine wakes and resets its prefix cache first
    woke_and_sampled = time.perf_counter() - t0
    assert ids(c) == ids(a), "the adapter's generations changed across sleep/wake"
    assert torch.allclose(lps(c), lps(a), atol=1e-3, rtol=0)

    # a training step in between: vLLM sleeps, the trainer's weights come back, then leave again
    policy.train_step(TrainBatch(_flat(a), [1.0, -1.0] * 4), TrainConfig(learning_rate=1e-3), temperature=SETTINGS.temperature)
    assert vllm_engine._HELD is not None and vllm_engine._HELD.asleep and offload.parked_count() == 0
    d = policy.sample(PROMPTS, 4, SETTINGS, seed=9)  # parks the trainer, wakes vLLM; the served adapter is the file's
    assert offload.parked_count() > 0
    _reset_prefix_cache()
    e = policy.sample(PROMPTS, 4, SETTINGS, seed=9)
    assert ids(d) == ids(e) == ids(a)
    print(
        f"\nLoRA across sleep/wake: identical tokens, max |d logprob| {float((lps(c) - lps(a)).abs().max()):.2e}; "
        f"sleep {slept:.2f} s, wake + sample {woke_and_sampled:.2f} s"
    )


def test_two_step_erdos_run_with_vllm_and_the_trainer(model_dir, tmp_path):
    """Must show 2: two steps of Erdős with vLLM generation and the resident trainer."""
    from safetensors.torch import load_file

    from discover import steps

    run_dir = tmp_path / "run"
    cfg = parse_config(
        {
            "problem": "erdos",
            "run_dir": str(run_dir),
            "steps": 2,
            "groups": 2,
            "rollouts_per_group": 4,
            "model": {"name": str(model_dir), "backend": "vllm", "dtype": "bfloat16", "lora_rank": 8, "device": "cuda:0"},
            "sampling": {"context_tokens": 8192, "thinking_budget": 4096, "max_answer_tokens": 256, "think_end": "</think>"},
            "sandbox": {"backend": "process", "concurrency": 2},
        }
    )
    run = steps.create_run(cfg)
    steps.initialise(run)
    for step in (0, 1):
        for task in ("select_parents", "generate", "evaluate", "update_archive", "train"):
            getattr(steps, task)(run, step)
    layout = run.layout
    stats = [json.loads(layout.train_stats(s).read_text()) for s in (0, 1)]
    print(f"\nstep 0: mean |sampler - learner| log-prob gap {stats[0]['logprob_gap']:.4g}, mean ratio {stats[0]['mean_ratio']:.4f}")
    print(f"step 1: mean |sampler - learner| log-prob gap {stats[1]['logprob_gap']:.4g}")
    assert stats[0]["tokens"] > 0 and stats[0]["logprob_gap"] < 0.1
    adapters = [load_file(layout.checkpoint(s) / "adapter" / "adapter_model.safetensors") for s in (0, 1, 2)]
    for before, after in zip(adapters, adapters[1:]):
        assert before.keys() == after.keys()
        assert any(not torch.equal(before[k], after[k]) for k in before)  # the adapter changed in each step
