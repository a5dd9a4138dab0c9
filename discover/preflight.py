"""What can be checked about a run configuration before anything is written or loaded.

`discover run` calls `preflight` before the run directory exists, so a configuration that cannot
work (a model that is neither a local directory nor a valid hub id, bad problem options, a Docker
sandbox without its image, and whatever the problem's own `preflight` names: a seeds file that is
missing, no compiler) fails with one line and leaves nothing behind to confuse the corrected run.
The checks here know no problem by name (docs/architecture.md, "Problem hooks").
"""

from __future__ import annotations

from pathlib import Path

from discover.config import EMBEDDED_MODEL, EMBEDDED_MODELS, ModelConfig, RunConfig


class PreflightError(ValueError):
    """A configuration that cannot work; the message names the field and the fix."""


def check_model_name(name: str) -> None:
    """An embedded model, an existing local directory, or a well-formed hub id ("org/name")."""
    if name in EMBEDDED_MODELS:
        return
    path = Path(name).expanduser()
    if path.is_dir():
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
        f"model.name {name!r} is neither a local model directory nor a valid hub id "
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
    problems = problem.preflight(config.sandbox.backend)
    if problems:
        raise PreflightError(problems[0])
