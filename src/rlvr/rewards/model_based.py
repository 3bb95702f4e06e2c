"""Model rewards: rewards that need a model or the group structure, not just the texts.

TRL-signature rewards (``f(prompts, completions, **columns)``) see one completion at a time.
A *model reward* is built once from its config options and a `RewardContext` (the policy, its
tokenizer, the run's random generator, how to load a frozen copy), then called on a whole batch
as ``reward(prompts, completions, group_ids, columns) -> ModelRewardResult``. These ship:

- ``brpo``: Writing-Zero's bootstrapped pairwise judge reward (`rlvr.rewards.judge`);
- ``reference_likelihood``: VR-CLI / log-likelihood of the reference answer
  (`rlvr.rewards.likelihood`);
- ``reward_model``: a sequence classifier's score (TRL's and verl's reward model,
  `rlvr.rewards.reward_model`);
- ``majority_vote``: TTRL's label-free reward, 1 for an answer that is its group's majority
  answer, or EMPO's, the share of the group that gave it (`rlvr.rewards.majority`);
- ``confidence``: the policy's certainty in its own tokens (Intuitor's self-certainty, RENT's
  negative entropy, EM-RL's log-likelihood; `rlvr.rewards.certainty`), label-free too.

`RewardScorer` (`rlvr.training.rewarding`) sends every ``reward.functions`` entry whose name is
in `MODEL_REWARDS` here, and the rest to `compose_rewards`. Like there, nothing a model reward
does stops training: a call that raises scores 0.0 for the batch and counts one error; a
non-finite score scores 0.0 and counts one error; unusable judgements are counted as errors
(or timeouts, when the judge request timed out).

Model choices in options: ``policy`` is the module being trained (its current weights);
``frozen`` is the *initial* policy, loaded again from ``model.name_or_path`` (so a resumed run
gets the same frozen model, not the checkpoint's weights); anything else is a local Hugging
Face model directory or hub name.
"""

from __future__ import annotations

import copy
import difflib
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import torch
from pydantic import Field, ValidationError
from torch import nn
from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerBase

from rlvr.algorithms.registry import Registry
from rlvr.config import ConfigError, ModelConfig, RewardSpec, Section
from rlvr.models.loading import ModelLoadError, load_model_and_tokenizer, load_pretrained
from rlvr.rewards.certainty import certainty_rewards
from rlvr.rewards.compose import RewardOutput
from rlvr.rewards.judge import HFJudge, Judge, OpenAIJudge, brpo_rewards
from rlvr.rewards.likelihood import reference_likelihood_rewards
from rlvr.rewards.majority import majority_vote_rewards
from rlvr.rewards.registry import UnknownRewardError, get_reward
from rlvr.rewards.reward_model import (
    is_sequence_classifier,
    reward_model_scores,
    reward_model_texts,
)
from rlvr.rewards.verify import VerifierError, answers_match

MAX_ERROR_EXAMPLES = 5


@dataclass
class ModelRewardResult:
    """Scores of one batch from one model reward."""

    scores: list[float]
    """Unweighted score per completion."""
    errors: int = 0
    """Failures counted as errors (a raising call, an unusable judgement, a non-finite score)."""
    timeouts: int = 0
    """Judge requests that timed out (their completions scored the failure score)."""
    error_examples: list[str] = field(default_factory=list)
    """A few messages, ``"name: what happened"``."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Numbers about the batch, logged as ``reward/<name>/<key>``."""


ModelReward = Callable[[list[str], list[str], torch.Tensor, dict[str, list]], ModelRewardResult]
"""``reward(prompts, completions, group_ids, columns) -> ModelRewardResult``."""

MODEL_REWARDS: Registry = Registry("model reward")
"""Builders of model rewards: ``build(options: dict, context: RewardContext) -> ModelReward``."""

Builder = Callable[[dict[str, Any], "RewardContext"], ModelReward]
S = TypeVar("S", bound=Section)


def model_reward(
    name: str, options: type[S]
) -> Callable[[Callable[[S, RewardContext], ModelReward]], Builder]:
    """Decorator: register ``build(options: S, context) -> ModelReward`` in `MODEL_REWARDS`
    under `name`, as the `Builder` that parses its options dict into `S` (`parse_options`)
    first; `check_options` validates the options against `S` before a run loads anything."""

    def register(build: Callable[[S, RewardContext], ModelReward]) -> Builder:
        @functools.wraps(build)
        def from_dict(given: dict[str, Any], context: RewardContext) -> ModelReward:
            return build(parse_options(options, name, given), context)

        from_dict.options = options  # type: ignore[attr-defined]
        from_dict.model_reward = name  # type: ignore[attr-defined]
        return MODEL_REWARDS.register(name)(from_dict)

    return register


def model_reward_builder(name: str) -> Builder | None:
    """The builder of the model reward a ``reward.functions`` name names, or None for a
    TRL-signature reward: a name in `MODEL_REWARDS`, or a ``package.module:build`` or
    ``file.py:build`` import path to a builder that `model_reward` decorated (importing it
    registers it, so a launcher script is not needed). A path that does not import is None
    here; the check of the TRL-signature rewards reports why."""
    if name in MODEL_REWARDS:
        return MODEL_REWARDS.get(name)
    if ":" not in name:
        return None
    try:
        found = get_reward(name)
    except UnknownRewardError:
        return None
    return found if getattr(found, "model_reward", None) in MODEL_REWARDS else None


@dataclass
class RewardContext:
    """What a model reward may use besides its options."""

    policy: nn.Module | None = None
    """The module being trained (``policy`` in options)."""
    tokenizer: PreTrainedTokenizerBase | None = None
    """The policy's tokenizer."""
    generator: torch.Generator | None = None
    """The run's generator (checkpointed), for random choices and judge sampling."""
    model_config: ModelConfig | None = None
    """How to load the initial policy again (``frozen``); None = a copy of `policy`."""
    seed: int = 0
    """Seed of the tiny model's initialisation (``frozen`` of ``tiny``)."""
    micro_batch_tokens: int = 4096
    """Token budget of one scoring forward pass."""
    _loaded: dict[str, tuple[nn.Module, PreTrainedTokenizerBase]] = field(
        default_factory=dict, repr=False
    )

    def rng(self) -> torch.Generator:
        """The run's generator, or a fresh one seeded with `seed`."""
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(self.seed)
        return self.generator

    def model(self, which: str, option: str) -> tuple[nn.Module, PreTrainedTokenizerBase]:
        """(model, tokenizer) for ``policy``, ``frozen`` or a path / hub name (loaded once)."""
        if which in self._loaded:
            return self._loaded[which]
        needs_policy = which == "policy" or (which == "frozen" and self.model_config is None)
        if needs_policy and (self.policy is None or self.tokenizer is None):
            raise ConfigError(
                f"{option}={which!r} needs the policy and its tokenizer in the RewardContext"
            )
        if which == "policy":
            loaded = (self.policy, self.tokenizer)
        elif which == "frozen" and self.model_config is not None:
            model, tokenizer = load_model_and_tokenizer(self.model_config, seed=self.seed)
            loaded = (model, tokenizer)
        elif which == "frozen":
            loaded = (copy.deepcopy(self.policy), self.tokenizer)
        else:
            try:
                loaded = load_pretrained(which)
            except ModelLoadError as exc:
                raise ConfigError(f"{option} {which!r} could not be loaded: {exc}") from exc
        model, tokenizer = loaded
        if which != "policy":
            model = model.eval().requires_grad_(False)
            if self.policy is not None:
                model = model.to(next(self.policy.parameters()).device)
        self._loaded[which] = (model, tokenizer)
        return self._loaded[which]


def parse_options(model: type[Section], reward: str, options: dict[str, Any]) -> Any:
    """Validate `options` against `model`; a ConfigError names the reward and the bad key."""
    try:
        return model.model_validate(options or {})
    except ValidationError as exc:
        problems = []
        for item in exc.errors():
            key = ".".join(str(p) for p in item["loc"])
            if item["type"] == "extra_forbidden":
                close = difflib.get_close_matches(key, list(model.model_fields), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                valid = ", ".join(model.model_fields)
                problems.append(f"unknown option {key!r} ({hint}valid options: {valid})")
            elif item["type"] == "missing":
                doc = " ".join((model.model_fields[key].description or "").split())
                problems.append(f"option {key!r} is required ({doc})")
            else:
                problems.append(f"option {key!r}: {item['msg']}")
        raise ConfigError(f"reward {reward!r}: " + "; ".join(problems)) from None


# --------------------------------------------------------------------------- brpo


class BRPOOptions(Section):
    judge: str
    """`policy`, `frozen`, a local HF model directory / hub name, or an http(s) URL of an
    OpenAI-compatible server (then `judge_model` names the model)."""
    judge_model: str | None = None
    """Model name sent to the HTTP judge (required with a URL)."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the HTTP judge's API key (unset = no key sent)."""
    timeout_s: float = 60.0
    """HTTP judge: socket timeout of one request."""
    max_workers: int = 8
    """HTTP judge: requests in flight at once."""
    max_new_tokens: int = 128
    """Longest judge answer in tokens."""
    temperature: float = 0.0
    """Judge sampling temperature (0 = greedy)."""
    batch_size: int = 64
    """Local judge: sequences decoded at once."""
    both_orders: bool = False
    """Judge each pair in both positions; a win needs both (cancels position bias, 2x cost)."""
    failure_score: float = -1.0
    """Reward of a rollout whose judgement is unusable (counted in reward/errors)."""


def make_judge(opts: BRPOOptions, context: RewardContext) -> Judge:
    """The judge the options name."""
    if opts.judge.startswith(("http://", "https://")):
        if not opts.judge_model:
            raise ConfigError(
                f"reward 'brpo': judge {opts.judge!r} is a URL, so option 'judge_model' "
                "(the model name the server serves) is required"
            )
        return OpenAIJudge(
            opts.judge,
            opts.judge_model,
            opts.api_key_env,
            opts.timeout_s,
            max_tokens=opts.max_new_tokens,
            temperature=opts.temperature,
            max_workers=opts.max_workers,
        )
    model, tokenizer = context.model(opts.judge, "reward 'brpo': judge")
    return HFJudge(
        model,
        tokenizer,
        opts.max_new_tokens,
        opts.temperature,
        batch_size=opts.batch_size,
        generator=context.rng(),
    )


@model_reward("brpo", BRPOOptions)
def build_brpo(opts: BRPOOptions, context: RewardContext) -> ModelReward:
    """BRPO against a random in-group reference; the judge sees the raw question (the
    ``question`` column) rather than the templated prompt, when the caller provides it."""
    judge = make_judge(opts, context)

    def reward(
        prompts: list[str], completions: list[str], group_ids: torch.Tensor, columns: dict
    ) -> ModelRewardResult:
        stats = getattr(judge, "stats", None)
        timeouts_before = stats.timeouts if stats is not None else 0
        questions = columns.get("question", prompts)
        result = brpo_rewards(
            questions,
            completions,
            group_ids,
            judge,
            context.rng(),
            both_orders=opts.both_orders,
            failure_score=opts.failure_score,
        )
        timed_out = (stats.timeouts - timeouts_before) if stats is not None else 0
        timeouts = min(timed_out, result.failed)
        examples = []
        if result.failed:
            judged = sum(r != i for i, r in enumerate(result.references))
            last = f" (last: {stats.last_error})" if stats is not None and stats.last_error else ""
            examples.append(
                f"brpo: {result.failed} of {judged} judgements unusable, scored "
                f"{opts.failure_score:g}{last}"
            )
        return ModelRewardResult(result.rewards, result.failed - timeouts, timeouts, examples)

    return reward


# --------------------------------------------------------------------------- majority vote


class MajorityVoteOptions(Section):
    timeout_s: float = Field(default=5.0, gt=0)
    """Seconds the verifier may take to compare one answer with its group's majority answer."""
    score: Literal["majority", "share"] = "majority"
    """`majority`: 1 for agreeing with the group's majority answer (TTRL); `share`: the share
    of the group that gave the same answer (EMPO's semantic-cluster probability)."""


@model_reward("majority_vote", MajorityVoteOptions)
def build_majority_vote(opts: MajorityVoteOptions, context: RewardContext) -> ModelReward:
    """TTRL's label-free reward, or EMPO's with ``score: share`` (`rlvr.rewards.majority`):
    no gold answer is read to score. Logged beside it, as TTRL logs them: ``agreement``, the
    mean share of a group that gave its majority answer, and ``label_accuracy``, the share of
    groups whose majority answer is the gold one (where the rows have one)."""

    def matches(answer: str, label: str) -> bool:
        return answers_match(answer, label, opts.timeout_s)

    def reward(
        prompts: list[str], completions: list[str], group_ids: torch.Tensor, columns: dict
    ) -> ModelRewardResult:
        groups = group_ids.tolist()
        vote = majority_vote_rewards(completions, groups, matches, opts.score)
        metrics = {"agreement": sum(vote.agreement.values()) / max(len(vote.agreement), 1)}
        golds = dict(zip(groups, columns.get("answer") or [], strict=False))
        if golds and all(gold not in (None, "") for gold in golds.values()):  # "": unlabelled
            right = [
                label is not None and _verdict(matches, label, str(golds[group]))
                for group, label in vote.labels.items()
            ]
            metrics["label_accuracy"] = sum(right) / len(right)
        examples = vote.errors[:MAX_ERROR_EXAMPLES]
        return ModelRewardResult(vote.rewards, len(vote.errors), vote.timeouts, examples, metrics)

    return reward


def _verdict(matches: Callable[[str, str], bool], answer: str, gold: str) -> bool:
    """`matches(answer, gold)`, False where the verifier cannot decide."""
    try:
        return matches(answer, gold)
    except VerifierError:
        return False


# --------------------------------------------------------------------------- confidence


class ConfidenceOptions(Section):
    measure: Literal["self_certainty", "negative_entropy", "logprob"] = "self_certainty"
    """Per token: `self_certainty` (KL from uniform, Intuitor), `negative_entropy` (RENT) or
    `logprob` (the sampled token's log-probability; summed, EM-RL's trajectory reward)."""
    model: Literal["policy", "frozen"] = "policy"
    """Scoring model: `policy` (its weights at this step, Intuitor's online scorer) or
    `frozen` (the initial policy)."""
    aggregate: Literal["mean", "sum"] = "mean"
    """Over the completion's tokens: `mean` (Intuitor, RENT) or `sum`."""
    temperature: float = Field(default=1.0, gt=0)
    """The logits are divided by it first (1: the model's own distribution)."""


@model_reward("confidence", ConfidenceOptions)
def build_confidence(opts: ConfidenceOptions, context: RewardContext) -> ModelReward:
    """The scoring model's certainty in each completion's sampled tokens (see
    `rlvr.rewards.certainty`); it reads the ``prompt_ids`` and ``completion_ids`` columns
    and, where given, ``completion_mask`` (the tokens the policy wrote)."""
    model, tokenizer = context.model(opts.model, "reward 'confidence': model")

    def reward(
        prompts: list[str], completions: list[str], group_ids: torch.Tensor, columns: dict
    ) -> ModelRewardResult:
        for needed in ("prompt_ids", "completion_ids"):
            if needed not in columns:
                raise ValueError(f"no reward column {needed!r} (have: {', '.join(columns)})")
        scores = certainty_rewards(
            model,
            columns["prompt_ids"],
            columns["completion_ids"],
            tokenizer.pad_token_id,
            measure=opts.measure,
            aggregate=opts.aggregate,
            temperature=opts.temperature,
            token_masks=columns.get("completion_mask"),
            micro_batch_tokens=context.micro_batch_tokens,
        )
        return ModelRewardResult(scores)

    return reward


# --------------------------------------------------------------------------- likelihood


class LikelihoodOptions(Section):
    model: str = "policy"
    """Scoring model: `policy`, `frozen` (the initial policy), or a local HF path / hub name."""
    mode: Literal["logprob", "perplexity", "probability"] = "logprob"
    """`logprob` (log-PPL gain), `perplexity` (VR-CLI % improvement) or `probability` (RLPR)."""
    column: str = "answer"
    """Reward column holding the reference text."""
    answer_prefix: str = ""
    """Text between the reasoning and the reference (e.g. `<answer>`), not scored."""
    answer_suffix: str = ""
    """Text after the reference (e.g. `</answer>`), scored with it."""
    reasoning_stop: str | None = None
    """Cut the completion at this marker (e.g. `<answer>`) so its own answer is not seen."""


@model_reward("reference_likelihood", LikelihoodOptions)
def build_reference_likelihood(opts: LikelihoodOptions, context: RewardContext) -> ModelReward:
    """Reference-likelihood improvement of each completion (see `rlvr.rewards.likelihood`)."""
    model, tokenizer = context.model(opts.model, "reward 'reference_likelihood': model")

    def reward(
        prompts: list[str], completions: list[str], group_ids: torch.Tensor, columns: dict
    ) -> ModelRewardResult:
        if opts.column not in columns:
            raise ValueError(f"no reward column {opts.column!r} (have: {', '.join(columns)})")
        references = [None if r is None else str(r) for r in columns[opts.column]]
        scores = reference_likelihood_rewards(
            model,
            tokenizer,
            prompts,
            completions,
            references,
            mode=opts.mode,
            answer_prefix=opts.answer_prefix,
            answer_suffix=opts.answer_suffix,
            reasoning_stop=opts.reasoning_stop,
            micro_batch_tokens=context.micro_batch_tokens,
        )
        return ModelRewardResult(scores)

    return reward


# --------------------------------------------------------------------------- reward model


class RewardModelOptions(Section):
    model: str
    """Local directory or hub name of a Hugging Face `*ForSequenceClassification` model."""
    chat_template: bool | None = None
    """Write the conversation with the reward model's chat template (None: when it has one);
    false: the prompt the policy saw, then the completion."""
    batch_size: int = Field(default=32, ge=1)
    """Sequences scored per forward pass."""
    max_length: int | None = Field(default=None, ge=1)
    """Keep only the last this many tokens of a longer text (None: whole texts)."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Parameter dtype of the reward model (None: the policy's, `model.dtype`)."""


def load_reward_model(
    opts: RewardModelOptions, context: RewardContext
) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """The sequence classifier `opts.model`, frozen, in `opts.dtype`, on the policy's device."""
    path, option = opts.model, "reward 'reward_model': model"
    policy_dtype = context.model_config.dtype if context.model_config else "float32"
    try:
        model, tokenizer = load_pretrained(
            path, opts.dtype or policy_dtype, AutoModelForSequenceClassification, option
        )
    except ModelLoadError as exc:
        raise ConfigError(str(exc)) from exc
    if not is_sequence_classifier(model):
        saved = ", ".join(model.config.architectures or [])
        raise ConfigError(
            f"{option} {path!r} is a {saved}, not a *ForSequenceClassification reward model: "
            "its score head would be random"
        )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model = model.eval().requires_grad_(False)
    if context.policy is not None:
        model = model.to(next(context.policy.parameters()).device)
    return model, tokenizer


@model_reward("reward_model", RewardModelOptions)
def build_reward_model(opts: RewardModelOptions, context: RewardContext) -> ModelReward:
    """A learned reward model's score of each completion (see `rlvr.rewards.reward_model`);
    it reads each prompt's messages from the ``prompt_messages`` column when there is one."""
    model, tokenizer = load_reward_model(opts, context)
    chat = opts.chat_template
    if chat is None:
        chat = getattr(tokenizer, "chat_template", None) is not None

    def reward(
        prompts: list[str], completions: list[str], group_ids: torch.Tensor, columns: dict
    ) -> ModelRewardResult:
        messages = columns.get("prompt_messages")
        texts = reward_model_texts(tokenizer, prompts, completions, messages, chat)
        scores = reward_model_scores(model, tokenizer, texts, opts.batch_size, opts.max_length)
        return ModelRewardResult(scores)

    return reward


# --------------------------------------------------------------------------- wiring


def build_model_rewards(
    specs: Sequence[RewardSpec], context: RewardContext
) -> dict[str, tuple[float, ModelReward]]:
    """``{name: (weight, reward)}`` for the specs naming a model reward, after
    `check_options` (a ConfigError for a model reward listed twice, bad options, or options
    given to a TRL-signature reward)."""
    check_options(specs)
    built: dict[str, tuple[float, ModelReward]] = {}
    for spec in specs:
        build = model_reward_builder(spec.name)
        if build is None:
            continue
        if spec.name in built:
            raise ConfigError(f"reward {spec.name!r} is listed twice in reward.functions")
        built[spec.name] = (spec.weight, build(spec.options, context))
    return built


def check_options(specs: Sequence[RewardSpec]) -> None:
    """What can be checked of the model rewards in `specs` before any model loads: options
    only for model rewards, no `conversational` (they read the prompts themselves), and the
    options of each registered with its `Section` (`model_reward`) valid."""
    for spec in specs:
        build = model_reward_builder(spec.name)
        if build is None:
            if spec.options:
                raise ConfigError(
                    f"reward {spec.name!r} takes no options (got {sorted(spec.options)}); only "
                    f"model rewards do: {', '.join(MODEL_REWARDS.names())}, or a builder of "
                    "one's own that @model_reward registers, named by import path"
                )
            continue
        if spec.conversational:
            raise ConfigError(
                f"reward {spec.name!r}: conversational is for TRL-signature rewards; a model "
                "reward reads the prompts and completions itself"
            )
        options = getattr(build, "options", None)
        if options is not None:
            parse_options(options, spec.name, spec.options)


def score_model_reward(
    name: str,
    reward: ModelReward,
    prompts: list[str],
    completions: list[str],
    group_ids: torch.Tensor,
    columns: dict[str, list],
) -> ModelRewardResult:
    """Call `reward` on a batch; never raises (failures score 0.0 and are counted)."""
    n = len(completions)
    try:
        result = reward(prompts, completions, group_ids, columns)
        if len(result.scores) != n:
            raise ValueError(f"returned {len(result.scores)} scores for {n} completions")
    except Exception as exc:
        message = f"{name}: {type(exc).__name__}: {exc}"
        return ModelRewardResult([0.0] * n, errors=1, error_examples=[message])
    scores = []
    for score in result.scores:
        value = float(score) if isinstance(score, (int, float)) else math.nan
        if not math.isfinite(value):
            result.errors += 1
            result.error_examples.append(f"{name}: ValueError: non-finite score {score!r}")
            value = 0.0
        scores.append(value)
    result.scores = scores
    return result


def add_model_rewards(
    output: RewardOutput,
    rewards: dict[str, tuple[float, ModelReward]],
    prompts: list[str],
    completions: list[str],
    group_ids: torch.Tensor,
    columns: dict[str, list],
) -> RewardOutput:
    """Score every model reward and add it to `output` (weighted total, parts, failure counts)."""
    for name, (weight, reward) in rewards.items():
        result = score_model_reward(name, reward, prompts, completions, group_ids, columns)
        output.per_reward[name] = result.scores
        output.total = [t + weight * s for t, s in zip(output.total, result.scores, strict=True)]
        output.errors += result.errors
        output.timeouts += result.timeouts
        output.error_examples.extend(result.error_examples)
        del output.error_examples[MAX_ERROR_EXAMPLES:]
        for key, value in result.metrics.items():
            output.metrics.setdefault(f"reward/{name}/{key}", []).append(value)
    return output
