"""Prompt samplers: which problems each RL step sees, resumable from a saved position."""

from __future__ import annotations

import random


class EpochSampler:
    """Uniform sampling without replacement: a fresh seeded permutation every epoch.

    The state is two integers (epoch, position), so a resumed run draws exactly the prompts the
    uninterrupted run would have drawn.
    """

    def __init__(self, size: int, seed: int) -> None:
        if size <= 0:
            raise ValueError("the task has no training problems")
        self.size, self.seed = size, seed
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.size))
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

    def state_dict(self) -> dict[str, int]:
        """Position to save in a checkpoint."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a saved position."""
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation(self.epoch)
