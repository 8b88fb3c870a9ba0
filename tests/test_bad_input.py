"""Hostile input (issue #10): every case ends in one clear message and exit 2 (or succeeds), never a
traceback; nothing outside an output directory is written, and no input is ever deleted."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.mazes.dataset_io import read_split, records, write_split
from mazerl.mazes.layout import MazeError
from conftest import assert_clear_error

runner = CliRunner()


def run(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def write_table(path: Path, rows: list[dict]) -> Path:
    """A maze table exactly as given (no schema), the way a user's tool would write it."""
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture()
def maze_rows(small_mazes) -> list[dict]:
    return records(read_split(small_mazes / "heldout.parquet"))[:4]


def minimal(rows: list[dict]) -> list[dict]:
    return [{k: r[k] for k in ("maze_id", "grid", "start", "goal")} for r in rows]


# ---------------------------------------------------------------------------------------- usage


@pytest.mark.parametrize("args, fragment", [(["no-such-command"], "No such command"),
                                            (["eval", "--no-such-option"], "No such option"),
                                            (["mazes", "generate", "--preset"], "requires an argument")])
def test_a_usage_error_is_a_usage_message_not_an_internal_error(args, fragment):
    """Usage errors are click's to report (typer's own copy of click in typer 0.2x): exit 2, no crash log."""
    result = run(*args)
    assert_clear_error(result, fragment)
    assert "internal error" not in result.output and "traceback in" not in result.output


# ---------------------------------------------------------------------------------------- data loss


@pytest.mark.parametrize("name", ["/tmp/mazerl-victim", "../escaped", "a/b", ".hidden", ""])
def test_a_split_name_can_never_write_outside_the_output_directory(tmp_path, name):
    cfg = tmp_path / "d.yaml"
    cfg.write_text(yaml.safe_dump({"reference_splits": {}, "splits": {name: {"count": 2}}}))
    out = tmp_path / "inner" / "out"
    before = set(tmp_path.rglob("*"))
    result = run("mazes", "generate", "--config", cfg, "--out", out)
    assert_clear_error(result, "split name")
    assert set(tmp_path.rglob("*")) == before and not Path("/tmp/mazerl-victim.parquet").exists()


def test_eval_overwrite_never_deletes_an_input_inside_the_output(small_mazes, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    data = work / "heldout.parquet"
    data.write_bytes((small_mazes / "heldout.parquet").read_bytes())
    result = run("eval", "--policy", "oracle", "--data", data, "--out", work, "--overwrite")
    assert_clear_error(result, "lies inside the output directory")
    assert data.is_file() and read_split(data) is not None


def test_the_same_data_twice_is_refused(small_mazes, tmp_path):
    heldout = small_mazes / "heldout.parquet"
    result = run("eval", "--policy", "oracle", "--data", heldout, "--data", small_mazes / ".." / "mazes" / "heldout.parquet",
                 "--out", tmp_path / "e")
    assert_clear_error(result, "given twice")
    assert not (tmp_path / "e").exists()


def _oracle_eval(data: Path, out: Path, *extra) -> None:
    result = run("eval", "--policy", "oracle", "--data", data, "--out", out, *extra)
    assert result.exit_code == 0, result.output


def test_compare_pairs_by_layout_not_by_id(tmp_path):
    """Two datasets drawn with different eval seeds share maze ids and no layouts: refused."""
    from mazerl.mazes.splits import DatasetConfig, generate_dataset

    for seed in (0, 1):
        cfg = DatasetConfig.model_validate({"eval_seed": seed, "reference_splits": {}, "splits": {"heldout": {"count": 12}}})
        generate_dataset(cfg, tmp_path / f"d{seed}")
        _oracle_eval(tmp_path / f"d{seed}" / "heldout.parquet", tmp_path / f"e{seed}")
    assert set(pd.read_parquet(tmp_path / "d0" / "heldout.parquet").maze_id) == set(
        pd.read_parquet(tmp_path / "d1" / "heldout.parquet").maze_id)
    result = run("eval", "compare", tmp_path / "e0", tmp_path / "e1", "--out", tmp_path / "c")
    assert_clear_error(result, "played different mazes", "not by maze id")
    same = run("eval", "compare", tmp_path / "e0", tmp_path / "e0", "--out", tmp_path / "c2")
    assert same.exit_code == 0, same.output


def test_compare_refuses_different_turn_budgets(small_mazes, tmp_path):
    data = small_mazes / "heldout.parquet"
    _oracle_eval(data, tmp_path / "a")
    _oracle_eval(data, tmp_path / "b", "--max-turns", "40")
    result = run("eval", "compare", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "c")
    assert_clear_error(result, "different turn budgets")


def test_compare_refuses_different_view_settings(small_mazes, tiny_model_dir, tmp_path):
    data = tmp_path / "few.parquet"
    write_split(records(read_split(small_mazes / "heldout.parquet"))[:2], data)
    for name, scale in (("a", "1.0"), ("b", "1.28")):
        r = run("eval", "--model", tiny_model_dir, "--data", data, "--out", tmp_path / name, "--render-scale", scale)
        assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["meta"]["view"]["render_scale"] == 1.0
    result = run("eval", "compare", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "c")
    assert_clear_error(result, "saw the mazes differently", "render_scale")


def test_a_model_without_saved_view_needs_a_named_view(small_mazes, tiny_model_dir, tmp_path):
    model = tmp_path / "bare"
    model.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.name != "mazerl_policy.json":
            (model / f.name).write_bytes(f.read_bytes())
    data = tmp_path / "few.parquet"
    write_split(records(read_split(small_mazes / "heldout.parquet"))[:1], data)
    result = run("eval", "--model", model, "--data", data, "--out", tmp_path / "e")
    assert_clear_error(result, "has no mazerl_policy.json", "--view NAME", "visgym", "mazerl")  # never silent defaults


def test_a_bad_saved_view_is_named(small_mazes, tiny_model_dir, tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    for f in tiny_model_dir.iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    (model / "mazerl_policy.json").write_text(json.dumps({"render_scale": -3}))
    result = run("eval", "--model", model, "--data", small_mazes / "heldout.parquet", "--out", tmp_path / "e")
    assert_clear_error(result, "mazerl_policy.json holds invalid view settings", "render_scale")
    assert "command line" not in result.output


# ------------------------------------------------------------------------------------ maze tables


def _bad_tables(rows: list[dict]) -> dict[str, tuple[list[dict], str]]:
    r0 = rows[0]
    g = [list(x) for x in r0["grid"]]
    unreachable = [list(x) for x in g]
    gr, gc = r0["goal"]
    for dr, dc in ((0, 1), (0, -1), (1, 0), (-1, 0)):
        unreachable[gr + dr][gc + dc] = 1
    wall_256 = [list(x) for x in g]
    wall_256[0][0] = 256
    huge = [[1] * 2001 for _ in range(2001)]

    def one(**change):
        return [dict({k: r0[k] for k in ("maze_id", "grid", "start", "goal")}, **change)]

    full = [dict(r) for r in rows]
    return {
        "unreachable goal": (one(grid=unreachable), "cannot be reached"),
        "ragged grid": (one(grid=[g[0], g[1][:-1], *g[2:]]), "rectangular"),
        "null grid": (one(grid=None), "grid must be"),
        "null start": (one(start=None), "start must be"),
        "start is goal": (one(start=r0["goal"]), "the same square"),
        "grid as a string": (one(grid="0101"), "grid must be"),
        "wall value 256": (one(grid=wall_256), "found 256"),
        "2001x2001 grid": (one(grid=huge), "largest allowed"),
        "start on a wall": (one(start=[0, 0]), "on a wall"),
        "duplicate maze ids": ([dict(full[0]), dict(full[1], maze_id=full[0]["maze_id"])], "appears more than once"),
        "zero turn budget": ([dict(full[0], max_turns=0)], "max_turns must be a whole number"),
        "NaN turn budget": ([dict(full[0], max_turns=float("nan"))], "max_turns must be a whole number"),
        "unknown palette": ([dict(full[0], palette="neon")], "drawing options"),
        "square_px 0": ([dict(full[0], square_px=0)], "drawing options"),
        "square_px 30000": ([dict(full[0], square_px=30000)], "drawing options"),
        "wrong shortest path": ([dict(full[0], shortest_path_moves=full[0]["shortest_path_moves"] + 2)], "shortest_path_moves is"),
        "wrong layout hash": ([dict(full[0], layout_hash="0" * 16)], "layout_hash is"),
        "unsafe split column": ([dict(full[0], split="../x")], "split name"),
    }


BAD_TABLE_CASES = [
    "unreachable goal", "ragged grid", "null grid", "null start", "start is goal", "grid as a string", "wall value 256",
    "2001x2001 grid", "start on a wall", "duplicate maze ids", "zero turn budget", "NaN turn budget", "unknown palette",
    "square_px 0", "square_px 30000", "wrong shortest path", "wrong layout hash", "unsafe split column"]


@pytest.mark.parametrize("case", BAD_TABLE_CASES)
def test_every_bad_maze_table_is_refused_with_the_row_and_rule(maze_rows, tmp_path, case):
    rows, fragment = _bad_tables(maze_rows)[case]
    path = write_table(tmp_path / "mine.parquet", rows)
    with pytest.raises(MazeError, match="row|maze_id"):
        read_split(path)
    for args in (("mazes", "show", path), ("eval", "--policy", "oracle", "--data", path, "--out", tmp_path / "e")):
        assert_clear_error(run(*args), fragment)
    assert not (tmp_path / "e").exists()


def test_a_minimal_valid_table_reads_and_its_derived_columns_are_checked(maze_rows, tmp_path):
    path = write_table(tmp_path / "mine.parquet", minimal(maze_rows))
    df = read_split(path)
    assert list(df.layout_hash) == [r["layout_hash"] for r in maze_rows]
    assert all(df.max_turns >= 1)


def test_a_fixture_with_a_repeated_episode_is_refused(visgym_fixture, tmp_path):
    doc = json.loads(visgym_fixture.read_text())
    doc["episodes"].append(doc["episodes"][0])
    bad = tmp_path / "f.json"
    bad.write_text(json.dumps(doc))
    assert_clear_error(run("mazes", "generate", "--preset", "smoke", "--reference", bad, "--out", tmp_path / "o"),
                       "recorded twice")
    assert_clear_error(run("mazes", "conformance", bad), "recorded twice")


def test_a_fixture_agent_error_names_the_agent_field(visgym_fixture, tmp_path):
    doc = json.loads(visgym_fixture.read_text())
    doc["episodes"] = doc["episodes"][:1]
    doc["episodes"][0]["agent"] = [0, 0]  # on the outer wall
    bad = tmp_path / "f.json"
    bad.write_text(json.dumps(doc))
    assert_clear_error(run("mazes", "conformance", bad), "episodes[0].agent:", "on a wall")
    doc["episodes"][0]["agent"] = "top-left"
    bad.write_text(json.dumps(doc))
    assert_clear_error(run("mazes", "conformance", bad), "episodes[0].agent must be [row, col]")


# ------------------------------------------------------------------------ files: encodings, YAML, places


NOT_UTF8 = b"splits:\n  heldout: {count: 2}\n# \xff\xfe caf\xe9\n"


def test_non_utf8_files_are_named(tmp_path, visgym_fixture):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(NOT_UTF8)
    assert_clear_error(run("mazes", "generate", "--config", bad, "--out", tmp_path / "o"), "not UTF-8", "bad.yaml")
    assert_clear_error(run("train", "grpo", "--config", bad), "not UTF-8")
    assert_clear_error(run("train", "sft", "--config", bad), "not UTF-8")
    assert_clear_error(run("pipeline", "compile", "--profile", bad, "--out", tmp_path / "p.yaml"), "not UTF-8")
    fixture = tmp_path / "f.json"
    fixture.write_bytes(b'{"episodes": ["\xff"]}')
    assert_clear_error(run("mazes", "conformance", fixture), "not UTF-8")
    token = tmp_path / "token"
    token.write_bytes(b"\xff\xfe")
    assert_clear_error(run("pipeline", "submit", "--profile", "hyperpod-g5", "--host", "http://127.0.0.1:9",
                           "--auth", "token", "--token-file", token), "not UTF-8")


def test_yaml_syntax_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("splits:\n  heldout: {count: 2\n  train: [\n")
    result = run("mazes", "generate", "--config", bad, "--out", tmp_path / "o")
    assert_clear_error(result, "not valid YAML", "line")


def test_numbers_must_be_finite_and_in_range(tmp_path):
    assert_clear_error(run("train", "grpo", "--config", "tiny-grpo", "--set", "optim.lr=.inf"), "optim.lr", "finite")
    assert_clear_error(run("train", "sft", "--config", "tiny-sft", "--set", "noise=.nan"), "noise", "finite")
    assert_clear_error(run("train", "grpo", "--config", "tiny-grpo", "--set", "optim.lr=5"), "optim.lr")
    prof = yaml.safe_load((Path(__file__).resolve().parents[1] / "src/mazerl/configs/profiles/local.yaml").read_text())
    prof.setdefault("pipeline", {})["min_gain"] = float("nan")
    path = tmp_path / "nan.yaml"
    path.write_text(yaml.safe_dump(prof))
    assert_clear_error(run("pipeline", "compile", "--profile", path, "--out", tmp_path / "p.yaml"), "finite")


def test_setting_inside_a_value_and_bad_resume_values(tmp_path):
    assert_clear_error(run("train", "grpo", "--config", "tiny-grpo", "--set", "steps.x=1"), "'steps' is a value")
    assert_clear_error(run("train", "grpo", "--config", "tiny-grpo", "--resume", "sometimes"), "allowed: auto")
    assert_clear_error(run("train", "grpo", "--config", "tiny-grpo", "--resume", tmp_path / "nonexistent"),
                       "not a checkpoint directory")


@pytest.mark.parametrize("where", ["/proc/mazerl-out", "/sys/mazerl-out"])
def test_unwritable_outputs_get_one_line(where, small_mazes, tmp_path):
    for args in (("mazes", "generate", "--preset", "smoke", "--out", where),
                 ("eval", "--policy", "oracle", "--data", small_mazes / "heldout.parquet", "--out", where),
                 ("policy", "init-tiny", "--out", where),
                 ("pipeline", "compile", "--profile", "local", "--out", f"{where}/p.yaml")):
        assert_clear_error(run(*args), f"cannot use {where}")


def test_compile_into_a_directory_and_its_temporary_file(tmp_path):
    assert_clear_error(run("pipeline", "compile", "--profile", "local", "--out", tmp_path), "is a directory")
    mine = tmp_path / "p.tmp.yaml"
    mine.write_text("a user's own file\n")
    assert run("pipeline", "compile", "--profile", "local", "--out", tmp_path / "p.yaml").exit_code == 0
    assert mine.read_text() == "a user's own file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.tmp.yaml", "p.yaml"]


def test_conformance_of_a_directory(tmp_path):
    assert_clear_error(run("mazes", "conformance", tmp_path), "is a directory")


def test_dataset_config_messages(tmp_path):
    cfg = tmp_path / "d.yaml"
    cfg.write_text(yaml.safe_dump({"reference_splits": {}, "splits": {"x": {"count": 2, "placement": "random", "min_moves": 999}}}))
    assert_clear_error(run("mazes", "generate", "--config", cfg, "--out", tmp_path / "o"), "min_moves = 999 is impossible")
    cfg.write_text(yaml.safe_dump({"reference_splits": {}, "splits": {"x": {"count": 2, "min_moves": 4}}}))
    assert_clear_error(run("mazes", "generate", "--config", cfg, "--out", tmp_path / "o"), "no effect")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    assert_clear_error(run("mazes", "generate", "--preset", "smoke", "--out", tmp_path / "full"), "pass --overwrite")
    assert "overwrite=True" not in run("mazes", "generate", "--preset", "smoke", "--out", tmp_path / "full").output


def test_model_options_with_a_scripted_agent_are_refused(small_mazes, tmp_path):
    result = run("eval", "--policy", "oracle", "--model", "x", "--data", small_mazes / "heldout.parquet", "--out", tmp_path / "e")
    assert_clear_error(result, "--model: used only with --policy model")


def test_samples_are_bounded_by_memory(small_mazes, tmp_path):
    from mazerl.evaluation.runner import MAX_SAMPLES, check_episode_budget

    with pytest.raises(MazeError, match="more than allowed"):
        check_episode_budget(10, MAX_SAMPLES + 1)
    with pytest.raises(MazeError, match="free memory holds"):
        check_episode_budget(10**9, 5_000)
    result = run("eval", "--policy", "oracle", "--data", small_mazes / "heldout.parquet", "--out", tmp_path / "e",
                 "--samples", str(10**8))
    assert_clear_error(result, "more than allowed")


# ------------------------------------------------------------------------- training state and numbers


def test_metrics_are_strict_json(tmp_path):
    from mazerl.metrics import MetricsWriter, read_metrics

    w = MetricsWriter(tmp_path / "m.jsonl")
    w.write({"step": 1, "loss": float("inf"), "kl": float("nan"), "ok": 0.5})
    w.close()
    text = (tmp_path / "m.jsonl").read_text()
    assert "Infinity" not in text and "NaN" not in text
    assert read_metrics(tmp_path / "m.jsonl") == [{"step": 1, "loss": None, "kl": None, "ok": 0.5}]
    with pytest.raises(FileExistsError, match="earlier run"):
        MetricsWriter(tmp_path / "m.jsonl")


def test_a_non_finite_gradient_stops_before_the_optimizer():
    from mazerl.rl.optim import NonFiniteError, check_loss, clip_and_check

    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([1.0, float("nan"), 0.0])
    with pytest.raises(NonFiniteError, match="gradient norm is nan"):
        clip_and_check([p], 1.0, step=3, lr=1e-3)
    with pytest.raises(NonFiniteError, match="loss is inf"):
        check_loss(torch.tensor(float("inf")), step=3, lr=1e-3)
    p.grad = torch.tensor([3.0, 4.0, 0.0])
    assert clip_and_check([p], 1.0, step=3, lr=1e-3) == pytest.approx(5.0)


def _trainer_config(model, small_mazes, out, **over):
    from mazerl.rl.config import GRPOConfig

    raw = {"policy": {"model": str(model), "history": {"turns": 0, "images": 1}, "render_scale": 1.28, "max_new_tokens": 6,
                      "prompt": "short"},
           "train_data": str(small_mazes / "train.parquet"), "output_dir": str(out), "steps": 1, "mazes_per_step": 1,
           "group_size": 2, "eval_every": 0, "checkpoint_every": 1, "max_turns": 2}
    raw.update(over)
    return GRPOConfig.model_validate(raw)


def test_resume_rules(tiny_model_dir, small_mazes, tmp_path):
    from mazerl.rl.trainer import GRPOTrainer, ResumeError

    out = tmp_path / "run"
    cfg = _trainer_config(tiny_model_dir, small_mazes, out)
    GRPOTrainer(cfg).run(resume="never")
    metrics_before = (out / "metrics.jsonl").read_bytes()
    ckpt = out / "checkpoints" / "step-00000001"

    # a fresh start never silently replaces an earlier run
    with pytest.raises(ResumeError, match="earlier run"):
        GRPOTrainer(cfg).run(resume="never")
    assert (out / "metrics.jsonl").read_bytes() == metrics_before
    # --resume DIR verifies the manifest hashes
    weights = next((ckpt / "model").glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ResumeError, match="cannot be trusted"):
        GRPOTrainer(cfg).resume(str(ckpt))
    # every checkpoint damaged: auto is an error, not a restart from step 0
    with pytest.raises(ResumeError, match="no usable checkpoint"):
        GRPOTrainer(cfg).run(resume="auto")
    assert (out / "metrics.jsonl").read_bytes() == metrics_before
    # explicitly asked for: start over
    record = GRPOTrainer(cfg).run(resume="never", overwrite=True)
    assert record["step"] == 1 and (out / "metrics.jsonl").read_bytes() != b""


def test_a_non_finite_loss_never_reaches_the_weights_or_a_checkpoint(tiny_model_dir, small_mazes, tmp_path, monkeypatch):
    import mazerl.rl.trainer as trainer_mod
    import mazerl.rl.worker as worker_mod
    from mazerl.rl.optim import NonFiniteError

    real = worker_mod.token_logprobs

    def poisoned(*args, **kwargs):  # what an overflow in the forward pass looks like to the update
        out = real(*args, **kwargs)
        out.logprobs = out.logprobs * float("inf")
        return out

    monkeypatch.setattr(worker_mod, "token_logprobs", poisoned)
    out = tmp_path / "run"
    trainer = trainer_mod.GRPOTrainer(_trainer_config(tiny_model_dir, small_mazes, out, steps=2, optim={"lr": 1e-2},
                                                      group_size=4, max_turns=4, filter_zero_variance_groups=False))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(NonFiniteError, match="step 1: the (loss|gradient norm) is"):
        trainer.run(resume="never")
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
    assert not (out / "final").exists()


def test_a_damaged_model_is_named_not_a_sampler_crash(tiny_model_dir, small_mazes, tmp_path):
    model = tmp_path / "nan-model"
    model.mkdir()
    for f in tiny_model_dir.iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    from safetensors.torch import load_file, save_file

    weights_file = next(model.glob("*.safetensors"))
    weights = load_file(weights_file)
    for k in weights:
        if weights[k].is_floating_point():
            weights[k] = torch.full_like(weights[k], float("nan"))
    save_file(weights, weights_file, metadata={"format": "pt"})
    data = tmp_path / "few.parquet"
    write_split(records(read_split(small_mazes / "heldout.parquet"))[:1], data)
    for extra in ((), ("--samples", "1")):
        result = run("eval", "--model", model, "--data", data, "--out", tmp_path / f"e{len(extra)}", *extra)
        assert_clear_error(result, "NaN or infinite", "weights are damaged")


# ------------------------------------------------------------------------------- the CLI's boundary


def test_an_unexpected_error_is_one_line_and_a_log(monkeypatch, tmp_path):
    import mazerl.evaluation.runner as runner_mod

    def boom(*a, **k):
        raise RuntimeError("something nobody expected")

    monkeypatch.setattr(runner_mod, "evaluate", boom)
    monkeypatch.setenv("MAZERL_ERROR_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.delenv("MAZERL_DEBUG", raising=False)
    result = run("eval", "--policy", "oracle", "--data", "x.parquet", "--out", tmp_path / "e")
    assert result.exit_code == 1
    assert "internal error: RuntimeError: something nobody expected" in " ".join(result.output.split())
    assert "Traceback" not in result.output
    logs = list((tmp_path / "logs").iterdir())
    assert len(logs) == 1 and "Traceback" in logs[0].read_text() and str(logs[0]) in "".join(result.output.split())
    debug = run("--debug", "eval", "--policy", "oracle", "--data", "x.parquet", "--out", tmp_path / "e")
    os.environ.pop("MAZERL_DEBUG", None)
    assert debug.exit_code == 1 and "Traceback" in debug.output


# ----------------------------------------------------------------------------------- KFP endpoints


class _HTMLEverywhere:
    """An HTTP server answering 200 with an HTML page to every request (a login page, a proxy)."""

    def __init__(self, status=200):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen = self.requests = []

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                seen.append((self.command, self.path))
                body = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body>" + b"x" * 5000 + b"</body></html>"
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("status", [200, 404])
def test_a_server_that_is_not_kfp_gets_nothing_uploaded(status, tmp_path):
    server = _HTMLEverywhere(status)
    try:
        result = run("pipeline", "submit", "--profile", "hyperpod-g5", "--host", server.url, "--auth", "none",
                     "--experiment", "x")
    finally:
        server.close()
    assert_clear_error(result, "html page titled 'sign in'")
    assert "xxxxxxxxxx" not in result.output  # the page is named, not dumped
    assert [m for m, _ in server.requests] == ["GET"]  # the health check only: no upload


def test_token_files_through_open(tmp_path):
    from mazerl.kfp_remote import KFPError, read_token

    with pytest.raises(KFPError, match="is empty"):
        read_token("/dev/null")
    r, w = os.pipe()
    os.write(w, b"s3cret\n")
    os.close(w)
    try:
        assert read_token(f"/dev/fd/{r}") == "s3cret"  # what bash's <(...) hands over
    finally:
        os.close(r)
    with pytest.raises(KFPError, match="not found"):
        read_token(tmp_path / "missing")


# ------------------------------------------------------------------------------------- file modes


def test_outputs_get_the_users_umask(small_mazes, tmp_path):
    old = os.umask(0o022)
    try:
        assert run("eval", "--policy", "oracle", "--data", small_mazes / "heldout.parquet", "--out", tmp_path / "e").exit_code == 0
        write_split(records(read_split(small_mazes / "heldout.parquet"))[:1], tmp_path / "one.parquet")
    finally:
        os.umask(old)
    for p in (tmp_path / "e" / "episodes.parquet", tmp_path / "e" / "summary.json", tmp_path / "one.parquet"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
    assert stat.S_IMODE((tmp_path / "e").stat().st_mode) == 0o755


def test_generate_and_pretrain_refuse_inputs_inside_their_output(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    cfg = out / "d.yaml"
    cfg.write_text(yaml.safe_dump({"reference_splits": {}, "splits": {"heldout": {"count": 2}}}))
    assert_clear_error(run("mazes", "generate", "--config", cfg, "--out", out, "--overwrite"), "lies inside the output directory")
    recipe = out / "recipe.yaml"
    recipe.write_text("{}\n")  # the default pretraining recipe
    assert_clear_error(run("policy", "pretrain-tiny", "--config", recipe, "--out", out, "--overwrite"), "lies inside the output directory")
    assert cfg.is_file() and recipe.is_file()


def test_training_into_an_unwritable_place(tiny_model_dir, small_mazes, tmp_path):
    cfg = tmp_path / "g.yaml"
    cfg.write_text(yaml.safe_dump({"policy": {"model": str(tiny_model_dir)}, "train_data": str(small_mazes / "train.parquet"),
                                   "output_dir": "/proc/mazerl-run", "steps": 1, "mazes_per_step": 1, "group_size": 2}))
    assert_clear_error(run("train", "grpo", "--config", cfg), "cannot use /proc/mazerl-run")
