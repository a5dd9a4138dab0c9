"""The vLLM backend's CPU-testable parts: factory, configuration, placement, vLLM output handling.

What needs a GPU (the engine itself) is in tests/test_gpu_vllm.py, marked `gpu`.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from discover.config import ConfigError, ModelConfig, RunConfig, parse_config
from discover.policy import load_policy, placement, vllm_engine
from discover.policy.vllm_backend import fresh_adapter, phase_output, sampled_logprobs

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("DISCOVER_CACHE", str(tmp_path_factory.mktemp("discover-cache")))
    yield
    mp.undo()


def _position(tok: int, lp: float) -> dict:
    return {tok: SimpleNamespace(logprob=lp, rank=1, decoded_token=None)}


def _completion(ids, finish, stop_reason=None):
    return SimpleNamespace(
        index=0,
        token_ids=ids,
        logprobs=[_position(t, -0.1 * (i + 1)) for i, t in enumerate(ids)],
        finish_reason=finish,
        stop_reason=stop_reason,
    )


# ----------------------------------------------------------------------------- factory and config


def test_factory_picks_the_backend(tmp_path):
    from discover.policy.transformers_backend import TransformersSampler
    from discover.policy.vllm_backend import VLLMSampler

    assert isinstance(load_policy(ModelConfig(name="tiny-qwen3", lora_rank=4, device="cpu")).sampler, TransformersSampler)
    policy = load_policy(ModelConfig(name="tiny-qwen3", backend="vllm", lora_rank=4), seed=3)
    assert isinstance(policy.sampler, VLLMSampler)
    # a new run's adapter is written by the resident trainer; no engine is needed for that
    policy.save(tmp_path / "adapter", tmp_path / "optimizer.pt")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file() and (tmp_path / "optimizer.pt").is_file()
    assert vllm_engine._HELD is None
    reloaded = load_policy(ModelConfig(name="tiny-qwen3", backend="vllm", lora_rank=4), tmp_path / "adapter")
    assert reloaded.sampler.adapter_dir == tmp_path / "adapter" and reloaded._trainer is None  # nothing loaded yet


@pytest.mark.skipif(HAS_VLLM, reason="checks the message where vLLM is not installed")
def test_generating_without_vllm_or_a_gpu_says_what_to_do():
    import torch

    policy = load_policy(ModelConfig(name="tiny-qwen3", backend="vllm", lora_rank=4))
    from discover.config import SamplingConfig

    with pytest.raises(RuntimeError, match="gpu extra|CUDA GPU") as err:
        policy.sample(["x"], 1, SamplingConfig(context_tokens=64, thinking_budget=32), seed=0)
    assert "backend: transformers" in str(err.value) or torch.cuda.is_available()


def test_placement_fields_are_validated():
    with pytest.raises(ValueError, match="CUDA GPUs"):
        ModelConfig(backend="vllm", device="cpu")
    with pytest.raises(ValueError, match="only apply to backend: vllm"):
        ModelConfig(generation_devices=[0])
    with pytest.raises(ValueError, match="distinct"):
        ModelConfig(backend="vllm", generation_devices=[0, 0])
    with pytest.raises(ConfigError, match="train.micro_batch"):
        parse_config({"problem": "toy", "train": {"micro_batch": 4}})  # replaced by model.micro_batch_tokens
    cfg = parse_config({"problem": "toy", "model": {"backend": "vllm", "generation_devices": [1], "training_devices": [0]}})
    assert isinstance(cfg, RunConfig) and cfg.model.training_devices == [0]


def test_preflight_names_the_missing_piece(monkeypatch):
    import torch

    from discover.preflight import PreflightError, check_model_backend

    check_model_backend(ModelConfig())  # the transformers backend needs nothing more
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(PreflightError, match="gpu extra|CUDA GPU"):
        check_model_backend(ModelConfig(backend="vllm"))


def test_memory_share_follows_placement(monkeypatch):
    shared = ModelConfig(backend="vllm", device="cuda:0")
    split = ModelConfig(backend="vllm", generation_devices=[1], training_devices=[0])
    tp_shared = ModelConfig(backend="vllm", generation_devices=[0, 1], training_devices=[1])
    assert placement.shares_gpu(shared) and placement.generation_memory_fraction(shared) == placement.SHARED_GPU_FRACTION
    assert not placement.shares_gpu(split) and placement.generation_memory_fraction(split) == placement.OWN_GPU_FRACTION
    assert placement.shares_gpu(tp_shared)
    assert placement.generation_memory_fraction(ModelConfig(backend="vllm", generation_memory_fraction=0.3)) == 0.3
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert placement.visible_devices_for([2, 3]) == "2,3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,7")
    assert placement.visible_devices_for([1, 2]) == "6,7"  # our index 1 is physical GPU 6
    with pytest.raises(ValueError, match="do not exist"):
        placement.visible_devices_for([3])


def test_engine_spec_rounds_the_lora_rank_up():
    spec = lambda r: vllm_engine.EngineSpec("m", "bfloat16", (0,), 4096, 0.5, r, False)  # noqa: E731
    assert [spec(r).max_lora_rank for r in (1, 4, 8, 20, 32, 33, 512)] == [1, 8, 8, 32, 32, 64, 512]
    with pytest.raises(ValueError, match="largest"):
        _ = spec(600).max_lora_rank


# ----------------------------------------------------------------------------- vLLM outputs


def test_stop_reasons_map_to_phase_stops():
    marker = (99,)
    assert phase_output(_completion([5, 6, 2], "stop"), marker).stop == "eos"  # EOS: stop_reason None
    assert phase_output(_completion([5, 99], "stop", 99), marker).stop == "marker"  # the one-token marker
    assert phase_output(_completion([5, 7], "stop", "</think>"), ()).stop == "marker"  # a stop string
    assert phase_output(_completion([5, 151643], "stop", 151643), marker).stop == "eos"  # another EOS id
    out = phase_output(_completion([5, 6, 7], "length"), marker)
    assert out.stop == "length" and out.token_ids == [5, 6, 7]
    assert out.logprobs == pytest.approx([-0.1, -0.2, -0.3])
    with pytest.raises(RuntimeError, match="abort"):
        phase_output(_completion([5], "abort"), marker)


def test_sampled_logprobs_from_both_vllm_layouts():
    ids = [3, 1, 4]

    class Flat:  # vLLM's FlatLogprobs layout: parallel lists, a range of entries per position
        start_indices, end_indices = [0, 1, 3], [1, 3, 4]
        token_ids, logprobs = [3, 7, 1, 4], [-0.5, -0.1, -0.7, -0.2]

        def __len__(self):
            return len(self.start_indices)

    f = Flat()
    assert sampled_logprobs(f, ids) == [-0.5, -0.7, -0.2]
    assert sampled_logprobs([_position(3, -0.5), _position(1, -0.7), _position(4, -0.2)], ids) == [-0.5, -0.7, -0.2]
    with pytest.raises(RuntimeError, match="2 log-probs for 3 tokens"):
        sampled_logprobs([_position(3, -0.5), _position(1, -0.7)], ids)


@pytest.mark.skipif(not HAS_VLLM, reason="the gpu extra (vllm) is not installed")
def test_real_vllm_output_types_convert():
    from vllm.logprobs import FlatLogprobs, Logprob
    from vllm.outputs import CompletionOutput

    flat = FlatLogprobs()
    for tok, lp in [(3, -0.5), (1, -0.7), (4, -0.2)]:
        flat.append({tok: Logprob(logprob=lp, rank=1)})
    out = CompletionOutput(
        index=0, text="", token_ids=[3, 1, 4], cumulative_logprob=None, logprobs=flat, finish_reason="stop", stop_reason=4
    )
    converted = phase_output(out, (4,))
    assert converted.stop == "marker" and converted.logprobs == [-0.5, -0.7, -0.2]
    from vllm import SamplingParams

    SamplingParams(n=1, temperature=1.0, top_k=0, max_tokens=4, logprobs=0, seed=2**61 + 5, stop=["</think>"])


def test_adapter_ids_and_names_are_never_reused(tmp_path):
    a, b = fresh_adapter(tmp_path / "ckpt"), fresh_adapter(tmp_path / "ckpt")
    assert a["lora_int_id"] != b["lora_int_id"] and a["lora_name"] != b["lora_name"]
    assert a["lora_path"] == b["lora_path"] == str(tmp_path / "ckpt")


def test_switching_adapters_drops_the_stale_ones():
    calls = []
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(remove_lora=lambda i: calls.append(("remove", i))),
        reset_prefix_cache=lambda: calls.append(("reset",)),
    )
    held = vllm_engine._Held(vllm_engine.EngineSpec("m", "bfloat16", (0,), 64, 0.5, 8, False), llm)
    vllm_engine.use_adapter(held, 1)
    assert calls == [] and held.lora_ids == {1}
    vllm_engine.use_adapter(held, 1)
    assert calls == []
    vllm_engine.use_adapter(held, 2)
    assert calls == [("remove", 1), ("reset",)] and held.lora_ids == {2}


@pytest.mark.skipif(not HAS_VLLM, reason="the gpu extra (vllm) is not installed")
def test_phase_engine_drives_vllms_engine_loop():
    """VLLMDecodeEngine against a stand-in for LLMEngine that finishes one request per step,
    with vLLM's own SamplingParams, RequestOutputKind and output types."""
    from vllm.logprobs import FlatLogprobs, Logprob
    from vllm.outputs import CompletionOutput
    from vllm.sampling_params import RequestOutputKind

    from discover.config import SamplingConfig
    from discover.policy.chat_format import ChatFormat
    from discover.policy.two_phase import sample_two_phase
    from discover.policy.vllm_backend import VLLMDecodeEngine

    class Engine:
        def __init__(self):
            self.queue, self.added, self.aborted = [], [], []

        def add_request(self, rid, prompt, params, lora_request=None):
            self.queue.append((rid, prompt, params))
            self.added.append((rid, prompt, params, lora_request))

        def has_unfinished_requests(self):
            return bool(self.queue)

        def step(self):
            rid, prompt, params = self.queue.pop(0)
            marker = bool(params.stop_token_ids) and len(prompt["prompt_token_ids"]) % 2 == 0
            ids = [5] * (params.max_tokens - 1) + [params.stop_token_ids[0] if marker else 6]
            flat = FlatLogprobs()
            for t in ids:
                flat.append({t: Logprob(logprob=-1.0)})
            done = CompletionOutput(
                index=0,
                text="",
                token_ids=ids,
                cumulative_logprob=None,
                logprobs=flat,
                finish_reason="stop" if marker else "length",
                stop_reason=ids[-1] if marker else None,
            )
            return [SimpleNamespace(request_id=rid, finished=True, outputs=[done])]

        def abort_request(self, ids):
            self.aborted += ids

    engine = Engine()
    phase = VLLMDecodeEngine(SimpleNamespace(llm_engine=engine), "LORA")
    vocab = {5: "a", 6: "b", 9: "</think>", 4: "!"}
    encode = lambda s: {"</think>": [9], "!</think>": [4, 9]}[s]  # noqa: E731
    decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    settings = SamplingConfig(context_tokens=64, thinking_budget=8, max_answer_tokens=3, think_end="</think>")
    (group,) = sample_two_phase(phase, [[1, 2, 3]], 2, settings, 0, ChatFormat("plain"), encode, decode, {0}, forced_phrase="!")
    thinking = [p for _, _, p, _ in engine.added[:2]]
    assert all(p.n == 1 and p.logprobs == 0 and p.top_k == 0 and p.top_p == 1.0 and p.temperature == 1.0 for p in thinking)
    # a one-token marker is a stop token id: no stop string, so nothing is detokenised
    assert all(p.stop_token_ids == [9] and not p.stop and not p.detokenize and not p.skip_special_tokens for p in thinking)
    assert all(p.output_kind == RequestOutputKind.FINAL_ONLY and p.max_tokens == 5 for p in thinking)
    assert thinking[0].seed != thinking[1].seed
    answers = [p for _, _, p, _ in engine.added[2:]]
    assert len(answers) == 2 and all(not p.stop_token_ids and not p.stop and not p.detokenize and p.max_tokens == 3 for p in answers)
    assert all(lora == "LORA" for *_, lora in engine.added)
    for c in group:  # prompt of 3 tokens: odd, so thinking ran out and was forced
        assert c.forced and c.completion_ids == [5, 5, 5, 5, 6, 4, 9, 5, 5, 6] and c.loss_mask == [1] * 5 + [0, 0] + [1] * 3
        assert c.sampler_logprobs == [-1.0] * 5 + [0.0, 0.0] + [-1.0] * 3
    assert engine.aborted == []


# ----------------------------------------------------------------------------- guards


def test_in_process_engine_is_refused_with_the_fix(monkeypatch):
    """VLLM_ENABLE_V1_MULTIPROCESSING=0 would put the engine in the trainer's process, on its device 0."""
    from discover.preflight import PreflightError, check_model_backend

    assert vllm_engine.multiprocessing_problem({}) is None
    assert vllm_engine.multiprocessing_problem({"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}) is None
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    message = vllm_engine.multiprocessing_problem()
    assert message is not None and "\n" not in message and "unset it" in message and "VLLM_ENABLE_V1_MULTIPROCESSING=0" in message
    with pytest.raises(RuntimeError, match="unset it"):
        vllm_engine.check_environment()
    with pytest.raises(RuntimeError, match="unset it"):  # before any import of vLLM or any GPU is needed
        vllm_engine._build(vllm_engine.EngineSpec("m", "bfloat16", (0,), 64, 0.5, 8, False))
    with pytest.raises(PreflightError, match="wrong GPU"):
        check_model_backend(ModelConfig(backend="vllm"))
    check_model_backend(ModelConfig())  # the transformers backend does not care


def test_a_one_token_marker_stops_by_token_id_without_detokenising():
    """Qwen3's `</think>` is one token: vLLM gets its id and no stop string (which would make it
    detokenise every token); a marker of several tokens is still matched as text."""
    from discover.policy.engine import PhaseRequest
    from discover.policy.resident import resolve_model_path
    from discover.policy.two_phase import Marker
    from discover.policy.vllm_backend import _tokenizer, stop_settings

    tok = _tokenizer(resolve_model_path("tiny-qwen3"))
    encode = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    one = Marker.of("</think>", encode)
    assert len(one.token_ids) == 1 and one.token_ids[0] == tok.convert_tokens_to_ids("</think>")
    settings = stop_settings(PhaseRequest([1, 2], 8, one.token_ids, one.strings))
    assert settings == {"stop_token_ids": [one.token_ids[0]], "stop": None, "detokenize": False}
    several = Marker.of("Final answer:", encode)
    assert several.token_ids == () and len(encode("Final answer:")) > 1
    assert stop_settings(PhaseRequest([1, 2], 8, several.token_ids, several.strings)) == {
        "stop_token_ids": None,
        "stop": ["Final answer:"],
        "detokenize": True,
    }
    assert stop_settings(PhaseRequest([1, 2], 8)) == {"stop_token_ids": None, "stop": None, "detokenize": False}  # answer phase


# ----------------------------------------------------------------------------- one copy of the weights on the GPU


def test_one_copy_plan_fields_and_memory_share():
    with pytest.raises(ValueError, match="offload_while_generating only apply to backend: vllm"):
        ModelConfig(offload_while_generating=True)
    one = ModelConfig(backend="vllm", device="cuda:0", sleep_while_training=True, offload_while_generating=True)
    assert placement.one_copy_on_gpu(one) and placement.generation_memory_fraction(one) == placement.ONE_COPY_GPU_FRACTION
    half = ModelConfig(backend="vllm", device="cuda:0", sleep_while_training=True)  # the trainer's weights stay
    assert placement.generation_memory_fraction(half) == placement.SHARED_GPU_FRACTION
    split = ModelConfig(
        backend="vllm", generation_devices=[1], training_devices=[0], sleep_while_training=True, offload_while_generating=True
    )
    assert placement.generation_memory_fraction(split) == placement.OWN_GPU_FRACTION
    assert ModelConfig().lora_dtype == "float32" and not ModelConfig(backend="vllm").offload_while_generating


def test_the_trainer_is_offloaded_before_the_engine_is_built_or_woken(monkeypatch):
    from discover.config import SamplingConfig
    from discover.policy import offload
    from discover.policy.trainer import LoRATrainer

    cfg = ModelConfig(
        name="tiny-qwen3", backend="vllm", device="cuda:0", lora_rank=4, sleep_while_training=True, offload_while_generating=True
    )
    monkeypatch.setattr(placement, "generation_devices", lambda m: [0])  # no GPU here: the engine is never built
    policy = load_policy(cfg)
    policy._load_trainer = lambda: LoRATrainer.load(ModelConfig(name="tiny-qwen3", lora_rank=4, device="cpu"))  # on CPU here
    trainer = policy.trainer
    seen = []

    def engine(spec):
        seen.append((spec.memory_fraction, offload.parked_count(), trainer.lora_parameters()[0].numel()))
        raise RuntimeError("stop here")

    monkeypatch.setattr(vllm_engine, "engine", engine)
    try:
        with pytest.raises(RuntimeError, match="stop here"):
            policy.sample(["x"], 1, SamplingConfig(context_tokens=64, thinking_budget=32), seed=0)
    finally:
        parked = offload.parked_count()
        offload.unpark_all()
    assert parked > 0
    assert seen and seen[0][0] == placement.ONE_COPY_GPU_FRACTION
    assert seen[0][1] > 0 and seen[0][2] == 0  # parked when the engine is asked for
    offload.park_all()
    trainer.sequence_logprobs([], temperature=1.0)  # anything the trainer computes brings its tensors back
    assert offload.parked_count() == 0 and trainer.lora_parameters()[0].numel() > 0


def test_prefix_cache_hits_are_counted_per_phase():
    """RequestOutput.num_cached_tokens per finished request, summed per phase (the answer phase's
    prompt is prompt + thinking, which the prefix cache should mostly serve)."""
    from discover.policy.vllm_backend import VLLMDecodeEngine

    outs = [
        SimpleNamespace(
            request_id="t", finished=True, prompt_token_ids=[1] * 40, num_cached_tokens=32, outputs=[_completion([5, 99], "stop", 99)]
        ),
        SimpleNamespace(
            request_id="a", finished=True, prompt_token_ids=[1] * 100, num_cached_tokens=96, outputs=[_completion([5, 6], "length")]
        ),
    ]
    fake = SimpleNamespace(has_unfinished_requests=lambda: True, step=lambda: [outs.pop(0)])
    engine = VLLMDecodeEngine(SimpleNamespace(llm_engine=fake), None)
    engine._pending = {"t": ((0, 0), (99,), "thinking"), "a": ((0, 1), (), "answer")}
    assert [k for k, _ in engine.poll()] == [(0, 0)] and [k for k, _ in engine.poll()] == [(0, 1)]
    stats = engine.prefix_cache_stats()
    assert stats["thinking"]["hit_rate"] == 0.8 and stats["answer"]["hit_rate"] == 0.96
    assert stats["answer"]["requests"] == 1 and stats["answer"]["prompt_tokens"] == 100
