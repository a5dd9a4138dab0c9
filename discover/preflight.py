"""What can be checked about a run configuration before anything is written or loaded.

`discover run` calls `preflight` before the run directory exists, so a configuration that cannot
work (a model that is neither a local directory nor a valid hub id, bad problem options, a seeds
file that is missing, a Docker sandbox without its image) fails with one line and leaves nothing
behind to confuse the corrected run.
"""

from __future__ import annotations

from pathlib import Path

from discover.config import EMBEDDED_MODEL, RunConfig


class PreflightError(ValueError):
    """A configuration that cannot work; the message names the field and the fix."""


def check_model_name(name: str) -> None:
    """The embedded model, an existing local directory, or a well-formed hub id ("org/name")."""
    if name == EMBEDDED_MODEL:
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


def preflight(config: RunConfig) -> None:
    """Raise PreflightError (one line) for anything in `config` that cannot work here."""
    from evaluators.registry import get_problem

    check_model_name(config.model.name)
    try:
        problem = get_problem(config.problem, **config.problem_options)
    except KeyError as err:
        raise PreflightError(str(err.args[0])) from None
    except (ValueError, TypeError) as err:
        raise PreflightError(f"problem_options: {err}") from None
    for option in ("seeds_file", "initial_program"):  # files a problem reads when the run starts
        path = config.problem_options.get(option)
        if path and not Path(path).expanduser().is_file():
            raise PreflightError(f"problem_options.{option} {path!r} does not exist (relative paths are taken from {Path.cwd()})")
    if problem.needs_sandbox and config.sandbox.backend == "docker":
        from evaluators.sandbox import docker_unavailable

        why = docker_unavailable(problem.image)
        if why:
            raise PreflightError(f"sandbox.backend 'docker' cannot run {problem.name} here: {why}; or set sandbox.backend: process")
    if problem.needs_sandbox and problem.image == "cpp20" and config.sandbox.backend != "docker":
        import shutil

        from evaluators.sandbox import docker_unavailable

        if shutil.which("g++") is None and (config.sandbox.backend == "process" or docker_unavailable("cpp20")):
            raise PreflightError(f"{problem.name} compiles C++ and the process backend needs g++ here: install it, or use sandbox.backend: docker with the cpp20 image")
