"""Which mazes each step trains on: a seeded, resumable walk through shuffled epochs of the pool, or a curriculum."""

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

    def available(self, step: int) -> int:
        """How many mazes step `step` draws from: the whole pool, every step."""
        return self.n_rows

    def set_horizon(self, steps: int) -> None:
        """An epoch walk does not depend on where the run ends."""

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


class CurriculumSampler:
    """Easy mazes first: step s draws its mazes from the easiest part of the pool, which grows linearly from
    `start_fraction` of it at step 1 to all of it at step `horizon`. Easy is fewer optimal moves (then the smaller
    maze). Each step's draw depends only on (seed, step) and the horizon, so those are the whole state: resume
    neither skips nor repeats. A run that a deadline ends early moves the horizon to its last step
    (`set_horizon`), so it still reaches the whole pool."""

    def __init__(self, difficulty: list[tuple[int, int]], seed: int, start_fraction: float, horizon: int):
        if not difficulty:
            raise ValueError("the training split is empty")
        self.n_rows = len(difficulty)
        self.seed = seed
        self.start_fraction = start_fraction
        self.horizon = max(1, horizon)
        self.order = sorted(range(self.n_rows), key=lambda i: (difficulty[i], i))
        self.step = 0

    def available(self, step: int) -> int:
        """How many of the easiest mazes step `step` (1-based) may draw from."""
        grown = self.start_fraction + (1 - self.start_fraction) * min(1.0, (step - 1) / max(1, self.horizon - 1))
        return max(1, min(self.n_rows, round(grown * self.n_rows)))

    def set_horizon(self, steps: int) -> None:
        """The pool is whole at step `steps` (from the next step on)."""
        self.horizon = max(1, int(steps))

    def next(self, k: int) -> list[int]:
        self.step += 1
        n = self.available(self.step)
        rng = random.Random(derive_seed(self.seed, "curriculum", self.step))
        picks: list[int] = []
        while len(picks) < k:  # without replacement within a step, unless it wants more than are available
            picks += rng.sample(range(n), min(n, k - len(picks)))
        return [self.order[i] for i in picks]

    def state_dict(self) -> dict:
        return {"step": self.step, "n_rows": self.n_rows, "seed": self.seed, "start_fraction": self.start_fraction,
                "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        # not the horizon: a deadline may have moved it, and the run goes on with the one it had
        differs = [k for k in ("n_rows", "seed", "start_fraction") if state.get(k) != mine[k]]
        if differs:
            raise ValueError(f"sampler state is for {', '.join(f'{k} {state.get(k)}' for k in differs)}; this run has "
                             f"{', '.join(f'{k} {mine[k]}' for k in differs)}")
        self.step = int(state["step"])
        self.horizon = int(state.get("horizon", self.horizon))


def train_sampler(train_df, seed: int, curriculum_start: float | None, horizon: int):
    """The walk through the train split that GRPO's steps take: shuffled epochs, or a curriculum (easy first)."""
    if curriculum_start is None:
        return MazeSampler(len(train_df), seed)
    difficulty = list(zip(train_df["shortest_path_moves"].astype(int), (train_df["height"] * train_df["width"]).astype(int)))
    return CurriculumSampler(difficulty, seed, curriculum_start, horizon)
