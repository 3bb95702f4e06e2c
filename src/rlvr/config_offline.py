"""The configurations of the offline commands: `rlvr sft` (cold-start fine-tuning), `rlvr dpo`
(preference optimisation) and `rlvr curate` (prompt curation). Their shared sections (model,
data) and the config machinery are in `rlvr.config`, with the RL run's."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlvr.config import (
    DataConfig,
    EngineSettings,
    ModelConfig,
    Section,
    ToolSettings,
    _at_most,
    refuse_fsdp_with_lora,
    refuse_hermes_without_chat,
)


class OfflineSharding(Section):
    """The memory and data-parallel settings `rlvr sft` and `rlvr dpo` take from `rlvr
    train`'s."""

    gradient_checkpointing: bool = False
    """As `train.gradient_checkpointing`: each decoder layer recomputed in backward, for
    micro-batches larger than memory allows otherwise (rlvr's fused forward only)."""

    shard_optimizer: bool = False
    """As `train.shard_optimizer`: under torchrun, AdamW's state partitioned over the ranks."""
    fsdp: bool = False
    """As `train.fsdp`: under torchrun, the weights, gradients and AdamW state sharded over the
    ranks with FSDP2; the output holds the whole weights."""
    fsdp_reshard_after_forward: bool = True
    """As `train.fsdp_reshard_after_forward`: False keeps the gathered weights through a step."""


class SFTTrainConfig(OfflineSharding, ToolSettings):
    """`rlvr sft`'s settings; its tool settings (`sft.tools`, `sft.tool_format`, ...) are those
    of the tool-calling solutions: `hermes` schemas go into the prompts as in RL, the results
    are left out of the loss, and `rlvr eval` of the model calls the same tools."""

    steps: int = Field(default=300, ge=1)
    """Optimizer steps of supervised fine-tuning."""
    epochs: float | None = Field(default=None, gt=0)
    """Passes over the worked solutions instead of sft.steps (TRL's num_train_epochs): the
    steps are then ceil(epochs × solutions / batch_size), and sft.steps is not used."""
    mask_tool_results: bool = True
    """Leave the tools' results in the solutions (a tool's output in a tool-calling solution,
    written in sft.tool_format: `<result>...</result>` by default) out of the loss, as TRL's
    assistant-only loss leaves tool turns out; the model still reads them (`docs/tools.md`: on
    the tiny model this is what lets it learn to call the tool). Solutions without a result
    are unaffected."""
    max_length: int | None = Field(default=None, ge=2)
    """Cut each example to this many tokens, prompt and solution together, from the
    solution's end (TRL's max_length, keep_start; TRL's default is 1024); an example whose
    prompt alone is as long is left out, with a warning. None: nothing is cut."""
    batch_size: int = Field(default=64, ge=1)
    """Worked solutions per optimizer step."""
    lr: float = Field(default=1e-3, ge=0.0)
    """Peak AdamW learning rate."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW weight decay, on the weight matrices and embeddings; norms and biases are not
    decayed (`optim.decay_groups`)."""
    warmup_steps: int = Field(default=20, ge=0)
    """Linear warm-up optimizer steps."""
    schedule: Literal["constant", "cosine"] = "cosine"
    """Learning-rate schedule after warm-up."""
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    """Cosine floor as a fraction of the peak learning rate."""
    max_grad_norm: float = Field(default=1.0, ge=0.0)
    """Gradient clipping by global norm (0 = off)."""
    micro_batch_tokens: int = Field(default=4096, ge=1)
    """Token budget of one forward/backward micro-batch: rows × longest sequence, padding
    included (why 4096: `train.micro_batch_tokens`)."""
    eval_examples: int = Field(default=256, ge=0)
    """Held-out problems with a worked solution (the first N of the task's held-out split)
    whose mean NLL per solution token, TRL's eval_loss, eval.jsonl reports (0: none)."""
    eval_every_steps: int = Field(default=0, ge=0)
    """Score the held-out solutions every N steps into eval.jsonl (0: only before the first
    and after the last step)."""
    seed: int = 0
    """Seed of initialisation and example order."""
    output_dir: str = "runs/sft"
    """Where the fine-tuned model (Hugging Face format) is written."""
    save_every: int = Field(default=0, ge=0)
    """Checkpoint every N steps into output_dir/checkpoints/step-N, which `rlvr sft --resume`
    continues (0 = none; the final model is written to output_dir either way)."""
    keep_checkpoints: int = Field(default=0, ge=0)
    """As `train.keep_checkpoints`: keep only the newest N checkpoints (0 = every one)."""
    log_to: list[Literal["tensorboard", "wandb"]] = Field(default_factory=list)
    """As `train.log_to`: also send each step's metrics to these (output_dir/tensorboard, a
    W&B run in sft.wandb_project)."""
    wandb_project: str = "rlvr"
    """W&B project for sft.log_to=[wandb]; the run is named after the output folder."""
    threads: int = Field(default=0, ge=0)
    """torch CPU threads (0 = leave torch's default)."""
    keep_freed_memory: bool = True
    """As `train.keep_freed_memory`: glibc malloc keeps freed activations for reuse."""


class SFTConfig(Section):
    """The whole configuration of `rlvr sft`: cold-start fine-tuning on worked solutions."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The model to fine-tune."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Task whose worked solutions are the targets."""
    sft: SFTTrainConfig = Field(default_factory=SFTTrainConfig)
    """Optimisation and output."""

    @model_validator(mode="after")
    def _fsdp_trains_whole_models(self) -> SFTConfig:
        refuse_fsdp_with_lora(self.sft.fsdp, self.model, "sft")
        return self

    @model_validator(mode="after")
    def _hermes_calls_are_chats(self) -> SFTConfig:
        refuse_hermes_without_chat(self.sft, self.data, "sft.tool_format")
        return self


class PreferenceDataConfig(DataConfig):
    """`DataConfig` plus the pair columns. A built-in task gives pairs sampled from the model
    and verified (`dpo.samples_per_prompt`); `file` reads them from data.path: pairs, or for
    KTO unpaired labelled responses."""

    chosen_column: str = "chosen"
    """Column of the preferred response text (task `file`)."""
    rejected_column: str = "rejected"
    """Column of the dispreferred response text (task `file`)."""
    completion_column: str = "completion"
    """Column of the response text of an unpaired file (task `file`, rows without
    data.chosen_column; KTO only)."""
    label_column: str = "label"
    """Column of an unpaired row's boolean label: true for a desirable response, false for an
    undesirable one (TRL's unpaired preference format)."""


class DPOTrainConfig(OfflineSharding, EngineSettings):
    loss: str | list[str] = "dpo"
    """Preference loss: `dpo`, `ln_dpo` (length-normalised DPO), `ipo`, `simpo`, `cpo`,
    `orpo`, `hinge` (SLiC), `robust` (robust DPO, with dpo.label_smoothing the label-noise
    rate), `apo_zero`, `apo_down`, `nca_pair`, `sppo_hard`, `bco_pair`, `exo_pair`,
    `discopop`, `kto`, `aot` or `aot_unpaired` (`docs/algorithms.md`); or a list of them,
    whose losses are summed with dpo.loss_weights (MPO; TRL's list of loss types)."""
    loss_weights: list[float] | None = None
    """Weight of each loss of a dpo.loss list, in its order (TRL's loss_weights); unset: 1
    each."""
    beta: float = Field(default=0.1, gt=0)
    """β: the scale of the implicit reward (DPO, LN-DPO, SimPO) or IPO's τ."""
    gamma: float = 0.0
    """SimPO's target reward margin γ (simpo only)."""
    label_smoothing: float = Field(default=0.0, ge=0, lt=0.5)
    """ε, the probability that a pair's label is flipped: conservative DPO's, robust's, or
    EXO's label distribution (1 − ε, ε); read by dpo, ln_dpo, simpo, cpo, robust, exo_pair,
    aot and aot_unpaired."""
    kto_desirable_weight: float = Field(default=1.0, gt=0)
    """KTO's λ_D, the weight of the desirable (chosen) examples' loss (TRL's
    desirable_weight; kto only)."""
    kto_undesirable_weight: float = Field(default=1.0, gt=0)
    """KTO's λ_U, the weight of the undesirable (rejected) examples' loss (TRL's
    undesirable_weight; kto only)."""
    discopop_tau: float = Field(default=0.05, gt=0)
    """τ, the temperature of DiscoPOP's switch between its two losses (discopop only)."""
    f_divergence: Literal["reverse_kl", "forward_kl", "js_divergence", "alpha_divergence"] = (
        "reverse_kl"
    )
    """f-DPO's divergence to the reference (TRL's f_divergence_type): the log-ratio u in the
    loss becomes f'(e^u) (`docs/algorithms.md`); for dpo, ln_dpo, ipo, hinge, robust,
    exo_pair and discopop. reverse_kl is DPO."""
    f_alpha: float = 0.5
    """α of f_divergence=alpha_divergence (TRL's f_alpha_divergence_coef)."""
    weighting: bool = False
    """WPO's weighting (TRL's use_weighting): each pair's loss times w(y_w)·w(y_l), the
    current policy's per-token probability of each response over Σ_v π(v)², averaged in log
    space (a no-grad pass of the step's pairs before its micro-batches)."""
    ld_alpha: float | None = Field(default=None, ge=0.0, le=1.0)
    """LD-DPO's α (TRL's ld_alpha): each response's tokens past the length the pair's two
    responses share count α-fold in its log-likelihood, policy's and reference's alike, so a
    longer response does not win by its length; None (1.0) counts them whole."""
    nll_coef: float = Field(default=0.0, ge=0.0)
    """α: add α times the chosen response's per-token negative log-likelihood to each pair's
    loss (IRPO, Pang et al. 2024; TRL's rpo_alpha), so the chosen likelihood does not fall."""
    steps: int = Field(default=100, ge=1)
    """Optimizer steps."""
    epochs: float | None = Field(default=None, gt=0)
    """Passes over the training pairs instead of dpo.steps (TRL's num_train_epochs): the
    steps are then ceil(epochs × pairs / batch_size), and dpo.steps is not used."""
    max_length: int | None = Field(default=None, ge=2)
    """Pairs from a file (`data.task=file`): cut each response from its end so that it and
    the prompt hold at most this many tokens (TRL's max_length, keep_start; TRL's default is
    1024); a pair whose prompt alone is as long is left out, with a warning. None: nothing is
    cut. (Sampled pairs are bounded by dpo.max_new_tokens.)"""
    batch_size: int = Field(default=32, ge=1)
    """Preference pairs per optimizer step; the loss is their mean."""
    lr: float = Field(default=1e-6, ge=0.0)
    """Peak AdamW learning rate."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW weight decay, on the weight matrices and embeddings; norms and biases are not
    decayed (`optim.decay_groups`)."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warm-up optimizer steps."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule after warm-up."""
    min_lr_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    """Cosine floor as a fraction of the peak learning rate."""
    max_grad_norm: float = Field(default=1.0, ge=0.0)
    """Gradient clipping by global norm (0 = off)."""
    micro_batch_tokens: int = Field(default=4096, ge=1)
    """Token budget of one forward/backward micro-batch (as `train.micro_batch_tokens`); a
    pair's two responses share one micro-batch and one prompt forward."""
    eval_every_steps: int = Field(default=0, ge=0)
    """Score the held-out pairs every N steps into eval.jsonl (0: only before the first and
    after the last step)."""
    eval_pairs: int = Field(default=256, ge=0)
    """Held-out pairs scored (task `file`: from the held-out rows; a built-in task: sampled on
    its held-out problems); 0 = none."""
    prompts: int = Field(default=512, ge=1)
    """Built-in task: training problems sampled to build pairs."""
    samples_per_prompt: int = Field(default=4, ge=2)
    """Built-in task: completions sampled per problem; a problem whose samples' rewards differ
    gives one pair (a best one chosen, a worst one rejected)."""
    sampled_as: Literal["pairs", "labelled"] = "pairs"
    """Built-in task: `pairs` (as above) or `labelled`: every sample alone, desirable when the
    verifier accepts it, undesirable otherwise (KTO's unpaired data; dpo.loss=kto only)."""
    temperature: float = Field(default=1.0, gt=0)
    """Built-in task: sampling temperature of the pairs' completions."""
    max_new_tokens: int = Field(default=64, ge=1)
    """Built-in task: generation budget of the pairs' completions."""
    seed: int = 0
    """Seed of initialisation, sampling and pair order."""
    output_dir: str = "runs/dpo"
    """Run directory: config.yaml, pairs.jsonl (sampled pairs), metrics.jsonl, eval.jsonl and
    the final model (Hugging Face format)."""
    save_every: int = Field(default=0, ge=0)
    """Checkpoint every N steps into output_dir/checkpoints/step-N, which `rlvr dpo --resume`
    continues (0 = none; the final model is written to output_dir either way)."""
    keep_checkpoints: int = Field(default=0, ge=0)
    """As `train.keep_checkpoints`: keep only the newest N checkpoints (0 = every one)."""
    log_to: list[Literal["tensorboard", "wandb"]] = Field(default_factory=list)
    """As `train.log_to`: also send each step's metrics and each held-out evaluation to these
    (output_dir/tensorboard, a W&B run in dpo.wandb_project)."""
    wandb_project: str = "rlvr"
    """W&B project for dpo.log_to=[wandb]; the run is named after the output folder."""
    threads: int = Field(default=0, ge=0)
    """torch CPU threads (0 = leave torch's default)."""
    keep_freed_memory: bool = True
    """As `train.keep_freed_memory`: glibc malloc keeps freed activations for reuse."""

    @property
    def losses(self) -> list[tuple[str, float]]:
        """Each preference loss with its weight: one loss weighs 1."""
        names = [self.loss] if isinstance(self.loss, str) else self.loss
        return list(zip(names, self.loss_weights or [1.0] * len(names), strict=True))

    @property
    def loss_name(self) -> str:
        """The loss, or the losses joined by `+`, for messages."""
        return "+".join(name for name, _ in self.losses)

    @model_validator(mode="after")
    def _settings_the_loss_uses(self) -> DPOTrainConfig:
        names = [self.loss] if isinstance(self.loss, str) else self.loss
        if not names:
            raise ValueError("dpo.loss: an empty list; name at least one loss")
        if len(set(names)) < len(names):
            raise ValueError(f"dpo.loss: a loss is listed twice in {names}")
        if self.loss_weights is not None and len(self.loss_weights) != len(names):
            raise ValueError(
                f"dpo.loss_weights: {len(self.loss_weights)} weights for {len(names)} losses "
                f"{names}; give one per loss"
            )
        for key, readers in LOSS_SETTINGS.items():
            changed = getattr(self, key) != type(self).model_fields[key].default
            if changed and not readers.intersection(names):
                raise ValueError(
                    f"dpo.{key} is read by {', '.join(sorted(readers))} only; loss "
                    f"{self.loss!r} does not use it"
                )
        return self


LOSS_SETTINGS = {
    "gamma": frozenset({"simpo"}),
    "discopop_tau": frozenset({"discopop"}),
    "kto_desirable_weight": frozenset({"kto"}),
    "kto_undesirable_weight": frozenset({"kto"}),
}
"""The settings only some losses read: one set away from its default with none of them in
dpo.loss is refused rather than ignored."""


class DPOConfig(Section):
    """The whole configuration of `rlvr dpo`: offline preference optimisation."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy, whose starting weights are also the reference."""
    data: PreferenceDataConfig = Field(default_factory=PreferenceDataConfig)
    """Where the preference pairs come from."""
    dpo: DPOTrainConfig = Field(default_factory=DPOTrainConfig)
    """Loss, optimisation, pair sampling and output."""
    preset: str | None = None
    """Name of the preference preset this config started from (informational)."""

    @model_validator(mode="after")
    def _fsdp_trains_whole_models(self) -> DPOConfig:
        refuse_fsdp_with_lora(self.dpo.fsdp, self.model, "dpo")
        return self


class CurateSection(ToolSettings, EngineSettings):
    samples_per_prompt: int = Field(default=8, ge=1)
    """Samples per problem from which its pass rate is measured."""
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature (use the one RL will sample at)."""
    max_new_tokens: int = Field(default=64, ge=1)
    """Generation budget of each sample."""
    min_pass_rate: float = Field(default=0.1, ge=0.0, le=1.0)
    """Keep problems whose pass rate is at least this (drops the ones the model never solves)."""
    max_pass_rate: float = Field(default=0.9, ge=0.0, le=1.0)
    """Keep problems whose pass rate is at most this (drops the ones it always solves)."""
    dedup: bool = True
    """Drop questions equal to an earlier one after case folding and whitespace collapsing."""
    max_problems: int = Field(default=0, ge=0)
    """Curate only the first N training problems (0 = all)."""
    seed: int = 0
    """Sampling seed."""
    output: str = "runs/curated.jsonl"
    """The curated problems, a JSONL file that `data.task=file data.path=...` reads."""

    @model_validator(mode="after")
    def _band(self) -> CurateSection:
        _at_most(
            "curate.min_pass_rate", self.min_pass_rate, "curate.max_pass_rate", self.max_pass_rate
        )
        return self


class CurateConfig(Section):
    """The whole configuration of `rlvr curate`: dedup and pass-rate filtering of prompts."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The model whose pass rates decide (usually the one RL will start from)."""
    data: DataConfig = Field(default_factory=DataConfig)
    """The task whose training problems are curated."""
    curate: CurateSection = Field(default_factory=CurateSection)
    """Sampling, the pass-rate band and the output file."""

    @model_validator(mode="after")
    def _hermes_calls_are_chats(self) -> CurateConfig:
        refuse_hermes_without_chat(self.curate, self.data, "curate.tool_format")
        return self
