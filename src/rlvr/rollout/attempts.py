"""Multi-attempt rollouts: after a wrong answer a user turn says so and the policy tries again.

Chung, Du and Fu 2025 (*Learning from Failures in Multi-Attempt Reinforcement Learning*,
arXiv:2503.04808) turn the one-answer task into a dialogue: when an attempt is wrong the
environment answers "incorrect, try again" and the model gets another attempt, up to a
number of attempts, and is rewarded for the answer it ends with. Here:

- an attempt ends where the policy ends its turn: the chat template's end-of-turn token,
  which must be one of the EOS ids (it is the policy's, trained on);
- the verifier judges the attempt's text (the tokens since the last user turn, with the
  results of its tool calls, `rollout.max_tool_calls` of them per attempt); a wrong one with
  room left in the generation budget gets the user turn (`retry_message`, rendered by the
  chat template, read from it around a placeholder) and the opening of the next assistant
  turn, both masked out of the loss like a tool's result, then one more sample;
- the completion is the whole dialogue after the prompt, scored by the rewards as one text:
  the verifiers read the last answer, so the reward is the last attempt's.

How it departs from the paper: the number of attempts is fixed (the paper draws it per
question), and the reward is the configured one (the paper's is +1 right, −0.5 wrong but
well-formed, −1 otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from rlvr.config_files import ConfigError
from rlvr.rollout.base import Rollout, RolloutEngine, SamplingParams
from rlvr.rollout.call_formats import turn_end

ANSWER = "\x00ANSWER\x00"
"""A placeholder for the assistant's attempt, rendered through the chat template."""

Judge = Callable[[list[int], list[str]], list[bool]]
"""(prompt index of each attempt, the attempt's text) -> whether each is right."""


def retry_turn(
    tokenizer, message: str, chat_kwargs: Mapping[str, Any] | None = None
) -> tuple[int, list[int]]:
    """(the chat template's end-of-turn token id, the tokens it writes after that token for a
    user turn saying `message` through the opening of the next assistant turn)."""
    messages = [
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": message},
    ]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **dict(chat_kwargs or {})
    )
    after = text[text.find(ANSWER) + len(ANSWER) :]
    if text.count(ANSWER) != 1 or message not in after:
        raise ConfigError(
            "rollout.attempts: the tokenizer's chat template does not render a user turn "
            "after an assistant turn"
        )
    end_id, end = turn_end(tokenizer, after, "rollout.attempts")
    return end_id, tokenizer(after[len(end) :], add_special_tokens=False)["input_ids"]


class Attempts:
    """A `RolloutEngine` that gives each wrong attempt of `engine`'s completions another
    one, up to `attempts` in all (the module docstring). `judge` reads the attempts of the
    prompts of the next `generate` call; an attempt ends with `end_id` (the template's
    end-of-turn), and `retry_ids` follow it (`retry_turn`)."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer,
        attempts: int,
        judge: Judge,
        turn: tuple[int, Sequence[int]],
    ) -> None:
        self.engine, self.tokenizer, self.attempts = engine, tokenizer, attempts
        self.judge, (self.end_id, retry_ids) = judge, turn
        self.retry_ids = list(retry_ids)

    @property
    def model(self):
        """The policy module the wrapped engine samples from."""
        return self.engine.model

    def sync_weights(self, model) -> None:
        """Make the wrapped engine sample from the current weights of `model`."""
        self.engine.sync_weights(model)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        """Sample `params.n` completions per prompt, each with up to `attempts` attempts."""
        budget = params.max_new_tokens
        first = self.engine.generate(prompts, params)
        index = list(first.prompt_index)
        tokens = [list(t) for t in first.completion_ids]
        logprobs = [list(lp) for lp in first.logprobs]
        masked = [list(m) for m in _masks(first)]
        calls, failed = (
            _counts(first.tool_calls, len(tokens)),
            _counts(first.failed_calls, len(tokens)),
        )
        finish, tries, starts = list(first.finish_reason), [1] * len(tokens), [0] * len(tokens)
        for _ in range(self.attempts - 1):
            ended = [
                row
                for row in range(len(tokens))
                if finish[row] == "stop"
                and tokens[row][-1:] == [self.end_id]
                and tries[row] < self.attempts
                and len(tokens[row]) + len(self.retry_ids) < budget
            ]
            texts = [self._text(tokens[row][starts[row] :]) for row in ended]
            right = self.judge([index[row] for row in ended], texts) if ended else []
            wrong = [row for row, ok in zip(ended, right, strict=True) if not ok]
            if not wrong:
                break
            for row in wrong:
                tokens[row] += self.retry_ids
                logprobs[row] += [0.0] * len(self.retry_ids)
                masked[row] += [True] * len(self.retry_ids)
                starts[row], tries[row] = len(tokens[row]), tries[row] + 1
            room = budget - min(len(tokens[row]) for row in wrong)
            turn = self.engine.generate(
                [prompts[index[row]] + tokens[row] for row in wrong],
                replace(params, n=1, min_new_tokens=0, max_new_tokens=room),
            )
            turn_masks = _masks(turn)
            turn_calls = _counts(turn.tool_calls, len(wrong))
            turn_failed = _counts(turn.failed_calls, len(wrong))
            for i, row in enumerate(wrong):
                new, left = turn.completion_ids[i], budget - len(tokens[row])
                tokens[row] += new[:left]
                logprobs[row] += turn.logprobs[i][:left]
                masked[row] += turn_masks[i][:left]
                calls[row], failed[row] = calls[row] + turn_calls[i], failed[row] + turn_failed[i]
                finish[row] = "length" if len(new) > left else turn.finish_reason[i]
        if first.tool_calls is None:  # no tools: nothing to count
            calls = failed = None
        return Rollout(index, tokens, logprobs, finish, masked, calls, failed, attempts=tries)

    def _text(self, tokens: list[int]) -> str:
        """An attempt's text as the rewards read completions: special tags kept, its
        end-of-turn token dropped."""
        return self.tokenizer.decode(tokens[:-1], skip_special_tokens=False)


def _masks(out: Rollout) -> list[list[bool]]:
    """Each completion's tool mask (True: a tool wrote the token), all False without tools."""
    if out.tool_mask is not None:
        return out.tool_mask
    return [[False] * len(tokens) for tokens in out.completion_ids]


def _counts(values: list[int] | None, n: int) -> list[int]:
    """Per-completion counts of tool calls, 0 each without tools."""
    return list(values) if values is not None else [0] * n
