"""Can a policy see the walls next to the agent? Its greedy move on solver-played states, by how many
of the agent's neighbours are open, and how often that move walks into a wall.

At a dead end (one open neighbour) the right move needs no planning at all, only sight of the four
squares around the agent, so accuracy there measures perception; "into a wall" counts moves that a
model which saw the walls would never make. States come from fresh 4x4 Wilson mazes (seeds far
from every split's) played by the solver with 25% random moves, as in pretraining.

Usage: python benchmarks/bench_perception.py [--model tiny-base] [--mazes 60] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import random

import torch

from mazerl.envs.agents import as_reply, oracle_action
from mazerl.envs.maze_env import EnvConfig, MazeTask
from mazerl.mazes.layout import MOVE_NAMES, MOVES
from mazerl.mazes.render import RenderOptions
from mazerl.mazes.sampling import sample_maze
from mazerl.mazes.visgym import VISGYM_MAX_TURNS
from mazerl.policy.config import PolicyConfig
from mazerl.rollout.factory import open_policy
from mazerl.rollout.multiturn import RolloutItem, rollout


def solver_states(tp, view: PolicyConfig, mazes: int, seed: int):
    """(packed sample, open moves, solver move) for every solver-chosen turn of noisy-solver episodes."""
    render = RenderOptions(square_px=max(4, round(RenderOptions().square_px * view.render_scale)))
    rng = random.Random(seed)
    items = [RolloutItem(MazeTask.build(sample_maze("wilson", (4, 4), 10_000_000 + seed * 1000 + i), render), str(i),
                         VISGYM_MAX_TURNS) for i in range(mazes)]
    turns: dict[int, list] = {}

    def teacher(env):
        mine = turns.setdefault(id(env), [])
        if env.position != env.task.maze.goal and rng.random() < 0.25:
            return as_reply(rng.choice(MOVE_NAMES)), False
        r, c = env.position
        mine.append(([m for m, (dr, dc) in MOVES.items() if not env.task.maze.grid[r + dr, c + dc]], oracle_action(env)))
        return as_reply(mine[-1][1]), True

    trajs = rollout(None, tp.chat, items, teacher=teacher, env_config=EnvConfig(render=render), history=view.history,
                    sampling=tp.sampling())
    states = []
    for tr, labels in zip(trajs, turns.values()):
        learned = [s for s in tr.samples() if s.n_loss_tokens]
        states += [(s, opens, move) for s, (opens, move) in zip(learned, labels) if move != "stop"]
    return states


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-base")
    ap.add_argument("--mazes", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    view = PolicyConfig.model_validate({"model": args.model})
    tp = open_policy(view)
    tp.policy.model.eval()
    states = solver_states(tp, view, args.mazes, args.seed)
    names = [tp.chat.decode_reply([w]).strip() for w in tp.reply_choices]
    table = collections.defaultdict(lambda: {"states": 0, "right": 0, "into_wall": 0})
    with torch.no_grad():
        for b in range(0, len(states), 32):
            chunk = states[b:b + 32]
            picks = greedy_words(tp, [s for s, _, _ in chunk])
            for (_, opens, move), pick in zip(chunk, picks):
                row = table[len(opens)]
                row["states"] += 1
                row["right"] += names[pick] == move
                row["into_wall"] += names[pick] not in opens and names[pick] != "stop"
    result = {"model": args.model, "mazes": args.mazes, "by_open_neighbours": {}}
    for k in sorted(table):
        row = table[k]
        result["by_open_neighbours"][k] = {"states": row["states"], "accuracy": row["right"] / row["states"],
                                           "into_wall": row["into_wall"] / row["states"]}
        print(f"{k} open neighbour(s): {row['states']:4d} states, greedy move = solver's {row['right'] / row['states']:.3f}, "
              f"into a wall {row['into_wall'] / row['states']:.3f}")
    n = sum(r["states"] for r in table.values())
    result["all"] = {"states": n, "accuracy": sum(r["right"] for r in table.values()) / n,
                     "into_wall": sum(r["into_wall"] for r in table.values()) / n}
    print(f"all: {n} states, accuracy {result['all']['accuracy']:.3f}, into a wall {result['all']['into_wall']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


def word_probabilities(tp, samples) -> torch.Tensor:
    """(samples, words): each sample's distribution over the reply grammar's words at its answer position (T = 1)."""
    from mazerl.rl.logprobs import backbone_and_head, token_logprobs

    tl = token_logprobs(tp.policy.model, tp.chat, samples, tp.sampling(temperature=1.0), with_entropy=False,
                        allowed_ids=tp.reply_choices, return_hidden=True)
    _, head = backbone_and_head(tp.policy.model)
    answer = torch.tensor([s.loss_mask.index(1) - 1 for s in samples])
    logits = head(tl.hidden[torch.arange(len(samples)), answer])[:, list(tp.reply_choices)]
    return torch.softmax(logits.float(), dim=-1)


def greedy_words(tp, samples) -> list[int]:
    """Index (into the reply grammar's words) of each sample's greedy move at its answer position."""
    return word_probabilities(tp, samples).argmax(-1).tolist()


if __name__ == "__main__":
    main()
