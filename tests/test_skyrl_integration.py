"""mazerl's mazes in SkyRL: `mazerl mazes export --format skyrl` and the skyrl-gym environment `mazerl-maze`,
played through the real skyrl-gym package (`skyrl_gym.make` on exported rows)."""

from __future__ import annotations

import importlib
import random
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

skyrl_gym = pytest.importorskip("skyrl_gym", reason="skyrl-gym is installed by the dev extras (mazerl[skyrl])")
from omegaconf import DictConfig  # noqa: E402  (comes with skyrl-gym)

from mazerl.cli import app  # noqa: E402
from mazerl.envs.actions import ACTION_FORMAT_HELP, parse_action  # noqa: E402
from mazerl.envs.agents import as_reply, oracle_action, random_action  # noqa: E402
from mazerl.envs.maze_env import EnvConfig, MazeEnv, MazeTask  # noqa: E402
from mazerl.errors import UserError  # noqa: E402
from mazerl.mazes.dataset_io import COLUMNS, read_split, records, row_render_options, row_to_maze  # noqa: E402
from mazerl.integrations.export import SKYRL_ENV_CLASS, ExportError, export_splits, skyrl_prompt  # noqa: E402
from mazerl.mazes.layout import MOVE_NAMES, MazeError  # noqa: E402
from mazerl.mazes.splits import read_manifest  # noqa: E402
from mazerl.policy.prompts import turn_text  # noqa: E402

from mazerl.integrations import skyrl as mazerl_skyrl  # noqa: E402  (registers mazerl-maze)

runner = CliRunner()
VISGYM_SPLITS = ("visgym-easy-64", "visgym-hard-64")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, visgym_fixture) -> Path:
    """A dataset as `mazes generate` lays it out: VisGym's easy-64 and hard-64 reference splits, a frozen
    evaluation split and a train split."""
    from mazerl.mazes.splits import DatasetConfig, generate_dataset

    out = tmp_path_factory.mktemp("skyrl") / "mazes"
    cfg = DatasetConfig.model_validate({"splits": {"heldout": {"count": 3, "sizes": ["3x3"], "max_turns": 12},
                                                   "train": {"count": 4, "sizes": ["3x3"]}}})
    generate_dataset(cfg, out, visgym_fixture)
    return out


@pytest.fixture(scope="module")
def exported(dataset, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("skyrl") / "rows"
    result = runner.invoke(app, ["mazes", "export", str(dataset), "--out", str(out), "--format", "skyrl"])
    assert result.exit_code == 0, result.output
    return out


def skyrl_rows(path: Path) -> list[dict]:
    """The rows as a SkyRL data loader hands them over: (prompt, env_class, extras)."""
    rows = []
    for rec in pd.read_parquet(path).to_dict("records"):
        extras = {k: v for k, v in rec.items() if k not in ("prompt", "env_class")}
        rows.append((list(rec["prompt"]), rec["env_class"], extras))
    return rows


def play(env, policy) -> list[dict]:
    """Play an episode through the SkyRL interface; each step's output, in order."""
    outputs = []
    done = False
    while not done:
        out = env.step(policy(env))
        outputs.append(out)
        done = out["done"]
    return outputs


def message_text(message: dict) -> str:
    return next(p["text"] for p in message["content"] if p["type"] == "text")


def message_frame(message: dict) -> np.ndarray:
    return mazerl_skyrl.frame_from_part(next(p for p in message["content"] if p["type"] == "image_url"))


# ---- export ------------------------------------------------------------------------------------------------

def test_export_writes_one_skyrl_file_per_split_the_frozen_splits_included(dataset, exported):
    manifest = read_manifest(dataset)
    assert sorted(p.name for p in exported.iterdir()) == sorted(f"{s}.parquet" for s in manifest["splits"])
    assert set(VISGYM_SPLITS) | {"heldout", "train"} == set(manifest["splits"])
    for split, info in manifest["splits"].items():
        table = pq.read_table(exported / f"{split}.parquet")
        assert table.column_names == ["prompt", "env_class", *COLUMNS]
        df = table.to_pandas()
        assert len(df) == info["rows"]
        assert set(df["env_class"]) == {SKYRL_ENV_CLASS}
        assert all([dict(m) for m in p] == skyrl_prompt() for p in df["prompt"])
        assert skyrl_prompt()[0]["role"] == "system"
        # the maze columns are the split's own: the export is still a maze table, equal to its source
        assert records(read_split(exported / f"{split}.parquet")) == records(read_split(dataset / info["file"]))


def test_export_writes_the_chosen_system_prompt(dataset, tmp_path):
    from mazerl.policy.prompts import SHORT_SYSTEM_PROMPT

    result = runner.invoke(app, ["mazes", "export", str(dataset / "heldout.parquet"), "--out", str(tmp_path / "short"),
                                 "--format", "skyrl", "--prompt", "short"])
    assert result.exit_code == 0, result.output
    prompts = pd.read_parquet(tmp_path / "short" / "heldout.parquet")["prompt"]
    assert all([dict(m) for m in p] == [{"role": "system", "content": SHORT_SYSTEM_PROMPT}] for p in prompts)
    result = runner.invoke(app, ["mazes", "export", str(dataset), "--out", str(tmp_path / "out"), "--format", "skyrl",
                                 "--prompt", "long"])
    assert result.exit_code == 2 and "unknown prompt 'long': allowed full, short" in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_export_takes_split_files_one_or_several(dataset, tmp_path):
    written = export_splits([dataset / "visgym-easy-64.parquet", dataset / "heldout.parquet"], tmp_path / "two", "skyrl")
    assert [(w.split, w.rows) for w in written] == [("visgym-easy-64", 64), ("heldout", 3)]
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["heldout.parquet", "visgym-easy-64.parquet"]


# ---- the environment, built from exported rows by skyrl_gym.make ------------------------------------------------

def test_mazerl_maze_is_registered_once_and_made_from_a_row(exported):
    assert SKYRL_ENV_CLASS == "mazerl-maze" and "mazerl-maze" in skyrl_gym.registry
    importlib.reload(mazerl_skyrl)  # a second import does not register it twice (skyrl-gym would refuse)
    prompt, env_class, extras = skyrl_rows(exported / "visgym-easy-64.parquet")[0]
    env = skyrl_gym.make(env_class, env_config=DictConfig({"env_class": env_class}), extras=extras)
    assert isinstance(env, skyrl_gym.envs.base_text_env.BaseTextEnv)
    assert env.max_turns == extras["max_turns"] == 18


@pytest.mark.parametrize("split", VISGYM_SPLITS)
def test_the_oracle_solves_every_visgym_maze_through_skyrl(exported, split):
    rows = skyrl_rows(exported / f"{split}.parquet")
    assert len(rows) == 64
    solved = 0
    for prompt, env_class, extras in rows:
        env = skyrl_gym.make(env_class, env_config=DictConfig({}), extras=extras)
        env.init(prompt)
        outputs = play(env, lambda e: as_reply(oracle_action(e.env)))
        episode = outputs[-1]["metadata"]["episode"]
        assert sum(o["reward"] for o in outputs) == 1.0 and outputs[-1]["observations"] == []
        assert episode["turns"] == extras["shortest_path_moves"] + 1 and episode["spl"] == 1.0
        solved += episode["success"]
        assert env.get_metrics()["success"] == 1.0
    assert solved == 64


def wander_action(env: MazeEnv, rng: random.Random) -> str:
    """Uniform over the four moves, walls included, never stop: bumps, loops, dead ends and timeouts."""
    return rng.choice(MOVE_NAMES)


def worded(action: str, rng: random.Random) -> str:
    """A move worded as a model might: a tag, VisGym's tuple, a tag after some text, or nothing valid."""
    form = rng.random()
    if form < 0.1:
        return "I am not sure where to go."
    if form < 0.3:
        return "('stop', 'stop')" if action == "stop" else f"('move', {MOVE_NAMES.index(action)})"
    if form < 0.5:
        return f"The dot should go {action}. <action>{action.upper()}</action>"
    return as_reply(action)


def same_moves_in_both(exported: Path, chat, choose) -> tuple[list[dict], dict[str, int]]:
    """Every VisGym maze played with the same seeded moves by mazerl's rollout (teacher replies) and through
    skyrl-gym; checks that both give the same episode statistics, per-turn rewards, frames and turn texts.
    Returns the episodes' statistics and how many replies of each form were played."""
    from mazerl.rollout.multiturn import items_from_split, rollout

    episodes: list[dict] = []
    forms: dict[str, int] = {}
    for split in VISGYM_SPLITS:
        path = exported / f"{split}.parquet"
        df = read_split(path)
        items = items_from_split(df, range(len(df)))
        maze_of_task = {id(item.task): item.maze_id for item in items}
        rngs = {item.maze_id: random.Random(f"moves-{item.maze_id}") for item in items}

        def teacher(env: MazeEnv):
            rng = rngs[maze_of_task[id(env.task)]]
            return worded(choose(env, rng), rng), True

        trajectories = {t.maze_id: t for t in rollout(None, chat, items, teacher=teacher)}
        for prompt, env_class, extras in skyrl_rows(path):
            rng = random.Random(f"moves-{extras['maze_id']}")
            env = skyrl_gym.make(env_class, env_config=None, extras=extras)
            conversation, _ = env.init(prompt)
            outputs = play(env, lambda e: worded(choose(e.env, rng), rng))
            mine = trajectories[extras["maze_id"]]
            assert outputs[-1]["metadata"]["episode"] == mine.stats.as_dict()
            assert [o["reward"] for o in outputs] == mine.rewards
            # what the model reads each turn: the same frames and the same turn texts as in mazerl's rollout
            messages = [conversation[-1]] + [o["observations"][0] for o in outputs if o["observations"]]
            frames = [s.image for s in mine.conversation.segments if s.kind == "image"]
            assert len(messages) == len(frames) == len(outputs)
            assert all(np.array_equal(message_frame(m), f) for m, f in zip(messages, frames))
            texts = [chat.tokenizer.decode(mine.conversation.segments[i + 1].ids)
                     for i, s in enumerate(mine.conversation.segments) if s.kind == "image"]
            assert all(t.startswith(message_text(m)) for m, t in zip(messages, texts))
            episodes.append(mine.stats.as_dict())
            for reply, action in zip(mine.replies, mine.stats.actions):
                form = "invalid" if action == "invalid" else "tuple" if reply.startswith("(") else "tag"
                forms[form] = forms.get(form, 0) + 1
    return episodes, forms


def test_a_random_policy_rarely_succeeds_with_mazerls_statistics(exported, tiny_policy):
    episodes, forms = same_moves_in_both(exported, tiny_policy[1], lambda env, rng: random_action(env, rng))
    solved = sum(e["success"] for e in episodes)
    print(f"random policy: {solved}/{len(episodes)} solved; reply forms {dict(sorted(forms.items()))}")
    assert len(episodes) == 128
    assert solved / len(episodes) <= 0.1, f"a random policy solved {solved} of {len(episodes)} mazes"
    assert forms["invalid"] and forms["tuple"] and forms["tag"]  # every reply form was played


def test_a_wandering_policy_has_mazerls_statistics_bumps_loops_and_timeouts_included(exported, tiny_policy):
    episodes, _ = same_moves_in_both(exported, tiny_policy[1], wander_action)
    for key in ("timeout", "loop", "wall_bumps", "revisits", "dead_end_entries", "parse_failures"):
        assert sum(e[key] for e in episodes), f"no episode exercised {key}"
    assert not any(e["success"] for e in episodes)


def test_messages_follow_mazerls_wording_and_frames(exported):
    prompt, env_class, extras = skyrl_rows(exported / "heldout.parquet")[0]
    env = skyrl_gym.make(env_class, env_config=None, extras=extras)
    prompt = [*prompt, {"role": "user", "content": "A maze for you."}]
    conversation, info = env.init(np.array(prompt))  # pandas reads the prompt column as a numpy array
    assert conversation[:-1] == prompt and info == {"maze_id": extras["maze_id"], "max_turns": 12}
    first = conversation[-1]
    assert first["role"] == "user" and [p["type"] for p in first["content"]] == ["image_url", "text"]
    assert first["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    row = pd.Series(extras)
    task = MazeTask.build(row_to_maze(row), row_render_options(row))
    assert np.array_equal(message_frame(first), task.renderer.frame(task.maze.start))
    assert message_text(first) == turn_text("", 1, 12)
    out = env.step("no idea")
    assert out["metadata"]["parse_ok"] is False and out["metadata"]["action"] is None and out["reward"] == 0.0
    assert message_text(out["observations"][0]) == turn_text(ACTION_FORMAT_HELP, 2, 12)
    assert out["metadata"]["episode"]["parse_failures"] == 1 and not out["done"]


@pytest.mark.parametrize("reply", ["<action>right</action>", "thinking... <action> Up </action>", "('move', 2)",
                                   "('stop', 'stop')", "<action>up</action> then <action>down</action>",
                                   "<action>jump</action>", "right", ""])
def test_replies_are_read_as_mazerls_parser_reads_them(exported, reply):
    prompt, env_class, extras = skyrl_rows(exported / "visgym-easy-64.parquet")[3]
    env = skyrl_gym.make(env_class, env_config=None, extras=extras)
    env.init(prompt)
    out = env.step(reply)
    assert out["metadata"]["action"] == parse_action(reply)
    assert out["metadata"]["episode"]["actions"] == [parse_action(reply) or "invalid"]


def test_env_config_shaping_gives_mazerls_shaped_rewards(exported):
    prompt, env_class, extras = skyrl_rows(exported / "visgym-hard-64.parquet")[5]
    shaping = {"step_penalty": 0.01, "progress_reward": 0.1, "wall_bump_penalty": 0.05}
    env = skyrl_gym.make(env_class, env_config=DictConfig(shaping), extras=extras)
    env.init(prompt)
    row = pd.Series(extras)
    ref = MazeEnv(row_to_maze(row), EnvConfig(**shaping, max_turns=int(extras["max_turns"])))
    ref.reset()
    rng, moves = random.Random(7), []
    outputs = play(env, lambda e: moves.append(random_action(e.env, rng)) or as_reply(moves[-1]))
    assert [o["reward"] for o in outputs] == [ref.step(as_reply(m)).reward for m in moves]
    assert any(r not in (0.0, 1.0) for r in (o["reward"] for o in outputs))


# ---- bad input -------------------------------------------------------------------------------------------------

def test_a_row_without_a_maze_is_a_clear_error(exported):
    _, env_class, extras = skyrl_rows(exported / "heldout.parquet")[0]
    with pytest.raises(UserError, match=r"the row has no maze: grid, start, goal missing .*mazes export --format skyrl"):
        skyrl_gym.make(env_class, env_config=None, extras={"maze_id": "m1", "max_turns": 5})
    with pytest.raises(UserError, match="the row has no maze: maze_id, grid, start, goal, max_turns missing"):
        skyrl_gym.make(env_class, env_config=None, extras={"reward_spec": {"ground_truth": "4"}})
    bad = {**extras, "grid": [[1, 1], [1, 2]]}
    with pytest.raises(UserError, match=rf"mazerl-maze row \(maze_id {extras['maze_id']!r}\): grid values must be 0"):
        skyrl_gym.make(env_class, env_config=None, extras=bad)
    walled = [[1] * 5, [1, 0, 1, 0, 1], [1] * 5, [1, 0, 1, 0, 1], [1] * 5]
    with pytest.raises(UserError, match=r"mazerl-maze row \(maze_id 'cut'\): .*cannot reach goal"):
        skyrl_gym.make(env_class, env_config=None, extras={"maze_id": "cut", "grid": walled, "start": [1, 1],
                                                           "goal": [1, 3], "max_turns": 5})
    with pytest.raises(UserError, match="max_turns must be a whole number in 1..10000"):
        skyrl_gym.make(env_class, env_config=None, extras={**extras, "max_turns": 0})
    with pytest.raises(UserError, match=r"invalid config mazerl-maze row .*drawing columns:\n  palette: Input should be"):
        skyrl_gym.make(env_class, env_config=None, extras={**extras, "palette": "neon"})
    with pytest.raises(UserError, match=r"invalid config mazerl-maze env_config:\n  step_penalty: .*greater than"):
        skyrl_gym.make(env_class, env_config=DictConfig({"step_penalty": -1.0}), extras=extras)
    with pytest.raises(UserError, match="unknown env_config setting.*allowed: step_penalty"):
        skyrl_gym.make(env_class, env_config={"max_steps": 3}, extras=extras)


def test_exporting_a_file_that_is_not_a_maze_table_writes_nothing(tmp_path):
    pq.write_table(pa.table({"question": ["2+2?"], "answer": ["4"]}), tmp_path / "gsm8k.parquet")
    (tmp_path / "notes.parquet").write_text("not parquet")
    for name, message in (("gsm8k.parquet", "missing required column"), ("notes.parquet", "not a readable parquet")):
        result = runner.invoke(app, ["mazes", "export", str(tmp_path / name), "--out", str(tmp_path / "out"),
                                     "--format", "skyrl"])
        assert result.exit_code == 2 and message in result.output, result.output
        assert not (tmp_path / "out").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(MazeError, match="holds no split files"):
        export_splits([tmp_path / "empty"], tmp_path / "out", "skyrl")
    assert not (tmp_path / "out").exists()


def test_a_manifest_naming_a_file_outside_its_dataset_is_refused(dataset, tmp_path):
    import json
    import shutil

    copy = tmp_path / "mazes"
    shutil.copytree(dataset, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["splits"]["train"]["file"] = "../elsewhere.parquet"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match="lists the split file '../elsewhere.parquet', which lies outside"):
        export_splits([copy], tmp_path / "out", "skyrl")
    assert not (tmp_path / "out").exists()


def test_an_unknown_format_lists_the_allowed_ones_and_writes_nothing(dataset, tmp_path):
    result = runner.invoke(app, ["mazes", "export", str(dataset), "--out", str(tmp_path / "out"), "--format", "verl"])
    assert result.exit_code == 2 and "unknown export format 'verl': allowed skyrl" in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_export_never_deletes_or_overwrites_its_input(dataset, tmp_path):
    import shutil

    copy = tmp_path / "mazes"
    shutil.copytree(dataset, copy)
    before = {p.name: p.read_bytes() for p in copy.iterdir()}
    result = runner.invoke(app, ["mazes", "export", str(copy), "--out", str(copy), "--format", "skyrl", "--overwrite"])
    assert result.exit_code == 2 and "lies inside the output directory" in result.output, result.output
    result = runner.invoke(app, ["mazes", "export", str(copy / "train.parquet"), "--out", str(copy), "--format", "skyrl"])
    assert result.exit_code == 2, result.output
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == before
    with pytest.raises(ExportError, match="split 'train' is given twice"):
        export_splits([copy / "train.parquet", copy], tmp_path / "out", "skyrl")
    assert not (tmp_path / "out").exists()


def test_without_skyrl_gym_the_import_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "skyrl_gym", None)  # what Python does for a package that is not installed
    monkeypatch.delitem(sys.modules, "mazerl.integrations.skyrl")
    with pytest.raises(ImportError, match=r"pip install 'mazerl\[skyrl\]'") as err:
        importlib.import_module("mazerl.integrations.skyrl")
    assert isinstance(err.value, UserError)
