"""`mazerl eval`: play every maze of the given splits and write episodes.parquet + summary.json.

The model plays greedily (one episode per maze) through the same batched rollout engine as
training; `samples` adds k sampled episodes per maze (pass@k, mean success). The oracle (BFS moves)
and random (uniform over legal moves and stop) agents play through the same environment and
metrics, without a model.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Literal

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..atomic import atomic_directory, check_output_dir, existing_path, refuse_inputs_inside, resolve_path, write_json
from ..envs.agents import as_reply, oracle_action, random_action
from ..envs.maze_env import EnvConfig, MazeEnv
from ..mazes.dataset_io import check_unique_mazes, read_split, records
from ..mazes.layout import MazeError
from ..config import Seed, Temperature, TurnBudget
from ..mazes.seeding import derive_seed
from ..policy.config import PolicyConfig
from ..rollout.multiturn import items_from_split, rollout
from .episodes import episode_row
from .report import check_training_curve, write_eval_report
from .summary import summarise


class EvalConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    policy: Literal["model", "oracle", "random"] = "model"
    model: PolicyConfig | None = None
    data: list[str] = Field(min_length=1, description="split parquet files")
    out: str
    samples: int = Field(0, ge=0, description="sampled episodes per maze on top of the greedy one")
    temperature: Temperature = Field(1.0, description="of the sampled episodes (the greedy one is separate)")
    max_turns: TurnBudget | None = Field(None, description="override every split's own turn budget")
    seed: Seed = 0
    env: EnvConfig = EnvConfig()
    limits: dict[str, int] = Field(default_factory=dict, description="split name -> evaluate only its first N mazes")
    overwrite: bool = False
    view_choice: dict | None = Field(None, description="how the model's view was chosen (policy.views.ChosenView.record): "
                                     "name, source, hash; recorded in summary.json and the report")

    @model_validator(mode="after")
    def _check(self):
        if self.policy == "model" and self.model is None:
            raise ValueError("policy 'model' needs model settings (--model PATH)")
        return self


def play_scripted(items, choose, env_config: EnvConfig):
    """Episodes of an agent that answers from the environment state (no model, no images used)."""
    stats = []
    for item in items:
        env = MazeEnv(item.task, env_config.model_copy(update={"max_turns": item.max_turns}))
        env.reset()
        while not env.done:
            env.step(as_reply(choose(env)))
        stats.append(env.stats)
    return stats


# Memory per stored episode (its row, pandas' copy, the summary's grouping), measured generously, and
# how many episodes are played at once when sampling (each holds its frames until it ends).
EPISODE_BYTES = 16 * 1024
SAMPLE_CHUNK_EPISODES = 256
MAX_SAMPLES = 10_000


def _load_splits(paths: list[str]) -> list[pd.DataFrame]:
    """Each split once, each maze once: a file given twice, two files of one split, or one maze under
    several ids would be counted more than once and narrow every interval."""
    seen: dict[Path, str] = {}
    for p in paths:
        key = resolve_path(p)
        if key in seen:
            raise MazeError(f"--data {p} is given twice (as {seen[key]!r} and {p!r}): each maze would count twice")
        seen[key] = p
    frames = []
    names: dict[str, str] = {}
    for p in paths:
        df = read_split(p)
        if len(df) == 0:
            raise MazeError(f"split {p} is empty: nothing to evaluate")
        name = str(df.split.iloc[0])
        if name in names:
            raise MazeError(f"--data {names[name]} and {p} are both split {name!r}: their results would be mixed; "
                            "give each split once")
        names[name] = p
        check_unique_mazes(df, p)
        frames.append(df)
    return frames


def check_episode_budget(mazes: int, samples: int) -> None:
    """Refuse a run whose episode records would not fit in memory, before playing any of it."""
    import psutil

    if samples > MAX_SAMPLES:
        raise MazeError(f"--samples {samples} is more than allowed ({MAX_SAMPLES} per maze)")
    episodes = mazes * (1 + samples)
    fits = psutil.virtual_memory().available // EPISODE_BYTES
    if episodes > fits:
        raise MazeError(f"{mazes} mazes x (1 + {samples} samples) = {episodes:,} episodes; this machine's free memory holds "
                        f"about {fits:,} episode records: use fewer --samples or fewer mazes")


def evaluate(cfg: EvalConfig, progress=None, metrics_log: str | Path | None = None) -> dict:
    """Run the evaluation; the output directory appears complete (summary last) or not at all."""
    # every input is checked before anything is played: none may lie in the output (--overwrite
    # replaces it), and a damaged training log is found now, not after every maze was played
    refuse_inputs_inside(cfg.out, {"--model": existing_path(cfg.model.model) if cfg.model else None,
                                   "--training-log": metrics_log})
    for d in cfg.data:
        refuse_inputs_inside(cfg.out, {"--data": d})
    check_output_dir(cfg.out, overwrite=cfg.overwrite)
    metrics = None
    if metrics_log is not None:
        from ..metrics import read_metrics

        metrics = read_metrics(metrics_log)
        check_training_curve(metrics, metrics_log)
    if cfg.policy == "model" and cfg.model is not None:
        from ..rollout.factory import check_engine_available

        check_engine_available(cfg.model)  # engine vllm where vLLM is missing: refused before any maze is read
    frames = _load_splits(cfg.data)
    started = time.perf_counter()
    rows: list[dict] = []
    episodes_played = 0
    frames = [df.iloc[: cfg.limits[str(df.split.iloc[0])]].reset_index(drop=True) if str(df.split.iloc[0]) in cfg.limits else df
              for df in frames]
    total_mazes = sum(len(df) for df in frames)
    check_episode_budget(total_mazes, cfg.samples)
    tp = None
    if cfg.policy == "model":
        assert cfg.model is not None
        cfg = cfg.model_copy(update={"model": with_engine_limits(cfg.model, frames, cfg.max_turns)})
        tp = open_for_evaluation(cfg.model)
    try:
        rows, episodes_played = _play(cfg, tp, frames, total_mazes, progress)
    finally:
        if tp is not None and hasattr(tp.engine, "close"):
            tp.engine.close()  # vLLM: its engine process and GPU memory
    seconds = time.perf_counter() - started
    episodes = pd.DataFrame(rows)
    summary = summarise(episodes)
    summary["meta"] = {
        "policy": cfg.policy, "model": cfg.model.model if cfg.model else None, "data": cfg.data,
        # the rules the episodes were played under: comparisons refuse evaluations that differ here
        "view": cfg.model.view() if cfg.model else None, "max_turns_override": cfg.max_turns,
        # what played them: comparisons refuse a pair played by different engines (kernels differ)
        "engine": cfg.model.engine if cfg.model else None, "dtype": cfg.model.dtype if cfg.model else None,
        "samples": cfg.samples, "temperature": cfg.temperature, "episodes": len(rows),
        "seconds": seconds, "episodes_per_s": len(rows) / max(seconds, 1e-9),
        # which view that was and where it came from (a named view, or the model's own file); the hash is of the
        # settings applied, so two evaluations with equal hashes saw the mazes alike
        "view_choice": _view_choice(cfg),
    }
    with atomic_directory(cfg.out, overwrite=cfg.overwrite) as tmp:
        pq.write_table(pa.Table.from_pandas(episodes, preserve_index=False), tmp / "episodes.parquet")
        write_eval_report(tmp, summary, episodes, metrics)
        write_json(tmp / "summary.json", summary)  # last
    return summary


def _view_choice(cfg: EvalConfig) -> dict | None:
    if cfg.model is None:
        return None
    from ..policy.views import view_hash

    applied = cfg.model.view()
    # a library caller that built PolicyConfig itself named no view: its settings are recorded all the same
    choice = dict(cfg.view_choice or {"name": "unnamed", "source": "settings given by the caller"})
    choice["hash"] = view_hash(applied)
    return choice


def with_engine_limits(policy: PolicyConfig, frames: list[pd.DataFrame], max_turns: int | None) -> PolicyConfig:
    """`policy` with the vLLM engine's per-prompt limits (images, max_model_len) derived from the splits it
    plays (their turn budgets and frame sizes), as the trainers derive them from their train split; limits set
    explicitly are checked against what the history needs. Other engines: unchanged."""
    if policy.engine != "vllm":
        return policy
    from ..cluster.plan import PromptLimits, image_tokens_counter, prompt_limits, split_episodes, with_prompt_limits

    counter = image_tokens_counter(policy.model)
    per_split = [prompt_limits(policy, split_episodes(df, policy.render_scale, max_turns), counter) for df in frames]
    most = PromptLimits(*(max(getattr(n, f) for n in per_split) for f in ("images", "tokens", "loss_tokens")))
    return with_prompt_limits(policy, most)


def open_for_evaluation(policy: PolicyConfig):
    """The policy's chat format and engine. The HF engine generates with the model itself; vLLM holds its own
    copy of the weights, so only the processor is opened here (a second copy on the GPU would take memory
    vLLM's gpu_memory_utilization share counts on)."""
    from ..rollout.factory import open_policy

    if policy.engine != "vllm":
        return open_policy(policy)
    from transformers import AutoProcessor

    from ..policy.chat import ChatFormat
    from ..policy.grammar import ActionGrammar
    from ..policy.loading import Policy, PolicyLoadError, looks_like_local_path
    from ..policy.prompts import PROMPTS
    from ..rollout.factory import TrainablePolicy
    from ..rollout.factory import make_engine

    if looks_like_local_path(policy.model) and not Path(policy.model).expanduser().is_dir():
        raise PolicyLoadError(f"model directory not found: {policy.model}")
    processor = AutoProcessor.from_pretrained(policy.model)
    chat = ChatFormat(processor, system_prompt=PROMPTS[policy.prompt])
    choices = ActionGrammar.from_chat(chat).word_ids if policy.reply_grammar == "action" else None
    engine = make_engine(policy, None, chat)
    return TrainablePolicy(Policy(model=None, processor=processor, source=policy.model), chat, engine, policy, choices)


def _play(cfg: EvalConfig, tp, frames: list[pd.DataFrame], total_mazes: int, progress) -> tuple[list[dict], int]:
    """Every split's episodes (greedy, then the samples) as episode rows, and how many were played."""
    rows: list[dict] = []
    episodes_played = 0
    mazes_before = 0
    for df in frames:
        split_rows = records(df)
        view = cfg.model or PolicyConfig(model="-")
        items = items_from_split(df, range(len(df)), view.render_scale, cfg.max_turns)

        def turn_progress(turn: int, active: int, n=len(df), split=str(df.split.iloc[0]), budget=max(it.max_turns for it in items)) -> None:
            if progress:
                # mazes still playing count by the share of their turn budget already used
                share = (mazes_before + n - active + active * min(1.0, turn / budget)) / total_mazes
                progress(split, mazes_before + n - active, total_mazes, share)

        if cfg.policy == "model":
            assert tp is not None and cfg.model is not None
            greedy = rollout(tp.engine, tp.chat, items, sampling=tp.sampling(temperature=0.0),
                             env_config=cfg.env, history=cfg.model.history, on_turn=turn_progress)
            runs = [(0, True, [t.stats for t in greedy])]
            if cfg.samples:
                runs += _sampled_runs(tp, cfg, items, progress, str(df.split.iloc[0]))
        elif cfg.policy == "oracle":
            runs = [(0, True, play_scripted(items, oracle_action, cfg.env))]
        else:
            rng = random.Random(derive_seed(cfg.seed, "random-agent"))
            runs = [(k, k == 0, play_scripted(items, lambda env: random_action(env, rng), cfg.env)) for k in range(1 + cfg.samples)]
        for sample, greedy_flag, stats in runs:
            for maze, st in zip(split_rows, stats):
                rows.append(episode_row(maze, st, policy=cfg.policy, sample=sample, greedy=greedy_flag))
                episodes_played += 1
        mazes_before += len(df)
        if progress:
            progress(str(split_rows[0]["split"]), mazes_before, total_mazes, mazes_before / total_mazes)
    return rows, episodes_played


def _sampled_runs(tp, cfg: EvalConfig, items, progress, split: str) -> list[tuple[int, bool, list]]:
    """`cfg.samples` sampled episodes per maze, played a chunk of mazes at a time so that memory holds
    only one chunk's frames; each episode's seed depends on its maze and sample, not on the chunk."""
    assert cfg.model is not None
    per_sample: list[list] = [[] for _ in range(cfg.samples)]
    chunk = max(1, SAMPLE_CHUNK_EPISODES // cfg.samples)
    for first in range(0, len(items), chunk):
        part = items[first : first + chunk]
        sampling = tp.sampling(temperature=cfg.temperature, seed=derive_seed(cfg.seed, "eval", split, first))
        sampled = rollout(tp.engine, tp.chat, part, group_size=cfg.samples, env_config=cfg.env,
                          history=cfg.model.history, sampling=sampling)
        for k in range(cfg.samples):
            per_sample[k] += [t.stats for t in sampled[k :: cfg.samples]]
        if progress:
            done = min(first + chunk, len(items))
            progress(f"{split} samples", done, len(items), done / len(items))
    return [(k + 1, False, stats) for k, stats in enumerate(per_sample)]


def _is_text(t) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_list(t) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


# What reading an evaluation back needs from episodes.parquet: column -> (kind, test on its arrow type).
EPISODE_COLUMNS = {
    "maze_id": ("text", _is_text), "split": ("text", _is_text), "layout_hash": ("text", _is_text),
    "start": ("list", _is_list), "goal": ("list", _is_list),
    "greedy": ("true/false", pa.types.is_boolean), "success": ("true/false", pa.types.is_boolean),
    "loop": ("true/false", pa.types.is_boolean), "max_turns": ("whole number", pa.types.is_integer),
    "steps_over_optimal": ("number", lambda t: pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_null(t)),
}


def load_episodes(eval_dir: str | Path) -> pd.DataFrame:
    """An evaluation's episodes, refused with the file's name when it is damaged or not one mazerl wrote."""
    path = Path(eval_dir) / "episodes.parquet"
    if not path.exists():
        raise MazeError(f"{eval_dir} is not an evaluation directory (no episodes.parquet)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise MazeError(f"{path} is not a readable parquet file ({err}); it is damaged: evaluate again") from None
    missing = [c for c in EPISODE_COLUMNS if c not in table.column_names]
    if missing:
        raise MazeError(f"{path} is not an episodes table of this mazerl: it lacks {', '.join(missing)} (written by "
                        "another program or an older mazerl?); evaluate again")
    wrong = [f"{c} ({kind} expected, found {table.schema.field(c).type})" for c, (kind, ok) in EPISODE_COLUMNS.items()
             if not ok(table.schema.field(c).type)]
    if wrong:
        raise MazeError(f"{path} has columns of the wrong type: {'; '.join(wrong)}; evaluate again")
    return table.to_pandas()
