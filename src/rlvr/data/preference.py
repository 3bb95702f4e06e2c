"""Preference pairs: read from a local file, or chosen among a model's verified samples.

A file holds one pair per row in TRL's standard preference format: a `prompt` (the question,
before the prompt template, or a conversation), a `chosen` and a `rejected` response (texts, or
one assistant message each; or, with no prompt, two whole conversations or texts that begin
alike). Or, for KTO, one labelled response per row in TRL's unpaired preference format: a
`prompt`, a `completion` and a boolean `label` (True: desirable), read as a one-sided pair (the
other side None). The first row sets the file's format; a row of the other format, or of
neither, is refused with the row named; nothing is skipped silently.

From a verifiable task (Pang et al. 2024, Iterative Reasoning Preference Optimization): sample
several completions per problem, score them with the task's verifier, and from each problem
whose scores differ take a best-scored completion as chosen and a worst-scored one as rejected.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlvr.data.loaders import (
    DataPath,
    DatasetError,
    assistant_reply,
    located,
    missing_column,
    parse_messages,
    read_rows,
)


@dataclass(frozen=True)
class PreferencePair:
    """One preference: for `prompt`, `chosen` is preferred to `rejected`; or one side alone, a
    labelled response of an unpaired file (the other side None)."""

    prompt: str | tuple[dict[str, str], ...]
    """The raw question, or a conversation ending with the user's turn (rendered by
    `data.template=chat`); the prompt template is applied when encoding."""
    chosen: str | None
    """The preferred (desirable) response text; None in an undesirable example."""
    rejected: str | None
    """The dispreferred (undesirable) response text; None in a desirable example."""

    @property
    def one_sided(self) -> bool:
        """A labelled response of an unpaired file, not a pair."""
        return self.chosen is None or self.rejected is None


def _text(row: dict, column: str, setting: str) -> str:
    if column not in row:
        raise missing_column(row, column, setting)
    value = row[column]
    if isinstance(value, list):  # TRL's conversational response: one assistant message
        value = assistant_reply(value, column)
    if not isinstance(value, str) or not value.strip():
        shown = "null" if value is None else repr(value)[:40]
        raise DatasetError(f"column {column!r} is {shown}, expected a non-empty string")
    return value


def _shared_start(sides: tuple[list, list] | tuple[str, str]) -> int:
    """How much of its start `chosen` shares with `rejected`: whole messages for two
    conversations; characters for two texts, less a space just before they part, which
    begins each response (TRL's `extract_prompt`: "The sky is" + " blue." / " green.")."""
    shared = 0
    while shared < min(map(len, sides)) and sides[0][shared] == sides[1][shared]:
        shared += 1
    if isinstance(sides[0], str) and shared and sides[0][shared - 1] == " ":
        shared -= 1
    return shared


def _implicit_prompt(row: dict, prompt_column: str, chosen: str, rejected: str) -> dict:
    """`row` with its prompt made explicit, for TRL's implicit-prompt pairs: no prompt column,
    and `chosen` and `rejected` two whole conversations or two texts; what they begin with in
    common (`_shared_start`) is the prompt, the rest of each its response. Any other row is
    returned as it is."""
    sides = row.get(chosen), row.get(rejected)
    kinds = {type(side) for side in sides}
    if prompt_column in row or not (kinds == {list} or kinds == {str}):
        return row
    what = "conversations" if kinds == {list} else "texts"
    shared = _shared_start(sides)
    if not shared:
        raise DatasetError(
            f"no {prompt_column!r} column, and the {what} of {chosen!r} and {rejected!r} do "
            "not begin alike (TRL's implicit prompt)"
        )
    for column, side in zip((chosen, rejected), sides, strict=True):
        if len(side) == shared:
            raise DatasetError(
                f"no {prompt_column!r} column, and {column!r} is all in the other's start: no "
                "response after the shared prompt (TRL's implicit prompt)"
            )
    responses = {chosen: sides[0][shared:], rejected: sides[1][shared:]}
    return {**row, prompt_column: sides[0][:shared], **responses}


def _labelled(
    row: dict, completion_column: str, label_column: str
) -> tuple[str | None, str | None]:
    """(completion, None) or (None, completion) of an unpaired row, by its boolean label."""
    completion = _text(row, completion_column, "data.completion_column")
    if label_column not in row:
        raise missing_column(row, label_column, "data.label_column")
    label = row[label_column]
    if not isinstance(label, bool):
        raise DatasetError(
            f"column {label_column!r} is {label!r}, expected true (desirable) or false "
            "(undesirable)"
        )
    return (completion, None) if label else (None, completion)


def load_preference_file(
    path: DataPath,
    *,
    prompt_column: str = "prompt",
    chosen_column: str = "chosen",
    rejected_column: str = "rejected",
    completion_column: str = "completion",
    label_column: str = "label",
) -> list[PreferencePair]:
    """Every row of a local JSONL/JSON/Parquet/CSV file as a `PreferencePair`, in file order: the
    rows of a pair file as pairs, those of an unpaired file (`completion_column`,
    `label_column`, no `chosen_column`) as one-sided pairs.

    The prompt may be a conversation and each response one assistant message (TRL's
    conversational preference format); with no prompt column, `chosen` and `rejected` may be
    whole conversations whose common first messages are the prompt, or two texts whose common
    start is (TRL's implicit prompt).

    Raises:
        DatasetError: naming the file and row, for a missing or non-text column, a malformed
            conversation, a label that is not a boolean, a row not in the first row's format,
            or a pair whose chosen and rejected texts are equal.
    """
    pairs: list[PreferencePair] = []
    unpaired = None
    for where, row in read_rows(path):
        try:
            labelled = chosen_column not in row and completion_column in row
            if unpaired is None:
                unpaired = labelled
            elif labelled != unpaired:
                raise DatasetError(
                    f"this row is unpaired ({completion_column!r}, no {chosen_column!r}) in a "
                    "file of pairs (the first row's format); a file holds one format"
                    if labelled
                    else f"this row is a pair ({chosen_column!r}) in an unpaired file (the first "
                    f"row's format: {completion_column!r} and {label_column!r}); a file holds "
                    "one format"
                )
            if not labelled:
                row = _implicit_prompt(row, prompt_column, chosen_column, rejected_column)
            prompt = row.get(prompt_column)
            sides = (
                _labelled(row, completion_column, label_column)
                if labelled
                else (
                    _text(row, chosen_column, "data.chosen_column"),
                    _text(row, rejected_column, "data.rejected_column"),
                )
            )
            pair = PreferencePair(
                parse_messages(prompt, prompt_column)
                if isinstance(prompt, list)
                else _text(row, prompt_column, "data.prompt_column"),
                *sides,
            )
        except DatasetError as e:
            raise DatasetError(f"{located(path, where)}: {e}") from None
        if pair.chosen == pair.rejected:
            raise DatasetError(f"{located(path, where)}: chosen and rejected are the same text")
        pairs.append(pair)
    return pairs


def pairs_from_groups(
    scores: list[float], group_size: int, rng: random.Random
) -> list[tuple[int, int]]:
    """(chosen, rejected) sample indices: one pair per group of `group_size` consecutive
    samples whose scores differ, a uniformly drawn best-scored sample against a uniformly
    drawn worst-scored one. Groups whose samples all score alike give no pair."""
    if group_size < 2 or len(scores) % group_size:
        raise ValueError(f"{len(scores)} scores do not split into groups of {group_size} (>= 2)")
    pairs = []
    for start in range(0, len(scores), group_size):
        group = range(start, start + group_size)
        best = max(scores[i] for i in group)
        worst = min(scores[i] for i in group)
        if best > worst:
            chosen = rng.choice([i for i in group if scores[i] == best])
            rejected = rng.choice([i for i in group if scores[i] == worst])
            pairs.append((chosen, rejected))
    return pairs
