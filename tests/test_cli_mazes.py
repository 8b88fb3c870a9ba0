import json

import pytest
import typer
from typer.testing import CliRunner

from mazerl.cli import app

runner = CliRunner()


def all_command_paths(typer_app: typer.Typer, prefix=()):
    group = typer.main.get_command(typer_app)

    def walk(cmd, path):
        yield path
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, (*path, name))

    yield from walk(group, prefix)


@pytest.mark.parametrize("path", list(all_command_paths(app)), ids=lambda p: " ".join(p) or "mazerl")
def test_every_command_has_help(path):
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_conformance_on_the_visgym_fixture(visgym_fixture):
    result = runner.invoke(app, ["mazes", "conformance", str(visgym_fixture)])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == "128/128 episodes match"


def test_conformance_reports_a_mismatch(tmp_path, visgym_fixture):
    doc = json.loads(visgym_fixture.read_text())
    step = next(s for e in doc["episodes"] for s in e["random_steps"] if s["feedback"] == "Cannot move into a wall.")
    step["feedback"] = "Ouch."
    doc["episodes"][-1]["random_steps"][0]["agent"] = [0, 0]
    bad = tmp_path / "tampered.json"
    bad.write_text(json.dumps(doc))
    result = runner.invoke(app, ["mazes", "conformance", str(bad)])
    assert result.exit_code == 1
    assert "'Ouch.'" in result.output and "agent ours" in result.output
    assert result.output.strip().splitlines()[-1] == "126/128 episodes match"


def test_generate_show_and_errors(tmp_path, visgym_fixture):
    out = tmp_path / "mazes"
    result = runner.invoke(app, ["mazes", "generate", "--preset", "smoke", "--out", str(out), "--reference", str(visgym_fixture)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["heldout"]["rows"] == 128
    assert "manifest:" in result.output

    again = runner.invoke(app, ["mazes", "generate", "--preset", "smoke", "--out", str(out)])
    assert again.exit_code == 2 and "not empty" in again.output

    shown = runner.invoke(app, ["mazes", "show", str(out / "heldout.parquet"), "--index", "3", "--png", str(tmp_path / "m.png")])
    assert shown.exit_code == 0, shown.output
    assert "#########" in shown.output and (tmp_path / "m.png").stat().st_size > 0
    assert runner.invoke(app, ["mazes", "show", str(out / "heldout.parquet"), "--index", "999"]).exit_code == 2

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("splits:\n  heldout:\n    count: 5\n    algorithm: [wilson]\n")
    bad = runner.invoke(app, ["mazes", "generate", "--config", str(cfg), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "algorithm" in bad.output and not (tmp_path / "x").exists()
    both = runner.invoke(app, ["mazes", "generate", "--config", str(cfg), "--preset", "smoke", "--out", str(tmp_path / "y")])
    assert both.exit_code == 2 and "exactly one" in both.output
