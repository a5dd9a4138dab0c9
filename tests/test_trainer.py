"""The resident trainer: token-budget micro-batches, right-padded log-probs, ratio truncation, residency."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from discover.config import ModelConfig, SamplingConfig, TrainConfig
from discover.objectives import importance_sampling_loss
from discover.policy.base import TrainBatch
from discover.policy.packing import pack_by_tokens, padded_tokens
from discover.policy.trainer import accumulate_gradients, token_logprobs

PROMPTS = ["Improve the bound.", "Write a function that returns a numpy array of floats. " * 3]
TEMPERATURE = 1.0  # the sampling temperature of `rollouts`, and so the one training steps and log-probs use


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("DISCOVER_CACHE", str(tmp_path_factory.mktemp("discover-cache")))
    yield
    mp.undo()


def _policy(name="tiny-qwen3", **kw):
    from discover.policy import transformers_backend

    return transformers_backend.load(ModelConfig(name=name, lora_rank=4, device="cpu", **kw))


@pytest.fixture(scope="module")
def rollouts():
    """Completions of four different lengths (two prompts, answers of 3 to 24 tokens)."""
    return _rollouts(_policy())


def _rollouts(policy):
    comps = []
    for i, n in enumerate((3, 24, 11, 17)):
        settings = SamplingConfig(context_tokens=512, max_answer_tokens=n, temperature=TEMPERATURE)
        comps += policy.sample([PROMPTS[i % 2]], 2, settings, seed=i)[0]
    assert len({len(c.prompt_ids) + len(c.completion_ids) for c in comps}) >= 4
    return comps


def _grads(policy) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in policy.trainer.lora_parameters()]


# ----------------------------------------------------------------------------- packing


def test_pack_by_tokens_respects_the_budget():
    lengths = [5, 40, 12, 12, 3, 70, 8, 8, 8, 1]
    batches = pack_by_tokens(lengths, 32)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        cost = len(b) * max(lengths[i] for i in b)
        assert cost <= 32 or len(b) == 1  # only a sequence over the budget stands alone over it
        assert all(2 * lengths[i] >= max(lengths[j] for j in b) for i in b)  # padding < half the work
    assert [b for b in batches if len(b) == 1 and lengths[b[0]] > 32] == [[5], [1]]
    assert pack_by_tokens(lengths, 32) == batches  # deterministic
    similar = [9, 12, 10, 12, 7]
    assert pack_by_tokens(similar, 10**6) == [[1, 3, 2, 0, 6 - 2]]  # one micro-batch, longest first
    assert padded_tokens(lengths, batches) <= 32 * len(batches) + 70 + 40
    with pytest.raises(ValueError):
        pack_by_tokens(lengths, 0)


@pytest.mark.parametrize("model", ["tiny-qwen3", "tiny"])
def test_split_batch_gradient_equals_unsplit(model, rollouts):
    """Must show 1: a batch over the token budget is split, and the summed gradient is the unsplit one."""
    if model == "tiny":
        policy = _policy("tiny")
        comps = _rollouts(policy)
    else:
        policy, comps = _policy(), rollouts
    advantages = [1.0, -0.5, 0.25, 0.0, -1.0, 0.75, 0.5, -0.25]
    lengths = [len(c.prompt_ids) + len(c.completion_ids) for c in comps]
    budget = max(lengths) + 5
    assert len(pack_by_tokens(lengths, budget)) >= 3  # the batch is over the budget: it is split

    def grads(budget: int) -> tuple[list[torch.Tensor], dict]:
        policy.trainer.model.zero_grad(set_to_none=True)
        policy.trainer.model.train()
        stats = accumulate_gradients(
            policy.trainer.model, comps, advantages, kl_coef=0.1, temperature=1.0, micro_batch_tokens=budget, pad_id=0
        )
        policy.trainer.model.eval()
        return _grads(policy), stats

    split, s1 = grads(budget)
    alone, s3 = grads(1)  # every sequence on its own
    whole, loss = _one_pass_gradient(policy, comps, advantages, kl_coef=0.1)  # no split at all
    assert s1["micro_batches"] >= 3 and s3["micro_batches"] == len(comps)
    assert s1["tokens"] == s3["tokens"] == sum(sum(c.loss_mask) for c in comps)
    assert any(g.abs().sum() > 0 for g in whole)
    for a, b, c in zip(split, whole, alone, strict=True):
        scale = b.abs().max().clamp(min=1e-12)
        assert torch.allclose(a, b, atol=1e-5 * scale, rtol=1e-4)
        assert torch.allclose(c, b, atol=1e-5 * scale, rtol=1e-4)
    assert abs(s1["loss"] - loss) < 1e-4 * max(1.0, abs(loss))


def _one_pass_gradient(policy, comps, advantages, kl_coef, center=False):
    """The reference: every rollout in one right-padded pass, the docs/method.md §2 loss, one backward."""
    from discover.objectives import kl_shaped_advantages

    model = policy.trainer.model
    model.zero_grad(set_to_none=True)
    model.train()
    with torch.no_grad(), model.disable_adapter():
        lp_b = torch.cat(token_logprobs(model, comps, 1.0, pad_id=0))
    lp_l = torch.cat(token_logprobs(model, comps, 1.0, pad_id=0))
    lp_s = torch.tensor([x for c in comps for x in c.sampler_logprobs])
    mask = torch.tensor([m for c in comps for m in c.loss_mask])
    adv = torch.tensor([a for c, a in zip(comps, advantages) for _ in c.completion_ids])
    mean = float((lp_s - lp_b)[mask.bool()].mean()) if center else 0.0  # released code: centred KL
    loss = importance_sampling_loss(lp_l, lp_s, kl_shaped_advantages(adv, lp_s, lp_b, kl_coef, mean), mask)
    loss.backward()
    model.eval()
    return _grads(policy), float(loss.detach())


def test_centred_kl_over_micro_batches_equals_one_pass(rollouts):
    policy = _policy()
    advantages = [1.0, -0.5, 0.25, 0.0, -1.0, 0.75, 0.5, -0.25]
    policy.trainer.model.zero_grad(set_to_none=True)
    policy.trainer.model.train()
    accumulate_gradients(
        policy.trainer.model, rollouts, advantages, kl_coef=0.5, temperature=1.0, micro_batch_tokens=1, pad_id=0, kl_center=True
    )
    policy.trainer.model.eval()
    split = _grads(policy)
    whole, _ = _one_pass_gradient(policy, rollouts, advantages, kl_coef=0.5, center=True)
    plain, _ = _one_pass_gradient(policy, rollouts, advantages, kl_coef=0.5, center=False)
    for a, b in zip(split, whole, strict=True):
        scale = b.abs().max().clamp(min=1e-12)
        assert torch.allclose(a, b, atol=1e-5 * scale, rtol=1e-4)
    assert any(not torch.allclose(a, b) for a, b in zip(whole, plain, strict=True))  # centring changes the gradient


def test_right_padded_logprobs_equal_one_sequence_at_a_time(rollouts):
    policy = _policy()
    with torch.no_grad():
        together = token_logprobs(policy.trainer.model, rollouts, 1.0, pad_id=0)
        for c, lp in zip(rollouts, together, strict=True):
            alone = token_logprobs(policy.trainer.model, [c], 1.0, pad_id=0)[0]
            assert lp.shape == (len(c.completion_ids),)
            assert torch.allclose(lp, alone, atol=1e-5, rtol=0)
            assert torch.allclose(lp, torch.tensor(c.sampler_logprobs), atol=1e-4, rtol=0)  # = the sampler's


def test_gradient_checkpointing_does_not_change_the_gradient(rollouts):
    grads = []
    for ckpt in (True, False):
        policy = _policy(gradient_checkpointing=ckpt)
        policy.trainer.model.train()
        accumulate_gradients(policy.trainer.model, rollouts, [1.0, -1.0] * 4, kl_coef=0.1, temperature=1.0, micro_batch_tokens=64, pad_id=0)
        grads.append(_grads(policy))
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def test_importance_ratio_is_reported_and_optionally_truncated():
    lp_l = torch.tensor([0.0, -1.0, -2.0], requires_grad=True)
    lp_s = torch.tensor([-1.0, -1.0, -1.0])  # ratios e, 1, 1/e
    adv, mask = torch.ones(3), torch.ones(3)
    loss = importance_sampling_loss(lp_l, lp_s, adv, mask, ratio_cap=2.0)
    loss.backward()
    assert torch.allclose(loss, -torch.tensor(2.0 + 1.0 + torch.exp(torch.tensor(-1.0)).item()))
    # d/d lp of min(r, C) * A: the capped token keeps a gradient of C (not zero, not e)
    assert torch.allclose(lp_l.grad, -torch.tensor([2.0, 1.0, torch.exp(torch.tensor(-1.0)).item()]))
    uncapped = torch.tensor([0.0, -1.0, -2.0], requires_grad=True)
    importance_sampling_loss(uncapped, lp_s, adv, mask).backward()
    assert torch.allclose(uncapped.grad[1:], lp_l.grad[1:]) and uncapped.grad[0] < lp_l.grad[0]


def test_train_step_reports_the_sampler_learner_gap(rollouts):
    policy = _policy()
    cfg = TrainConfig(learning_rate=1e-2, kl_coef=0.1, importance_ratio_cap=1.5)
    stats = policy.train_step(TrainBatch(rollouts, [1.0, -1.0] * 4), cfg, temperature=TEMPERATURE)
    assert stats["logprob_gap"] < 1e-4 and abs(stats["mean_ratio"] - 1.0) < 1e-4  # step 0: learner == sampler
    assert stats["ratio_capped_fraction"] == 0.0 and stats["grad_norm"] > 0
    stats = policy.train_step(TrainBatch(rollouts, [1.0, -1.0] * 4), cfg, temperature=TEMPERATURE)  # now the policy has moved
    assert stats["logprob_gap"] > 1e-4 and stats["max_ratio"] > 1.0


def test_bfloat16_trainer_keeps_float32_adapter(rollouts):
    policy = _policy(dtype="bfloat16")
    assert all(p.dtype == torch.float32 for p in policy.trainer.lora_parameters())  # Adam on bf16 weights would lose lr 4e-5
    before = [p.detach().clone() for p in policy.trainer.lora_parameters()]
    stats = policy.train_step(TrainBatch(rollouts, [1.0, -1.0] * 4), TrainConfig(learning_rate=1e-3, kl_coef=0.1), temperature=TEMPERATURE)
    assert stats["logprob_gap"] < 0.1  # bf16 learner against float32 sampler log-probs
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.trainer.lora_parameters()))


def test_second_step_in_the_same_process_does_not_load_weights_again(tmp_path, monkeypatch, rollouts):
    """Must show 1: the base model stays resident; each step loads only its adapter."""
    from transformers import AutoModelForCausalLM

    from discover.policy import load_policy
    from discover.policy.qwen3_model import tiny_qwen3_path

    model_dir = tmp_path / "model"  # a path no other test has loaded: a fresh cache entry
    shutil.copytree(tiny_qwen3_path(), model_dir)
    loads = []
    real = AutoModelForCausalLM.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        loads.append(args[0])
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(counting))
    cfg = ModelConfig(name=str(model_dir), lora_rank=4, device="cpu")
    train = TrainConfig(learning_rate=1e-2)
    adapter = None
    params = []
    for step in range(3):
        policy = load_policy(cfg, adapter)
        stats = policy.train_step(TrainBatch(rollouts, [1.0, -1.0] * 4), train, temperature=TEMPERATURE)
        assert stats["tokens"] > 0
        adapter = tmp_path / f"checkpoint-{step}"
        policy.save(adapter)
        params.append(policy.trainer.model.get_base_model().get_input_embeddings().weight)
    assert loads == [str(model_dir)]  # one load of the weights for three steps
    assert params[0] is params[1] is params[2]  # the very same resident tensors


def test_bfloat16_lora_option_trains_bfloat16_adapter(rollouts, tmp_path):
    """model.lora_dtype: bfloat16 gives bf16 adapter parameters (and Adam state) that train and reload."""
    from discover.policy.trainer import LoRATrainer

    policy = _policy(lora_dtype="bfloat16")
    params = policy.trainer.lora_parameters()
    assert params and all(p.dtype == torch.bfloat16 for p in params)
    before = [p.detach().clone() for p in params]
    stats = policy.train_step(TrainBatch(rollouts, [1.0, -1.0] * 4), TrainConfig(learning_rate=1e-2, kl_coef=0.1), temperature=TEMPERATURE)
    assert stats["tokens"] > 0 and stats["grad_norm"] > 0 and math.isfinite(stats["loss"])
    after = policy.trainer.lora_parameters()
    assert all(p.dtype == torch.bfloat16 for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    state = policy.trainer._optimizer.state[after[0]]
    assert state["exp_avg"].dtype == torch.bfloat16
    policy.save(tmp_path / "adapter")
    reloaded = LoRATrainer.load(ModelConfig(name="tiny-qwen3", lora_rank=4, device="cpu", lora_dtype="bfloat16"), tmp_path / "adapter")
    assert all(p.dtype == torch.bfloat16 for p in reloaded.lora_parameters())
    assert all(torch.equal(a, b) for a, b in zip(after, reloaded.lora_parameters()))
    assert all(p.dtype == torch.float32 for p in _policy().trainer.lora_parameters())  # the default is unchanged


def test_offloading_between_steps_keeps_training_identical(rollouts):
    """model.offload_while_generating: the trainer's tensors parked in CPU memory (their storage
    emptied) between steps and brought back give bit-identical LoRA parameters and log-probs."""
    from discover.policy import offload

    try:
        _offload_steps(rollouts, offload)
    finally:
        offload.unpark_all()  # a failure here must not leave other tests' resident models parked


def _offload_steps(rollouts, offload):
    batch = TrainBatch(rollouts, [1.0, -1.0] * 4)
    train = TrainConfig(learning_rate=1e-2, kl_coef=0.1)
    plain, parked = _policy(), _policy()
    for step in range(3):
        plain.train_step(batch, train, temperature=TEMPERATURE)
        parked.train_step(batch, train, temperature=TEMPERATURE)
        trainer = parked.trainer
        n = sum(1 for _ in trainer.parkable_tensors())
        first = offload.park_all()
        assert first.tensors >= n and offload.parked_count() == first.tensors
        assert all(t.numel() == 0 for t, _ in trainer.parkable_tensors())  # nothing left where it was
        base = trainer.model.get_base_model().get_input_embeddings().weight
        assert base.numel() == 0 and any(t is base for t, _ in offload._all_tensors())  # the shared resident base too
        with pytest.raises(RuntimeError):
            trainer.model(input_ids=torch.tensor([[1, 2, 3]]))  # parked weights cannot be computed with
        assert offload.park_all().tensors == 0  # already parked: nothing more
        back = offload.unpark_all()
        assert back.tensors == first.tensors and offload.parked_count() == 0
        if step:  # the frozen base weights were copied once: parking again copies only the adapter and Adam
            assert 0 < first.copied_bytes < sum(t.numel() * t.element_size() for t, _ in trainer.parkable_tensors())
    for a, b in zip(plain.trainer.lora_parameters(), parked.trainer.lora_parameters(), strict=True):
        assert torch.equal(a, b)
    lp_plain = plain.trainer.sequence_logprobs(rollouts, temperature=TEMPERATURE)
    offload.park_all()
    lp_parked = parked.trainer.sequence_logprobs(rollouts, temperature=TEMPERATURE)  # brings everything back first
    assert offload.parked_count() == 0
    assert all(torch.equal(a, b) for a, b in zip(lp_plain, lp_parked))
