"""`mazerl policy pretrain-tiny`: make the pretrained tiny base (`tiny-base`) by behaviour cloning.

It plays the part Qwen3-VL-8B-Instruct plays in the reference run: a model that already solves some
mazes, which GRPO then improves. Readable top to bottom:

    exclusions = every layout of the evaluation splits (default + smoke presets, VisGym reference)
    validation = 4x4 mazes outside the exclusions            # checkpoint choice, never the heldout set
    pool       = training-family mazes outside both          # recorded: pretraining_mazes.parquet
    model      = tiny Qwen3-VL ("base" shape); vision tower started as a maze reader (vision_init "maze":
                 heads that read the four neighbours, heads that find the agent and the goal), rest random
    for step in steps:
        turns = noisy-solver episodes on pool mazes           # random moves (into walls too) are seen, not learned
        loss  = cross-entropy of the solver's move            # over the five action words (the reply grammar)
              + perception_weight x "which of the agent's neighbours are open" (4 bits, at the same position)
        every eval_every steps: greedy validation success -> snapshot
    shipped   = the last snapshot whose validation success is inside the target band
    measured  = its greedy success on 500 heldout mazes (Wilson interval), parse failures when sampling
    provenance.json: command, config, seeds, versions, git commit, wall time, steps, sha256 of every file

Everything is decided by step counts and seeds; `minutes` only caps the run (then the step count
reached is recorded, and `--steps` reproduces it).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .. import __version__
from ..atomic import atomic_directory, check_output_dir, write_json
from ..config import Seed, Temperature
from ..envs.agents import as_reply, oracle_action
from ..envs.maze_env import EnvConfig, MazeTask
from ..mazes.dataset_io import write_split
from ..mazes.hashing import layout_hash, walls_hash
from ..mazes.layout import MOVE_NAMES, MOVES, Maze, size_name
from ..mazes.render import RenderOptions
from ..mazes.sampling import sample_maze
from ..mazes.seeding import derive_seed
from ..mazes.solver import solve
from ..mazes.splits import _row
from ..mazes.visgym import VISGYM_MAX_TURNS
from ..policy.sampling import HistoryConfig
from ..rollout.multiturn import RolloutItem, rollout
from .config import OptimConfig, PolicyConfig
from .logprobs import token_logprobs
from ..metrics import MetricsWriter
from .optim import check_loss, clip_and_check, make_optimizer

POOL_FILE = "pretraining_mazes.parquet"
PROVENANCE_FILE = "provenance.json"


class PoolSize(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    cells: int = Field(ge=2, le=8, description="square mazes of cells x cells")
    count: int = Field(ge=1, le=200_000, description="unique layouts wanted (fewer exist for tiny sizes: all are taken)")
    weight: float = Field(gt=0.0, description="share of training turns drawn from this size")


class PretrainConfig(BaseModel):
    """What `pretrain-tiny` builds and how. Defaults make the shipped tiny-base."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    size: Literal["small", "medium", "base", "deep", "base-deep"] = "base"
    vision_init: Literal["random", "neighbours", "maze"] = Field(
        "maze", description="how the vision tower starts (policy.tiny.VisionInit): random, neighbours, or maze "
                              "(neighbour heads, and heads that find the agent and the goal)")
    seed: Seed = Field(0, description="weights, pool, validation set and data order all derive from it")
    steps: int = Field(5000, ge=1, description="optimizer steps (the reproducible stopping rule)")
    schedule_steps: int = Field(3000, ge=1, description="length of the learning-rate schedule (a run may stop earlier)")
    minutes: float | None = Field(None, gt=0.0, description="also stop after this much training time")
    batch_turns: int = Field(64, ge=1, description="learned turns per optimizer step")
    turns_per_maze: int = Field(2, ge=1, description="turns taken from each teacher episode")
    noise: float = Field(0.25, ge=0.0, lt=1.0, description="chance a teacher turn is a random move (into walls too): seen, not learned")
    perception_weight: float = Field(
        1.0, ge=0.0, le=100.0,
        description="weight of the perception loss: at the answer position, four otherwise unused tokens' logits "
                    "classify which of the agent's neighbours are open (0: the move loss alone)")
    pool: list[PoolSize] = Field(
        default_factory=lambda: [PoolSize(cells=2, count=16, weight=0.1), PoolSize(cells=3, count=400, weight=0.3),
                                 PoolSize(cells=4, count=8000, weight=0.6)],
        min_length=1,
    )
    algorithm: str = Field("wilson", description="the training family's generator (VisGym's)")
    validation_mazes: int = Field(200, ge=1, description="4x4 mazes for choosing the snapshot (not evaluation mazes)")
    eval_every: int = Field(150, ge=1, description="steps between validation runs (each one saves a snapshot)")
    target_success: tuple[float, float] = Field(
        (0.25, 0.5), description="ship the last snapshot whose validation success lies in [low, high]")
    heldout_mazes: int = Field(500, ge=1, description="heldout mazes (default preset) measured for the provenance")
    view: PolicyConfig = Field(
        default_factory=lambda: PolicyConfig(model="-", prompt="short", history=HistoryConfig(turns=1, images=1),
                                             render_scale=0.64, max_new_tokens=8, reply_grammar="action"),
        description="how the model sees mazes (saved with it as mazerl_policy.json)",
    )
    optim: OptimConfig = OptimConfig(lr=1e-3, weight_decay=0.01, warmup_steps=100, schedule="cosine", min_lr_ratio=0.05)
    grpo_temperature: Temperature = Field(1.0, description="temperature whose parse-failure rate is measured")

    @model_validator(mode="after")
    def _check(self):
        low, high = self.target_success
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"target_success must be [low, high] with 0 <= low <= high <= 1, got {list(self.target_success)}")
        if self.view.reply_grammar != "action":
            raise ValueError("view.reply_grammar must be 'action': pretraining learns the five action words")
        if self.perception_weight > 0 and self.view.history.turns is None:
            raise ValueError("perception_weight > 0 needs a history window (view.history.turns set): with the whole "
                             "history every turn shares one sequence, and the perception loss reads one answer per sample")
        return self


# ---- which mazes it may use ---------------------------------------------------------------------

def evaluation_splits(preset_name: str):
    """A dataset preset without its train split: just the frozen evaluation splits."""
    from ..mazes.splits import TRAIN_SPLIT, preset

    cfg = preset(preset_name)
    return cfg.model_copy(update={"splits": {k: v for k, v in cfg.splits.items() if k != TRAIN_SPLIT}})


def evaluation_exclusions(reference: str | Path | None) -> set[str]:
    """Walls hashes of every evaluation maze of the default and smoke presets and of the VisGym
    reference file: pretraining never sees these walls, with any start and goal."""
    import tempfile

    from ..mazes.dataset_io import read_split
    from ..mazes.splits import generate_dataset

    walls: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("default", "smoke"):
            out = Path(tmp) / name
            manifest = generate_dataset(evaluation_splits(name), out, reference)
            for info in manifest["splits"].values():
                walls.update(read_split(out / info["file"]).walls_hash)
    return walls


def draw_mazes(cells: int, count: int, algorithm: str, seed: int, stream: str, excluded_walls: set[str],
               taken: set[str]) -> list[Maze]:
    """Up to `count` mazes with VisGym corner placement and unique layouts, none with excluded walls.

    Tiny sizes have few layouts: drawing stops after 50 x count tries and keeps what it found."""
    found: list[Maze] = []
    for i in range(count * 50):
        maze = sample_maze(algorithm, (cells, cells), derive_seed(seed, stream, cells, i))
        if walls_hash(maze.grid) in excluded_walls:
            continue
        lh = layout_hash(maze.grid, maze.start, maze.goal)
        if lh in taken:
            continue
        if len(solve(maze.grid, maze.start, maze.goal)) + 1 > VISGYM_MAX_TURNS:
            continue  # unsolvable in the VisGym budget: never shown as a task
        taken.add(lh)
        found.append(maze)
        if len(found) == count:
            break
    return found


# ---- the training loop --------------------------------------------------------------------------

class Pretrainer:
    def __init__(self, cfg: PretrainConfig, out: Path, reference: str | Path | None, log=print):
        from ..policy.tiny import init_tiny
        from ..rollout.factory import open_policy
        from .common import seed_everything

        self.cfg, self.out, self.log = cfg, out, log
        seed_everything(cfg.seed)
        work = out.parent / f".{out.name}.work"
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        self.work = work
        log("drawing mazes: evaluation layouts excluded (default + smoke presets, VisGym reference)")
        excluded_walls = evaluation_exclusions(reference)
        self.excluded_count = len(excluded_walls)
        taken: set[str] = set()
        self.validation = draw_mazes(4, cfg.validation_mazes, cfg.algorithm, cfg.seed, "validation", excluded_walls, taken)
        excluded_walls |= {walls_hash(m.grid) for m in self.validation}
        self.pool: dict[int, list[Maze]] = {}
        for p in cfg.pool:
            self.pool[p.cells] = draw_mazes(p.cells, p.count, cfg.algorithm, cfg.seed, "pool", excluded_walls, taken)
        log("pool: " + ", ".join(f"{size_name((c, c))}: {len(m)}" for c, m in self.pool.items()) + f"; validation: {len(self.validation)}")
        init_tiny(work / "init", size=cfg.size, seed=cfg.seed, vision_init=cfg.vision_init)
        self.view = cfg.view.model_copy(update={"model": str(work / "init")})
        self.tp = open_policy(self.view)
        self.model = self.tp.policy.model
        self.perception_ids = perception_token_ids(self.tp.chat.tokenizer) if cfg.perception_weight > 0 else []
        self.render = RenderOptions(square_px=max(4, round(RenderOptions().square_px * self.view.render_scale)))
        self._tasks: dict[tuple[int, int], MazeTask] = {}

    def _task(self, cells: int, index: int) -> MazeTask:
        key = (cells, index)
        if key not in self._tasks:
            self._tasks[key] = MazeTask.build(self.pool[cells][index], self.render)
        return self._tasks[key]

    def teacher_batch(self, step: int):
        """`batch_turns` learned turns from noisy-solver episodes on pool mazes drawn for this step."""
        cfg = self.cfg
        rng = random.Random(derive_seed(cfg.seed, "batch", step))
        sizes = [p.cells for p in cfg.pool]
        weights = [p.weight for p in cfg.pool]
        n_mazes = -(-cfg.batch_turns // cfg.turns_per_maze)
        items = []
        for k in range(n_mazes):
            cells = rng.choices(sizes, weights)[0]
            index = rng.randrange(len(self.pool[cells]))
            items.append(RolloutItem(self._task(cells, index), f"{cells}-{index}", VISGYM_MAX_TURNS))

        seen: dict[int, list[list[float]]] = {}  # env -> its learned turns' open neighbours, in turn order

        def teacher(env):
            learned = seen.setdefault(id(env), [])  # first asked in item order, whatever the first turn is
            if env.position != env.task.maze.goal and rng.random() < cfg.noise:
                return as_reply(rng.choice(MOVE_NAMES)), False
            learned.append(open_neighbours(env.task.maze.grid, env.position))
            return as_reply(oracle_action(env)), True

        trajs = rollout(None, self.tp.chat, items, teacher=teacher, env_config=EnvConfig(render=self.render),
                        history=self.view.history, sampling=self.tp.sampling())
        batch, labels = [], []
        for tr, env_labels in zip(trajs, seen.values()):  # envs are made, and first asked, in item order
            learned = [s for s in tr.samples() if s.n_loss_tokens]
            if len(learned) != len(env_labels):
                raise RuntimeError("teacher turns and learned samples disagree (a history window that packs turns?)")
            for k in sorted(rng.sample(range(len(learned)), min(cfg.turns_per_maze, len(learned)))):
                batch.append(learned[k])
                labels.append(env_labels[k])
        return batch[: cfg.batch_turns], labels[: cfg.batch_turns]

    def validate(self, mazes: list[Maze], temperature: float = 0.0, seed: int = 0) -> dict:
        from ..evaluation.stats import wilson_interval

        items = [RolloutItem(MazeTask.build(m, self.render), str(i), VISGYM_MAX_TURNS) for i, m in enumerate(mazes)]
        self.model.eval()
        try:
            trajs = rollout(self.tp.engine, self.tp.chat, items, sampling=self.tp.sampling(temperature=temperature, seed=seed),
                            env_config=EnvConfig(render=self.render), history=self.view.history)
        finally:
            self.model.train()
        wins = sum(t.stats.success for t in trajs)
        turns = sum(t.stats.turns for t in trajs)
        low, high = wilson_interval(wins, len(trajs))
        return {"success": wins / len(trajs), "successes": wins, "episodes": len(trajs), "wilson_95": [low, high],
                "wall_bump_rate": sum(t.stats.wall_bumps for t in trajs) / max(1, turns),
                "parse_failure_rate": sum(t.stats.parse_failures for t in trajs) / max(1, turns),
                "loop_rate": sum(t.stats.loop for t in trajs) / len(trajs)}

    def run(self, on_step=None) -> dict:
        from ..policy.trainable import save_model_dir

        cfg = self.cfg
        optimizer, scheduler = make_optimizer(list(self.model.parameters()), cfg.optim, cfg.schedule_steps)
        metrics = MetricsWriter(self.work / "metrics.jsonl")
        snapshots: list[dict] = []
        started = time.perf_counter()
        step = 0
        try:
            for step in range(1, cfg.steps + 1):
                batch, neighbours = self.teacher_batch(step)
                tl = token_logprobs(self.model, self.tp.chat, batch, self.tp.sampling(temperature=1.0), with_entropy=False,
                                    allowed_ids=self.tp.reply_choices, return_hidden=cfg.perception_weight > 0)
                loss = -tl.logprobs.mean()
                perception = {}
                if cfg.perception_weight > 0:
                    p_loss, p_acc = perception_loss(self.model, tl.hidden, batch, neighbours, self.perception_ids)
                    loss = loss + cfg.perception_weight * p_loss
                    perception = {"perception_loss": p_loss.item(), "perception_accuracy": p_acc}
                check_loss(loss, step, scheduler.get_last_lr()[0])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                clip_and_check(self.model.parameters(), cfg.optim.max_grad_norm, step, scheduler.get_last_lr()[0])
                optimizer.step()
                scheduler.step()
                record = {"step": step, "loss": loss.item(), "move_accuracy": float(tl.argmax_correct.float().mean()),
                          **perception, "lr": scheduler.get_last_lr()[0], "minutes": (time.perf_counter() - started) / 60}
                out_of_time = cfg.minutes is not None and record["minutes"] >= cfg.minutes
                if step % cfg.eval_every == 0 or step == cfg.steps or out_of_time:
                    val = self.validate(self.validation)
                    record.update({f"validation/{k}": v for k, v in val.items() if not isinstance(v, list)})
                    snap = self.work / "snapshots" / f"step-{step:06d}"
                    save_model_dir(self.model, self.tp.policy.processor, snap, self.view)
                    snapshots.append({"step": step, "path": str(snap), "minutes": record["minutes"], **val})
                    self.log(f"step {step}: validation success {val['success']:.3f} "
                             f"(bumps {val['wall_bump_rate']:.2f}/turn), move accuracy {record['move_accuracy']:.3f}, "
                             f"{record['minutes']:.1f} min")
                metrics.write(record)
                if on_step:
                    on_step(step, record)
                if out_of_time:
                    break
        finally:
            metrics.close()
        return {"steps": step, "minutes": (time.perf_counter() - started) / 60, "snapshots": snapshots}


def open_neighbours(grid, position) -> list[float]:
    """1.0 for each move of MOVE_NAMES whose square next to `position` is open floor, else 0.0."""
    r, c = position
    return [0.0 if grid[r + dr, c + dc] else 1.0 for dr, dc in (MOVES[m] for m in MOVE_NAMES)]


def perception_token_ids(tokenizer) -> list[int]:
    """The tokens whose logits at the answer position say "is the square to the right/up/left/down
    open?": the move words with a leading space, which the reply grammar never lets the model say."""
    ids = [tokenizer.encode(f" {m}", add_special_tokens=False) for m in MOVE_NAMES]
    if any(len(i) != 1 for i in ids):
        raise ValueError("the perception loss needs ' right', ' up', ' left', ' down' as single tokens (a tiny tokenizer)")
    return [i[0] for i in ids]


def perception_loss(model, hidden, samples, labels, token_ids) -> tuple[torch.Tensor, float]:
    """Binary cross-entropy of "is the agent's neighbour open?" from `token_ids`' logits at the
    position that chooses the move, and the share of those bits right.

    Why: the move loss alone gives one 5-way label per picture, and it only helps once the answer
    position attends to the agent's square among ~80 image tokens; these four bits ask for exactly
    what that square's token holds (with `vision_init: neighbours`), so the attention forms sooner
    (measured in docs/BENCHMARKS.md)."""
    from .logprobs import backbone_and_head

    _, head = backbone_and_head(model)
    device = hidden.device
    rows = torch.arange(len(samples), device=device)
    cols = torch.tensor([s.loss_mask.index(1) - 1 for s in samples], device=device)
    logits = head(hidden[rows, cols])[:, list(token_ids)].float()
    target = torch.tensor(labels, device=device)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
    return loss, float(((logits > 0).float() == target).float().mean())


def choose_snapshot(snapshots: list[dict], band: tuple[float, float]) -> tuple[dict, str]:
    """The last snapshot inside the band; else the one closest to it. Returns it and why it was chosen."""
    low, high = band
    inside = [s for s in snapshots if low <= s["success"] <= high]
    if inside:
        chosen = inside[-1]
        later = [s for s in snapshots if s["step"] > chosen["step"]]
        why = f"last snapshot with validation success in [{low}, {high}]"
        if later:
            why += f"; training went on to step {snapshots[-1]['step']} (validation success {snapshots[-1]['success']:.3f}): an earlier checkpoint is shipped"
        return chosen, why
    chosen = min(snapshots, key=lambda s: (min(abs(s["success"] - low), abs(s["success"] - high)), -s["step"]))
    return chosen, f"no snapshot reached validation success in [{low}, {high}]: the closest one is shipped"


def _git_state() -> dict:
    """The source checkout's commit, and whether it had uncommitted changes (None outside a checkout)."""
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None}
    if head.returncode != 0:
        return {"git_commit": None, "git_dirty": None}
    return {"git_commit": head.stdout.strip(), "git_dirty": bool(status.stdout.strip())}


def file_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every file in `directory` except provenance.json (which records them)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())
            if p.is_file() and p.name != PROVENANCE_FILE}


def pretrain_tiny(cfg: PretrainConfig, out: str | Path, *, reference: str | Path | None, overwrite: bool = False,
                  command: list[str] | None = None, log=print, on_step=None) -> dict:
    """Build, train, choose, measure and write the pretrained tiny base to `out`; returns its provenance."""
    from ..mazes.dataset_io import read_split, row_to_maze

    out = Path(out)
    check_output_dir(out, overwrite=overwrite)  # refuse before any work
    started = time.time()
    trainer = Pretrainer(cfg, out, reference, log=log)
    try:
        result = trainer.run(on_step)
        chosen, why = choose_snapshot(result["snapshots"], cfg.target_success)
        log(f"shipping step {chosen['step']}: {why}")
        # Measure the chosen snapshot on the default preset's heldout mazes (what `make demo` evaluates).
        from ..mazes.splits import generate_dataset
        from ..rollout.factory import open_policy

        trainer.tp = open_policy(trainer.view.model_copy(update={"model": chosen["path"]}))
        trainer.model = trainer.tp.policy.model
        heldout_dir = trainer.work / "heldout"
        dcfg = evaluation_splits("default")
        generate_dataset(dcfg, heldout_dir, reference)
        heldout_df = read_split(heldout_dir / "heldout.parquet").iloc[: cfg.heldout_mazes]
        heldout_mazes = [row_to_maze(r) for _, r in heldout_df.iterrows()]
        heldout = trainer.validate(heldout_mazes)
        sampled = trainer.validate(heldout_mazes, temperature=cfg.grpo_temperature, seed=cfg.seed)
        log(f"heldout ({len(heldout_df)} mazes, greedy): success {heldout['success']:.3f} "
            f"(95% CI {heldout['wilson_95'][0]:.3f}-{heldout['wilson_95'][1]:.3f}); sampled at T={cfg.grpo_temperature}: "
            f"parse failures {sampled['parse_failure_rate']:.4f} per turn")
        pool_rows = [
            _row(f"pretrain-{size_name((c, c))}-{i:06d}", "pretrain", m, "visgym-corners", VISGYM_MAX_TURNS, RenderOptions())
            for c, mazes in trainer.pool.items() for i, m in enumerate(mazes)
        ]
        with atomic_directory(out, overwrite=overwrite) as tmp:
            for f in Path(chosen["path"]).iterdir():
                shutil.copy2(f, tmp / f.name)
            write_split(pool_rows, tmp / POOL_FILE)
            shutil.copy2(trainer.work / "metrics.jsonl", tmp / "pretraining_metrics.jsonl")
            provenance = {
                "name": "tiny-base",
                "command": command or sys.argv,
                "config": cfg.model_dump(mode="json"),
                "seeds": {"seed": cfg.seed, "heldout_eval_seed": dcfg.eval_seed},
                "package_version": __version__,
                **_git_state(),
                "torch_version": torch.__version__,
                "wall_time_s": round(time.time() - started, 1),
                "steps_run": result["steps"],
                "training_minutes": round(result["minutes"], 2),
                "shipped_step": chosen["step"],
                "shipped_because": why,
                "curve": [{k: s[k] for k in ("step", "minutes", "success", "wall_bump_rate", "loop_rate")} for s in result["snapshots"]],
                "pool": {size_name((c, c)): len(m) for c, m in trainer.pool.items()},
                "excluded_evaluation_walls": trainer.excluded_count,
                "validation_mazes": len(trainer.validation),
                "heldout": {"mazes": len(heldout_df), "max_turns": VISGYM_MAX_TURNS, "greedy": heldout,
                            f"sampled_t{cfg.grpo_temperature:g}": sampled},
                "files": file_hashes(tmp),
            }
            write_json(tmp / PROVENANCE_FILE, provenance)
            for f in tmp.iterdir():
                f.chmod(0o644)  # package data: readable by every user of an installed mazerl
    finally:
        shutil.rmtree(trainer.work, ignore_errors=True)
    return provenance


def read_provenance(model_dir: str | Path) -> dict | None:
    path = Path(model_dir) / PROVENANCE_FILE
    return json.loads(path.read_text()) if path.exists() else None
