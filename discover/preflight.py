"""What can be checked about a run configuration before anything is written or loaded.

`discover run` calls `preflight` before the run directory exists, so a configuration that cannot
work (a model that is neither a local directory nor a valid hub id, bad problem options, a Docker
sandbox without its image, whatever the problem's own `preflight` names: a seeds file that is
missing, no compiler; an answer format the problem cannot take; and a prompt that does not fit the model's context or the thinking budget)
fails with one line and leaves nothing behind to confuse the corrected run. The checks here know
no problem by name (docs/architecture.md, "Problem hooks").
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from discover.config import EMBEDDED_MODEL, EMBEDDED_MODELS, ModelConfig, RunConfig


class PreflightError(ValueError):
    """A configuration that cannot work; the message names the field and the fix."""


def check_model_name(name: str) -> None:
    """An embedded model, an existing local directory or .gguf file, or a well-formed hub id ("org/name")."""
    if name in EMBEDDED_MODELS:
        return
    path = Path(name).expanduser()
    if path.is_dir() or (path.suffix == ".gguf" and path.is_file()):  # a .gguf file is converted once (gguf_models.py)
        return
    looks_like_path = name.startswith(("/", ".", "~")) or name.count("/") > 1 or path.suffix in (".bin", ".safetensors")
    if not looks_like_path:
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        try:
            validate_repo_id(name)
            return
        except HFValidationError:
            pass
    raise PreflightError(
        f"model.name {name!r} is neither a local model directory, a .gguf file nor a valid hub id "
        f"(like 'Qwen/Qwen3-8B'); use '{EMBEDDED_MODEL}' for the embedded model"
    )


def check_model_backend(model: ModelConfig) -> None:
    """The vllm backend needs the vllm package and a CUDA GPU where the run executes."""
    if model.backend != "vllm":
        return
    import importlib.util

    from discover.policy.vllm_engine import multiprocessing_problem

    problem = multiprocessing_problem()
    if problem is not None:
        raise PreflightError(problem)

    if importlib.util.find_spec("vllm") is None:
        raise PreflightError(
            "model.backend 'vllm' needs the gpu extra (`uv sync --extra gpu`, Linux x86_64 with CUDA); or set model.backend: transformers"
        )
    import torch

    if not torch.cuda.is_available():
        raise PreflightError(
            "model.backend 'vllm' needs a CUDA GPU and none is visible here; run on a GPU worker or set model.backend: transformers"
        )


def check_process_tree_bound(problem, backend: str) -> None:
    """The process backend refuses to run where it cannot bound a candidate's process tree (no
    cgroup it may write) unless sandbox.allow_unbounded_process_tree is set: say so before the run."""
    from evaluators.sandbox.process import allow_from_env, tree_bound, unbounded_message

    layout, why = tree_bound()
    if layout is not None or allow_from_env():
        return
    if backend == "auto":
        from evaluators.sandbox import docker_unavailable

        if not docker_unavailable(problem.image):
            return  # auto picks docker
    raise PreflightError(unbounded_message(why))


def check_isolation(problem, backend: str, isolation: str) -> None:
    """The sandbox can isolate candidates as `isolation` asks (bubblewrap for the process backend,
    gVisor's runtime for Docker), or the run does not start: fail closed, naming the fix."""
    from evaluators.sandbox import docker_unavailable
    from evaluators.sandbox.process import isolation_message, isolation_problem

    docker = backend == "docker" or (backend == "auto" and isolation != "none" and not docker_unavailable(problem.image))
    if docker:
        if isolation == "none":
            raise PreflightError("sandbox.isolation 'none' applies to the process backend only; set sandbox.backend: process")
        if isolation == "gvisor":
            from evaluators.sandbox.docker_engine import gvisor_missing

            why = gvisor_missing()
            if why:
                raise PreflightError(f"sandbox.isolation 'gvisor' cannot run here: {why}")
        return
    why = isolation_problem(isolation)
    if why:
        raise PreflightError(isolation_message(isolation, why))


def check_answer_format(config: RunConfig, problem) -> None:
    """`sampling.answer_format: edits` edits the parent's program, so the problem's answers must be
    programs (not data, like the toy problem's digits) and every seed state must carry a program."""
    if config.sampling.answer_format != "edits":
        return
    fix = "or use sampling.answer_format: program"
    if not problem.needs_sandbox:
        raise PreflightError(
            f"sampling.answer_format 'edits' edits the parent's program, but the answers of problem {problem.name} are not programs; {fix}"
        )
    from discover.run import draw_seeds

    if any(not seed.code.strip() for seed in draw_seeds(problem, config)):
        raise PreflightError(
            f"sampling.answer_format 'edits' edits the parent's program, but the seed states of problem {problem.name} "
            "carry no program to edit; give them one (problem_options: starter for the mathematics problems, "
            f"initial_program for AtCoder) {fix}"
        )


def seed_contexts(config: RunConfig) -> list[str]:
    """The contexts of the run's seed states as select_parents builds them (discover/steps.py),
    distinct ones only. A seed whose program must run to be scored (a kernel, a contest program)
    is shown with score 0 and without its program's output, which only the run knows: its real
    context is longer by that output's tail, at most `prompts.OBSERVATION_CHARS` characters."""
    from discover.prompts import build_context
    from discover.run import draw_seeds, make_problem

    problem = make_problem(config)
    contexts: dict[str, None] = {}
    for seed in draw_seeds(problem, config):
        reward, construction, observation = 0.0, seed.construction, ""
        if not (seed.code.strip() and problem.needs_sandbox and seed.construction is None):  # scored without running
            verdict = problem.verify(seed.construction)
            reward, observation = verdict.reward, verdict.observation
        state = problem.render_state(seed.code, construction)
        context = build_context(
            problem.description,
            state,
            reward,
            observation,
            previous_reward=None,
            target=problem.target,
            answer_format=config.sampling.answer_format,
        )
        contexts[context] = None
    return list(contexts)


@contextmanager
def _quiet_tokenizer() -> Iterator[None]:
    """Without transformers' warning that a text is longer than the tokenizer's model_max_length:
    that length is what is checked here, and the check says so in its one line."""
    logger = logging.getLogger("transformers.tokenization_utils_base")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _max_positions(model_config: Any) -> int | None:
    """The model's own limit on prompt + completion: learned absolute positions (`n_positions`),
    else `max_position_embeddings` (the length a RoPE model was built for); None when neither is set."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    for name in ("n_positions", "max_position_embeddings"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_prompt_length(config: RunConfig) -> None:
    """The longest seed context, rendered in the model's chat format and tokenized by the model's
    tokenizer (with `sampling.answer_prefix`), must leave room to think and answer: the generator's
    own rule (`two_phase.prompt_problem`), against sampling.context_tokens or the model's positions
    (config.json's `n_positions` / `max_position_embeddings`) where fewer, and the thinking budget.

    Only the tokenizer and config.json are read; no weights load. Skipped, because it cannot be
    done cheaply, for a hub id that is not in the local Hugging Face cache (no download here), a
    GGUF model not converted yet (converting reads its weights) and a model folder whose tokenizer
    does not load (the run's loader reports that). The contexts of MIGRATE's neighbourhood slots
    (`mixed.neighbourhood`) are built from answers the run has not written yet, and are not checked.
    """
    from discover.policy.gguf_models import ModelUnavailable
    from discover.policy.model_files import files_without_weights

    try:
        folder = files_without_weights(config.model.name)
    except ModelUnavailable as err:
        raise PreflightError(str(err)) from None
    if folder is None:
        return
    from transformers import AutoConfig, AutoTokenizer

    from discover.policy.chat_format import chat_format_for
    from discover.policy.two_phase import prompt_problem

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model_config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError):
        return
    sampling = config.sampling
    try:
        fmt = chat_format_for(tokenizer, sampling.think_end)
    except ValueError as err:
        raise PreflightError(str(err)) from None
    with _quiet_tokenizer():
        prefix = len(tokenizer.encode(sampling.answer_prefix, add_special_tokens=False)) if sampling.answer_prefix else 0
        length = max(
            len(fmt.render(tokenizer, text, thinking=sampling.think_end is not None, **config.model.chat_template_kwargs)) + prefix
            for text in seed_contexts(config)
        )
    positions = _max_positions(model_config)
    context = min(sampling.context_tokens, positions) if positions else sampling.context_tokens
    why = prompt_problem(length, sampling, context, f"the prompt of problem {config.problem}")
    if why:
        raise PreflightError(why)


def preflight(config: RunConfig) -> None:
    """Raise PreflightError (one line) for anything in `config` that cannot work here."""
    from evaluators.registry import get_problem

    check_model_name(config.model.name)
    check_model_backend(config.model)
    try:
        problem = get_problem(config.problem, **config.problem_options)
    except KeyError as err:
        raise PreflightError(str(err.args[0])) from None
    except (ValueError, TypeError) as err:
        raise PreflightError(f"problem_options: {err}") from None
    if problem.needs_sandbox and config.sandbox.backend == "docker":
        from evaluators.sandbox import docker_unavailable

        why = docker_unavailable(problem.image)
        if why:
            raise PreflightError(f"sandbox.backend 'docker' cannot run {problem.name} here: {why}; or set sandbox.backend: process")
    if problem.needs_sandbox and config.sandbox.backend in ("process", "auto") and not config.sandbox.allow_unbounded_process_tree:
        check_process_tree_bound(problem, config.sandbox.backend)
    if problem.needs_sandbox:
        check_isolation(problem, config.sandbox.backend, config.sandbox.isolation)
    problems = problem.preflight(config.sandbox.backend)
    if problems:
        raise PreflightError(problems[0])
    check_answer_format(config, problem)
    check_prompt_length(config)
