"""Preference pairs from files (TRL's standard format, plain text) and from verified samples."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlvr.data.loaders import DatasetError
from rlvr.data.preference import PreferencePair, load_preference_file, pairs_from_groups
from rlvr.data.templates import encode_prompts
from rlvr.models.tiny import build_tiny_tokenizer
from rlvr.training.pairs import encode_pairs

ROWS = [
    {"prompt": "What is 2+3?", "chosen": "<answer>5</answer>", "rejected": "6", "id": 1},
    {"prompt": "What is 7+6?", "chosen": "<answer>13</answer>", "rejected": "no idea", "id": 2},
]
ASKED = {"role": "user", "content": "q"}
SAID_A, SAID_B, SAID_C = ({"role": "assistant", "content": text} for text in "abc")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_and_parquet_give_the_same_pairs(tmp_path):
    expected = [PreferencePair(r["prompt"], r["chosen"], r["rejected"]) for r in ROWS]
    assert load_preference_file(write_jsonl(tmp_path / "p.jsonl", ROWS)) == expected
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "p.parquet")
    assert load_preference_file(tmp_path / "p.parquet") == expected


def test_conversational_pairs(tmp_path):
    """TRL's conversational preference format: messages for the prompt, one assistant message
    for each response."""
    system = {"role": "system", "content": "Be brief."}
    user = {"role": "user", "content": "What is 2+3?"}
    rows = [
        {
            "prompt": [system, user],
            "chosen": [{"role": "assistant", "content": "<answer>5</answer>"}],
            "rejected": [{"role": "assistant", "content": "6"}],
        }
    ]
    (pair,) = load_preference_file(write_jsonl(tmp_path / "c.jsonl", rows))
    assert pair == PreferencePair((system, user), "<answer>5</answer>", "6")
    tok = build_tiny_tokenizer()
    tokens = encode_pairs([pair], "chat", tok)
    assert tokens.prompts[0] == encode_prompts("chat", [[system, user]], tok)[1][0]
    assert tokens.chosen[0] == tok("<answer>5</answer>", add_special_tokens=False)["input_ids"] + [
        tok.eos_token_id
    ]


def test_implicit_prompt_pairs_share_their_first_messages(tmp_path):
    """TRL's implicit prompt: no prompt column, chosen and rejected whole conversations; the
    messages they begin with in common are the prompt (system and user turns here)."""
    system = {"role": "system", "content": "Be brief."}
    user = {"role": "user", "content": "What is 2+3?"}
    good, bad = ({"role": "assistant", "content": text} for text in ("5", "6"))
    rows = [{"chosen": [system, user, good], "rejected": [system, user, bad], "id": 7}]
    assert load_preference_file(write_jsonl(tmp_path / "i.jsonl", rows)) == [
        PreferencePair((system, user), "5", "6")
    ]
    with pytest.raises(DatasetError) as caught:  # nothing shared: no prompt to take
        load_preference_file(
            write_jsonl(tmp_path / "n.jsonl", [{"chosen": [good], "rejected": [bad]}])
        )
    assert str(caught.value).endswith(
        "n.jsonl, row 1 (line 1): no 'prompt' column, and the conversations of 'chosen' and "
        "'rejected' do not begin alike (TRL's implicit prompt)"
    )


def test_implicit_prompt_texts_share_their_first_characters(tmp_path):
    """TRL's standard implicit prompt: the common start of two texts, less a space just before
    they part, which begins each response (TRL's own example)."""
    rows = [
        {"chosen": "The sky is blue.", "rejected": "The sky is green."},
        {"chosen": "Human: 2+3?\nAssistant: 5", "rejected": "Human: 2+3?\nAssistant: 6"},
    ]
    assert load_preference_file(write_jsonl(tmp_path / "t.jsonl", rows)) == [
        PreferencePair("The sky is", " blue.", " green."),
        PreferencePair("Human: 2+3?\nAssistant:", " 5", " 6"),
    ]


def test_custom_column_names(tmp_path):
    rows = [{"q": "x?", "good": "a", "bad": "b"}]
    pairs = load_preference_file(
        write_jsonl(tmp_path / "p.jsonl", rows),
        prompt_column="q",
        chosen_column="good",
        rejected_column="bad",
    )
    assert pairs == [PreferencePair("x?", "a", "b")]


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        (
            {"prompt": "q", "chosen": "a"},
            "missing column 'rejected'; this row has columns ['prompt', 'chosen']; "
            "set data.rejected_column to the one that holds it",
        ),
        ({"prompt": "q", "chosen": "", "rejected": "b"}, "column 'chosen' is '', expected"),
        ({"prompt": None, "chosen": "a", "rejected": "b"}, "column 'prompt' is null"),
        ({"prompt": "q", "chosen": 3, "rejected": "b"}, "column 'chosen' is 3"),
        (
            {"prompt": "q", "chosen": [{"role": "user", "content": "a"}], "rejected": "b"},
            "column 'chosen': a conversational response must be one assistant message",
        ),
        (
            {"prompt": [{"role": "assistant", "content": "q"}], "chosen": "a", "rejected": "b"},
            "column 'prompt': a conversation must end with a non-empty user turn",
        ),
        ({"prompt": "q", "chosen": "same", "rejected": "same"}, "chosen and rejected are the same"),
        (  # TRL's implicit prompt: whole conversations, the messages they begin with shared
            {"chosen": [ASKED, SAID_A], "rejected": [SAID_B, ASKED]},
            "do not begin alike",
        ),
        (
            {"chosen": [ASKED, SAID_A], "rejected": [ASKED, SAID_A, SAID_B]},
            "'chosen' is all in the other's start: no response",
        ),
        ({"chosen": "Yes", "rejected": "No"}, "the texts of 'chosen' and 'rejected' do not begin"),
        (  # the space before the parting begins the responses: no prompt is left
            {"chosen": " yes", "rejected": " no"},
            "the texts of 'chosen' and 'rejected' do not begin alike",
        ),
        ({"chosen": "It is", "rejected": "It is not"}, "'chosen' is all in the other's start"),
        (  # a text and a conversation: no implicit prompt, each side read as a response
            {"chosen": "It is", "rejected": [ASKED, SAID_A]},
            "column 'rejected': a conversational response must be one assistant message",
        ),
        (  # the shared messages end with the assistant's: a prompt must end with the user's
            {"chosen": [ASKED, SAID_A, SAID_B], "rejected": [ASKED, SAID_A, SAID_C]},
            "column 'prompt': a conversation must end with a non-empty user turn",
        ),
    ],
)
def test_bad_rows_name_file_and_row(tmp_path, bad_row, message):
    path = write_jsonl(tmp_path / "pairs.jsonl", [ROWS[0], bad_row])
    with pytest.raises(DatasetError, match=r"pairs\.jsonl, row 2 \(line 2\)") as caught:
        load_preference_file(path)
    assert message in str(caught.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DatasetError, match=r"nothing\.jsonl: no such file"):
        load_preference_file(tmp_path / "nothing.jsonl")


def test_pairs_from_groups_by_hand():
    scores = [
        *[0.0, 1.0, 0.0, 1.0],  # group 0: best {1, 3}, worst {0, 2}
        *[1.0, 1.0, 1.0, 1.0],  # group 1: all alike, no pair
        *[0.5, 0.2, 0.9, 0.2],  # group 2: best {10}, worst {9, 11}
    ]
    pairs = pairs_from_groups(scores, 4, random.Random(0))
    assert len(pairs) == 2
    (c0, r0), (c2, r2) = pairs
    assert c0 in (1, 3) and r0 in (0, 2)
    assert c2 == 10 and r2 in (9, 11)
    # the draws among tied samples are uniform: every best/worst index turns up
    draws = {pairs_from_groups(scores, 4, random.Random(s))[0] for s in range(40)}
    assert draws == {(1, 0), (1, 2), (3, 0), (3, 2)}


def test_pairs_from_groups_refuses_ragged_groups():
    with pytest.raises(ValueError, match="groups of 4"):
        pairs_from_groups([0.0] * 6, 4, random.Random(0))
    with pytest.raises(ValueError, match="groups of 1"):
        pairs_from_groups([0.0, 1.0], 1, random.Random(0))


def test_a_list_of_pair_files_is_read_in_order_and_names_the_bad_file(tmp_path):
    first = write_jsonl(tmp_path / "one.jsonl", ROWS[1:])
    second = write_jsonl(
        tmp_path / "two.jsonl", [*ROWS[:1], {**ROWS[0], "rejected": ROWS[0]["chosen"]}]
    )
    with pytest.raises(DatasetError, match=r"two\.jsonl row 2 \(line 2\): chosen and rejected"):
        load_preference_file([first, second])
    write_jsonl(second, ROWS[:1])
    assert [p.prompt for p in load_preference_file([first, second])] == [
        "What is 7+6?",
        "What is 2+3?",
    ]


UNPAIRED = [
    {"prompt": "What is 2+3?", "completion": "<answer>5</answer>", "label": True},
    {"prompt": "What is 7+6?", "completion": "no idea", "label": False},
]


def test_unpaired_rows_are_one_sided_pairs(tmp_path):
    """TRL's unpaired preference format (KTO): a desirable row is a pair without its rejected
    side, an undesirable one without its chosen side; encoded, the missing side is empty."""
    pairs = load_preference_file(write_jsonl(tmp_path / "u.jsonl", UNPAIRED))
    assert pairs == [
        PreferencePair("What is 2+3?", "<answer>5</answer>", None),
        PreferencePair("What is 7+6?", None, "no idea"),
    ]
    assert all(p.one_sided for p in pairs) and not PreferencePair("q", "a", "b").one_sided
    tokens = encode_pairs(pairs, "none", build_tiny_tokenizer())
    assert tokens.rejected[0] == [] and tokens.chosen[1] == []
    assert tokens.chosen[0] and tokens.rejected[1]
    renamed = [{"q": r["prompt"], "text": r["completion"], "good": r["label"]} for r in UNPAIRED]
    assert pairs == load_preference_file(
        write_jsonl(tmp_path / "r.jsonl", renamed),
        prompt_column="q",
        completion_column="text",
        label_column="good",
    )


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [UNPAIRED[0], {**UNPAIRED[1], "label": 1}],
            "column 'label' is 1, expected true (desirable) or false (undesirable)",
        ),
        (
            [UNPAIRED[0], {"prompt": "q", "completion": "a"}],
            "missing column 'label'; this row has columns ['prompt', 'completion']; "
            "set data.label_column to the one that holds it",
        ),
        ([UNPAIRED[0], {**UNPAIRED[1], "completion": " "}], "column 'completion' is ' '"),
        (
            [UNPAIRED[0], ROWS[0]],
            "this row is a pair ('chosen') in an unpaired file (the first row's format: "
            "'completion' and 'label'); a file holds one format",
        ),
        (
            [ROWS[0], UNPAIRED[0]],
            "this row is unpaired ('completion', no 'chosen') in a file of pairs (the first "
            "row's format); a file holds one format",
        ),
    ],
)
def test_bad_unpaired_rows_name_file_and_row(tmp_path, rows, message):
    path = write_jsonl(tmp_path / "unpaired.jsonl", rows)
    with pytest.raises(DatasetError, match=r"unpaired\.jsonl, row 2 \(line 2\)") as caught:
        load_preference_file(path)
    assert message in str(caught.value)
