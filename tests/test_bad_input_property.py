"""Property-based hostile input: random mutations of valid maze tables, dataset configs and VisGym
fixtures. Whatever the mutation, a command either succeeds with a valid result or fails with a clear
message (exit 2; conformance may also report a mismatch, exit 1): never a traceback, and nothing
outside its output directory changes."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.mazes.dataset_io import read_split, records

runner = CliRunner()
# Derandomized so that CI is reproducible; MAZERL_PROPERTY_EXAMPLES=1000 (and a seed of your own via
# --hypothesis-seed) searches wider.
SETTINGS = settings(max_examples=int(os.environ.get("MAZERL_PROPERTY_EXAMPLES", "40")), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

JUNK = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=6), st.lists(st.integers(-2, 3), max_size=3))


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def check_outcome(result, allowed=(0, 2)) -> None:
    assert result.exit_code in allowed, result.output
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code == 2:
        assert "error:" in result.output


@pytest.fixture(scope="module")
def base_rows(small_mazes) -> list[dict]:
    rows = records(read_split(small_mazes / "heldout.parquet"))[:3]
    return [{k: r[k] for k in ("maze_id", "grid", "start", "goal", "max_turns", "palette", "square_px")} for r in rows]


@st.composite
def mutated_table(draw, rows: list[dict]) -> list[dict]:
    rows = json.loads(json.dumps(rows))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(rows) - 1))
        kind = draw(st.sampled_from(["cell", "drop_row", "start", "goal", "id", "turns", "palette", "px", "column"]))
        r = rows[i]
        grid_ok = isinstance(r["grid"], list) and r["grid"] and all(isinstance(x, list) and x for x in r["grid"])
        if kind in ("cell", "drop_row") and not grid_ok:
            continue  # an earlier mutation already replaced the grid
        if kind == "cell":
            y = draw(st.integers(0, len(r["grid"]) - 1))
            x = draw(st.integers(0, len(r["grid"][y]) - 1))
            r["grid"][y][x] = draw(st.integers(-3, 300))
        elif kind == "drop_row":
            r["grid"].pop(draw(st.integers(0, len(r["grid"]) - 1)))
        elif kind in ("start", "goal"):
            r[kind] = draw(st.one_of(st.none(), st.lists(st.integers(-2, 12), min_size=0, max_size=3)))
        elif kind == "id":
            r["maze_id"] = rows[(i + 1) % len(rows)]["maze_id"]
        elif kind == "turns":
            r["max_turns"] = draw(st.one_of(st.integers(-5, 10**9), st.just(0)))
        elif kind == "palette":
            r["palette"] = draw(st.sampled_from(["visgym", "dark", "neon", ""]))
        elif kind == "px":
            r["square_px"] = draw(st.integers(-1, 40_000))
        else:
            col = draw(st.sampled_from(["grid", "start", "goal"]))
            r[col] = draw(JUNK)
    return rows


def _write(rows: list[dict], path: Path) -> bool:
    """Write the table as a user's tool would; False when pyarrow itself cannot (mixed types)."""
    try:
        pq.write_table(pa.Table.from_pylist(rows), path)
        return True
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return False


@SETTINGS
@given(data=st.data())
def test_mutated_maze_tables(base_rows, data):
    rows = data.draw(mutated_table(base_rows))
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "in"
        inputs.mkdir()
        table = inputs / "mine.parquet"
        if not _write(rows, table):
            return
        before = digest(inputs)
        out = Path(tmp) / "out"
        result = runner.invoke(app, ["eval", "--policy", "oracle", "--data", str(table), "--out", str(out)])
        check_outcome(result)
        if result.exit_code == 0:
            summary = json.loads((out / "summary.json").read_text())
            assert summary["meta"]["episodes"] == len(rows)
        else:
            assert not out.exists()
        check_outcome(runner.invoke(app, ["mazes", "show", str(table)]))
        assert digest(inputs) == before


SPLIT_FIELDS = {
    "count": st.one_of(st.integers(-2, 4), JUNK),
    "sizes": st.one_of(st.lists(st.sampled_from(["2", "3x3", "visgym-easy", "0", "99", "abc", "3x"]), max_size=2), JUNK),
    "algorithms": st.one_of(st.lists(st.sampled_from(["wilson", "dfs", "nope"]), max_size=2), JUNK),
    "placement": st.one_of(st.sampled_from(["visgym-corners", "random", "dead-ends", "middle"]), JUNK),
    "min_moves": st.one_of(st.integers(-1, 40), JUNK),
    "max_turns": st.one_of(st.integers(-1, 50), JUNK),
}


@SETTINGS
@given(fields=st.dictionaries(st.sampled_from(sorted(SPLIT_FIELDS)), st.none(), max_size=4),
       name=st.one_of(st.sampled_from(["heldout", "x", "../up", "/abs", "a b", "ok.v2"]), st.text(max_size=5)),
       data=st.data())
def test_mutated_dataset_configs(fields, name, data):
    spec = {"count": 2, "sizes": ["2"]}
    for k in fields:
        spec[k] = data.draw(SPLIT_FIELDS[k])
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cfg = root / "in" / "d.yaml"
        cfg.parent.mkdir()
        try:
            cfg.write_text(yaml.safe_dump({"reference_splits": {}, "splits": {name: spec}}))
        except yaml.YAMLError:
            return
        before = digest(root)
        out = root / "work" / "out"
        result = runner.invoke(app, ["mazes", "generate", "--config", str(cfg), "--out", str(out)])
        check_outcome(result)
        after = {k: v for k, v in digest(root).items() if not k.startswith("work/out/")}
        assert after == before  # nothing written anywhere but inside --out
        if result.exit_code == 0:
            assert (out / "manifest.json").is_file()


@pytest.fixture(scope="module")
def one_episode(visgym_fixture) -> dict:
    doc = json.loads(visgym_fixture.read_text())
    doc["episodes"] = doc["episodes"][:1]
    return doc


@SETTINGS
@given(data=st.data())
def test_mutated_fixtures(one_episode, data):
    doc = json.loads(json.dumps(one_episode))
    ep = doc["episodes"][0]
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(sorted(ep)))
        if data.draw(st.booleans()):
            ep.pop(key)
        else:
            ep[key] = data.draw(JUNK)
        if not ep:
            break
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.json"
        text = json.dumps(doc, allow_nan=True)
        path.write_text(text)
        check_outcome(runner.invoke(app, ["mazes", "conformance", str(path)]), allowed=(0, 1, 2))
        assert path.read_text() == text
