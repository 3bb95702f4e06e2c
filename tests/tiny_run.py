"""Overrides shared by the tests that run the RL loop: a 1-layer tiny model on one-digit sums."""

TINY_RUN = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64",
    "data.max_digits=1",
    "data.max_terms=2",
    "data.train_size=100",
    "data.test_size=10",
    "rollout.prompts_per_step=3",
    "rollout.samples_per_prompt=4",
    "rollout.max_new_tokens=10",
    "train.lr=1e-3",
]
