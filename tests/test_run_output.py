"""What a person sees while a local run goes: progress lines, a readable console, the real error."""

import io
import json
import time

import pytest

from mazerl.progress import PREFIX, Progress
from mazerl.metrics import MetricsFileError, read_metrics
from mazerl.task_logs import _Tee, console_line, task_error


def test_progress_lines_name_the_task_count_figures_elapsed_and_eta():
    lines = []
    with Progress("train-grpo", total=10, unit="step", interval=3600, printer=lambda s, flush: lines.append(s)) as p:
        time.sleep(0.05)
        p.update(4, reward=0.41, success=0.375)
        lines.append(p.line())
    first, middle, last = lines[0], lines[-2], lines[-1]
    assert first.startswith(PREFIX) and "train-grpo" in first and "step 0/10" in first
    assert "step 4/10" in middle and "reward 0.41" in middle and "success 0.375" in middle
    assert "elapsed" in middle and "ETA" in middle
    assert last.endswith("done") and "step 4/10" in last


def test_progress_speaks_at_least_every_interval_even_when_nothing_changes():
    lines = []
    with Progress("evaluate-trained", total=None, unit="mazes", interval=0.2, printer=lambda s, flush: lines.append(s)):
        time.sleep(1.3)  # one slow unit of work: no update() calls at all
    assert len(lines) >= 1 + 5  # the opening line, a heartbeat at least every 0.2 s, the closing one


def test_progress_total_follows_a_new_estimate():
    p = Progress("train-grpo", total=90, unit="step", printer=lambda s, flush: None)
    p.update(3)
    assert "step 3/90" in p.line()
    p.update(4, total=28)  # the schedule fitted to the deadline: 28 steps will run
    assert "step 4/28" in p.line()
    p.update(5)  # no new estimate: the last one stands
    assert "step 5/28" in p.line()


def test_progress_eta_respects_a_time_budget():
    p = Progress("train-grpo", total=1000, unit="step", deadline_s=60, printer=lambda s, flush: None)
    p._started -= 30  # 30 s in, 1 step done: steps alone say ~8 hours, the budget says 30 s
    p.update(1)
    assert "ETA 00:30" in p.line() or "ETA 00:29" in p.line()


def test_console_keeps_task_boundaries_and_progress_and_drops_executor_chatter():
    assert console_line("\x1b[96mExecuting task 'train-grpo'\x1b[0m") == "> train-grpo"
    assert console_line("Task 'train-grpo' finished with status \x1b[92mSUCCESS\x1b[0m") == "ok: train-grpo"
    assert console_line("Task 'warm-start' finished with status FAILURE") == "FAILURE: warm-start"
    assert console_line(f"{PREFIX} train-grpo  step 3/9  reward 0.2") == "  train-grpo  step 3/9  reward 0.2"
    assert console_line('{"inputs": {"parameterValues": {"model": "tiny-base"}}}') is None
    assert console_line("Streamed logs:") is None
    terminal, log = io.StringIO(), io.StringIO()
    tee = _Tee(terminal, log, console_line)
    tee.write("Executing task 'compare'\nsome json {\n")
    tee.write(f"{PREFIX} compare  done\npartial line without end")
    assert log.getvalue().endswith("partial line without end")  # the log gets everything, as written
    assert terminal.getvalue() == "> compare\n  compare  done\n"  # the console: whole lines, filtered


def test_task_error_finds_the_exception_a_task_ended_with(tmp_path):
    log = tmp_path / "task.log"
    log.write_text("Executing task 'warm-start'\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "mazerl.config.ConfigError: config file not found: /x/no-such-sft.yaml\n"
                   "Task 'warm-start' finished with status FAILURE\n")
    assert task_error(log) == "ConfigError: config file not found: /x/no-such-sft.yaml"
    log.write_text("nothing went wrong here\n")
    assert task_error(log) is None


def test_read_metrics_tolerates_only_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}) + "\n" + '{"step": 3, "rew')
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    path.write_text(json.dumps({"step": 1}) + "\n" + "garbage\n" + json.dumps({"step": 3}) + "\n")
    with pytest.raises(MetricsFileError, match="line 2"):
        read_metrics(path)
