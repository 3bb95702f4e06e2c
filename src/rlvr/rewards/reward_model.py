"""A learned reward model: a sequence classifier's score of the prompt and the completion.

The reward of TRL's ``reward_funcs="<model id>"`` and verl's ``reward_model.enable``: a Hugging
Face ``*ForSequenceClassification`` model (an outcome reward model trained on preferences,
Ouyang et al. 2022, "Training language models to follow instructions with human feedback",
section 3.5) reads the whole conversation and its first logit at the last token is the
reward, ``r(x, y) = logits[0]``. The conversation is written with the reward model's own chat
template (the prompt's messages, then the completion as the assistant's turn), as TRL does
for conversational data; a reward model without a chat template reads the prompt the policy
saw followed by the completion, TRL's ``prompt + completion``.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase


def is_sequence_classifier(model: PreTrainedModel) -> bool:
    """Whether `model` was saved as a sequence classifier (its config's architectures), so
    that its score head is trained rather than freshly initialised on loading."""
    names = model.config.architectures or [type(model).__name__]
    return any(name.endswith("ForSequenceClassification") for name in names)


def reward_model_texts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    completions: list[str],
    messages: list[list[dict[str, str]]] | None,
    chat_template: bool,
) -> list[str]:
    """What the reward model reads for each completion: with `chat_template`, the prompt's
    `messages` and the completion as the assistant's reply, rendered by `tokenizer`'s chat
    template; otherwise the prompt text followed by the completion."""
    if not chat_template:
        return [p + c for p, c in zip(prompts, completions, strict=True)]
    if messages is None:
        messages = [[{"role": "user", "content": p}] for p in prompts]
    return [
        tokenizer.apply_chat_template([*turns, {"role": "assistant", "content": c}], tokenize=False)
        for turns, c in zip(messages, completions, strict=True)
    ]


@torch.inference_mode()
def reward_model_scores(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    batch_size: int,
    max_length: int | None = None,
) -> list[float]:
    """``logits[:, 0]`` of `model` on each text, `batch_size` texts per forward, padded on the
    right (the classifier reads the last token that is not padding); texts longer than
    `max_length` tokens keep their end, where the completion is."""
    device = next(model.parameters()).device
    scores: list[float] = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start : start + batch_size], add_special_tokens=False)
        ids = [row[-max_length:] if max_length else row for row in batch["input_ids"]]
        width = max(len(row) for row in ids)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([row + [pad] * (width - len(row)) for row in ids], device=device)
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
        logits = model(input_ids=input_ids, attention_mask=mask.to(device)).logits
        scores.extend(logits[:, 0].float().tolist())
    return scores
