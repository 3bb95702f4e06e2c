"""The frozen teacher of on-policy distillation (`algorithm.distill.teacher`).

It scores the student's sampled tokens at the rollout's temperature, as the reference model
does; it must share the policy's tokenizer, since a token id has to mean the same text to
both models.
"""

from __future__ import annotations

from torch import nn

from rlvr.config import ConfigError, ModelConfig
from rlvr.models import fused
from rlvr.models.loading import DTYPES, ModelLoadError, disable_dropout_, load_pretrained

KEY = "algorithm.distill.teacher"


def check_same_vocabulary(teacher_tokenizer, tokenizer, name: str) -> None:
    """A `ConfigError` naming the teacher when its vocabulary differs from the policy's."""
    theirs, ours = teacher_tokenizer.get_vocab(), tokenizer.get_vocab()
    if theirs == ours:
        return
    index = min(i for _, i in set(theirs.items()) ^ set(ours.items()))

    def token_at(vocab: dict[str, int]) -> str:
        return next((repr(token) for token, i in vocab.items() if i == index), "no token")

    raise ConfigError(
        f"{KEY} {name!r}: its tokenizer differs from the policy's ({len(theirs)} vs "
        f"{len(ours)} tokens; first difference at id {index}: {token_at(theirs)} in the "
        f"teacher's, {token_at(ours)} in the policy's); the teacher scores the student's token "
        "ids, so both need the same vocabulary"
    )


def load_teacher(name: str, model_config: ModelConfig, policy: nn.Module, tokenizer) -> nn.Module:
    """The teacher `name`, frozen, in the policy's dtype on the policy's device."""
    try:
        teacher, teacher_tokenizer = load_pretrained(name, model_config.dtype, key=KEY)
    except ModelLoadError as exc:
        raise ConfigError(str(exc)) from None
    check_same_vocabulary(teacher_tokenizer, tokenizer, name)
    disable_dropout_(teacher)
    setattr(teacher, fused.ENABLE_ATTR, model_config.fused_forward)
    device = next(policy.parameters()).device
    return teacher.to(device=device, dtype=DTYPES[model_config.dtype]).eval().requires_grad_(False)
