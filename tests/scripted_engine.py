"""An engine that returns scripted turns, for the tool-call tests."""

from rlvr.models.tiny import build_tiny_tokenizer
from rlvr.rollout.base import Rollout

TOK = build_tiny_tokenizer()
ENDS_OF_CALLS = ("</calculator>", "```output", "<|im_end|>", "?")
"""A scripted turn that ends with one of these stopped (finish `stop`), any other ran out."""


def ids(text: str, tokenizer=TOK) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class Scripted:
    """Returns the scripted turns (texts, one list per `generate`), recording what it was
    asked."""

    def __init__(self, *turns: list[str], tokenizer=TOK) -> None:
        self.turns, self.asked, self.model, self.tokenizer = list(turns), [], None, tokenizer

    def generate(self, prompts, params):
        self.asked.append((prompts, params))
        texts = self.turns.pop(0)
        tokens = [ids(t, self.tokenizer) for t in texts]
        return Rollout(
            [i // params.n for i in range(len(tokens))],
            tokens,
            [[-0.5] * len(t) for t in tokens],
            ["stop" if t.endswith(ENDS_OF_CALLS) else "length" for t in texts],
        )
