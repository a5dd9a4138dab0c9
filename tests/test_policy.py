"""The transformers + peft policy backend on the embedded tiny model (CPU, offline)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from discover.config import ModelConfig, SamplingConfig, TrainConfig
from discover.policy.base import Completion, TrainBatch
from discover.policy.chat_format import FORCED_PHRASE

PROMPT = "We want to find a construction that improves the best known bound. Write the code. " * 3
MARKER = "<<END-OF-THINKING-NEVER-EMITTED>>"
TEMPERATURE = 1.0  # the sampling temperature of `samples`, and so the one training steps and log-probs use


@pytest.fixture(scope="module", autouse=True)
def tiny_cache(tmp_path_factory):
    """Build the tiny model into a temporary DISCOVER_CACHE, never the user's cache."""
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("discover-cache")
    mp.setenv("DISCOVER_CACHE", str(root))
    from discover.policy.tiny_model import tiny_model_path

    path = tiny_model_path()
    assert path.is_relative_to(root)
    yield path
    mp.undo()


def _model_cfg(**kw) -> ModelConfig:
    return ModelConfig(name="tiny", lora_rank=4, device="cpu", **kw)


def _load(adapter_dir: Path | None = None, seed: int = 0):
    from discover.policy import transformers_backend

    return transformers_backend.load(_model_cfg(), adapter_dir=adapter_dir, seed=seed)


@pytest.fixture(scope="module")
def samples():
    policy = _load()
    settings = SamplingConfig(context_tokens=2048, max_answer_tokens=12, temperature=TEMPERATURE)
    return policy.sample([PROMPT], 8, settings, seed=3)[0]


def _train_cfg(**kw) -> TrainConfig:
    base = dict(
        learning_rate=1e-2,
        kl_coef=0.0,
    )
    base.update(kw)
    return TrainConfig(**base)


def _lp(policy, comps, temperature: float = TEMPERATURE, **kw) -> list[torch.Tensor]:
    with torch.no_grad():
        return [t.detach().clone() for t in policy.sequence_logprobs(comps, temperature=temperature, **kw)]


def _allclose(a: list[torch.Tensor], b: list[torch.Tensor], atol: float = 1e-5) -> bool:
    return all(torch.allclose(x, y, atol=atol, rtol=0) for x, y in zip(a, b, strict=True))


# ----------------------------------------------------------------------------- tiny model / paths


def test_tokenizer_splits_digits(tiny_cache):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_cache)
    assert tok.tokenize("12345") == ["1", "2", "3", "4", "5"]
    assert tok.eos_token == tok.bos_token == tok.pad_token == "<|endoftext|>"
    text = "def f(x):\n    return np.sum(x[3:17])\n"
    assert tok.decode(tok.encode(text)) == text
    assert 400 <= len(tok) <= 600


def test_tiny_model_build_is_deterministic(tmp_path, tiny_cache):
    from discover.policy.tiny_model import build_tiny_model, tiny_model_path

    out = build_tiny_model(tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json"):
        assert (out / name).read_bytes() == (tiny_cache / name).read_bytes()
    assert tiny_model_path() == tiny_cache  # second call reuses the built model


def test_resolve_model_path(tmp_path, tiny_cache):
    from discover.policy.placement import pick_device
    from discover.policy.resident import resolve_model_path

    assert resolve_model_path("tiny") == str(tiny_cache)
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert resolve_model_path("someorg/some-model") == "someorg/some-model"
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type in ("cpu", "cuda")


def test_unloadable_model_is_a_runtime_error():
    from discover.config import ModelConfig
    from discover.policy import transformers_backend

    with pytest.raises(RuntimeError, match="nonexistent"):
        transformers_backend.load(ModelConfig(name="/nonexistent/model-dir", device="cpu"))


# ----------------------------------------------------------------------------- sampling


def test_sampling_is_deterministic_per_seed():
    policy = _load()
    settings = SamplingConfig(context_tokens=2048, max_answer_tokens=10)
    a = policy.sample([PROMPT, "Another prompt 123"], 4, settings, seed=7)
    b = policy.sample([PROMPT, "Another prompt 123"], 4, settings, seed=7)
    c = policy.sample([PROMPT, "Another prompt 123"], 4, settings, seed=8)
    ids = lambda out: [[x.completion_ids for x in group] for group in out]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)
    assert [[x.sampler_logprobs for x in g] for g in a] == [[x.sampler_logprobs for x in g] for g in b]
    assert len(a) == 2 and all(len(g) == 4 for g in a)
    prompt_ids = policy.sampler.render_prompt(PROMPT)
    for comp in a[0]:
        assert comp.prompt_ids == prompt_ids
        assert len(comp.completion_ids) == len(comp.sampler_logprobs) == len(comp.loss_mask)
        assert 1 <= len(comp.completion_ids) <= 10
        assert comp.answer == comp.text and not comp.forced
        assert comp.finish_reason in ("stop", "length")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_match_sequence_logprobs(temperature):
    policy = _load()
    settings = SamplingConfig(context_tokens=2048, max_answer_tokens=12, temperature=temperature)
    comps = [c for g in policy.sample([PROMPT, "short 42"], 6, settings, seed=1) for c in g]
    lps = policy.sequence_logprobs(comps, temperature=temperature)
    for comp, lp in zip(comps, lps, strict=True):
        assert lp.shape == (len(comp.completion_ids),)
        assert torch.allclose(lp.detach(), torch.tensor(comp.sampler_logprobs), atol=1e-4, rtol=0)


def test_sequence_logprobs_take_the_temperature_and_not_the_last_samples(samples):
    policy = _load()
    comps = samples[:3]
    before = _lp(policy, comps, temperature=0.7)
    hot = SamplingConfig(context_tokens=2048, max_answer_tokens=4, temperature=5.0)
    policy.sample([PROMPT], 2, hot, seed=0)
    assert _allclose(_lp(policy, comps, temperature=0.7), before)  # what was sampled before changes nothing
    assert not _allclose(_lp(policy, comps, temperature=5.0), before, atol=1e-3)
    with pytest.raises(TypeError, match="temperature"):
        policy.sequence_logprobs(comps)  # no remembered default: the caller says which distribution
    with pytest.raises(TypeError, match="temperature"):
        policy.train_step(TrainBatch(comps, [1.0] * 3), _train_cfg())


def test_eos_is_kept_with_mask_one():
    policy = _load()
    eos = policy.sampler.tokenizer.eos_token_id
    # EOS made likely (as tests/test_chat_format.py does for '</think>'): a bias of 5 on its logit gives
    # it about one chance in five a token against the random model's other 511, so nearly every
    # completion stops at EOS, most after some other tokens, whatever the machine's arithmetic.
    head = policy.trainer.model.get_base_model().get_output_embeddings()
    bias = torch.zeros(head.weight.shape[0])
    bias[eos] = 5.0
    hook = head.register_forward_hook(lambda module, args, out: out + bias.to(out.dtype))
    try:
        settings = SamplingConfig(context_tokens=2048, max_answer_tokens=60, temperature=1.0)
        comps = policy.sample(["x"], 64, settings, seed=0)[0]
    finally:
        hook.remove()
    stopped = [c for c in comps if c.finish_reason == "stop"]
    assert any(len(c.completion_ids) > 1 for c in stopped), [(c.finish_reason, len(c.completion_ids)) for c in comps]
    for c in stopped:
        assert c.completion_ids[-1] == eos and c.loss_mask[-1] == 1
        assert eos not in c.completion_ids[:-1]
        assert "<|endoftext|>" not in c.text
        assert c.text == policy.sampler.tokenizer.decode(c.completion_ids[:-1])
    for c in comps:
        if c.finish_reason == "length":
            assert len(c.completion_ids) == 60 and eos not in c.completion_ids


def test_forced_phrase_when_thinking_budget_runs_out():
    policy = _load()
    prompt_len = len(policy.sampler.render_prompt(PROMPT))
    think = 5
    settings = SamplingConfig(context_tokens=2048, thinking_budget=prompt_len + think, max_answer_tokens=7, think_end=MARKER)
    # the plain format (no chat template) closes the thinking with the configured marker (docs/method.md §5a)
    phrase = policy.sampler.tokenizer.encode(FORCED_PHRASE + MARKER, add_special_tokens=False)
    comps = policy.sample([PROMPT], 6, settings, seed=2)[0]
    for c in comps:
        assert c.forced
        n = len(c.completion_ids)
        assert think + len(phrase) < n <= think + len(phrase) + 7
        assert c.completion_ids[think : think + len(phrase)] == phrase
        assert c.loss_mask == [1] * think + [0] * len(phrase) + [1] * (n - think - len(phrase))
        assert all(lp == 0.0 for lp in c.sampler_logprobs[think : think + len(phrase)])
        assert all(lp < 0.0 for lp in c.sampler_logprobs[:think])
        assert FORCED_PHRASE + MARKER in c.text
        body = c.completion_ids[think + len(phrase) :]
        if c.finish_reason == "stop":
            body = body[:-1]
        assert c.answer == policy.sampler.tokenizer.decode(body)
    # the learner's log-probs still line up with the sampler's on the generated tokens
    for c, lp in zip(comps, _lp(policy, comps, temperature=settings.temperature), strict=True):
        m = torch.tensor(c.loss_mask, dtype=torch.bool)
        assert torch.allclose(lp[m], torch.tensor(c.sampler_logprobs)[m], atol=1e-4, rtol=0)


def test_marker_ends_thinking_and_answer_follows_it():
    policy = _load()
    marker = "e"  # a random model emits this letter quickly
    settings = SamplingConfig(context_tokens=2048, thinking_budget=1500, max_answer_tokens=5, think_end=marker)
    comps = policy.sample(["go"], 8, settings, seed=0)[0]
    hit = [c for c in comps if marker in c.text]
    assert hit
    for c in hit:
        assert not c.forced and all(m == 1 for m in c.loss_mask)
        assert c.answer == c.text.split(marker, 1)[1]


def test_prompt_longer_than_thinking_budget_raises():
    policy = _load()
    n = len(policy.sampler.render_prompt(PROMPT))
    settings = SamplingConfig(context_tokens=2048, thinking_budget=n - 3, think_end=MARKER)
    with pytest.raises(ValueError) as err:
        policy.sample([PROMPT], 1, settings, seed=0)
    assert str(n) in str(err.value) and str(n - 3) in str(err.value)


# ----------------------------------------------------------------------------- training


def test_train_step_changes_lora_and_raises_logprob(samples):
    policy = _load()
    before = {n: p.detach().clone() for n, p in policy.trainer.model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in policy.trainer.model.named_parameters() if not p.requires_grad}
    assert before and all("lora" in n for n in before)
    target = samples[0]
    lp0 = _lp(policy, [target])[0].sum()
    stats = policy.train_step(TrainBatch([target], [1.0]), _train_cfg(), temperature=TEMPERATURE)
    for name, value in before.items():  # TRL-style; B starts at 0, so only B has a gradient
        if "lora_B" in name:
            assert not torch.equal(value, dict(policy.trainer.model.named_parameters())[name]), name
    for name, value in frozen.items():
        assert torch.equal(value, dict(policy.trainer.model.named_parameters())[name]), name
    lp1 = _lp(policy, [target])[0].sum()
    assert lp1 > lp0 + 1e-3
    assert stats["tokens"] == sum(target.loss_mask)
    assert abs(stats["mean_ratio"] - 1.0) < 1e-4  # first step: learner == sampler
    assert stats["grad_norm"] > 0 and stats["loss"] < 0


def test_zero_advantage_without_kl_changes_nothing(samples):
    policy = _load()
    before = [p.detach().clone() for p in policy.trainer.lora_parameters()]
    stats = policy.train_step(TrainBatch(samples[:4], [0.0] * 4), _train_cfg(kl_coef=0.0), temperature=TEMPERATURE)
    assert stats["tokens"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, policy.trainer.lora_parameters(), strict=True))


def test_kl_term_uses_base_model(samples):
    policy = _load()
    # fresh adapter: policy == base, sampler == policy, so the KL statistic is ~0
    stats = policy.train_step(TrainBatch(samples[:4], [0.5, -0.5, 1.0, -1.0]), _train_cfg(kl_coef=0.1), temperature=TEMPERATURE)
    assert abs(stats["kl"]) < 1e-4
    assert stats["tokens"] == sum(sum(c.loss_mask) for c in samples[:4])


def test_save_load_round_trip_and_base_logprobs(tmp_path, samples):
    policy = _load()
    fresh = _load(seed=5)
    comps = samples[:5]
    base_before = _lp(policy, comps, with_adapter=False)
    policy.train_step(TrainBatch(comps, [1.0, -1.0, 0.5, 0.0, -0.5]), _train_cfg(), temperature=TEMPERATURE)
    trained = _lp(policy, comps)
    base_after = _lp(policy, comps, with_adapter=False)
    assert not _allclose(trained, base_after, atol=1e-4)  # the adapter now matters
    assert _allclose(base_after, base_before)  # the base model itself never changes
    assert _allclose(base_after, _lp(fresh, comps))  # a fresh LoRA (B = 0) is the base model
    adapter, opt = tmp_path / "adapter", tmp_path / "optimizer.pt"
    policy.save(adapter, opt)
    policy.save(adapter, opt)  # overwriting is atomic too
    assert (adapter / "adapter_config.json").is_file() and opt.is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp leftovers
    reloaded = _load(adapter_dir=adapter)
    assert _allclose(_lp(reloaded, comps), trained, atol=1e-6)
    # continuing from the saved optimizer state gives the same step as continuing in memory
    cfg = _train_cfg()
    batch = TrainBatch(comps, [0.3, 0.2, -0.1, 0.4, -0.6])
    policy.train_step(batch, cfg, temperature=TEMPERATURE)
    reloaded.train_step(batch, cfg, optimizer_state=opt, temperature=TEMPERATURE)
    assert _allclose(_lp(reloaded, comps), _lp(policy, comps), atol=1e-5)


def test_two_policies_do_not_interfere(samples):
    comps = samples[:3]
    a = _load(seed=0)
    ref = _lp(a, comps)
    a.train_step(TrainBatch(comps, [1.0, 1.0, 1.0]), _train_cfg(), temperature=TEMPERATURE)
    a_trained = _lp(a, comps)
    b = _load(seed=1)  # same cached base model, new adapter
    assert _allclose(_lp(b, comps), ref)  # b starts from the base model, untouched by a's training
    b.train_step(TrainBatch(comps, [-1.0, -1.0, -1.0]), _train_cfg(), temperature=TEMPERATURE)
    assert _allclose(_lp(a, comps), a_trained)  # b's training does not leak into a
    assert not _allclose(_lp(b, comps), a_trained, atol=1e-4)
    assert a.trainer.model is not b.trainer.model
    assert not (set(map(id, a.trainer.lora_parameters())) & set(map(id, b.trainer.lora_parameters())))


def test_empty_and_mismatched_batches(samples):
    policy = _load()
    with pytest.raises(ValueError):
        policy.train_step(TrainBatch(samples[:2], [1.0]), _train_cfg(), temperature=TEMPERATURE)
    forced_only = Completion(prompt_ids=[1, 2], completion_ids=[3, 4], sampler_logprobs=[0.0, 0.0], loss_mask=[0, 0], text="", answer="")
    stats = policy.train_step(TrainBatch([forced_only], [1.0]), _train_cfg(), temperature=TEMPERATURE)
    assert stats["tokens"] == 0
