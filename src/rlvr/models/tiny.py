"""The tiny built-in model: a character-level tokenizer and a few-million-parameter Llama.

It is built offline (no hub access), so tests and `rlvr demo` run anywhere. The tokenizer is a
byte-free character vocabulary (printable ASCII plus newline) with the R1/ChatML tags as single
special tokens; the model is a standard `transformers` Llama causal LM, so everything that works
on it works on real Hugging Face checkpoints too.
"""

from __future__ import annotations

import string

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, EOS, UNK = "<|pad|>", "<|im_end|>", "<|unk|>"
ROLE_TAGS = ["<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TAGS = [*ROLE_TAGS, "<|im_start|>", "<think>", "</think>", "<answer>", "</answer>"]
# A compact chat template (one role token per turn): a character-level model pays for every
# character of boilerplate in every forward pass.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|im_end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per printable ASCII character or newline.

    Every character is its own token (a BPE with an empty merge list), so arithmetic is seen digit
    by digit. The chat and reasoning tags are single added tokens; pad and EOS are distinct ids.
    """
    chars = [*string.printable[:95], "\n"]
    specials = [PAD, EOS, UNK, *CHAT_TAGS]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, eos_token=EOS, unk_token=UNK
    )
    tokenizer.add_special_tokens({"additional_special_tokens": CHAT_TAGS})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 768,
    max_position_embeddings: int = 1024,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A randomly initialised Llama-architecture causal LM sized for a CPU (≈3M parameters)."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        rope_theta=10000.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model
