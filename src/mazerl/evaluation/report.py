"""HTML (self-contained) and Markdown reports of an evaluation or a comparison, with pictures.

Charts: success per split and per size with 95% Wilson whiskers, failure categories, steps over
optimal, the training curve when a metrics log is given, and filmstrips of a few failed and solved
episodes (the frames the model saw, with its moves) so a reader can watch a loop or a dead end.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ..atomic import write_bytes, write_text  # noqa: E402
from ..mazes.dataset_io import read_split, row_render_options, row_to_maze  # noqa: E402
from ..mazes.render import FrameRenderer  # noqa: E402
from .episodes import FAILURE_CATEGORIES  # noqa: E402

ARROWS = {"right": "→", "up": "↑", "left": "←", "down": "↓", "stop": "■", "invalid": "?"}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _bar_with_ci(labels: list[str], values: list[float], cis: list[list[float]], title: str) -> bytes:
    fig, ax = plt.subplots(figsize=(max(4, 1.1 * len(labels)), 3.2))
    x = np.arange(len(labels))
    err = np.clip(np.array([[v - lo for v, (lo, hi) in zip(values, cis)], [hi - v for v, (lo, hi) in zip(values, cis)]]), 0, None)
    ax.bar(x, values, yerr=err, capsize=4, color="#4c72b0")
    ax.set_xticks(x, labels, rotation=30, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("success (95% Wilson CI)")
    ax.set_title(title)
    return _png(fig)


def _failures_chart(summary: dict) -> bytes:
    splits = list(summary["splits"])
    fig, ax = plt.subplots(figsize=(max(4, 1.1 * len(splits)), 3.2))
    bottom = np.zeros(len(splits))
    for cat in FAILURE_CATEGORIES:
        vals = np.array([summary["splits"][s]["greedy"]["failure_categories"][cat] / summary["splits"][s]["greedy"]["episodes"] for s in splits])
        ax.bar(splits, vals, bottom=bottom, label=cat.replace("_", " "))
        bottom += vals
    ax.set_ylabel("share of episodes")
    ax.set_title("why episodes failed")
    ax.legend(fontsize=7, loc="upper right")
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    return _png(fig)


def _steps_hist(episodes: pd.DataFrame) -> bytes:
    fig, ax = plt.subplots(figsize=(5, 3))
    solved = episodes[episodes.greedy & episodes.success]
    if len(solved):
        ax.hist(solved.steps_over_optimal, bins=np.arange(1.0, max(2.0, solved.steps_over_optimal.max()) + 0.25, 0.125))
    ax.set_xlabel("moves / optimal (solved episodes)")
    ax.set_ylabel("episodes")
    ax.set_title("solution length")
    return _png(fig)


# The training panel: each per-step figure GRPO logs, one small chart each, so a run whose success
# stays flat still shows what moved (reward, format, entropy).
TRAINING_PANELS = (
    ("success", (("success_rate", "training episodes (sampled)"), ("eval/success", "held-out (greedy)"))),
    ("reward", (("reward_mean", "mean episode reward"),)),
    ("parse failures per turn", (("parse_failure_rate", "training episodes"),)),
    ("entropy (nats per token)", (("entropy", "policy entropy"),)),
)


def check_training_curve(metrics: list[dict], path) -> None:
    """Every record that holds a figure the curve plots has a whole-number `step`, and the figures are
    numbers (null stands for a non-finite value): checked before an evaluation plays, not after."""
    from ..metrics import MetricsFileError

    plotted = [key for _, series in TRAINING_PANELS for key, _ in series]
    for number, record in enumerate(metrics, start=1):
        keys = [k for k in plotted if k in record]
        if not keys:
            continue
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise MetricsFileError(f"{path}: record {number} has {keys[0]} but no whole-number step (step = {step!r}); "
                                   "every record of a training log needs its step")
        for key in keys:
            value = record[key]
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise MetricsFileError(f"{path}: record {number} (step {step}): {key} = {value!r} is not a number")


def _curve(metrics: list[dict]) -> bytes | None:
    panels = [(title, [(label, [(r["step"], r[key]) for r in metrics if key in r]) for key, label in series])
              for title, series in TRAINING_PANELS]
    panels = [(title, [(label, pts) for label, pts in series if pts]) for title, series in panels]
    panels = [(title, series) for title, series in panels if series]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels):
        for label, pts in series:
            ax.plot(*zip(*pts), marker="o" if len(pts) < 30 else None, markersize=3, label=label)
        ax.set_xlabel("step")
        ax.set_title(title, fontsize=9)
        if len(series) > 1:
            ax.legend(fontsize=7)
    fig.suptitle("training", fontsize=10)
    return _png(fig)


def filmstrip(maze_row, episode, max_frames: int = 12) -> bytes:
    """The frames of one episode with the move taken after each."""
    maze = row_to_maze(maze_row)
    renderer = FrameRenderer(maze.grid, maze.goal, row_render_options(maze_row))
    path = [tuple(p) for p in episode["path"]]
    actions = list(episode["actions"])
    n = min(len(path), max_frames)
    fig, axes = plt.subplots(1, n, figsize=(1.3 * n, 1.6))
    axes = np.atleast_1d(axes)
    for i, ax in enumerate(axes):
        ax.imshow(renderer.frame(path[i]))
        ax.set_xticks([])
        ax.set_yticks([])
        move = actions[i] if i < len(actions) else ""
        ax.set_title(f"{i + 1} {ARROWS.get(move, move)}", fontsize=8)
    title = f"{episode['maze_id']}: {'solved' if episode['success'] else episode['failure_category']}"
    fig.suptitle(title, fontsize=9)
    return _png(fig)


def _b64(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def eval_tables(summary: dict) -> list[list[str]]:
    head = ["split", "n", "success", "95% CI", "steps/opt", "SPL", "loops", "bumps/turn", "dead ends/ep", "recovery", "parse fail"]
    rows = [head]
    for split, e in summary["splits"].items():
        g = e["greedy"]
        rows.append([split, str(g["episodes"]), f"{g['success']:.3f}", f"{g['success_ci95'][0]:.3f}–{g['success_ci95'][1]:.3f}",
                     _fmt(g["steps_over_optimal"]), f"{g['spl']:.3f}", f"{g['loop_rate']:.3f}", f"{g['wall_bump_rate']:.3f}",
                     f"{g['dead_end_entries_per_episode']:.2f}", _fmt(g["mean_recovery_turns"]), f"{g['parse_failure_rate']:.3f}"])
    return rows


def _html_table(rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _md_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines)


CSS = "body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}img{max-width:100%}"


def write_eval_report(eval_dir: str | Path, summary: dict, episodes: pd.DataFrame, metrics: list[dict] | None = None,
                      filmstrips: int = 3) -> tuple[Path, Path]:
    """report.html (images embedded) and report.md (+ report_files/*.png) in `eval_dir`."""
    eval_dir = Path(eval_dir)
    figures: list[tuple[str, bytes]] = []
    splits = list(summary["splits"])
    figures.append(("success per split", _bar_with_ci(
        splits, [summary["splits"][s]["greedy"]["success"] for s in splits],
        [summary["splits"][s]["greedy"]["success_ci95"] for s in splits], "greedy success per split")))
    sizes: dict[str, list[int]] = {}
    for s in splits:
        for size, b in summary["splits"][s]["strata"]["size"].items():
            acc = sizes.setdefault(size, [0, 0])
            acc[0] += b["successes"]
            acc[1] += b["episodes"]
    from .stats import wilson_interval

    size_labels = sorted(sizes, key=lambda k: int(k.split("x")[0]))
    figures.append(("success per size", _bar_with_ci(
        size_labels, [sizes[k][0] / sizes[k][1] for k in size_labels],
        [list(wilson_interval(*sizes[k])) for k in size_labels], "greedy success per maze size (all splits)")))
    figures.append(("failure categories", _failures_chart(summary)))
    figures.append(("steps over optimal", _steps_hist(episodes)))
    if metrics:
        curve = _curve(metrics)
        if curve:
            figures.append(("training curve", curve))
    data_paths = {Path(p).stem: p for p in summary.get("meta", {}).get("data", [])}
    strips: list[tuple[str, bytes]] = []
    greedy = episodes[episodes.greedy]
    for label, subset in (("failed", greedy[~greedy.success]), ("solved", greedy[greedy.success])):
        for _, ep in subset.head(filmstrips).iterrows():
            split_file = data_paths.get(ep["split"])
            if split_file is None:
                continue
            df = read_split(split_file)
            row = df[df.maze_id == ep["maze_id"]].iloc[0]
            strips.append((f"{label}: {ep['maze_id']}", filmstrip(row, ep)))
    table = eval_tables(summary)
    meta = summary.get("meta", {})
    title = f"mazerl evaluation: {meta.get('policy', '')} {meta.get('model') or ''}".strip()
    view_line = view_text(meta)
    parts = [f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>"]
    if view_line:
        parts.append(f"<p class='view'>{html.escape(view_line)}</p>")
    parts.append(_html_table(table))
    parts += [f"<h2>{html.escape(name)}</h2><img src='{_b64(png)}'>" for name, png in figures]
    if strips:
        parts.append("<h2>episodes</h2>")
        parts += [f"<h3>{html.escape(name)}</h3><img src='{_b64(png)}'>" for name, png in strips]
    parts.append("</body></html>")
    html_path = eval_dir / "report.html"
    write_text(html_path, "\n".join(parts))
    md = [f"# {title}", ""] + ([view_line, ""] if view_line else []) + [_md_table(table), ""]
    for i, (name, png) in enumerate(figures + strips):
        rel = f"report_files/figure{i:02d}.png"
        write_bytes(eval_dir / rel, png)
        md += [f"## {name}", "", f"![{name}]({rel})", ""]
    md_path = eval_dir / "report.md"
    write_text(md_path, "\n".join(md))
    return html_path, md_path


def view_text(meta: dict) -> str | None:
    """One line saying how the model was shown the mazes: the view's name, where it came from, its settings."""
    choice, settings = meta.get("view_choice"), meta.get("view")
    if not choice or settings is None:
        return None
    shown = ", ".join(f"{k} {json.dumps(v, sort_keys=True)}" for k, v in sorted(settings.items()))
    line = f"View: {choice.get('name')} ({choice.get('source')}; hash {choice.get('hash')}): {shown}"
    if choice.get("replaced_saved_view") is not None:
        line += f"; replaces the model's saved view {json.dumps(choice['replaced_saved_view'], sort_keys=True)}"
    return line


def compare_tables(cmp: dict) -> list[list[str]]:
    rows = [["split", "mazes", "base", "new", "diff", "95% CI", "McNemar p", "loops base→new", "loops p", "Δ steps/opt"]]
    for split, c in cmp["splits"].items():
        steps = c["steps_over_optimal_diff"]
        rows.append([split, str(c["mazes"]), f"{c['success_base']:.3f}", f"{c['success_new']:.3f}", f"{c['success_diff']:+.3f}",
                     f"{c['success_diff_ci95'][0]:+.3f}…{c['success_diff_ci95'][1]:+.3f}", f"{c['mcnemar_p']:.3g}",
                     f"{c['loop_rate_base']:.3f}→{c['loop_rate_new']:.3f}", f"{c['loop_mcnemar_p']:.3g}",
                     "–" if steps is None else f"{steps['diff']:+.3f}"])
    return rows


def guard_tables(cmp: dict) -> list[list[str]]:
    """One row per guard (empty without guards), and the decision's verdict on it."""
    if not cmp.get("guards"):
        return []

    def num(x) -> str:
        return "–" if x is None else f"{x:.3f}"

    rows = [["guard", "split", "mazes", "base", "new", "p", "tolerance", "verdict"]]
    for g in cmp["guards"]:
        verdict = "BLOCKS" if not g["passed"] else "passes" if g["decided"] else "undecided"
        rows.append([g["name"], g["split"], str(g["pairs"]), num(g["base"]), num(g["new"]), f"{g['p']:.3g}",
                     f"{g['tolerance']:g}", f"{verdict}: {g['why']}"])
    return rows


def decision_line(cmp: dict) -> str:
    """The promotion decision in one sentence (empty without one)."""
    d = cmp.get("decision")
    if not d:
        return ""
    rule = (f"heldout {d['success_diff']:+.3f}, p = {d['p_value']:.3g}; rule: gain > {d['min_gain']} and p <= "
            f"{d['max_p_value']}: {'met' if d.get('criterion_met', d['improved']) else 'not met'}")
    guards = (f"; blocked by {', '.join(d['blocked_by'])}" if d.get("blocked_by") else
              "; no guard blocks" if "blocked_by" in d else "")
    undecided = f" (undecided, too few mazes: {', '.join(d['undecided'])})" if d.get("undecided") else ""
    return f"promote: {'yes' if d['improved'] else 'no'} ({rule}{guards}{undecided})"


def write_compare_report(out_dir: str | Path, cmp: dict) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    splits = list(cmp["splits"])
    fig, ax = plt.subplots(figsize=(max(4, 1.1 * len(splits)), 3.2))
    x = np.arange(len(splits))
    diffs = [cmp["splits"][s]["success_diff"] for s in splits]
    lo = [d - cmp["splits"][s]["success_diff_ci95"][0] for d, s in zip(diffs, splits)]
    hi = [cmp["splits"][s]["success_diff_ci95"][1] - d for d, s in zip(diffs, splits)]
    ax.bar(x, diffs, yerr=np.clip([lo, hi], 0, None), capsize=4, color="#55a868")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x, splits, rotation=30, ha="right")
    ax.set_ylabel("success: new - base (95% CI)")
    png = _png(fig)
    table = compare_tables(cmp)
    guards = guard_tables(cmp)
    verdict = decision_line(cmp)
    title = f"mazerl comparison: {cmp['new']} vs {cmp['base']}"
    html_path = out_dir / "compare.html"
    write_text(html_path, f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
               f"<h1>{html.escape(title)}</h1>" + (f"<p><b>{html.escape(verdict)}</b></p>" if verdict else "")
               + f"{_html_table(table)}" + (f"<h2>guards</h2>{_html_table(guards)}" if guards else "")
               + f"<h2>success difference</h2><img src='{_b64(png)}'></body></html>")
    write_bytes(out_dir / "compare_files" / "difference.png", png)
    md_path = out_dir / "compare.md"
    write_text(md_path, f"# {title}\n\n" + (f"**{verdict}**\n\n" if verdict else "") + f"{_md_table(table)}\n\n"
               + (f"## guards\n\n{_md_table(guards)}\n\n" if guards else "")
               + "![success difference](compare_files/difference.png)\n")
    return html_path, md_path
