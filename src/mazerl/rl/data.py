"""Which mazes each step trains on: a seeded, resumable walk through shuffled epochs of the pool."""

from __future__ import annotations

import random

from ..mazes.seeding import derive_seed


class MazeSampler:
    """Yields row indices without replacement within an epoch; epoch e's order depends only on
    (seed, e), so the position (epoch, offset) is the whole state: resume neither skips nor repeats."""

    def __init__(self, n_rows: int, seed: int):
        if n_rows < 1:
            raise ValueError("the training split is empty")
        self.n_rows = n_rows
        self.seed = seed
        self.epoch = 0
        self.offset = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.n_rows))
        random.Random(derive_seed(self.seed, "epoch", epoch)).shuffle(order)
        return order

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.offset == self.n_rows:
                self.epoch += 1
                self.offset = 0
                self._order = self._permutation(self.epoch)
            take = min(k - len(out), self.n_rows - self.offset)
            out += self._order[self.offset : self.offset + take]
            self.offset += take
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "n_rows": self.n_rows, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["n_rows"] != self.n_rows or state["seed"] != self.seed:
            raise ValueError(
                f"sampler state is for {state['n_rows']} rows / seed {state['seed']}, this run has {self.n_rows} / {self.seed}"
            )
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self._order = self._permutation(self.epoch)
