"""Wall-clock time of the whole local DAG (`mazerl pipeline run --profile local`), per task.

    python benchmarks/bench_pipeline.py --config smoke [--json out.json]
    python benchmarks/bench_pipeline.py --from-log outputs/pipeline/runs/<run>/pipeline.log

Runs the CLI in a subprocess (as `make demo` does), then reads kfp.local's task start/finish lines
from the run's pipeline.log and the promotion decision from compare/. Targets (issue #5): smoke
<= 5 min, default <= 20 min on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
EVENT = re.compile(r"^(\d\d:\d\d:\d\d\.\d+) - INFO - (?:Executing task '([^']+)'|Task '([^']+)' finished with status (\w+))")


def task_durations(log_text: str) -> list[dict]:
    """[{task, seconds, status}] in the order the tasks ran."""
    started: dict[str, datetime] = {}
    rows = []
    for line in log_text.splitlines():
        m = EVENT.match(ANSI.sub("", line))
        if not m:
            continue
        stamp = datetime.strptime(m.group(1), "%H:%M:%S.%f")
        if m.group(2):
            started[m.group(2)] = stamp
        elif m.group(3) in started:
            seconds = (stamp - started.pop(m.group(3))).total_seconds() % 86400  # across midnight
            rows.append({"task": m.group(3), "seconds": round(seconds, 1), "status": m.group(4)})
    return rows


def report(run_dir: Path, total_s: float | None, log: Path | None = None) -> dict:
    tasks = task_durations((log or run_dir / "pipeline.log").read_text(errors="replace"))
    comparison = run_dir / "compare" / "result" / "comparison.json"
    decision = json.loads(comparison.read_text())["decision"] if comparison.exists() else None
    out = {"run_dir": str(run_dir), "total_s": total_s, "tasks": tasks, "tasks_total_s": round(sum(t["seconds"] for t in tasks), 1),
           "decision": decision}
    for t in tasks:
        print(f"  {t['task']:<16} {t['seconds']:>7.1f} s  {t['status']}")
    if total_s is not None:
        print(f"  {'whole command':<16} {total_s:>7.1f} s  ({total_s / 60:.1f} min)")
    if decision:
        print(f"  promotion: {'yes' if decision['improved'] else 'no'} (heldout {decision['success_diff']:+.3f}, p = {decision['p_value']:.3g})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="smoke", choices=["smoke", "default"])
    ap.add_argument("--from-log", type=Path, help="report an existing run's pipeline.log instead of running")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.from_log:
        if not args.from_log.is_file():
            ap.error(f"--from-log {args.from_log}: no such file; give a run's log, "
                     "outputs/pipeline/runs/<run>/pipeline.log")
        out = report(args.from_log.parent, None, args.from_log)
    else:
        runs = REPO / "outputs" / "pipeline" / "runs"
        before = set(runs.glob("mazerl-*"))
        cmd = [sys.executable, "-m", "mazerl.cli", "pipeline", "run", "--profile", "local", "--config", args.config]
        reference = REPO.parent / "shared" / "fixtures" / "visgym_maze2d_public.json"
        if reference.exists():
            cmd += ["--reference", str(reference)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL)
        total = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"the pipeline run failed (exit {proc.returncode})")
        (run_dir,) = sorted(set(runs.glob("mazerl-*")) - before)
        out = report(run_dir, round(total, 1))
        out["config"] = args.config
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
