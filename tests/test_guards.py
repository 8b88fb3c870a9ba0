"""The promotion guards: a trained model that is significantly worse on any split, loops more, bumps more
walls or takes longer routes is not promoted, whatever its heldout gain; a guard with too few mazes to
tell says so (issue #34)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from conftest import assert_clear_error
from mazerl.cli import app
from mazerl.config import ConfigError
from mazerl.evaluation.guards import GuardSettings, evaluate_guards
from mazerl.evaluation.runner import EvalConfig, evaluate
from mazerl.mazes.layout import MazeError
from mazerl.evaluation.guards import guard_settings
from mazerl.workflow import compare

runner = CliRunner()
GUARD_FIELDS = {"name", "split", "metric", "base", "new", "p", "tolerance", "decided", "passed"}


def _episodes(n: int, success: float, loop: float = 0.1, bumps: float = 0.0, steps: float = 1.2, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ok = np.arange(n) < round(success * n)
    turns = np.full(n, 18)
    return pd.DataFrame({"success": ok, "loop": np.arange(n) < round(loop * n),
                         "wall_bumps": np.round(bumps * turns + rng.integers(0, 2, n)).astype(int), "turns": turns,
                         "steps_over_optimal": np.where(ok, steps + rng.uniform(0, 0.05, n), np.nan)})


def _by_name(guards: list[dict]) -> dict:
    return {g["name"]: g for g in guards}


def test_more_loops_block_a_promotion_that_heldout_success_alone_would_pass():
    base, new = _episodes(300, 0.30, loop=0.10), _episodes(300, 0.47, loop=0.19)
    guards = _by_name(evaluate_guards({"heldout": (base, new)}, GuardSettings()))
    assert guards["success:heldout"]["passed"] and guards["success:heldout"]["decided"]
    loop = guards["loop_rate"]
    assert not loop["passed"] and loop["decided"] and loop["p"] <= 0.05 and loop["new"] > loop["base"]
    # within its tolerance the same rise passes
    tolerant = _by_name(evaluate_guards({"heldout": (base, new)}, GuardSettings(loop_tolerance=0.1)))
    assert tolerant["loop_rate"]["passed"]


def test_loops_on_a_larger_level_block_only_where_guard_loop_splits_names_that_split():
    """Heldout's loops as they were, hard-64's doubled (the 4x4 hour's pattern): the default guards heldout's only;
    naming the split (or '' for every split) adds its own loop guard, which blocks."""
    paired = {"heldout": (_episodes(500, 0.3, loop=0.11), _episodes(500, 0.6, loop=0.11)),
              "visgym-hard-64": (_episodes(300, 0.1, loop=0.15, seed=3), _episodes(300, 0.2, loop=0.35, seed=3))}
    default = _by_name(evaluate_guards(paired, guard_settings({})))
    assert default["loop_rate"]["passed"] and "loop_rate:visgym-hard-64" not in default
    for value in ("heldout,visgym-hard-64", ""):
        named = _by_name(evaluate_guards(paired, guard_settings({"guard_loop_splits": value})))
        hard = named["loop_rate:visgym-hard-64"]
        assert not hard["passed"] and hard["split"] == "visgym-hard-64" and hard["metric"] == "loop rate"
        assert (hard["base"], hard["new"]) == (0.15, 0.35) and named["loop_rate"]["passed"]
    assert guard_settings({"guard_loop_splits": "heldout, visgym-hard-64"}).loop_splits == ["heldout", "visgym-hard-64"]
    # a comparison without heldout still gets its other guards by default, and a clear error where heldout is named
    only_hard = {"visgym-hard-64": paired["visgym-hard-64"]}
    assert "loop_rate" not in _by_name(evaluate_guards(only_hard, GuardSettings()))
    with pytest.raises(MazeError, match="guard_loop_splits names 'heldout'"):
        evaluate_guards(only_hard, guard_settings({"guard_loop_splits": "heldout"}))


def test_a_split_significantly_worse_blocks_and_a_small_one_is_undecided_not_passed():
    paired = {"heldout": (_episodes(300, 0.3), _episodes(300, 0.4)),
              "larger": (_episodes(200, 0.5, seed=1), _episodes(200, 0.3, seed=1)),
              "visual-shift": (_episodes(12, 0.25, seed=2), _episodes(12, 0.25, seed=2))}
    guards = _by_name(evaluate_guards(paired, GuardSettings()))
    assert not guards["success:larger"]["passed"]
    small = guards["success:visual-shift"]
    assert small["passed"] and not small["decided"] and "12 mazes cannot rule out" in small["why"]
    assert all(GUARD_FIELDS <= set(g) for g in guards.values())


def test_wall_bumps_and_longer_routes_are_guarded():
    base, new = _episodes(300, 0.5, bumps=0.05, steps=1.2), _episodes(300, 0.5, bumps=0.30, steps=1.6)
    guards = _by_name(evaluate_guards({"heldout": (base, new)}, GuardSettings()))
    assert not guards["wall_bumps_per_turn"]["passed"] and not guards["steps_over_optimal"]["passed"]
    same = _by_name(evaluate_guards({"heldout": (base, base.copy())}, GuardSettings()))
    assert all(g["passed"] and g["decided"] for g in same.values())


@pytest.fixture(scope="module")
def oracle_and_random(small_mazes, tmp_path_factory):
    out = tmp_path_factory.mktemp("evals")
    data = [str(small_mazes / "heldout.parquet"), str(small_mazes / "tiny.parquet")]
    evaluate(EvalConfig(policy="oracle", data=data, out=str(out / "oracle")))
    evaluate(EvalConfig(policy="random", data=data, out=str(out / "random")))
    return out


def test_the_decision_names_the_guard_that_blocked_even_with_the_main_rule_met(oracle_and_random, tmp_path):
    """A worse model with the gate opened (min_gain -1.5, p <= 1): the main rule is met, the guards block it."""
    e = oracle_and_random
    result = compare(str(e / "oracle"), str(e / "random"), str(tmp_path / "cmp"), -1.5, 1.0)
    d = result["decision"]
    assert d["criterion_met"] and not d["improved"] and "success:heldout" in d["blocked_by"]
    saved = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert saved["decision"]["blocked_by"] == d["blocked_by"] and {g["split"] for g in saved["guards"]} >= {"heldout", "tiny"}
    assert all(GUARD_FIELDS <= set(g) for g in saved["guards"])
    assert "BLOCKS" in (tmp_path / "cmp" / "compare.md").read_text() and "blocked by" in (tmp_path / "cmp" / "compare.md").read_text()
    # the other way round nothing blocks, and without guards the same worse model would have been promoted
    better = compare(str(e / "random"), str(e / "oracle"), str(tmp_path / "cmp2"), 0.0, 0.05)["decision"]
    assert better["improved"] and better["blocked_by"] == []
    unguarded = compare(str(e / "oracle"), str(e / "random"), str(tmp_path / "cmp3"), -1.5, 1.0, {"guards": False})
    assert unguarded["decision"]["improved"] and unguarded["guards"] == []


def test_eval_compare_prints_the_guards(oracle_and_random, tmp_path):
    e = oracle_and_random
    result = runner.invoke(app, ["eval", "compare", str(e / "oracle"), str(e / "random"), "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert "guards" in result.output and "BLOCKS" in result.output


# ---- bad input -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("values,named", [({"guard_p_value": 0.0}, "guard_p_value"), ({"guard_p_value": 1.5}, "guard_p_value"),
                                          ({"guard_loop_tolerance": -0.1}, "guard_loop_tolerance"),
                                          ({"guard_success_tolerance": -1}, "guard_success_tolerance"),
                                          ({"guard_margin": 2.0}, "guard_margin")])
def test_guard_parameters_out_of_range_are_named(values, named):
    with pytest.raises(ConfigError, match=named):
        guard_settings(values)


@pytest.mark.parametrize("parameter", ["guard_splits", "guard_loop_splits"])
def test_a_guard_naming_a_split_the_evaluation_lacks_is_a_clear_error(oracle_and_random, tmp_path, parameter):
    e = oracle_and_random
    with pytest.raises(MazeError, match=f"{parameter} names 'larger'.*evaluated: heldout, tiny"):
        compare(str(e / "oracle"), str(e / "random"), str(tmp_path / "cmp"), 0.0, 0.05, {parameter: "heldout,larger"})
    assert not (tmp_path / "cmp" / "comparison.json").exists()


def test_a_pipeline_run_with_a_negative_guard_tolerance_is_refused_before_it_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["pipeline", "run", "--config", "smoke", "--param", "guard_loop_tolerance=-0.1"])
    assert_clear_error(result, "guard_loop_tolerance")
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("comparison.json"))


@pytest.mark.parametrize("args, named", [
    (["--param", "guard_loop_splits=heldout,visgym-hard"], "guard_loop_splits names 'visgym-hard'"),
    (["--param", "guard_splits=heldout,larger,nope"], "guard_splits names 'nope'"),
    # without the reference file there is no hard-64 to guard
    (["--reference", "none", "--param", "guard_loop_splits=visgym-hard-64"], "guard_loop_splits names 'visgym-hard-64'")])
def test_a_pipeline_run_guarding_a_split_it_will_not_evaluate_is_refused_before_it_starts(args, named, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["pipeline", "run", "--config", "smoke", *args])
    assert_clear_error(result, named)
    assert "evaluated: heldout, larger, algorithm-shift, visual-shift" in " ".join(result.output.split())
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("comparison.json"))


def test_the_splits_a_run_will_evaluate_are_the_presets_and_the_reference_files():
    from mazerl.profiles import load_profile
    from mazerl.pipelines.run import check_arguments
    from mazerl.workflow import evaluation_split_names

    assert evaluation_split_names("smoke", "visgym")[-2:] == ["visgym-easy-64", "visgym-hard-64"]
    assert "train" not in evaluation_split_names("default", "none")
    checked = check_arguments(load_profile("local"), {"guard_loop_splits": "heldout,visgym-hard-64", "guard_splits": ""})
    assert checked["guard_loop_splits"] == "heldout,visgym-hard-64"


@pytest.mark.parametrize("script, option, value, allowed", [
    ("bench_retraining.py", "--rounds", "0", ">= 1"), ("bench_retraining.py", "--rounds", "-2", ">= 1"),
    ("bench_retraining.py", "--rounds", "three", ">= 1"), ("bench_retraining.py", "--param", "grpo_steps", "KEY=VALUE"),
    ("bench_retraining.py", "--from-json", "no-such-retraining.json", "not a retraining.json"),
    ("bench_signals.py", "--variants", "", "baseline, no-loop-penalty, revisit"),
    ("bench_signals.py", "--variants", "baseline,loops-off", "baseline, no-loop-penalty, revisit"),
    ("bench_signals.py", "--variants", "nope", "baseline, no-loop-penalty, revisit"),
    ("bench_signals.py", "--train-seeds", "1,x", "non-negative integers"),
    ("bench_signals.py", "--train-seeds", "-1", "non-negative integers"),
    ("bench_learning.py", "--train-pool", "nope", "mixed-sizes"),
    ("bench_learning.py", "--train-pool", "mostly-4x4 --train-data x.parquet", "not both"),
    ("bench_continuation.py", "--run", "nowhere --steps 5 --mazes nowhere", "not a pipeline train-grpo task directory"),
    ("bench_continuation.py", "--steps", "0 --run nowhere --mazes nowhere", "give 1 or more")])
def test_a_benchmark_refuses_a_bad_option_before_it_writes_anything(script, option, value, allowed, tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), option, *value.split(" "), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and option in proc.stderr and allowed in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "o").exists()


def test_bench_pipeline_refuses_a_log_that_is_not_there(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_pipeline.py"), "--from-log",
                           str(tmp_path / "pipeline.log")], capture_output=True, text=True)
    assert proc.returncode == 2 and "--from-log" in proc.stderr and "runs/<run>/pipeline.log" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bench_retraining_reports_an_earlier_run_with_each_rounds_decision(tmp_path):
    """--from-json redraws an earlier run's curve and table without running anything; a round that was not
    promoted is labelled with what stopped it, and the summary counts only promoted models."""
    import json
    import subprocess
    import sys

    from conftest import ROOT

    def record(k, promoted, blocked, new, loops):
        return {"round": k, "seconds": 700.0, "start_model": "/r/models/m1", "promoted": promoted, "blocked_by": blocked,
                "heldout_base": 0.444, "heldout_new": new, "heldout_p": 0.01, "loop_base": 0.142, "loop_new": loops,
                "loop_p": 0.005, "hard64_base": 0.172, "hard64_new": 0.188}
    rounds = [{**record(1, True, [], 0.444, 0.142), "heldout_base": 0.312, "loop_base": 0.112, "start_model": "/a/tiny-base"},
              record(2, False, ["loop_rate"], 0.482, 0.182), record(3, False, [], 0.466, 0.098)]
    source = tmp_path / "retraining.json"
    source.write_text(json.dumps({"config": "default", "rounds": rounds}))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_retraining.py"), "--from-json", str(source)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split("|")[-2].strip() for row in rows] == ["promoted", "blocked: loop_rate", "not significant"]
    assert "0.312 -> 0.444 (+13.2 points)" in proc.stdout
    assert (tmp_path / "retraining.png").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["retraining.json", "retraining.png"]


def test_routes_a_little_longer_than_an_optimal_base_pass_the_default_steps_tolerance():
    """The 2026-12-05 demo: tiny-base solves only along the optimal route (steps/optimal 1.000); the trained model's
    shared solves were 1.034 on average. Within the default 0.05 that passes; at tolerance 0 it blocks."""
    base = _episodes(117, 1.0, steps=1.0)
    base["steps_over_optimal"] = 1.0
    new = base.copy()
    new.loc[:10, "steps_over_optimal"] = 1.36  # 11 of 117 mazes with a detour: +0.034 on average
    default = _by_name(evaluate_guards({"heldout": (base, new)}, GuardSettings()))["steps_over_optimal"]
    assert default["passed"] and default["decided"] and "within its tolerance" in default["why"]
    strict = _by_name(evaluate_guards({"heldout": (base, new)}, GuardSettings(steps_tolerance=0.0)))["steps_over_optimal"]
    assert not strict["passed"] and strict["p"] < 0.001


def test_bench_signals_counts_the_training_time_of_a_resumed_run_from_its_first_step():
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("bench_signals", ROOT / "benchmarks" / "bench_signals.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # steps 1-2 before an interruption, 3-4 after the resume: the trainer's total restarts at the resume
    metrics = [{"step": 0, "eval/success": 0.3}, {"step": 1, "time/step": 30.0, "time/training_total": 30.0},
               {"step": 2, "time/step": 30.0, "time/training_total": 60.0},
               {"step": 3, "time/step": 60.0, "time/training_total": 60.0},
               {"step": 4, "time/step": 60.0, "time/training_total": 120.0}]
    assert bench.training_minutes(metrics) == 3.0
    # every variant with its own train split names a variant and a pool that exist
    assert all(v in bench.VARIANTS and pool in bench.POOLS for v, pool in bench.TRAIN_POOLS.items())
