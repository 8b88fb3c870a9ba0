import json

import pandas as pd
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from mazerl.mazes.dataset_io import COLUMNS, read_split, row_render_options, row_to_maze, table_content_hash
from mazerl.mazes.layout import MazeError
from mazerl.mazes.splits import DatasetConfig, SplitSpec, generate_dataset, preset
from mazerl.mazes.solver import solve


def small_config(**overrides) -> DatasetConfig:
    cfg = {
        "splits": {
            "heldout": {"count": 40, "max_turns": 18},
            "larger": {"count": 10, "sizes": ["5x5", "6x6"]},
            "algorithm-shift": {"count": 8, "algorithms": ["dfs", "kruskal", "prim", "braided"]},
            "visual-shift": {"count": 12, "derived_from": "heldout", "render": [{"palette": "inverted"}, {"wall_style": "thin"}]},
            "train": {"count": 60},
        }
    }
    cfg.update(overrides)
    return DatasetConfig.model_validate(cfg)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, visgym_fixture):
    out = tmp_path_factory.mktemp("ds") / "mazes"
    manifest = generate_dataset(small_config(), out, visgym_fixture)
    return out, manifest


def test_every_split_is_written_with_the_schema(dataset):
    out, manifest = dataset
    assert set(manifest["splits"]) == {"visgym-easy-64", "visgym-hard-64", "heldout", "larger", "algorithm-shift", "visual-shift", "train"}
    counts = {n: m["rows"] for n, m in manifest["splits"].items()}
    assert counts == {"visgym-easy-64": 64, "visgym-hard-64": 64, "heldout": 40, "larger": 20, "algorithm-shift": 32, "visual-shift": 12, "train": 60}
    for name, info in manifest["splits"].items():
        df = read_split(out / info["file"])
        assert list(df.columns) == list(COLUMNS)
        assert len(df) == info["rows"] and (df.split == name).all()
        assert table_content_hash(df) == info["content_hash"], "manifest hash matches the file's content"
        assert df.maze_id.is_unique
    assert json.loads((out / "manifest.json").read_text()) == manifest


def test_rows_are_consistent_mazes(dataset):
    out, _ = dataset
    df = pd.concat([read_split(p) for p in out.glob("*.parquet")])
    for _, row in df.sample(60, random_state=0).iterrows():
        maze = row_to_maze(row)
        assert (maze.height, maze.width) == (row.height, row.width)
        assert len(solve(maze.grid, maze.start, maze.goal)) == row.shortest_path_moves
        row_render_options(row)  # valid options


def test_no_layout_in_two_splits_except_derived(dataset):
    out, _ = dataset
    owners: dict[str, str] = {}
    for path in out.glob("*.parquet"):
        df = read_split(path)
        if path.stem == "visual-shift":
            heldout = set(read_split(out / "heldout.parquet").walls_hash)
            assert set(df.walls_hash) <= heldout and (df.source_split == "heldout").all()
            continue
        if not path.stem.startswith("visgym-"):
            assert df.walls_hash.is_unique, f"{path.stem} repeats a layout"
        for h in set(df.walls_hash):
            assert owners.setdefault(h, path.stem) == path.stem, f"layout in {owners[h]} and {path.stem}"


def test_reference_split_is_the_fixture_in_seed_order(dataset, visgym_fixture):
    out, _ = dataset
    df = read_split(out / "visgym-easy-64.parquet")
    episodes = [e for e in json.loads(visgym_fixture.read_text())["episodes"] if e["env_id"] == "maze_2d/easy"]
    assert list(df.seed) == sorted(e["seed"] for e in episodes)
    first = min(episodes, key=lambda e: e["seed"])
    assert [list(r) for r in df.iloc[0].grid] == first["maze_map"]
    assert list(df.iloc[0].start) == first["agent"] and (df.max_turns == 18).all()


def test_split_turn_budgets(dataset):
    out, _ = dataset
    larger = read_split(out / "larger.parquet")
    assert (larger.max_turns == [max(2 * o, o + 10) for o in larger.shortest_path_moves]).all()
    assert (read_split(out / "heldout.parquet").max_turns == 18).all()


def test_a_budget_per_size_keeps_each_size_to_its_own(tmp_path):
    """A pool of two sizes: 18 turns at VisGym-easy size, the default rule at 5x5 (a single 18 would keep only the
    5x5 mazes whose route is the shortest possible, 16 moves)."""
    cfg = small_config(splits={"train": {"count": 30, "sizes": ["visgym-easy", "5x5"], "max_turns": {"4x4": 18}}})
    generate_dataset(cfg, tmp_path / "m")
    df = read_split(tmp_path / "m" / "train.parquet")
    easy, hard = df[df.height == 9], df[df.height == 11]
    assert len(easy) == len(hard) == 30
    assert (easy.max_turns == 18).all()
    assert (hard.max_turns == [max(2 * o, o + 10) for o in hard.shortest_path_moves]).all()
    assert hard.shortest_path_moves.max() > 17  # not filtered down to what 18 turns allow


@pytest.mark.parametrize("budget, named", [({"6x6": 20}, "6x6"), ({"4x4": 1}, "2 or more"), ({"huge": 20}, "huge")])
def test_a_bad_budget_per_size_is_named(budget, named):
    with pytest.raises(ValidationError, match=named):
        SplitSpec(count=3, sizes=["4x4", "5x5"], max_turns=budget)

def test_a_count_per_size_weights_the_pool_and_keeps_each_sizes_first_mazes(tmp_path):
    """{'4x4': 30, '5x5': 6}: 30 of one size and 6 of the other, and the very mazes the first 6 of an even pool of
    that size are (a pool cut down by size is the same pool, so runs on the two compare maze for maze)."""
    even = small_config(splits={"heldout": {"count": 20}, "train": {"count": 30, "sizes": ["visgym-easy", "visgym-hard"],
                                                                    "max_turns": {"4x4": 18}}})
    weighted = small_config(splits={"heldout": {"count": 20}, "train": {"count": {"visgym-easy": 30, "5x5": 6},
                                                                        "sizes": ["visgym-easy", "visgym-hard"],
                                                                        "max_turns": {"4x4": 18}}})
    m_even, m_weighted = generate_dataset(even, tmp_path / "even"), generate_dataset(weighted, tmp_path / "weighted")
    a, b = read_split(tmp_path / "even" / "train.parquet"), read_split(tmp_path / "weighted" / "train.parquet")
    assert b.height.value_counts().to_dict() == {9: 30, 11: 6}
    kept = pd.concat([a[a.height == 9], a[a.height == 11].iloc[:6]])
    assert list(b.maze_id) == list(kept.maze_id) and list(b.walls_hash) == list(kept.walls_hash)
    assert m_weighted["splits"]["train"]["rows"] == 36 and m_even["eval_splits_hash"] == m_weighted["eval_splits_hash"]


@pytest.mark.parametrize("spec, named", [
    ({"count": {"4x4": 3}, "sizes": ["4x4", "5x5"]}, "no count for 5x5"),
    ({"count": {"4x4": 3, "5x5": 2, "6x6": 1}, "sizes": ["4x4", "5x5"]}, "6x6 not among them"),
    ({"count": {"4x4": 0, "5x5": 2}, "sizes": ["4x4", "5x5"]}, "greater than or equal to 1"),
    ({"count": {"huge": 3}, "sizes": ["4x4"]}, "count names a size it cannot read"),
    ({"count": {"4x4": 3}, "derived_from": "heldout"}, "give one number"),
])
def test_a_bad_count_per_size_is_named(spec, named):
    with pytest.raises(ValidationError, match=named):
        SplitSpec.model_validate(spec)



def test_same_config_same_bytes_any_worker_count(tmp_path, visgym_fixture):
    a = generate_dataset(small_config(), tmp_path / "a", visgym_fixture, workers=1)
    b = generate_dataset(small_config(), tmp_path / "b", visgym_fixture, workers=2)
    assert {n: m["content_hash"] for n, m in a["splits"].items()} == {n: m["content_hash"] for n, m in b["splits"].items()}


def test_new_train_seed_keeps_eval_splits_frozen(tmp_path):
    a = generate_dataset(small_config(), tmp_path / "a")
    b = generate_dataset(small_config(train_seed=7), tmp_path / "b")
    assert a["eval_splits_hash"] == b["eval_splits_hash"]
    assert a["splits"]["train"]["content_hash"] != b["splits"]["train"]["content_hash"]
    assert a["splits"]["heldout"]["content_hash"] == b["splits"]["heldout"]["content_hash"]


def test_without_reference_file_the_split_is_left_out_with_a_notice(tmp_path):
    m = generate_dataset(small_config(), tmp_path / "d")
    assert not any(n.startswith("visgym-easy") for n in m["splits"])
    assert any("visgym-easy" in n for n in m["notices"])


def test_impossible_request_fails_and_leaves_nothing(tmp_path):
    cfg = DatasetConfig(reference_splits={}, splits={"heldout": SplitSpec(count=500, sizes=["2x2"])})
    with pytest.raises(MazeError, match=r"found only \d+ unique layouts of 500"):
        generate_dataset(cfg, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_non_empty_output_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    cfg = DatasetConfig(reference_splits={}, splits={"heldout": SplitSpec(count=5)})
    with pytest.raises(FileExistsError, match="not empty"):
        generate_dataset(cfg, out)
    assert (out / "keep.txt").read_text() == "mine"
    generate_dataset(cfg, out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["heldout.parquet", "manifest.json"]


@pytest.mark.parametrize(
    "raw, field",
    [
        ({"splits": {"heldout": {"count": 5, "colour": "red"}}}, "colour"),
        ({"splits": {"heldout": {"count": 0}}}, "count"),
        ({"splits": {"heldout": {"count": 5, "algorithms": ["eller"]}}}, "algorithms"),
        ({"splits": {"heldout": {"count": 5, "sizes": ["4x4", "huge"]}}}, "sizes"),
        ({"splits": {"heldout": {"count": 5, "sizes": [1]}}}, "sizes"),
        ({"splits": {"v": {"count": 5, "derived_from": "nowhere"}}}, "derived_from"),
        ({"splits": {"heldout": {"count": 5, "render": [{"palette": "neon"}]}}}, "palette"),
        ({"splits": {"heldout": {"count": 5}}, "dedup": "fuzzy"}, "dedup"),
    ],
)
def test_bad_configs_name_the_field(raw, field):
    with pytest.raises(ValidationError, match=field):
        DatasetConfig.model_validate(raw)


def test_unknown_preset():
    with pytest.raises(MazeError, match="allowed default, smoke"):
        preset("huge")


def test_default_preset_meets_the_issue_minimums():
    cfg = preset("default")
    assert cfg.splits["heldout"].count >= 500
    larger = cfg.splits["larger"]
    assert larger.count >= 200 and min(s[0] for s in larger.sizes) > 4


def test_split_missing_columns_is_a_clear_error(tmp_path, dataset):
    out, _ = dataset
    table = pq.read_table(out / "heldout.parquet").drop_columns(["goal", "grid"])
    pq.write_table(table, tmp_path / "bad.parquet")
    with pytest.raises(MazeError, match="missing required column.*grid, goal|missing required column.*goal"):
        read_split(tmp_path / "bad.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(MazeError, match="not a readable parquet"):
        read_split(tmp_path / "junk.parquet")
    with pytest.raises(MazeError, match="not found"):
        read_split(tmp_path / "absent.parquet")


def test_malformed_fixture_files(tmp_path):
    from mazerl.mazes.visgym import FixtureError, load_visgym_fixture

    bad = tmp_path / "f.json"
    for text, message in [
        ("{", "not valid JSON"),
        ('{"x": 1}', "'episodes' list"),
        ('{"episodes": []}', "empty"),
        ('{"episodes": [{"env_id": "maze_2d/easy"}]}', "missing seed"),
        ('{"episodes": [{"env_id": "maze_2d/easy", "seed": 0, "maze_map": [[1,1],[1,1]], "agent": [1,1], "target": [1,1], "shortest_path_moves": 0}]}', "maze_map"),
        ('{"episodes": [{"env_id": "x", "seed": 0, "maze_map": [], "agent": [1,1], "target": [1,1], "shortest_path_moves": 0}]}', "env_id"),
    ]:
        bad.write_text(text)
        with pytest.raises(FixtureError, match=message):
            load_visgym_fixture(bad)
    with pytest.raises(FixtureError, match="not found"):
        load_visgym_fixture(tmp_path / "absent.json")


def test_every_generated_maze_is_solvable_within_its_turn_budget(dataset):
    out, _ = dataset
    for path in out.glob("*.parquet"):
        df = read_split(path)
        assert (df.shortest_path_moves + 1 <= df.max_turns).all(), path.stem
