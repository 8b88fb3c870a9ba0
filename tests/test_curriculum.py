"""The curriculum sampler: easy mazes first, the whole pool by the last step, resumable from its step alone."""

import pandas as pd
import pytest

from mazerl.config import load_config
from mazerl.rl.config import GRPOConfig
from mazerl.rl.data import CurriculumSampler, MazeSampler, train_sampler


def pool(n: int = 40) -> pd.DataFrame:
    # optimal moves 40, 39, ..., 1: the easiest rows are the last ones
    return pd.DataFrame({"shortest_path_moves": list(range(n, 0, -1)), "height": [9] * n, "width": [9] * n})


def test_early_steps_draw_only_the_easiest_and_the_last_step_the_whole_pool():
    df = pool()
    s = train_sampler(df, seed=3, curriculum_start=0.25, horizon=10)
    assert isinstance(s, CurriculumSampler)
    first = s.next(8)
    assert len(set(first)) == 8 and all(df.shortest_path_moves[i] <= 10 for i in first)  # the easiest quarter
    assert s.available(1) == 10 and s.available(10) == 40
    sizes = [s.available(k) for k in range(1, 11)]
    assert sizes == sorted(sizes)  # it only grows
    drawn = set()
    for _ in range(200):
        s.step = 9
        drawn.update(s.next(8))
    assert max(df.shortest_path_moves[i] for i in drawn) > 30  # the hardest mazes come in at the end


def test_ties_in_moves_put_the_smaller_maze_first():
    df = pd.DataFrame({"shortest_path_moves": [16, 16], "height": [11, 9], "width": [11, 9]})
    assert train_sampler(df, 0, 0.5, 4).order == [1, 0]


def test_resume_repeats_nothing_and_skips_nothing():
    a = CurriculumSampler([(m, 81) for m in range(30)], seed=1, start_fraction=0.2, horizon=6)
    whole = [a.next(5) for _ in range(6)]
    b = CurriculumSampler([(m, 81) for m in range(30)], seed=1, start_fraction=0.2, horizon=6)
    b.next(5), b.next(5)
    state = b.state_dict()
    c = CurriculumSampler([(m, 81) for m in range(30)], seed=1, start_fraction=0.2, horizon=6)
    c.load_state_dict(state)
    assert [c.next(5) for _ in range(4)] == whole[2:]


def test_a_state_from_another_curriculum_is_refused():
    a = CurriculumSampler([(m, 81) for m in range(30)], seed=1, start_fraction=0.2, horizon=6)
    b = CurriculumSampler([(m, 81) for m in range(30)], seed=1, start_fraction=0.5, horizon=6)
    with pytest.raises(ValueError, match="start_fraction 0.2.*start_fraction 0.5"):
        b.load_state_dict(a.state_dict())


def test_more_mazes_a_step_than_are_available_repeats_rather_than_fails():
    s = CurriculumSampler([(m, 81) for m in range(10)], seed=0, start_fraction=0.2, horizon=5)
    rows = s.next(5)  # 2 available
    assert len(rows) == 5 and set(rows) <= set(s.order[:2])


def test_off_by_default_and_bounded():
    assert isinstance(train_sampler(pool(), 0, None, 10), MazeSampler)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(Exception, match="curriculum_start"):
            load_config(GRPOConfig, "tiny-grpo", {"curriculum_start": bad})


def test_the_trainer_walks_its_pool_easy_first_when_asked(tiny_model_dir, small_mazes, tmp_path):
    """Both trainers take their sampler from train_sampler; the in-process one is checked here end to end: its
    first step's mazes are among the quarter of the pool with the fewest optimal moves, and a checkpoint keeps
    the curriculum's place."""
    from mazerl.rl.trainer import GRPOTrainer

    cfg = GRPOConfig.model_validate({
        "policy": {"model": str(tiny_model_dir), "history": {"turns": 0, "images": 1}, "max_new_tokens": 4},
        "train_data": str(small_mazes / "train.parquet"), "output_dir": str(tmp_path / "run"), "steps": 8,
        "mazes_per_step": 4, "group_size": 2, "eval_every": 0, "curriculum_start": 0.25})
    trainer = GRPOTrainer(cfg)
    moves = trainer.train_df.shortest_path_moves
    quarter = sorted(moves)[len(moves) // 4 - 1]
    assert all(moves.iloc[i] <= quarter for i in trainer.sampler.next(4))
    trainer.step = 1
    trainer.save_checkpoint()
    again = GRPOTrainer(cfg)
    assert again.resume("auto") == 1 and again.sampler.step == 1
    assert again.sampler.next(4) == trainer.sampler.next(4)


def test_a_moved_horizon_reaches_the_whole_pool_at_the_new_end_and_survives_a_resume():
    a = CurriculumSampler([(m, 81) for m in range(40)], seed=1, start_fraction=0.25, horizon=100)
    a.next(4)
    assert a.available(10) < 20  # ten steps into a hundred-step curriculum
    a.set_horizon(10)  # a deadline says the run ends at step 10
    assert a.available(10) == 40 and a.available(2) < a.available(9) < 40
    b = CurriculumSampler([(m, 81) for m in range(40)], seed=1, start_fraction=0.25, horizon=100)
    b.load_state_dict(a.state_dict())  # the run resumes with the horizon it had, not its config's steps
    assert b.horizon == 10 and b.next(4) == a.next(4)
