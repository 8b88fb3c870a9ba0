import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.envs.maze_env import EnvConfig, MazeEnv
from mazerl.evaluation.compare import compare
from mazerl.evaluation.episodes import episode_row, failure_category
from mazerl.evaluation.floor import random_agent_success
from mazerl.evaluation.runner import EvalConfig, evaluate
from mazerl.evaluation.stats import mcnemar_exact, paired_comparison, wilson_interval
from mazerl.mazes.dataset_io import read_split, records, row_to_maze, write_split
from mazerl.mazes.layout import MazeError
from mazerl.mazes.splits import generate_dataset, preset

from test_mazes_solver_hash_render import HAND_MAZE

runner = CliRunner()


@pytest.fixture(scope="module")
def suite(tmp_path_factory, visgym_fixture):
    out = tmp_path_factory.mktemp("suite") / "mazes"
    generate_dataset(preset("smoke"), out, visgym_fixture)
    return out


def eval_splits(suite):
    return [str(p) for p in sorted(suite.glob("*.parquet")) if p.stem != "train"]


def play(actions, max_turns=18):
    env = MazeEnv(HAND_MAZE, EnvConfig(max_turns=max_turns))
    env.reset()
    for a in actions:
        if env.done:
            break
        env.step(f"<action>{a}</action>" if a != "garbage" else "no idea")
    return env.stats


def test_failure_categories_of_hand_built_episodes():
    assert failure_category(play(["right"] * 4 + ["down"] * 4 + ["stop"])) is None
    assert failure_category(play(["garbage"] * 3 + ["stop"])) == "format_error"
    assert failure_category(play(["right", "left"] * 9)) == "timeout_with_loop"
    assert failure_category(play(["down"] * 4 + ["right"] * 2 + ["up", "up", "up", "up"] + ["left"] * 8)) == "timeout_without_loop"
    assert failure_category(play(["up", "up", "up", "stop"])) == "repeated_wall_bumps"
    assert failure_category(play(["right", "stop"])) == "premature_stop"


def test_episode_row_records_the_dead_end_excursion():
    st = play(["down", "down", "down", "up", "up", "up", "right", "right", "right", "right", "down", "down", "down", "down", "stop"])
    maze = {"maze_id": "hand", "split": "t", "height": 7, "width": 7, "algorithm": "hand", "forks_on_solution": 2,
            "dead_ends_next_to_solution": 2, "shortest_path_moves": 8, "layout_hash": "abc", "start": [1, 1], "goal": [5, 5]}
    row = episode_row(maze, st, policy="test", sample=0, greedy=True)
    assert (row["layout_hash"], row["start"], row["goal"]) == ("abc", [1, 1], [5, 5])
    assert row["success"] and row["dead_end_entries"] == 1 and row["dead_end_recovery_turns"] == [5]
    assert row["steps_over_optimal"] == pytest.approx(14 / 8) and row["spl"] == pytest.approx(8 / 14)
    assert row["failure_category"] is None and not row["loop"]


def test_wilson_and_mcnemar_known_values():
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(1, 10) == pytest.approx((0.0179, 0.4042), abs=1e-4)
    assert wilson_interval(28, 64) == pytest.approx((0.3229, 0.5591), abs=1e-4)
    assert mcnemar_exact(2, 10) == pytest.approx(0.03857, abs=1e-5)
    assert mcnemar_exact(5, 5) == 1.0 and mcnemar_exact(0, 0) == 1.0
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_paired_comparison_properties():
    base = [True] * 20 + [False] * 30
    new = [True] * 18 + [False] * 2 + [True] * 15 + [False] * 15
    pc = paired_comparison(base, new)
    assert pc.diff == pytest.approx(0.26) and pc.only_base == 2 and pc.only_new == 15
    assert pc.diff_low < pc.diff < pc.diff_high and pc.diff_low > 0
    rev = paired_comparison(new, base)
    assert rev.diff_low == pytest.approx(-pc.diff_high) and rev.diff_high == pytest.approx(-pc.diff_low)
    assert pc.p_value == pytest.approx(mcnemar_exact(2, 15))


def test_oracle_is_perfect_on_every_split(suite, tmp_path):
    summary = evaluate(EvalConfig(policy="oracle", data=eval_splits(suite), out=str(tmp_path / "oracle")))
    assert set(summary["splits"]) == {"heldout", "larger", "algorithm-shift", "visual-shift", "visgym-easy-64", "visgym-hard-64"}
    for split, entry in summary["splits"].items():
        g = entry["greedy"]
        assert g["success"] == 1.0 and g["spl"] == pytest.approx(1.0) and g["loop_rate"] == 0.0, split
        assert g["steps_over_optimal"] == pytest.approx(1.0) and g["dead_end_entries_per_episode"] == 0
    html = (tmp_path / "oracle" / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 5
    assert (tmp_path / "oracle" / "report.md").read_text().count("](report_files/") >= 4


def test_random_agent_lands_on_its_exact_floor(suite, tmp_path):
    path = suite / "heldout.parquet"
    df = read_split(path)
    expected = np.mean([random_agent_success(row_to_maze(r), int(r.max_turns)) for _, r in df.iterrows()])
    summary = evaluate(EvalConfig(policy="random", data=[str(path)], out=str(tmp_path / "random"), samples=15))
    episodes = pd.read_parquet(tmp_path / "random" / "episodes.parquet")
    observed = episodes.success.mean()
    se = (expected * (1 - expected) / len(episodes)) ** 0.5
    assert abs(observed - expected) < 4 * se + 1e-3, (observed, expected)
    assert 0 < expected < 0.05
    assert summary["splits"]["heldout"]["sampled"]["k"] == 15


def test_floor_dynamic_programme_on_a_trivial_maze():
    # Start on the goal: stop at once with prob 1/(k+1), else wander; one turn -> exactly 1/(k+1).
    from mazerl.mazes.layout import Maze

    m = Maze(grid=HAND_MAZE.grid, start=(5, 5), goal=(5, 5))
    assert random_agent_success(m, 1) == pytest.approx(1 / 2)  # one legal move (up) and stop


def test_compare_and_its_errors(suite, tmp_path):
    data = [str(suite / "heldout.parquet")]
    evaluate(EvalConfig(policy="oracle", data=data, out=str(tmp_path / "a")))
    evaluate(EvalConfig(policy="random", data=data, out=str(tmp_path / "b")))
    result = compare(tmp_path / "b", tmp_path / "a")
    c = result["splits"]["heldout"]
    assert c["success_new"] == 1.0 and c["success_diff"] > 0.9 and c["mcnemar_p"] < 1e-6
    cli = runner.invoke(app, ["eval", "compare", str(tmp_path / "b"), str(tmp_path / "a")])
    assert cli.exit_code == 0, cli.output
    assert "heldout" in cli.output and (tmp_path / "a" / "compare.html").exists()
    assert json.loads((tmp_path / "a" / "comparison.json").read_text())["splits"]["heldout"]["mazes"] == c["mazes"]
    # a different maze set cannot be paired
    rows = records(read_split(suite / "heldout.parquet"))[:10]
    write_split(rows, tmp_path / "heldout.parquet")
    evaluate(EvalConfig(policy="oracle", data=[str(tmp_path / "heldout.parquet")], out=str(tmp_path / "c")))
    with pytest.raises(MazeError, match="different mazes"):
        compare(tmp_path / "a", tmp_path / "c")


def test_bad_inputs_leave_no_partial_output(suite, tmp_path, tiny_model_dir):
    write_split([], tmp_path / "empty.parquet")
    with pytest.raises(MazeError, match="empty"):
        evaluate(EvalConfig(policy="oracle", data=[str(tmp_path / "empty.parquet")], out=str(tmp_path / "o1")))
    assert not (tmp_path / "o1").exists()
    result = runner.invoke(app, ["eval", "--policy", "model", "--data", str(suite / "heldout.parquet"), "--out", str(tmp_path / "o2")])
    assert result.exit_code == 2 and "--model" in result.output
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "noproc")
    (tmp_path / "noproc" / "processor_config.json").unlink(missing_ok=True)
    (tmp_path / "noproc" / "preprocessor_config.json").unlink(missing_ok=True)
    result = runner.invoke(app, ["eval", "--model", str(tmp_path / "noproc"), "--data", str(suite / "heldout.parquet"), "--out", str(tmp_path / "o3")])
    assert result.exit_code == 2 and "no processor" in result.output
    assert not (tmp_path / "o3").exists()


def test_model_evaluation_through_the_cli(suite, tmp_path, tiny_model_dir):
    rows = records(read_split(suite / "heldout.parquet"))[:6]
    write_split(rows, tmp_path / "heldout.parquet")
    result = runner.invoke(app, ["eval", "--model", str(tiny_model_dir), "--data", str(tmp_path / "heldout.parquet"),
                                 "--out", str(tmp_path / "ev"), "--samples", "2", "--max-new-tokens", "4", "--max-turns", "3"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == f"report: {tmp_path / 'ev' / 'report.html'}"
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert summary["splits"]["heldout"]["greedy"]["episodes"] == 6
    assert summary["splits"]["heldout"]["sampled"]["k"] == 2
    episodes = pd.read_parquet(tmp_path / "ev" / "episodes.parquet")
    assert len(episodes) == 18 and set(episodes.turns) == {3}


def test_a_users_table_needs_only_id_grid_start_goal(suite, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    full = read_split(suite / "heldout.parquet").head(8)
    mine = [{"maze_id": r["maze_id"], "grid": r["grid"], "start": r["start"], "goal": r["goal"], "my_note": "kept out"}
            for r in records(full)]
    pq.write_table(pa.Table.from_pylist(mine), tmp_path / "mine.parquet")
    derived = read_split(tmp_path / "mine.parquet")
    for col in ("shortest_path_moves", "layout_hash", "walls_hash", "forks_on_solution", "dead_ends_next_to_solution"):
        assert list(derived[col]) == list(full[col]), col
    assert set(derived.split) == {"mine"} and set(derived.square_px) == {25} and set(derived.palette) == {"visgym"}
    assert list(derived.max_turns) == [max(2 * m, m + 10) for m in full.shortest_path_moves]
    result = runner.invoke(app, ["eval", "--policy", "oracle", "--data", str(tmp_path / "mine.parquet"), "--out", str(tmp_path / "ev")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert summary["splits"]["mine"]["greedy"]["success"] == 1.0 and summary["splits"]["mine"]["greedy"]["episodes"] == 8


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.update(goal=r["start"]), "start and goal are the same square"),
    (lambda r: r.update(grid=[row[:-1] if i == 2 else row for i, row in enumerate(r["grid"])]), "rectangular"),
    (lambda r: r.update(grid=[[2 if v else 0 for v in row] for row in r["grid"]]), "0 \\(floor\\) or 1 \\(wall\\)"),
    (lambda r: r.update(start=[0, 0]), "start \\(0, 0\\) is on a wall"),
    (lambda r: r.update(start=[1]), "start must be \\[row, col\\]"),
])
def test_a_users_table_with_a_broken_row_is_refused_naming_the_row(suite, tmp_path, edit, message):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"maze_id": r["maze_id"], "grid": r["grid"], "start": r["start"], "goal": r["goal"]}
            for r in records(read_split(suite / "heldout.parquet").head(3))]
    edit(rows[1])
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    with pytest.raises(MazeError, match=f"row 1 \\(maze_id '{rows[1]['maze_id']}'\\).*{message}"):
        read_split(tmp_path / "bad.parquet")


def test_unreachable_goal_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    grid = [[1] * 7, [1, 0, 1, 0, 0, 0, 1], [1, 0, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0, 1], [1] * 7]
    pq.write_table(pa.Table.from_pylist([{"maze_id": "walled", "grid": grid, "start": [3, 1], "goal": [1, 5]}]), tmp_path / "u.parquet")
    with pytest.raises(MazeError, match="row 0 .*cannot be reached"):
        read_split(tmp_path / "u.parquet")


def test_the_training_panel_shows_reward_success_parse_failures_and_entropy(tmp_path):
    from mazerl.evaluation.report import TRAINING_PANELS, _curve

    keys = {key for _, series in TRAINING_PANELS for key, _ in series}
    assert {"success_rate", "eval/success", "reward_mean", "parse_failure_rate", "entropy"} <= keys
    log = [{"step": s, "success_rate": 0.0, "reward_mean": 0.01 * s, "parse_failure_rate": 0.9 - 0.1 * s, "entropy": 4.0}
           for s in range(1, 6)]
    assert _curve(log)[:8] == b"\x89PNG\r\n\x1a\n"
    assert _curve([{"step": 1}]) is None
