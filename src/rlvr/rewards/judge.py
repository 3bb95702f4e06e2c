"""Pairwise generative judges and BRPO, the bootstrapped pairwise reward of Writing-Zero.

A judge reads a prompt and two responses and returns a score for each (`compare`). Two ship:
`HFJudge` generates its verdict with any local causal LM through the in-process rollout engine
(the policy itself, a frozen copy, or another model), and `OpenAIJudge` asks an
OpenAI-compatible ``/v1/chat/completions`` endpoint (stdlib `urllib`, no new dependency).
Judge output is untrusted text: `parse_judgement` accepts the common verdict formats and returns
``None`` for anything else; an HTTP error or a timeout is ``None`` too. Nothing here raises on a
bad judgement: the caller counts the ``None`` values.

BRPO (Jia et al. 2025, "Writing-Zero: Bridge the Gap Between Non-verifiable Tasks and
Verifiable Rewards", arXiv:2506.00103): in each group one rollout, drawn uniformly at random,
is the temporary reference; every other rollout is judged against it and gets +1 if the judge
prefers it and -1 otherwise, turning a subjective comparison into a binary, verifiable reward.

How this departs from the paper:
- the paper's judge is a GenRM trained with writing principles and self-critique; ours is any
  LM with a generic comparison prompt (`JUDGE_TEMPLATE`), so judgement quality is the user's;
- the reference rollout itself gets 0 (we could not confirm the paper's value for it; 0 is
  what public re-implementations use, and it keeps the reference out of the win/loss signal);
- a tie is not a win (-1), following "+1 if it wins, -1 otherwise";
- an unusable judgement (unparseable, HTTP error, timeout) scores `failure_score`, -1 by
  default, so that breaking the judge is never better than losing to the reference (a policy
  must not learn to emit text that derails its judge); it is counted by the caller;
- ``both_orders=True`` (off by default) judges each pair twice with the positions swapped and
  counts a win only when both orders prefer the rollout, which cancels a judge's position bias
  at twice the cost; by default the rollout is always response A and the reference B;
- `brpo_rewards` returns a `BRPOResult` (rewards, references, failure count) rather than a
  bare list, so that unusable judgements are counted where they happen.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlvr.models.loading import decode_completions, eos_token_ids
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.hf import HFRolloutEngine

Judgement = tuple[float, float]
"""(score of response A, score of response B); higher is better, only the order matters."""

JUDGE_TEMPLATE = (
    "Compare two responses to the prompt below and decide which is better.\n"
    "[Prompt]\n{prompt}\n[Response A]\n{response_a}\n[Response B]\n{response_b}\n"
    "[End]\nRate each response from 0 to 10. Reply with one line exactly like:\n"
    "Score A: <0-10>, Score B: <0-10>"
)
"""The default judge instruction; ``{prompt}``, ``{response_a}``, ``{response_b}`` are filled."""


def judge_prompt(
    prompt: str, response_a: str, response_b: str, template: str = JUDGE_TEMPLATE
) -> str:
    """The judge's instruction for one pair (`template` with the three fields filled)."""
    return template.format(prompt=prompt, response_a=response_a, response_b=response_b)


_NUMBER = r"([-+]?\d+(?:\.\d+)?)"
_SCORE = {
    side: re.compile(
        rf"score\s*(?:of\s*|for\s*)?(?:response\s*|assistant\s*)?{side}\b\s*(?:is\s*)?[:=]?\s*"
        rf"\**\s*{_NUMBER}(?:\s*/\s*{_NUMBER})?",
        re.IGNORECASE,
    )
    for side in "ab"
}
_BRACKET_VERDICT = re.compile(r"\[\[\s*(a|b|c|tie)\s*\]\]", re.IGNORECASE)
_WORD_VERDICT = re.compile(
    r"(?:winner|verdict|better\s+response|preferred(?:\s+response)?|final\s+answer)\s*(?:is\s*)?"
    r"[:=]?\s*\**\s*(?:response\s*|assistant\s*)?(a|b|tie|draw|both|neither)\b",
    re.IGNORECASE,
)
_JSON_OBJECT = re.compile(r"\{[^{}]*\}")
_VERDICTS = {"a": (1.0, 0.0), "b": (0.0, 1.0)}
_KEY_SIDE = {
    "a": "a", "b": "b", "scorea": "a", "scoreb": "b", "responsea": "a", "responseb": "b",
    "ascore": "a", "bscore": "b",
}  # fmt: skip


def _verdict(word: str) -> Judgement:
    """(1, 0) for A, (0, 1) for B, (0.5, 0.5) for a tie ("c" is MT-Bench's tie)."""
    return _VERDICTS.get(word.lower(), (0.5, 0.5))


def _finite(pair: tuple[float, float]) -> Judgement | None:
    return pair if all(math.isfinite(v) for v in pair) else None


def _from_json(text: str) -> Judgement | None:
    """Scores from the last JSON object that has both sides or a winner."""
    for match in reversed(_JSON_OBJECT.findall(text)):
        try:
            obj = json.loads(match)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        sides: dict[str, float] = {}
        for key, value in obj.items():
            side = _KEY_SIDE.get(re.sub(r"[^a-z]", "", str(key).lower()))
            if side is None or isinstance(value, bool):
                continue
            try:
                sides[side] = float(value)
            except (TypeError, ValueError):
                continue
        if len(sides) == 2:
            return _finite((sides["a"], sides["b"]))
        winner = next((v for k, v in obj.items() if str(k).lower() == "winner"), None)
        if isinstance(winner, str) and winner.strip().lower() in {"a", "b", "tie", "c"}:
            return _verdict(winner.strip())
    return None


def _from_scores(text: str) -> Judgement | None:
    """Explicit scores: ``Score A: 7/10, Score B: 3`` -> (7, 3); divided when both have a max."""
    found = {side: pattern.findall(text) for side, pattern in _SCORE.items()}
    if not (found["a"] and found["b"]):
        return None
    (a, a_max), (b, b_max) = found["a"][-1], found["b"][-1]
    if a_max and b_max and float(a_max) > 0 and float(b_max) > 0:
        return _finite((float(a) / float(a_max), float(b) / float(b_max)))
    return _finite((float(a), float(b)))


def parse_judgement(text: str | None) -> Judgement | None:
    """(score A, score B) from a judge's free text, or None when it says nothing usable.

    Tried in order, the first that matches wins: a JSON object (``{"a": 7, "b": 3}``,
    ``{"score_a": .., "score_b": ..}``, ``{"winner": "B"}``); explicit scores
    (``Score A: 7/10, Score B: 3``; when both give a maximum the scores are divided by it);
    a bracketed verdict (``[[A]]``, ``[[B]]``, ``[[C]]``/``[[tie]]``, the last one counts);
    a worded verdict (``Winner: B``, ``Verdict: tie``, ``Better response: A``). A verdict
    becomes (1, 0), (0, 1) or (0.5, 0.5) for a tie. Non-finite scores are None.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    found = _from_json(text) or _from_scores(text)
    if found is not None:
        return found
    brackets = _BRACKET_VERDICT.findall(text)
    if brackets:
        return _verdict(brackets[-1])
    words = _WORD_VERDICT.findall(text)
    return _verdict(words[-1]) if words else None


@dataclass
class JudgeStats:
    """What went wrong with a judge so far (cumulative; read deltas around a call)."""

    unparseable: int = 0
    """Answers that `parse_judgement` could not read."""
    errors: int = 0
    """Requests that failed: HTTP error status, refused connection, malformed response body."""
    timeouts: int = 0
    """Requests that got no answer within the timeout."""
    last_error: str = ""
    """The latest failure, for logs (never contains the API key)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, kind: str, message: str) -> None:
        """Count one failure of `kind` ("unparseable", "errors" or "timeouts")."""
        with self._lock:
            setattr(self, kind, getattr(self, kind) + 1)
            self.last_error = message


class Judge(Protocol):
    """Anything that compares two responses to the same prompt."""

    def compare(
        self, prompts: Sequence[str], responses_a: Sequence[str], responses_b: Sequence[str]
    ) -> list[Judgement | None]:
        """One (score A, score B) per pair, or None where the judgement is unusable."""
        ...


def _check_pairs(prompts: Sequence[str], a: Sequence[str], b: Sequence[str]) -> None:
    if not len(prompts) == len(a) == len(b):
        raise ValueError(f"{len(prompts)} prompts, {len(a)} responses A, {len(b)} responses B")


class HFJudge:
    """A local causal LM as judge, generating with the in-process rollout engine.

    The instruction goes through the tokenizer's chat template when it has one. `model` may be
    the policy itself (self-judging): generation runs in eval mode, without gradient, and puts
    the module back in the mode it was in. `generator` seeds sampling when `temperature > 0`.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        *,
        batch_size: int = 64,
        generator: torch.Generator | None = None,
        template: str = JUDGE_TEMPLATE,
    ) -> None:
        self.tokenizer = tokenizer
        self.params = SamplingParams(n=1, temperature=temperature, max_new_tokens=max_new_tokens)
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.engine = HFRolloutEngine(
            model, self.eos_ids, tokenizer.pad_token_id, batch_size, generator
        )
        self.template = template
        self.stats = JudgeStats()
        self.last_outputs: list[str] = []
        """The raw judge texts of the latest `compare` call (for inspection)."""

    def _render(self, text: str) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": text}]
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        return text

    def compare(
        self, prompts: Sequence[str], responses_a: Sequence[str], responses_b: Sequence[str]
    ) -> list[Judgement | None]:
        """Generate one verdict per pair and parse it."""
        _check_pairs(prompts, responses_a, responses_b)
        if not prompts:
            return []
        texts = [
            self._render(judge_prompt(p, a, b, self.template))
            for p, a, b in zip(prompts, responses_a, responses_b)
        ]
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        out = self.engine.generate(ids, self.params)
        self.last_outputs = decode_completions(self.tokenizer, out.completion_ids, self.eos_ids)
        results = [parse_judgement(text) for text in self.last_outputs]
        for text, result in zip(self.last_outputs, results):
            if result is None:
                self.stats.record("unparseable", f"unparseable judgement {text[:80]!r}")
        return results


MAX_RESPONSE_BYTES = 4 << 20
"""Most bytes read from one HTTP judge response (a longer body is cut, hence malformed)."""


def chat_completions_url(base_url: str) -> str:
    """``http://host:8000`` or ``http://host:8000/v1`` -> ``http://host:8000/v1/chat/completions``."""
    parsed = urllib.parse.urlparse(base_url)
    if parsed.scheme not in {"http", "https"} or not parsed.netloc:
        raise ValueError(f"judge URL {base_url!r} must start with http:// or https://")
    base = base_url.rstrip("/")
    return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")


class OpenAIJudge:
    """A judge behind an OpenAI-compatible chat-completions endpoint (vLLM, SGLang, OpenAI, ...).

    The API key is read from the environment variable `api_key_env` at each request and sent
    as a bearer token (no header when the variable is unset, as local servers need none); it is
    never stored, logged or put in an error message. Each pair is one request, `max_workers` in
    flight at once; an HTTP error, a malformed body or no answer within `timeout_s` (a socket
    timeout: per connect/read, not a total deadline) makes that pair None and is counted in
    `stats`.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        *,
        max_tokens: int = 512,
        temperature: float = 0.0,
        max_workers: int = 8,
        template: str = JUDGE_TEMPLATE,
    ) -> None:
        self.url = chat_completions_url(base_url)
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.max_workers = max(1, int(max_workers))
        self.template = template
        self.stats = JudgeStats()

    def __repr__(self) -> str:
        return f"OpenAIJudge(url={self.url!r}, model={self.model!r}, key from ${self.api_key_env})"

    def _request(self, content: str) -> str | None:
        """The judge's reply text, or None (counted in `stats`) when the request failed."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read(MAX_RESPONSE_BYTES)
            reply = json.loads(raw.decode("utf-8", errors="replace"))
            return str(reply["choices"][0]["message"]["content"])
        except urllib.error.HTTPError as exc:
            self.stats.record("errors", f"{self.url}: HTTP {exc.code}")
        except (TimeoutError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)
            kind = "timeouts" if isinstance(reason, TimeoutError) else "errors"
            self.stats.record(kind, f"{self.url}: {type(reason).__name__}: {reason}")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            self.stats.record("errors", f"{self.url}: malformed response ({type(exc).__name__})")
        except OSError as exc:  # a connection reset mid-response
            self.stats.record("errors", f"{self.url}: {type(exc).__name__}")
        return None

    def _judge_one(self, content: str) -> Judgement | None:
        text = self._request(content)
        if text is None:
            return None
        result = parse_judgement(text)
        if result is None:
            self.stats.record("unparseable", f"unparseable judgement {text[:80]!r}")
        return result

    def compare(
        self, prompts: Sequence[str], responses_a: Sequence[str], responses_b: Sequence[str]
    ) -> list[Judgement | None]:
        """One request per pair, in parallel; results in input order."""
        _check_pairs(prompts, responses_a, responses_b)
        contents = [
            judge_prompt(p, a, b, self.template)
            for p, a, b in zip(prompts, responses_a, responses_b)
        ]
        if len(contents) <= 1 or self.max_workers == 1:
            return [self._judge_one(c) for c in contents]
        with ThreadPoolExecutor(min(self.max_workers, len(contents))) as pool:
            return list(pool.map(self._judge_one, contents))


# --------------------------------------------------------------------------- BRPO


@dataclass
class BRPOResult:
    """Rewards of one batch under BRPO, with what is needed to audit them."""

    rewards: list[float]
    """+1 (beat its group's reference), -1 (did not), 0 (is the reference)."""
    references: list[int]
    """For each sample, the index of its group's reference rollout."""
    failed: int = 0
    """Rollouts whose judgement was unusable (they scored `failure_score`)."""


def brpo_references(group_ids: Sequence[int], generator: torch.Generator) -> list[int]:
    """For each sample, the index of its group's reference, drawn uniformly within the group.

    Groups are visited in order of first appearance, one draw from `generator` each, so the
    choice is reproducible from the generator state.
    """
    members: dict[int, list[int]] = {}
    for index, group in enumerate(group_ids):
        members.setdefault(int(group), []).append(index)
    references = [0] * len(group_ids)
    for rows in members.values():
        pick = rows[int(torch.randint(len(rows), (1,), generator=generator))]
        for row in rows:
            references[row] = pick
    return references


def brpo_outcome(wins: bool | None, failure_score: float = -1.0) -> float:
    """Writing-Zero's bootstrapped reward of one rollout judged against its reference:
    r = +1 if the judge prefers the rollout, -1 otherwise (tie included); `failure_score`
    when the judgement is unusable (None)."""
    if wins is None:
        return failure_score
    return 1.0 if wins else -1.0


def _wins(judgement: Judgement | None, rollout_is_a: bool) -> bool | None:
    if judgement is None:
        return None
    a, b = judgement
    return a > b if rollout_is_a else b > a


def brpo_rewards(
    prompts: Sequence[str],
    completions: Sequence[str],
    group_ids: Sequence[int] | torch.Tensor,
    judge: Judge,
    generator: torch.Generator,
    *,
    both_orders: bool = False,
    failure_score: float = -1.0,
) -> BRPOResult:
    """BRPO rewards (Writing-Zero): each group's random reference gets 0, every other rollout
    r_i = +1 if judge(prompt, o_i, o_ref) prefers o_i else -1.

    All pairs of the batch go to the judge in one `compare` call (the rollout as response A);
    with `both_orders` the swapped pairs go in the same call and a win needs both orders.
    Returns a `BRPOResult` (a departure from a plain list: the failure count travels with it).
    """
    n = len(completions)
    if len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts for {n} completions")
    ids = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    if len(ids) != n:
        raise ValueError(f"{len(ids)} group ids for {n} completions")
    references = brpo_references(ids, generator)
    rows = [i for i in range(n) if references[i] != i]
    pair_prompts = [prompts[i] for i in rows]
    rollouts = [completions[i] for i in rows]
    refs = [completions[references[i]] for i in rows]
    if both_orders:
        judged = judge.compare(pair_prompts * 2, rollouts + refs, refs + rollouts)
    else:
        judged = judge.compare(pair_prompts, rollouts, refs)
    expected = len(rows) * (2 if both_orders else 1)
    if len(judged) != expected:
        raise ValueError(f"judge returned {len(judged)} judgements for {expected} pairs")
    rewards, failed = [0.0] * n, 0
    for k, row in enumerate(rows):
        wins = _wins(judged[k], rollout_is_a=True)
        if both_orders:
            swapped = _wins(judged[k + len(rows)], rollout_is_a=False)
            wins = None if wins is None or swapped is None else wins and swapped
        failed += wins is None
        rewards[row] = brpo_outcome(wins, failure_score)
    return BRPOResult(rewards=rewards, references=references, failed=failed)
