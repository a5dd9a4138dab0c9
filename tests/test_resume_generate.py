"""A generate killed midway resumes with the missing rollouts only, and a trainer rank lost mid-step
fails the train task cleanly (docs/runs.md, "A generate killed midway"; docs/cluster.md). The kills
come from tests/faults/sitecustomize.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from discover.run import read_evaluations, read_rollouts
from storage.manifest import read_manifest
from tests.conftest import tiny_toy_config

FAULTS = Path(__file__).parent / "faults"
LOGPROB_TOLERANCE = 1e-5  # what batching may change in a sampler log-prob (float32 logits of another batch shape)


def assert_same_rollouts(got: list, want: list) -> float:
    """Every field equal but the sampler log-probs, which batching may move by float32 rounding
    (within LOGPROB_TOLERANCE); returns the largest log-prob difference."""
    assert len(got) == len(want)
    worst = 0.0
    for a, b in zip(got, want):
        da, db = dataclasses.asdict(a), dataclasses.asdict(b)
        la, lb = da.pop("sampler_logprobs"), db.pop("sampler_logprobs")
        assert da == db and len(la) == len(lb), (a.group, a.index)
        worst = max(worst, max((abs(x - y) for x, y in zip(la, lb)), default=0.0))
    assert worst <= LOGPROB_TOLERANCE
    return worst


def _max_relative_difference(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys()
    return max(float((ta[k] - tb[k]).abs().max() / tb[k].abs().max().clamp(min=1e-12)) for k in ta)


def test_each_row_samples_its_own_distribution_from_its_own_draw() -> None:
    """hf_decode.sample_tokens inverts a row's cumulative distribution at the row's uniform: the
    frequencies follow the probabilities, a token of probability 0 is never drawn, and a row's token
    does not depend on the other rows."""
    import numpy as np
    import torch

    from discover.policy.hf_decode import sample_tokens

    probs = torch.tensor([0.1, 0.0, 0.2, 0.3, 0.4])
    u = torch.from_numpy(np.random.default_rng(0).random(20_000))
    drawn = sample_tokens(probs.log().expand(len(u), -1), u)
    freq = torch.bincount(drawn, minlength=5).double() / len(u)
    assert freq[1] == 0 and torch.allclose(freq, probs.double(), atol=0.01)
    assert sample_tokens(probs.log().unsqueeze(0), torch.tensor([1.0 - 1e-12])).item() == 4  # the top of [0, 1)
    other = torch.log_softmax(torch.randn(3, 5), -1)
    both = sample_tokens(torch.cat([probs.log().unsqueeze(0), other]), torch.tensor([0.45, 0.1, 0.5, 0.9]))
    assert both[0].item() == sample_tokens(probs.log().unsqueeze(0), torch.tensor([0.45])).item() == 3


@pytest.mark.parametrize("think", [False, True])
def test_generating_only_the_missing_keys_gives_the_full_batchs_completions(tiny_model_cache: Path, think: bool) -> None:
    """The HF engine samples each request from its own seed: the keys generated without the others
    (in a smaller batch, other prompts padded differently) get the same tokens as in the full batch,
    and log-probs equal up to the float32 rounding of another batch shape."""
    from discover.config import parse_config
    from discover.policy import load_policy

    sampling = {"context_tokens": 512, "thinking_budget": 160, "max_answer_tokens": 48}
    if think:
        sampling["think_end"] = "</think>"
    config = parse_config(tiny_toy_config(Path("unused"), sampling=sampling))
    policy = load_policy(config.model, None, seed=3)
    contexts = ["Write a number.", "A longer context: improve the construction of the parent state below, please.", "x"]
    k = 5
    full = {(g, j): c for g, j, c in policy.sample_stream(contexts, k, config.sampling, 11)}
    worst = 0.0
    for skip in ({(0, 0), (1, 3), (2, 4)}, {(g, j) for g in range(3) for j in range(k) if (g + j) % 2}, {(0, j) for j in range(k)}):
        part = {(g, j): c for g, j, c in policy.sample_stream(contexts, k, config.sampling, 11, frozenset(skip))}
        assert set(part) == set(full) - skip  # nothing skipped is generated, nothing missing is left out
        for key, c in part.items():
            assert c.completion_ids == full[key].completion_ids, key
            assert c.text == full[key].text and c.loss_mask == full[key].loss_mask
            worst = max(worst, max((abs(a - b) for a, b in zip(c.sampler_logprobs, full[key].sampler_logprobs)), default=0.0))
    print(f"\nlargest sampler log-prob difference, subset against full batch: {worst:.3g}")
    assert worst <= LOGPROB_TOLERANCE


def test_a_smaller_decode_batch_gives_the_same_completions_in_several_batches(tiny_model_cache: Path) -> None:
    """`model.decode_batch_size` bounds the rows decoded together (memory): 15 rollouts in batches of
    4 are the same tokens as in one batch, and come back batch by batch (4, 4, 4, 3)."""
    from discover.config import parse_config
    from discover.policy import load_policy
    from discover.policy.hf_decode import HFDecodeEngine

    contexts = ["Write a number.", "A longer context: improve the construction below, please.", "x"]
    streams = {}
    for size in (512, 4):
        config = parse_config(
            tiny_toy_config(Path("unused"), model={"name": "tiny", "lora_rank": 4, "device": "cpu", "decode_batch_size": size})
        )
        policy = load_policy(config.model, None, seed=3)
        streams[size] = {(g, j): c for g, j, c in policy.sample_stream(contexts, 5, config.sampling, 11)}
    assert streams[4].keys() == streams[512].keys()
    for key, c in streams[4].items():
        assert c.completion_ids == streams[512][key].completion_ids, key
    from discover.policy.engine import PhaseRequest

    sampler = policy.sampler
    engine = HFDecodeEngine(sampler.trainer.model, sampler.tokenizer, sampler.trainer.device, sampler.eos_ids(), None, batch_size=4)
    for i in range(15):
        engine.submit(i, PhaseRequest([1, 2, 3], 2), 1.0, i)
    sizes = []
    while out := engine.poll():
        sizes.append(len(out))
    assert sizes == [4, 4, 4, 3]


def _discover(args: list[str], env: dict[str, str], crash: str | None = None) -> subprocess.CompletedProcess:
    env = dict(env)
    if crash:
        env["DISCOVER_CRASH_AT"] = crash
        env["PYTHONPATH"] = os.pathsep.join([str(FAULTS), *filter(None, [env.get("PYTHONPATH")])])
    # A new session: the crash hook kills the whole group (the temporary Prefect server included).
    return subprocess.run(
        [sys.executable, "-m", "cli", *args], env=env, capture_output=True, text=True, timeout=600, start_new_session=True
    )


@pytest.mark.slow
def test_a_generate_killed_midway_generates_only_the_missing_rollouts(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """SIGKILL after 3 of the 8 rollouts of step 0 are stored, then `discover resume`: those 3 are
    reused (and evaluated once), the 5 others generated, and every output equals an uninterrupted run's."""
    ref_dir, crash_dir = tmp_path / "uninterrupted", tmp_path / "crashed"
    for d in (ref_dir, crash_dir):
        (tmp_path / f"{d.name}.yaml").write_text(yaml.safe_dump(tiny_toy_config(d, seed=5, steps=1)))
    done = _discover(["run", str(tmp_path / "uninterrupted.yaml")], cli_env)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = _discover(["run", str(tmp_path / "crashed.yaml")], cli_env, crash="rollout:0:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    generated = crash_dir / "steps" / "0000" / "generated"
    assert len(list(generated.glob("*.json"))) == 3 and not (crash_dir / "steps" / "0000" / "rollouts.parquet").exists()
    (generated / ".0000-00007.json.abcd.tmp").write_text('{"inputs": "half a rec')  # what a kill mid-write leaves

    resumed = _discover(["resume", str(crash_dir)], cli_env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    stats = json.loads((crash_dir / "steps" / "0000" / "generate.json").read_text())
    assert (stats["rollouts_reused"], stats["rollouts_generated"]) == (3, 5)
    assert json.loads((ref_dir / "steps" / "0000" / "generate.json").read_text())["rollouts_reused"] == 0
    assert not generated.exists()  # the step's output holds them all
    worst = assert_same_rollouts(
        read_rollouts(crash_dir / "steps/0000/rollouts.parquet"), read_rollouts(ref_dir / "steps/0000/rollouts.parquet")
    )
    print(f"\nlargest sampler log-prob difference, resumed against uninterrupted: {worst:.3g}")
    # every rollout evaluated once, the reused ones too (evaluations also record their seconds, which differ)
    verdicts = [
        [(e.child_id, e.reward, e.valid, e.reason, e.code) for e in read_evaluations(d / "steps" / "0000" / "evaluations.parquet")]
        for d in (crash_dir, ref_dir)
    ]
    assert len(verdicts[0]) == 8 and verdicts[0] == verdicts[1]
    assert (crash_dir / "archive/0001.parquet").read_bytes() == (ref_dir / "archive/0001.parquet").read_bytes()
    # the adapter trained on them: equal where the log-probs are (here they were), else within rounding of them
    adapter = "checkpoints/0001/adapter/adapter_model.safetensors"
    assert _max_relative_difference(crash_dir / adapter, ref_dir / adapter) <= 1e-4
    executions = [(e["step"], e["task"]) for e in read_manifest(crash_dir / "manifest.json")["executions"]]
    assert executions.count((0, "generate")) == 1

    status = subprocess.run([sys.executable, "-m", "cli", "status", str(crash_dir)], env=cli_env, capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    assert "1/1 steps" in status.stdout


@pytest.mark.slow
def test_a_trainer_rank_lost_mid_step_fails_train_cleanly_and_a_retry_completes_it(
    tmp_path: Path, tiny_model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cluster.trainer_world_size: 2`: rank 1 SIGKILLed while the ranks accumulate gradients makes
    `train` raise, leaves no checkpoint (nor a half-written one under its name), and the task run
    again writes the checkpoint an uninterrupted run writes."""
    from discover import steps
    from discover.config import parse_config
    from flows.engines import ray_connection
    from tests.test_method_rules import _set_rewards

    runs = {}
    for name in ("uninterrupted", "killed"):
        config = tiny_toy_config(tmp_path / name, seed=4, steps=1, cluster={"trainer_world_size": 2})
        config["train"] = {"kl_coef": 0.1}
        run = steps.create_run(parse_config(config))
        steps.initialise(run)
        steps.select_parents(run, 0)
        steps.generate(run, 0)
        steps.evaluate(run, 0)
        _set_rewards(run, 0, [0.0, 0.25, 0.5, 1.0, 0.3, 0.1, 0.2, 0.9])  # both groups with signal: an optimizer step
        steps.update_archive(run, 0)
        runs[name] = run
    with ray_connection(runs["uninterrupted"]):
        steps.train(runs["uninterrupted"], 0)

    killed, trigger = runs["killed"], tmp_path / "kill-rank-1"
    # read by the ranks (tests/faults/sitecustomize.py): the run's Ray instance passes its environment on
    monkeypatch.setenv("DISCOVER_KILL_RANK", f"1:{trigger}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAULTS), *filter(None, [os.environ.get("PYTHONPATH")])]))
    checkpoints = killed.root / "checkpoints"
    with ray_connection(killed):
        trigger.touch()
        with pytest.raises(Exception, match=r"trainer rank 1 of 2 failed while training \(.*\); every rank was stopped"):
            steps.train(killed, 0)
        assert not trigger.exists()  # the rank took the kill
        assert sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".")) == ["0000"]
        assert not killed.layout.train_stats(0).exists()
        steps.train(killed, 0)  # the task's retry: a new group from checkpoint 0
    ref, out = runs["uninterrupted"].layout.checkpoint(1), killed.layout.checkpoint(1)
    assert sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".")) == ["0000", "0001"]
    for rel in ("adapter/adapter_model.safetensors", "optimizer.pt"):
        assert (out / rel).read_bytes() == (ref / rel).read_bytes(), rel
