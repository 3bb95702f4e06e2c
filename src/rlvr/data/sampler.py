"""Prompt samplers: which problems each RL step sees, resumable from a saved position.

`data.sampler` picks one: `epoch` (uniform, every problem once per epoch), `sequential` (the
task's own order every epoch: a curriculum file, TRL's `shuffle_dataset=False`, verl's
`data.shuffle=False`) or `prioritized` (Kimi k1.5: problems drawn by how often the policy
still fails them). The loop reports each
step's pass rates to the sampler (`observe`), DESIGN's "curriculum ◀── pass rates".
"""

from __future__ import annotations

import math
import random

import torch


class EpochSampler:
    """Uniform sampling without replacement: a fresh seeded permutation every epoch.

    The state is two integers (epoch, position), so a resumed run draws exactly the prompts the
    uninterrupted run would have drawn.
    """

    def __init__(self, size: int, seed: int, shuffle: bool = True) -> None:
        if size <= 0:
            raise ValueError("the task has no training problems")
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        """The epoch's order: seeded and shuffled, or the task's own (`shuffle` False)."""
        order = list(range(self.size))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self, count: int) -> list[int]:
        """The next `count` problem indices, crossing epoch boundaries as needed."""
        picked = []
        while len(picked) < count:
            if self.position == self.size:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            take = min(count - len(picked), self.size - self.position)
            picked.extend(self._order[self.position : self.position + take])
            self.position += take
        return picked

    def observe(self, indices: list[int], pass_rates: list[float]) -> None:
        """Uniform sampling does not use pass rates."""

    def stats(self) -> dict[str, float]:
        """No sampler metrics."""
        return {}

    def state_dict(self) -> dict[str, int]:
        """Position to save in a checkpoint."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a saved position."""
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation(self.epoch)


class PrioritizedSampler:
    """Kimi k1.5's prioritised sampling (Kimi Team 2025, §2.3.4): problem i is drawn with
    probability ∝ 1 − s_i, where s_i is its success rate, so the problems the policy fails get
    the most rollouts and the ones it always solves stop costing any.

    How this departs from the paper: s_i is the share of correct samples in the latest group of
    problem i (the paper does not say how it averages), and a problem not sampled yet has
    s_i = 0, so every problem is tried before any is deprioritised. `min_priority` keeps a floor
    under 1 − s_i (0, the paper's rule, never draws a problem solved every time again). The
    `count` problems of one draw are distinct (weighted sampling without replacement,
    Efraimidis & Spirakis 2006: the largest u^(1/w)); when fewer problems than that have a
    priority above 0, the rest are drawn uniformly from the others.

    The state (the measured rates and the generator's state) goes into checkpoints, so a
    resumed run draws what the uninterrupted one would have.
    """

    def __init__(self, size: int, seed: int, min_priority: float = 0.0) -> None:
        if size <= 0:
            raise ValueError("the task has no training problems")
        if not 0.0 <= min_priority <= 1.0:
            raise ValueError(f"min_priority must be in [0, 1], got {min_priority}")
        self.size, self.min_priority = size, min_priority
        self.pass_rates = torch.full((size,), float("nan"), dtype=torch.float64)
        """Latest measured pass rate of each problem; NaN until it is first drawn."""
        self._generator = torch.Generator().manual_seed(seed)

    def priorities(self) -> torch.Tensor:
        """max(1 − s_i, min_priority) of every problem, s_i = 0 for the unseen ones."""
        rates = torch.nan_to_num(self.pass_rates, nan=0.0)
        return (1.0 - rates).clamp(min=self.min_priority)

    def next(self, count: int) -> list[int]:
        """`count` problem indices, distinct up to `size` of them (a larger count takes a
        fresh draw for each further `size`, as epochs do)."""
        picked: list[int] = []
        while len(picked) < count:
            picked.extend(self._draw(min(count - len(picked), self.size)))
        return picked

    def _draw(self, count: int) -> list[int]:
        """`count` <= size distinct indices by priority, the rest uniformly (class docstring).
        One uniform u_i per problem: the largest log(u_i)/w_i (the order of u^(1/w)) among
        w_i > 0, then the smallest u_i among the others."""
        weights = self.priorities()
        u = torch.rand(self.size, generator=self._generator, dtype=torch.float64)
        positive = weights > 0
        keys = torch.where(positive, u.clamp(min=1e-300).log() / weights, -math.inf)
        picked = keys.topk(min(count, int(positive.sum()))).indices
        if len(picked) < count:
            others = (~positive).nonzero().flatten()
            rest = others[u[others].argsort()[: count - len(picked)]]
            picked = torch.cat([picked, rest])
        return picked.tolist()

    def observe(self, indices: list[int], pass_rates: list[float]) -> None:
        """Record the measured success rate of each drawn problem (its latest group's)."""
        if len(indices) != len(pass_rates):
            raise ValueError(f"{len(indices)} problems but {len(pass_rates)} pass rates")
        for index, rate in zip(indices, pass_rates):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"pass rate {rate} of problem {index} is outside [0, 1]")
        self.pass_rates[indices] = torch.tensor(pass_rates, dtype=torch.float64)

    def stats(self) -> dict[str, float]:
        """`sampler/seen`: share of problems sampled at least once; `sampler/solved`: share
        whose latest group was all correct."""
        seen = int((~self.pass_rates.isnan()).sum())
        solved = int((self.pass_rates == 1.0).sum())
        return {"sampler/seen": seen / self.size, "sampler/solved": solved / self.size}

    def state_dict(self) -> dict:
        """The measured rates and the generator state, for checkpoints."""
        return {"pass_rates": self.pass_rates.clone(), "rng": self._generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint."""
        self.pass_rates = state["pass_rates"].clone()
        self._generator.set_state(state["rng"])


PromptSampler = EpochSampler | PrioritizedSampler


def build_sampler(name: str, size: int, seed: int, min_priority: float = 0.0) -> PromptSampler:
    """The sampler `data.sampler` names."""
    if name in ("epoch", "sequential"):
        return EpochSampler(size, seed, shuffle=name == "epoch")
    if name == "prioritized":
        return PrioritizedSampler(size, seed, min_priority)
    raise ValueError(f"unknown data.sampler {name!r}; choose epoch, sequential or prioritized")
