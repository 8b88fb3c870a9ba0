"""pretrain-tiny and the shipped tiny-base: what it learned from, what it is, and how it is named."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.mazes.dataset_io import read_split
from mazerl.mazes.splits import generate_dataset
from mazerl.mazes.visgym import load_visgym_fixture, reference_file
from mazerl.policy import loading
from mazerl.policy.loading import PolicyLoadError, load_policy, packaged_model_dir
from mazerl.policy.config import PolicyConfig
from mazerl.rl.pretrain import POOL_FILE, PROVENANCE_FILE, choose_snapshot, evaluation_splits

runner = CliRunner()
TINY_RUN = {"steps": 3, "eval_every": 2, "validation_mazes": 3, "heldout_mazes": 4, "batch_turns": 6, "turns_per_maze": 2,
            "pool": [{"cells": 3, "count": 8, "weight": 0.5}, {"cells": 4, "count": 20, "weight": 0.5}]}


@pytest.fixture(scope="module")
def evaluation_walls(tmp_path_factory) -> set[str]:
    """Walls of every evaluation maze of the default and smoke presets, reference splits included."""
    walls: set[str] = set()
    for name in ("default", "smoke"):
        out = tmp_path_factory.mktemp(name) / "mazes"
        manifest = generate_dataset(evaluation_splits(name), out, reference_file())
        assert {"visgym-easy-64", "visgym-hard-64", "heldout"} <= set(manifest["splits"])
        for info in manifest["splits"].values():
            walls |= set(read_split(out / info["file"]).walls_hash)
    return walls


def _reference_walls() -> set[str]:
    from mazerl.mazes.hashing import walls_hash

    walls = {walls_hash(ep.maze.grid) for ep in load_visgym_fixture(reference_file())}
    assert len(walls) > 100  # 64 easy + 64 hard recordings
    return walls


def test_pretrain_tiny_writes_a_complete_traceable_model(tmp_path, evaluation_walls):
    cfg = tmp_path / "pt.yaml"
    cfg.write_text(yaml.safe_dump(TINY_RUN))
    out = tmp_path / "base"
    result = runner.invoke(app, ["policy", "pretrain-tiny", "--out", str(out), "--config", str(cfg)])
    assert result.exit_code == 0, result.output[-3000:]
    prov = json.loads((out / PROVENANCE_FILE).read_text())
    assert prov["steps_run"] == 3 and prov["shipped_step"] in (2, 3)
    assert prov["command"][:3] == ["mazerl", "policy", "pretrain-tiny"]
    assert prov["config"]["steps"] == 3 and prov["seeds"]["seed"] == 0
    assert prov["package_version"] and "git_commit" in prov and prov["wall_time_s"] > 0
    assert prov["heldout"]["mazes"] == 4 and len(prov["heldout"]["greedy"]["wilson_95"]) == 2
    files = {p.name for p in out.iterdir() if p.name != PROVENANCE_FILE}
    assert set(prov["files"]) == files and {"model.safetensors", "config.json", POOL_FILE, "mazerl_policy.json"} <= files
    for name, digest in prov["files"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    pool = read_split(out / POOL_FILE)
    assert len(pool) == prov["pool"]["3x3"] + prov["pool"]["4x4"]
    assert not set(pool.walls_hash) & evaluation_walls
    # the model opens through the ordinary loader, with the view it was trained with
    view = PolicyConfig.for_model(str(out))
    assert view.reply_grammar == "action" and view.render_scale == 0.64 and view.history.turns == 1
    load_policy(out)


def test_pretrain_tiny_refuses_bad_input_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**TINY_RUN, "stepz": 4}))
    r = runner.invoke(app, ["policy", "pretrain-tiny", "--out", str(tmp_path / "a"), "--config", str(bad)])
    assert r.exit_code == 2 and "stepz" in r.output and not (tmp_path / "a").exists()
    full_history = tmp_path / "full.yaml"
    full_history.write_text(yaml.safe_dump({**TINY_RUN, "view": {"model": "-", "history": {"turns": None}, "reply_grammar": "action"}}))
    r = runner.invoke(app, ["policy", "pretrain-tiny", "--out", str(tmp_path / "a"), "--config", str(full_history)])
    assert r.exit_code == 2 and "history window" in r.output and not (tmp_path / "a").exists()
    for weight in ("-1", ".nan"):
        wrong = tmp_path / "w.yaml"
        wrong.write_text(f"perception_weight: {weight}\n")
        r = runner.invoke(app, ["policy", "pretrain-tiny", "--out", str(tmp_path / "a"), "--config", str(wrong)])
        assert r.exit_code == 2 and "perception_weight" in r.output and not (tmp_path / "a").exists()
    unknown_init = tmp_path / "vi.yaml"
    unknown_init.write_text("vision_init: clever\n")
    r = runner.invoke(app, ["policy", "pretrain-tiny", "--out", str(tmp_path / "a"), "--config", str(unknown_init)])
    assert r.exit_code == 2 and "vision_init" in r.output and "maze" in r.output
    for flag, value in (("--minutes", "0"), ("--minutes", "-3"), ("--steps", "0")):
        r = runner.invoke(app, ["policy", "pretrain-tiny", "--out", str(tmp_path / "b"), flag, value])
        assert r.exit_code == 2 and flag in r.output and not (tmp_path / "b").exists()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    r = runner.invoke(app, ["policy", "pretrain-tiny", "--out", str(taken), "--steps", "1"])
    assert r.exit_code == 2 and "not empty" in r.output and "--overwrite" in r.output
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]


def test_choose_snapshot_ships_an_earlier_checkpoint_when_training_goes_past_the_band():
    snaps = [{"step": s, "success": v} for s, v in ((100, 0.05), (200, 0.3), (300, 0.45), (400, 0.7))]
    chosen, why = choose_snapshot(snaps, (0.25, 0.5))
    assert chosen["step"] == 300 and "earlier checkpoint" in why
    chosen, why = choose_snapshot(snaps[:1], (0.25, 0.5))
    assert chosen["step"] == 100 and "no snapshot reached" in why


# ---- the shipped tiny-base --------------------------------------------------------------------------

def test_shipped_tiny_base_is_complete_small_and_measured():
    path = packaged_model_dir("tiny-base")
    prov = json.loads((path / PROVENANCE_FILE).read_text())
    size = sum(p.stat().st_size for p in path.iterdir())
    assert size <= 20 * 2**20, f"tiny-base is {size / 2**20:.1f} MB; the cap is 20 MB"
    heldout = prov["heldout"]
    assert heldout["mazes"] >= 500 and heldout["max_turns"] == 18
    g = heldout["greedy"]
    assert 0.20 <= g["success"] <= 0.60, g  # the reference's starting level: room to grow, enough to reinforce
    assert g["wilson_95"][0] <= g["success"] <= g["wilson_95"][1]
    sampled = next(v for k, v in heldout.items() if k.startswith("sampled_t"))
    assert sampled["parse_failure_rate"] < 0.02
    assert prov["steps_run"] >= prov["shipped_step"] > 0 and prov["curve"]


def test_shipped_tiny_base_never_saw_an_evaluation_layout(evaluation_walls):
    pool = read_split(packaged_model_dir("tiny-base") / POOL_FILE)
    assert len(pool) > 1000
    assert not set(pool.walls_hash) & evaluation_walls
    assert not set(pool.walls_hash) & _reference_walls()


def test_tiny_base_is_a_model_name_everywhere(tmp_path):
    path = packaged_model_dir("tiny-base")
    view = PolicyConfig.model_validate({"model": "tiny-base"})
    assert Path(view.model) == path and view.reply_grammar == "action"
    assert PolicyConfig.model_validate({"model": "tiny-base", "render_scale": 1.0}).render_scale == 1.0  # explicit wins
    policy = load_policy("tiny-base")
    assert policy.model.config.vision_config.spatial_merge_size == 1
    from mazerl.workflow import resolve_base_model

    assert resolve_base_model("tiny-base", str(tmp_path / "unused"), None) == str(path)


def test_a_damaged_or_missing_tiny_base_is_named(tmp_path, monkeypatch):
    copy = tmp_path / "assets" / "tiny-base"
    shipped = packaged_model_dir("tiny-base")
    shutil.copytree(shipped, copy)
    monkeypatch.setattr(loading, "_assets_dir", lambda: tmp_path / "assets")
    assert packaged_model_dir("tiny-base") == copy
    with open(copy / "model.safetensors", "r+b") as fh:
        fh.seek(4000)
        fh.write(b"\x00\x01\x02")
    with pytest.raises(PolicyLoadError, match=r"model\.safetensors does not match its hash"):
        load_policy("tiny-base")
    shutil.copy2(shipped / "model.safetensors", copy / "model.safetensors")  # repaired; now a file goes missing
    (copy / "tokenizer.json").unlink()
    with pytest.raises(PolicyLoadError, match=r"tokenizer\.json is missing"):
        packaged_model_dir("tiny-base")
    shutil.rmtree(copy)
    with pytest.raises(PolicyLoadError, match="no 'tiny-base' model.*make tiny-base"):
        load_policy("tiny-base")
    r = runner.invoke(app, ["eval", "--model", "tiny-base", "--data", str(tmp_path / "x.parquet"), "--out", str(tmp_path / "e")])
    assert r.exit_code == 2 and "tiny-base" in r.output and "Traceback" not in r.output


def test_perception_labels_are_the_open_neighbours_of_the_agent_in_each_picture(tmp_path, monkeypatch):
    """Each learned turn's four perception bits say which squares next to the agent are open, read here
    from the picture itself: the blue square is the agent, grey squares are walls."""
    import numpy as np

    from mazerl.mazes.layout import MOVES, MOVE_NAMES
    from mazerl.rl import pretrain
    from mazerl.rl.pretrain import PretrainConfig, Pretrainer, perception_token_ids

    monkeypatch.setattr(pretrain, "evaluation_exclusions", lambda reference: set())  # no presets to generate here
    cfg = PretrainConfig.model_validate({**TINY_RUN, "batch_turns": 24, "turns_per_maze": 3, "noise": 0.4})
    trainer = Pretrainer(cfg, tmp_path / "out", None, log=lambda *a: None)
    batch, labels = trainer.teacher_batch(step=1)
    assert len(batch) == len(labels) == 24
    px = trainer.render.square_px
    checked = 0
    for sample, bits in zip(batch, labels):
        frame = sample.images[-1]
        centres = frame[px // 2::px, px // 2::px]  # one pixel per square, in the middle
        (r,), (c,) = np.nonzero((centres == (0, 0, 255)).all(-1))
        wall = (centres == (169, 169, 169)).all(-1)
        assert bits == [0.0 if wall[r + dr, c + dc] else 1.0 for dr, dc in (MOVES[m] for m in MOVE_NAMES)]
        checked += 1
    assert checked == 24
    ids = perception_token_ids(trainer.tp.chat.tokenizer)
    assert len(set(ids)) == 4 and not set(ids) & set(trainer.tp.reply_choices)  # never a word the grammar lets it say
