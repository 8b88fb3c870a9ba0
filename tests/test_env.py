import numpy as np
import pytest

from mazerl.envs.actions import parse_action
from mazerl.envs.maze_env import FEEDBACK_INVALID, FEEDBACK_OK, FEEDBACK_WALL, EnvConfig, MazeEnv, MazeEnvBatch, MazeTask
from mazerl.mazes.layout import MOVES, Maze
from mazerl.mazes.render import render_rgb
from mazerl.mazes.sampling import sample_maze
from mazerl.mazes.solver import solve

from test_mazes_solver_hash_render import HAND, HAND_MAZE


def act(a: str) -> str:
    return f"I think so. <action>{a}</action>"


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("<action>up</action>", "up"),
        ("<ACTION>Left</ACTION>", "left"),
        ("first <action>left</action>, no: <action>down</action>", "down"),
        ("<action> stop </action>", "stop"),
        ("<action>up</action> and some trailing words", "up"),
        ("<action>left</action><action>jump</action>", None),  # the last tag counts, and it is invalid
        ("<action>north</action>", None),
        ("move up", None),
        ("", None),
        (None, None),
        ("x" * 10_000, None),
        ("x" * 10_000 + "<action>right</action>", "right"),
        ("('move', 2)", "left"),
        (("move", 3), "down"),
        (("stop", "stop"), "stop"),
        ("('move', 9)", None),
        ("<action>up</action> then ('move', 0)", "right"),
    ],
)
def test_parse_action(reply, expected):
    assert parse_action(reply) == expected


def test_solving_a_maze_earns_the_reward():
    m = sample_maze("wilson", (4, 4), 3)
    env = MazeEnv(m)
    env.reset()
    for move in solve(m.grid, m.start, m.goal):
        out = env.step(act(move))
        assert out.reward == 0.0 and not out.done and out.observation.feedback == FEEDBACK_OK
    out = env.step(act("stop"))
    assert out.done and out.reward == 1.0
    st = env.stats
    assert st.success and not st.premature_stop and not st.timeout and not st.loop
    assert st.spl == 1.0 and st.moves == st.optimal_moves
    assert np.array_equal(env.render(), render_rgb(m.grid, m.goal, m.goal))


def test_wall_bumps_and_parse_failures_use_a_turn_and_change_nothing():
    env = MazeEnv(HAND_MAZE)
    first = env.reset().image.copy()
    out = env.step(act("up"))
    assert out.observation.feedback == FEEDBACK_WALL and out.observation.position == (1, 1)
    out = env.step("I will go up")
    assert out.observation.feedback == FEEDBACK_INVALID and "<action>ACTION</action>" in FEEDBACK_INVALID
    assert np.array_equal(out.observation.image, first)
    st = env.stats
    assert (st.turns, st.wall_bumps, st.parse_failures, st.moves) == (2, 1, 1, 0)
    assert st.actions == ["up", "invalid"]


def test_observation_image_is_read_only():
    env = MazeEnv(HAND_MAZE)
    obs = env.reset()
    with pytest.raises(ValueError):
        obs.image[0, 0] = 0


def test_premature_stop_and_timeout():
    env = MazeEnv(HAND_MAZE)
    env.reset()
    out = env.step(act("stop"))
    assert out.done and out.reward == 0.0 and env.stats.premature_stop and not env.stats.timeout
    with pytest.raises(RuntimeError, match="reset"):
        env.step(act("up"))

    env = MazeEnv(HAND_MAZE, EnvConfig(max_turns=3))
    env.reset()
    results = [env.step(act("right")) for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert env.stats.timeout and not env.stats.premature_stop and not env.stats.success


def test_an_episode_ends_once_the_goal_is_out_of_reach_only_when_asked():
    m = sample_maze("wilson", (4, 4), 3)
    route = solve(m.grid, m.start, m.goal)
    budget = len(route) + 2  # the route, `stop`, one turn to spare
    wall = next(name for name, (dr, dc) in MOVES.items() if m.grid[m.start[0] + dr, m.start[1] + dc])

    def play(moves, **cfg):
        env = MazeEnv(m, EnvConfig(max_turns=budget, **cfg))
        env.reset()
        done = [env.step(act(mv)).done for mv in moves]
        return env, done

    # one bump uses the spare turn: the goal is still in reach (route + stop fit exactly)
    env, done = play([wall, *route, "stop"], end_when_out_of_reach=True)
    assert env.stats.success and done == [False] * (len(route) + 1) + [True]
    # a second bump puts it out of reach: the episode ends there, a timeout, not a success
    env, done = play([wall, wall], end_when_out_of_reach=True)
    assert done == [False, True] and env.stats.timeout and not env.stats.success and env.stats.turns == 2
    # off by default: the same two bumps leave the episode running
    env, done = play([wall, wall])
    assert done == [False, False] and not env.done
    # when arrival ends the episode, `stop` is not needed: two bumps still leave it in reach
    env, done = play([wall, wall], end_when_out_of_reach=True, terminate_on_goal=True)
    assert done == [False, False]


def test_loop_by_oscillation_and_by_triple_visit():
    env = MazeEnv(HAND_MAZE)
    env.reset()
    for a in ["right", "left"]:
        env.step(act(a))
    assert not env.stats.loop
    env.step(act("up"))  # a bump is not a move: it neither makes nor breaks an oscillation
    env.step(act("right"))  # positions (1,1) (1,2) (1,1) (1,2): A-B-A-B
    assert env.stats.oscillation and env.stats.loop
    assert env.stats.revisits == 2 and env.stats.revisit_rate == pytest.approx(2 / 3)

    env = MazeEnv(HAND_MAZE)
    env.reset()
    for a in ["right", "right", "left", "left", "down", "up"]:  # (1,1) visited 3 times, no A-B-A-B
        env.step(act(a))
    assert env.stats.max_visits == 3 and not env.stats.oscillation and env.stats.loop


def test_dead_end_entry_and_recovery():
    env = MazeEnv(HAND_MAZE, EnvConfig(max_turns=30))
    env.reset()
    for a in ["down", "down", "down", "up", "left", "up", "up"]:  # into pocket 1, bump, back out
        env.step(act(a))
    st = env.stats
    assert st.dead_end_entries == 1 and st.recovery_turns == [6]
    for a in ["right", "right", "right", "right", "down", "down", "left"]:  # into pocket 2 and stay
        env.step(act(a))
    env.step(act("stop"))
    st = env.stats
    assert st.dead_end_entries == 2 and st.recovery_turns == [6] and st.unrecovered_dead_end
    assert st.premature_stop


def test_shaping_terms_are_off_by_default_and_applied_when_set():
    cfg = EnvConfig(step_penalty=0.01, wall_bump_penalty=0.1, format_bonus=0.05, terminate_on_goal=True)
    env = MazeEnv(HAND_MAZE, cfg)
    env.reset()
    assert env.step(act("up")).reward == pytest.approx(0.05 - 0.1 - 0.01)
    assert env.step("nothing").reward == pytest.approx(-0.01)
    rewards = [env.step(act(m)).reward for m in solve(HAND, (1, 1), (5, 5))]
    assert rewards[-1] == pytest.approx(1.0 + 0.05 - 0.01)
    assert env.done and env.stats.success and not env.stats.stopped


def test_stop_off_goal_penalty_applies_only_off_the_goal():
    cfg = EnvConfig(progress_reward=0.1, stop_off_goal_penalty=0.2, max_turns=30)
    env = MazeEnv(HAND_MAZE, cfg)
    env.reset()
    assert env.step(act("stop")).reward == pytest.approx(-0.2)  # a lost episode, worse than a step away
    assert env.done and env.stats.premature_stop
    env = MazeEnv(HAND_MAZE, cfg)
    env.reset()
    total = sum(env.step(act(m)).reward for m in solve(HAND, (1, 1), (5, 5)) + ["stop"])
    assert total == pytest.approx(1.0 + 0.1 * 8) and env.stats.success  # on the goal: no penalty


def test_progress_reward_is_potential_based():
    env = MazeEnv(HAND_MAZE, EnvConfig(progress_reward=0.1, max_turns=30))
    env.reset()
    assert env.step(act("right")).reward == pytest.approx(0.1)  # one square closer
    assert env.step(act("left")).reward == pytest.approx(-0.1)  # and back: the sum is zero
    assert env.step(act("up")).reward == 0.0  # a bump does not move
    total = sum(env.step(act(m)).reward for m in solve(HAND, (1, 1), (5, 5)) + ["stop"])
    assert total == pytest.approx(1.0 + 0.1 * 8)


def test_batch_steps_only_unfinished_episodes():
    tasks = [MazeTask.build(sample_maze("wilson", (4, 4), s)) for s in range(3)] + [MazeTask.build(HAND_MAZE)]
    batch = MazeEnvBatch(tasks, EnvConfig(max_turns=5))
    obs = batch.reset()
    assert len(obs) == 4 and obs[3].image.shape == (175, 175, 3)
    results = batch.step([act("stop"), act("up"), "garbage", act("right")])
    assert results[0].done and not results[1].done
    results = batch.step([act("up")] * 4)
    assert results[0] is None and results[1] is not None
    with pytest.raises(ValueError, match="replies"):
        batch.step([act("up")])
    while not batch.all_done:
        batch.step([act("down")] * 4)
    assert [s.turns for s in batch.stats()] == [1, 5, 5, 5]


def test_heterogeneous_task_shares_precomputation_across_episodes():
    task = MazeTask.build(HAND_MAZE)
    a, b = MazeEnv(task), MazeEnv(task)
    a.reset()
    b.reset()
    a.step(act("right"))
    assert a.position == (1, 2) and b.position == (1, 1)
    assert not np.array_equal(a.render(), b.render())


def test_unreachable_goal_is_rejected():
    grid = HAND.copy()
    grid[4, 5] = 1
    grid[2, 5] = 1
    with pytest.raises(ValueError, match="cannot reach"):
        MazeTask.build(Maze(grid=grid, start=(1, 1), goal=(5, 5)))


def test_revisit_penalty_charges_each_move_onto_a_square_already_visited():
    env = MazeEnv(HAND_MAZE, EnvConfig(revisit_penalty=0.05, max_turns=30))
    env.reset()
    rewards = [env.step(act(a)).reward for a in ["right", "left", "right", "up"]]  # (1,2) (1,1)* (1,2)* bump
    assert rewards == pytest.approx([0.0, -0.05, -0.05, 0.0])
    assert env.stats.revisits == 2
    env = MazeEnv(HAND_MAZE)  # off by default
    env.reset()
    assert [env.step(act(a)).reward for a in ["right", "left"]] == [0.0, 0.0]


def test_dead_end_exit_bonus_is_paid_once_per_pocket_left():
    env = MazeEnv(HAND_MAZE, EnvConfig(dead_end_exit_bonus=0.3, max_turns=30))
    env.reset()
    rewards = [env.step(act(a)).reward for a in ["down", "down", "down", "up", "left", "up", "up"]]  # into pocket 1, out
    assert env.stats.recovery_turns == [6]
    assert sum(rewards) == pytest.approx(0.3) and rewards.count(0.3) == 1


def test_loop_penalty_charges_the_moves_that_make_a_loop_and_nothing_before():
    env = MazeEnv(HAND_MAZE, EnvConfig(loop_penalty=0.2, max_turns=30))
    env.reset()
    # start (1,1), then (1,2) (1,1): a revisit, no loop yet; back to (1,2) completes A-B-A-B
    rewards = [env.step(act(a)).reward for a in ["right", "left", "right", "up"]]
    assert rewards == pytest.approx([0.0, 0.0, -0.2, 0.0])  # the bump (up) is no move and costs nothing
    assert env.stats.loop and env.stats.loop_closures == 1
    # (1,1) a third time, and a bounce again: one closure, charged once
    assert env.step(act("left")).reward == pytest.approx(-0.2) and env.stats.loop_closures == 2
    env = MazeEnv(HAND_MAZE)  # off by default
    env.reset()
    assert [env.step(act(a)).reward for a in ["right", "left", "right", "left"]] == [0.0] * 4
