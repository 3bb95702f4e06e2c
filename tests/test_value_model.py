"""The critic's value model (`rlvr.models.value.ValueModel`): a trainable copy of the policy's
backbone plus a scalar head that starts at 0, checked against the policy's own hidden states
through a head set by hand."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.models.value import ValueModel

# two rows, the second left-padded by two positions
IDS = torch.tensor([[20, 21, 22, 23, 24], [0, 0, 30, 31, 32]])
MASK = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
POSITIONS = (MASK.cumsum(-1) - 1).clamp(min=0)


def tiny_policy() -> torch.nn.Module:
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, intermediate_size=64, seed=0)
    return model.eval()


@pytest.fixture(scope="module")
def policy():
    return tiny_policy()


def set_head(critic: ValueModel) -> tuple[torch.Tensor, float]:
    """Give the head (zero at the start) the weights w = 0.1 · (1..hidden), bias 0.5."""
    w = torch.arange(1, critic.head.in_features + 1, dtype=torch.float32) * 0.1
    with torch.no_grad():
        critic.head.weight.copy_(w[None])
        critic.head.bias.fill_(0.5)
    return w, 0.5


def test_a_fresh_value_model_predicts_zero_and_trains_its_own_copy_of_the_backbone(policy):
    """The first values are exactly 0 (head weight and bias 0); every parameter of the critic
    trains, also when the policy's are frozen (a LoRA policy's base); and the backbone is a
    copy: changing it leaves the policy as it was."""
    policy.requires_grad_(False)
    try:
        critic = ValueModel(policy)
    finally:
        policy.requires_grad_(True)
    values, _ = critic(IDS, MASK, POSITIONS)
    assert values.shape == (2, 5) and bool((values == 0).all())
    assert all(p.requires_grad for p in critic.parameters())
    embed = policy.get_input_embeddings().weight
    before = embed.detach().clone()
    with torch.no_grad():
        critic.backbone.get_input_embeddings().weight.add_(1.0)
    assert torch.equal(embed, before)


def test_values_are_the_head_over_the_backbone_hidden_states_of_every_position(policy):
    """values[b, s] = w · h[b, s] + bias with h the policy backbone's last hidden states under
    the given mask and positions (left padding); `keep_last` keeps the last positions."""
    critic = ValueModel(policy).eval()
    w, bias = set_head(critic)
    with torch.no_grad():
        hidden = policy.base_model(
            input_ids=IDS, attention_mask=MASK, position_ids=POSITIONS
        ).last_hidden_state
        expected = hidden @ w + bias
        values, _ = critic(IDS, MASK, POSITIONS)
        last_two, _ = critic(IDS, MASK, POSITIONS, keep_last=2)
    torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last_two, expected[:, -2:], rtol=1e-5, atol=1e-5)


def test_values_of_positions_appended_to_a_cache_equal_those_of_one_pass(policy):
    """The prompt's pass returns its KV cache; the next two positions through that cache get
    the values the whole sequence gets in one pass."""
    critic = ValueModel(policy).eval()
    set_head(critic)
    with torch.no_grad():
        whole, _ = critic(IDS, MASK, POSITIONS)
        _, cache = critic(IDS[:, :3], MASK[:, :3], POSITIONS[:, :3])
        rest, cache = critic(IDS[:, 3:], MASK, POSITIONS[:, 3:], cache=cache)
    assert cache.get_seq_length() == 5
    torch.testing.assert_close(rest, whole[:, 3:], rtol=1e-5, atol=1e-5)


def test_the_head_takes_the_policy_dtype():
    """A bfloat16 policy gives a bfloat16 head, so the critic runs on its hidden states."""
    critic = ValueModel(tiny_policy().to(torch.bfloat16))
    assert critic.head.weight.dtype == torch.bfloat16
    values, _ = critic(IDS, MASK, POSITIONS)
    assert values.dtype == torch.bfloat16 and values.shape == (2, 5)


def test_left_padding_leaves_the_values_of_the_real_tokens_as_they_are():
    """A model with absolute position embeddings (GPT-2), so the positions given matter: a
    row left-padded by two positions, with its positions counted from its first real token,
    gets the values of the same tokens unpadded."""
    config = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=16)
    torch.manual_seed(0)
    critic = ValueModel(GPT2LMHeadModel(config)).eval()
    set_head(critic)
    with torch.no_grad():
        padded, _ = critic(IDS[1:], MASK[1:], POSITIONS[1:])
        alone, _ = critic(IDS[1:, 2:], MASK[1:, 2:], POSITIONS[1:, 2:])
    assert POSITIONS[1].tolist() == [0, 0, 0, 1, 2]
    torch.testing.assert_close(padded[:, 2:], alone, rtol=1e-5, atol=1e-5)
