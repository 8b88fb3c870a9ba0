"""Scheduled retraining, rounds back to back: does each round start from the last promoted model and
improve on it?

    python benchmarks/bench_retraining.py --rounds 3 [--config default|smoke] [--param KEY=VALUE] [--out DIR] [--png PATH]

Measured with `--rounds 3 --param grpo_config=tiny-grpo-retrain` (at most 24 training minutes a round at 48
mazes a step; the demo's tiny-grpo, 11 minutes at 16, was too short to compound: docs/BENCHMARKS.md, "Retraining").

Each round is `mazerl pipeline run --profile local` in DIR (one registry for all rounds), exactly as a
recurring run does it: `resolve-model` starts from the registry's last promoted model (tiny-base in round
1), the train seed is drawn from the run id (a fresh one each round), the evaluation splits are the same
frozen files, and the guarded gate decides. A round that is not promoted leaves the registry as it was,
so the next round starts from the same model. Writes DIR/retraining.json (each round's start model,
decision, blocking guards, heldout success and loop rate, VisGym hard-64 success) and the curve (success and
loops per round; --png, default DIR/retraining.png), and prints a Markdown table of the rounds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rounds {text!r}: give a whole number of rounds >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--rounds {value}: give a whole number of rounds >= 1")
    return value


def key_value(text: str) -> str:
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--param {text!r}: give KEY=VALUE, a pipeline parameter and its value")
    return text


def latest_run(root: Path, before: set[Path]) -> Path | None:
    runs = sorted(set(root.glob("outputs/pipeline/runs/mazerl-*")) - before)
    return runs[-1] if runs else None


def round_record(run_dir: Path) -> dict:
    """What one pipeline run decided and measured, from its task outputs."""
    comparison = json.loads((run_dir / "compare" / "result" / "comparison.json").read_text())
    start = json.loads((run_dir / "resolve-model" / "executor_output.json").read_text())["parameterValues"]["Output"]
    splits, d = comparison["splits"], comparison["decision"]
    held = splits["heldout"]
    hard = splits.get("visgym-hard-64", {})
    return {"run": run_dir.name, "start_model": start, "promoted": bool(d["improved"]),
            "blocked_by": d.get("blocked_by", []), "undecided": d.get("undecided", []),
            "heldout_base": held["success_base"], "heldout_new": held["success_new"], "heldout_p": held["mcnemar_p"],
            "loop_base": held["loop_rate_base"], "loop_new": held["loop_rate_new"], "loop_p": held["loop_mcnemar_p"],
            "hard64_base": hard.get("success_base"), "hard64_new": hard.get("success_new")}


def table(rounds: list[dict]) -> str:
    lines = ["| round | start | minutes | heldout success (p) | heldout loops (p) | hard-64 | decision |",
             "|---|---|---|---|---|---|---|"]
    for r in rounds:
        decision = decision_label(r)
        hard = (f"{r['hard64_base']:.3f} -> {r['hard64_new']:.3f}" if r["hard64_base"] is not None else "-")
        lines.append(f"| {r['round']} | {Path(r['start_model']).name} | {r['seconds'] / 60:.1f} | "
                     f"{r['heldout_base']:.3f} -> {r['heldout_new']:.3f} ({r['heldout_p']:.2g}) | "
                     f"{r['loop_base']:.3f} -> {r['loop_new']:.3f} ({r['loop_p']:.2g}) | {hard} | {decision} |")
    return "\n".join(lines)


def decision_label(r: dict) -> str:
    if r["promoted"]:
        return "promoted"
    return f"blocked: {', '.join(r['blocked_by'])}" if r["blocked_by"] else "not significant"


def plot(rounds: list[dict], path: Path) -> None:
    """Each round's candidate (filled: promoted, hollow: not) and the registry's model after the round (the line
    the next round starts from), heldout success and loop rate, with the +30-point target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = list(range(len(rounds) + 1))
    base_success, base_loops = rounds[0]["heldout_base"], rounds[0]["loop_base"]
    registry_success, registry_loops = [base_success], [base_loops]
    for r in rounds:  # a round that is not promoted leaves the registry's model as it was
        registry_success.append(r["heldout_new"] if r["promoted"] else registry_success[-1])
        registry_loops.append(r["loop_new"] if r["promoted"] else registry_loops[-1])
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    ax.step(x, registry_success, "-", where="post", color="tab:blue", label="heldout success, promoted model")
    ax.step(x, registry_loops, "--", where="post", color="tab:orange", label="heldout loop rate, promoted model")
    for i, r in enumerate(rounds, start=1):
        face = "tab:blue" if r["promoted"] else "white"
        ax.plot(i, r["heldout_new"], "o", color="tab:blue", markerfacecolor=face)
        ax.plot(i, r["loop_new"], "s", color="tab:orange", markerfacecolor="tab:orange" if r["promoted"] else "white")
        ax.annotate(decision_label(r), (i, r["heldout_new"]), textcoords="offset points", xytext=(0, 7),
                    ha="center", fontsize=7)
    ax.axhline(base_success + 0.30, color="grey", linestyle=":", linewidth=1)
    ax.annotate("target: base + 30 points", (0, base_success + 0.30), textcoords="offset points", xytext=(2, 3),
                fontsize=7, color="grey")
    ax.set_xticks(x, ["base"] + [f"round {i}" for i in x[1:]])
    ax.set_ylim(0, 1)
    ax.set_ylabel("500 heldout mazes, greedy")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive)
    parser.add_argument("--from-json", type=Path, metavar="PATH",
                        help="draw the curve and print the table of an earlier run's retraining.json; runs nothing")
    parser.add_argument("--config", choices=["default", "smoke"], default="default")
    parser.add_argument("--out", type=Path, default=Path("outputs/retraining"))
    parser.add_argument("--png", type=Path, help="where the curve goes (default: OUT/retraining.png)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", type=key_value,
                        help="pipeline parameter for every round (mazerl pipeline run --param), e.g. grpo_steps=200")
    args = parser.parse_args(argv)
    if args.from_json is not None:
        return report_earlier(parser, args.from_json, args.png)
    if args.rounds is None:
        parser.error("give --rounds N (N >= 1), or --from-json PATH to report an earlier run")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    mazerl = shutil.which("mazerl") or f"{sys.executable} -m mazerl"
    rounds: list[dict] = []
    for k in range(1, args.rounds + 1):
        before = set(out.glob("outputs/pipeline/runs/mazerl-*"))
        t0 = time.time()
        params = [a for kv in args.param for a in ("--param", kv)]
        proc = subprocess.run([*mazerl.split(), "pipeline", "run", "--profile", "local", "--config", args.config, *params],
                              cwd=out, capture_output=True, text=True)
        run_dir = latest_run(out, before)
        if run_dir is None or not (run_dir / "compare" / "result" / "comparison.json").is_file():
            print(f"round {k}: the pipeline failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}", file=sys.stderr)
            return 1
        record = {"round": k, "seconds": round(time.time() - t0, 1), **round_record(run_dir)}
        rounds.append(record)
        print(f"round {k}: from {Path(record['start_model']).name}: heldout {record['heldout_base']:.3f} -> "
              f"{record['heldout_new']:.3f} (p = {record['heldout_p']:.3g}), loops {record['loop_base']:.3f} -> "
              f"{record['loop_new']:.3f}; {'promoted' if record['promoted'] else 'not promoted'}"
              + (f" (blocked by {', '.join(record['blocked_by'])})" if record["blocked_by"] else ""), flush=True)
        (out / "retraining.json").write_text(json.dumps({"config": args.config, "params": args.param, "rounds": rounds}, indent=2) + "\n")
    png = args.png or out / "retraining.png"
    summarise(rounds, png, out / "retraining.json")
    return 0


def summarise(rounds: list[dict], png: Path, source: Path) -> None:
    plot(rounds, png)
    print(table(rounds))
    first = rounds[0]["heldout_base"]
    promoted = [r["heldout_new"] for r in rounds if r["promoted"]]
    last = promoted[-1] if promoted else first
    print(f"last promoted model vs the start: heldout {first:.3f} -> {last:.3f} ({(last - first) * 100:+.1f} points); "
          f"{source}, {png}")


def report_earlier(parser: argparse.ArgumentParser, source: Path, png: Path | None) -> int:
    try:
        rounds = json.loads(source.read_text())["rounds"]
        if not rounds:
            raise ValueError("it lists no rounds")
        for r in rounds:
            missing = {"round", "seconds", "start_model", "promoted", "blocked_by", "heldout_base", "heldout_new",
                       "heldout_p", "loop_base", "loop_new", "loop_p", "hard64_base", "hard64_new"} - set(r)
            if missing:
                raise ValueError(f"round {r.get('round', '?')} lacks {', '.join(sorted(missing))}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        parser.error(f"--from-json {source}: not a retraining.json written by this benchmark ({exc})")
    summarise(rounds, png or source.with_suffix(".png"), source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
