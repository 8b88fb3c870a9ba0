"""Hostile input (issue #32): inputs a command could delete, tables that would count wrong, and bad
input found only after the work was done. Every case ends in one clear message and exit 2 before any
work starts, and no input is ever deleted."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.errors import UserError
from mazerl.mazes.dataset_io import read_split, records, write_split
from mazerl.mazes.layout import MazeError
from conftest import assert_clear_error
from test_bad_input import maze_rows, minimal, run, tree_digest, write_table  # noqa: F401 (maze_rows: a fixture)

runner = CliRunner()
SETTINGS = settings(max_examples=int(os.environ.get("MAZERL_PROPERTY_EXAMPLES", "40")), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture()
def two_mazes(maze_rows, tmp_path) -> Path:
    """A two-maze heldout split: evaluations that could run finish in moments."""
    path = tmp_path / "data" / "heldout.parquet"
    path.parent.mkdir()
    write_split(maze_rows[:2], path)
    return path


def _oracle_eval(data: Path, out: Path) -> None:
    result = run("eval", "--policy", "oracle", "--data", data, "--out", out)
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------------ no input is ever deleted


def test_eval_overwrite_refuses_the_model_it_evaluates(tiny_model_dir, two_mazes, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tiny_model_dir, out / "model")
    before = tree_digest(out)
    result = run("eval", "--model", out / "model", "--data", two_mazes, "--out", out, "--overwrite")
    assert_clear_error(result, "--model", "lies inside the output directory", "choose another")
    assert tree_digest(out) == before


def test_eval_refuses_a_training_log_inside_its_output(two_mazes, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    log = out / "metrics.jsonl"
    log.write_text('{"step": 1, "loss": 0.5}\n')
    assert_clear_error(run("eval", "--policy", "oracle", "--data", two_mazes, "--out", out, "--overwrite",
                           "--training-log", log), "--training-log", "lies inside the output directory")
    assert log.read_text() == '{"step": 1, "loss": 0.5}\n'


GRPO_SMALL = {"mazes_per_step": 1, "group_size": 2, "max_turns": 2}


def test_show_never_writes_its_picture_over_the_split(two_mazes):
    before = two_mazes.read_bytes()
    assert_clear_error(run("mazes", "show", two_mazes, "--png", two_mazes), "is also the output", "choose another --png")
    assert two_mazes.read_bytes() == before


def _training_config(path: Path, model: Path, train: Path, out: Path, **extra) -> Path:
    raw = {"policy": {"model": str(model), "history": {"turns": 0, "images": 1}, "render_scale": 1.28,
                      "max_new_tokens": 6, "prompt": "short"},
           "train_data": str(train), "output_dir": str(out), "steps": 1, **extra}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("command", ["sft", "grpo"])
def test_training_overwrite_refuses_a_base_model_in_its_own_final(command, tiny_model_dir, small_mazes, tmp_path):
    """policy.model = OUTPUT_DIR/final: --overwrite would delete the model the run starts from."""
    out = tmp_path / "run"
    shutil.copytree(tiny_model_dir, out / "final")
    (out / "metrics.jsonl").write_text('{"step": 1}\n')  # an earlier run, so --overwrite has something to replace
    extra = {"batch_size": 2} if command == "sft" else GRPO_SMALL
    cfg = _training_config(tmp_path / "c.yaml", out / "final", small_mazes / "train.parquet", out, **extra)
    before = tree_digest(out)
    args = ["train", command, "--config", cfg, "--overwrite"] + (["--resume", "never"] if command == "grpo" else [])
    assert_clear_error(run(*args), "policy.model", "lies inside the output directory", "final", "choose another")
    assert tree_digest(out) == before


def test_training_refuses_a_config_file_or_data_among_the_files_it_replaces(tiny_model_dir, small_mazes, tmp_path):
    out = tmp_path / "run"
    (out / "tensorboard").mkdir(parents=True)
    train = out / "tensorboard" / "train.parquet"
    shutil.copy(small_mazes / "train.parquet", train)
    cfg = _training_config(out / "tensorboard" / "g.yaml", tiny_model_dir, small_mazes / "train.parquet", out,
                           **GRPO_SMALL)
    before = tree_digest(out)
    assert_clear_error(run("train", "grpo", "--config", cfg, "--resume", "never", "--overwrite"),
                       "--config", "lies inside the output directory")
    cfg2 = _training_config(tmp_path / "g2.yaml", tiny_model_dir, train, out, **GRPO_SMALL)
    assert_clear_error(run("train", "grpo", "--config", cfg2, "--resume", "never", "--overwrite"),
                       "train_data", "lies inside the output directory")
    assert tree_digest(out) == before


SEGMENT = st.text(alphabet="abc-_.", min_size=1, max_size=5).filter(lambda t: t not in (".", ".."))


@SETTINGS
@given(run_file=st.sampled_from(["final", "checkpoints", "tensorboard", "metrics.jsonl"]),
       setting=st.sampled_from(["policy.model", "train_data", "eval_data", "--config"]),
       below=st.lists(SEGMENT, max_size=3), detour=st.booleans())
def test_no_training_input_may_lie_among_the_run_files(run_file, setting, below, detour, tmp_path_factory):
    """Wherever among the files a run replaces an input lies (also reached through '..'), it is refused."""
    from mazerl.atomic import InputInsideOutputError
    from mazerl.rl.common import refuse_inputs_in_run_files
    from mazerl.rl.config import GRPOConfig
    from mazerl.rl.trainer import RUN_FILES

    out = tmp_path_factory.mktemp("run")
    inner = out / run_file
    for part in below:
        inner = inner / part
    inner.mkdir(parents=True)  # present, so that a model given by path counts as one
    (out / "elsewhere").mkdir()
    given = (out / "elsewhere" / ".." / run_file).joinpath(*below) if detour else inner
    paths = {"policy.model": "Qwen/Qwen3-VL-8B-Instruct", "train_data": str(out.parent / "train.parquet"), "eval_data": None}
    extra = {}
    if setting == "--config":
        extra = {"--config": given}
    else:
        paths[setting] = str(given)
    cfg = GRPOConfig.model_validate({"policy": {"model": paths["policy.model"]}, "train_data": paths["train_data"],
                                     "eval_data": paths["eval_data"], "output_dir": str(out)})
    with pytest.raises(InputInsideOutputError, match=rf"{re.escape(setting)} .* lies inside the output directory"):
        refuse_inputs_in_run_files(cfg, RUN_FILES, extra)


def test_pruning_never_deletes_an_input(tmp_path):
    from mazerl.rl.checkpoint import CheckpointManager

    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4):
        (root / f"step-{step:08d}" / "model").mkdir(parents=True)
        (root / f"step-{step:08d}" / "model" / "config.json").write_text("{}")
    manager = CheckpointManager(root, keep_last=1)
    manager.prune(keep=[root / "step-00000001" / "model"])
    assert sorted(p.name for p in root.iterdir()) == ["step-00000001", "step-00000004"]


def test_a_run_resumed_from_a_named_checkpoint_keeps_it(tiny_model_dir, small_mazes, tmp_path):
    """--resume DIR is an input of the run: keep-last-K pruning leaves it in place."""
    from mazerl.rl.config import GRPOConfig
    from mazerl.rl.trainer import GRPOTrainer

    out = tmp_path / "run"
    raw = yaml.safe_load(_training_config(tmp_path / "g.yaml", tiny_model_dir, small_mazes / "train.parquet", out,
                                          **GRPO_SMALL, eval_every=0, checkpoint_every=1,
                                          keep_checkpoints=1).read_text())
    GRPOTrainer(GRPOConfig.model_validate(raw)).run(resume="never")
    first = out / "checkpoints" / "step-00000001"
    GRPOTrainer(GRPOConfig.model_validate({**raw, "steps": 2})).run(resume=str(first))
    assert first.is_dir() and (out / "checkpoints" / "step-00000002").is_dir()


# ------------------------------------------------------------------------ tables that count wrong


@pytest.mark.parametrize("column", ["start", "goal"])
def test_booleans_are_not_coordinates(column, maze_rows, tmp_path):
    """bool is an int subclass (in Python and numpy): [True, True] must not pass for (1, 1)."""
    rows = minimal(maze_rows)
    other = "goal" if column == "start" else "start"
    for r in rows:
        r[column], r[other] = [True, True], [len(r["grid"]) - 2, len(r["grid"][0]) - 2]
    with pytest.raises(MazeError, match=rf"row 0 .*{column} must be \[row, col\].*True"):
        read_split(write_table(tmp_path / "t.parquet", rows))


def test_a_boolean_grid_is_refused(maze_rows, tmp_path):
    rows = minimal(maze_rows)
    for r in rows:
        r["grid"] = [[bool(v) for v in line] for line in r["grid"]]
    with pytest.raises(MazeError, match="row 0.*grid values must be 0 .*1"):
        read_split(write_table(tmp_path / "t.parquet", rows))


@pytest.mark.parametrize("field", ["agent", "target"])
def test_booleans_are_not_visgym_coordinates(field, visgym_fixture, tmp_path):
    from mazerl.mazes.visgym import FixtureError, load_visgym_fixture

    doc = json.loads(visgym_fixture.read_text())
    doc["episodes"] = doc["episodes"][:2]
    doc["episodes"][1][field] = [True, True]
    bad = tmp_path / "ref.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(FixtureError, match=rf"episodes\[1\]\.{field} must be \[row, col\]"):
        load_visgym_fixture(bad)


def test_the_same_maze_under_two_ids_is_refused_in_an_evaluation(maze_rows, tmp_path):
    rows = minimal(maze_rows)
    rows.append({**rows[2], "maze_id": "copy-of-2"})
    data = write_table(tmp_path / "heldout.parquet", rows)
    result = run("eval", "--policy", "oracle", "--data", data, "--out", tmp_path / "e")
    assert_clear_error(result, "the same maze", repr(rows[2]["maze_id"]), "'copy-of-2'")
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("name", ["..parquet", "...parquet", "....parquet"])
def test_a_file_name_of_dots_is_not_a_split_name(name, maze_rows, tmp_path):
    data = write_table(tmp_path / name, minimal(maze_rows))
    with pytest.raises(MazeError, match="split name .* is not allowed.*letters, digits"):
        read_split(data)
    assert_clear_error(run("eval", "--policy", "oracle", "--data", data, "--out", tmp_path / "e"), "split name")


ALLOWED = st.text(alphabet="abcXYZ019_-.", min_size=1, max_size=12)


@SETTINGS
@given(stem=st.one_of(ALLOWED, st.text(alphabet="ab.-_ é/\\:*", min_size=1, max_size=8)))
def test_a_split_named_by_its_file_follows_the_split_name_rule(stem, maze_rows, tmp_path_factory):
    """Whatever the file is called, the split it names is either allowed by the rule or refused."""
    from mazerl.mazes.dataset_io import check_split_name

    if "/" in stem or "\\" in stem or stem in (".", ".."):
        return
    folder = tmp_path_factory.mktemp("names")
    try:
        check_split_name(stem)
        allowed = True
    except ValueError:
        allowed = False
    path = folder / f"{stem}.parquet"
    write_table(path, minimal(maze_rows[:1]))
    if allowed:
        assert set(read_split(path).split) == {stem}
    else:
        with pytest.raises(MazeError, match="not allowed"):
            read_split(path)


def test_two_files_of_one_split_are_refused_not_mixed(maze_rows, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_table(tmp_path / "a" / "heldout.parquet", minimal(maze_rows[:2]))
    b = write_table(tmp_path / "b" / "heldout.parquet", minimal(maze_rows[2:]))
    result = run("eval", "--policy", "oracle", "--data", a, "--data", b, "--out", tmp_path / "e")
    assert_clear_error(result, "both split 'heldout'")
    assert not (tmp_path / "e").exists()


def test_a_file_holding_several_splits_is_refused(maze_rows, tmp_path):
    rows = [{**r, "split": "heldout" if i < 2 else "larger"} for i, r in enumerate(minimal(maze_rows))]
    data = write_table(tmp_path / "mixed.parquet", rows)
    with pytest.raises(MazeError, match="holds several splits.*'heldout'.*'larger'"):
        read_split(data)


def test_a_reference_split_is_named_after_its_real_size(visgym_fixture, tmp_path):
    from mazerl.mazes.splits import DatasetConfig, generate_dataset
    from mazerl.workflow import evaluation_limits

    doc = json.loads(visgym_fixture.read_text())
    easy = [e for e in doc["episodes"] if e["env_id"] == "maze_2d/easy"][:3]
    hard = [e for e in doc["episodes"] if e["env_id"] == "maze_2d/hard"][:5]
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({**doc, "episodes": easy + hard}))
    cfg = DatasetConfig.model_validate({"splits": {"heldout": {"count": 2}}})
    manifest = generate_dataset(cfg, tmp_path / "d", ref)
    assert {n: m["rows"] for n, m in manifest["splits"].items()} == {"visgym-easy-3": 3, "visgym-hard-5": 5, "heldout": 2}
    assert set(read_split(tmp_path / "d" / "visgym-easy-3.parquet").split) == {"visgym-easy-3"}
    # the evaluation plays the reference splits in full, whatever their size
    assert evaluation_limits(str(tmp_path / "d"), ["heldout", "visgym-easy-3", "visgym-hard-5"], 1, 1) == {"heldout": 1}


def test_a_reference_file_with_one_maze_under_two_seeds_is_refused(visgym_fixture, tmp_path):
    from mazerl.mazes.splits import DatasetConfig, generate_dataset

    doc = json.loads(visgym_fixture.read_text())
    easy = [e for e in doc["episodes"] if e["env_id"] == "maze_2d/easy"][:3]
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({**doc, "episodes": easy + [{**easy[1], "seed": 99}]}))
    cfg = DatasetConfig.model_validate({"reference_splits": {"visgym-easy": "maze_2d/easy"}, "splits": {"heldout": {"count": 2}}})
    with pytest.raises(MazeError, match=r"same maze .*'visgym-easy-4-seed001', 'visgym-easy-4-seed099'"):
        generate_dataset(cfg, tmp_path / "d", ref)
    assert not (tmp_path / "d").exists()


def test_a_reference_split_name_with_a_count_is_refused():
    from mazerl.mazes.splits import DatasetConfig

    with pytest.raises(ValueError, match="ends in a count.*'visgym-easy'"):
        DatasetConfig.model_validate({"reference_splits": {"visgym-easy-64": "maze_2d/easy"}, "splits": {"heldout": {"count": 2}}})


# ------------------------------------------------------------------------ found before the work, not after


def test_a_bad_training_log_is_found_before_any_maze_is_played(two_mazes, tmp_path, monkeypatch):
    import mazerl.evaluation.runner as runner_mod

    played = []
    real = runner_mod.play_scripted
    monkeypatch.setattr(runner_mod, "play_scripted", lambda *a, **k: played.append(1) or real(*a, **k))
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    result = run("eval", "--policy", "oracle", "--data", two_mazes, "--out", tmp_path / "e", "--training-log", log)
    assert_clear_error(result, str(log), "line 2")
    assert not played and not (tmp_path / "e").exists()


def test_pipeline_run_with_a_missing_reference_is_one_message(tmp_path, monkeypatch):
    import mazerl.pipelines.run as pipeline_run

    def must_not_start(*args, **kwargs):
        raise AssertionError("the DAG started")

    monkeypatch.setattr(pipeline_run, "run_local_logged", must_not_start)
    result = run("pipeline", "run", "--config", "smoke", "--reference", tmp_path / "missing.json")
    assert_clear_error(result, "reference file not found", "missing.json")


def _corrupt_truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _corrupt_garbage(path: Path) -> None:
    path.write_bytes(b"PAR1 this is not a parquet file at all")


def _corrupt_columns(path: Path) -> None:
    pq.write_table(pa.table({"x": [1, 2]}), path)


def _corrupt_types(path: Path) -> None:
    table = pq.read_table(path)
    column = table.schema.get_field_index("success")
    pq.write_table(table.set_column(column, "success", pa.array(["yes"] * len(table))), path)


@pytest.fixture(scope="module")
def evaluation(small_mazes, tmp_path_factory) -> Path:
    """An oracle evaluation of two mazes, made once for the tests that damage copies of it."""
    work = tmp_path_factory.mktemp("evaluation")
    write_split(records(read_split(small_mazes / "heldout.parquet"))[:2], work / "heldout.parquet")
    _oracle_eval(work / "heldout.parquet", work / "e")
    return work / "e"


@pytest.mark.parametrize("corrupt", [_corrupt_truncated, _corrupt_garbage, _corrupt_columns, _corrupt_types])
def test_compare_names_a_corrupt_episodes_table(corrupt, evaluation, tmp_path):
    shutil.copytree(evaluation, tmp_path / "a")
    shutil.copytree(evaluation, tmp_path / "b")
    corrupt(tmp_path / "b" / "episodes.parquet")
    result = run("eval", "compare", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "c")
    assert_clear_error(result, str(tmp_path / "b" / "episodes.parquet"))


@pytest.mark.parametrize("option", ["--data", "--training-log"])
def test_a_symlink_loop_is_named(option, two_mazes, tmp_path):
    loop = tmp_path / "loop"
    os.symlink(tmp_path / "loop2", loop)
    os.symlink(loop, tmp_path / "loop2")
    args = ["eval", "--policy", "oracle", "--data", loop if option == "--data" else two_mazes, "--out", tmp_path / "e"]
    if option == "--training-log":
        args += ["--training-log", loop]
    assert_clear_error(run(*args), str(loop), "symbolic link")


@pytest.mark.parametrize("content", [b"\xff\xfe\x00\x81binary garbage", b"{not json", b"[1, 2]"])
def test_a_damaged_dataset_manifest_is_named(content, tmp_path):
    from mazerl.workflow import evaluation_limits

    (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(UserError, match="manifest.json"):
        evaluation_limits(str(tmp_path), ["heldout"], 1, 1)
