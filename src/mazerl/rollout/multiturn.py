"""The batched multi-turn rollout loop: B mazes x G samples played at once.

Each turn: build every unfinished episode's context, generate all replies in one engine call,
parse and step every environment, append the feedback and the new frame, repeat. Trajectories keep
the sampled token ids, a loss mask, per-turn rewards and the environment's episode statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..envs.maze_env import EnvConfig, MazeEnv, MazeTask
from ..envs.stats import EpisodeStats
from ..envs.actions import parse_action
from ..mazes.seeding import derive_seed
from ..policy.chat import ChatFormat, Conversation, PackedSample
from ..policy.grammar import ActionGrammar
from ..policy.prompts import turn_text
from ..policy.sampling import HistoryConfig, SamplingParams
from .engine import GenerationOutput, GenerationRequest, InferenceEngine


@dataclass
class RolloutItem:
    """One maze to play: its task (pre-rendered), id, turn budget and group."""

    task: MazeTask
    maze_id: str
    max_turns: int


@dataclass
class Trajectory:
    maze_id: str
    group: int  # index of the maze in this rollout batch; samples of one maze share it
    conversation: Conversation
    stats: EpisodeStats
    rewards: list[float] = field(default_factory=list)  # per turn
    replies: list[str] = field(default_factory=list)
    truncated_replies: int = 0  # replies cut by max_new_tokens
    weights_version: int = 0  # the oldest weights version any of its replies was sampled with
    _versions: set[int] = field(default_factory=set, repr=False)

    @property
    def reward(self) -> float:
        return float(sum(self.rewards))

    def samples(self) -> list[PackedSample]:
        return self.conversation.pack()


# A teacher answers for the model: (reply text, whether the model should learn to say it).
Teacher = Callable[[MazeEnv], tuple[str, bool]]


def rollout(
    engine: InferenceEngine | None,
    chat: ChatFormat,
    items: list[RolloutItem],
    *,
    group_size: int = 1,
    sampling: SamplingParams = SamplingParams(),
    env_config: EnvConfig = EnvConfig(),
    history: HistoryConfig = HistoryConfig(),
    teacher: Teacher | None = None,
    call_offset: int = 0,
    on_turn: Callable[[int, int], None] | None = None,
) -> list[Trajectory]:
    """Play every item `group_size` times. With `teacher`, replies come from it (its text,
    tokenised) instead of the engine: that makes behaviour-cloning data in the same format.

    `on_turn(turn, active)` is called after each turn (progress bars).
    """
    if engine is None and teacher is None:
        raise ValueError("rollout needs an engine or a teacher")
    envs: list[MazeEnv] = []
    trajs: list[Trajectory] = []
    # an episode's sampling seed comes from what it is (maze, its repeat in this call, sample k), never
    # from its position: the same maze gets the same samples alone, in any batch, on any rollout worker
    episode_keys: list[str] = []
    seen: dict[str, int] = {}
    configs: dict[int, EnvConfig] = {}
    for g, item in enumerate(items):
        cfg = configs.setdefault(item.max_turns, env_config.model_copy(update={"max_turns": item.max_turns}))
        repeat = seen[item.maze_id] = seen.get(item.maze_id, -1) + 1
        for k in range(group_size):
            episode_keys.append(f"{item.maze_id}/{repeat}/{k}")
            env = MazeEnv(item.task, cfg)
            obs = env.reset()
            conv = Conversation()
            conv.add(chat.system())
            conv.add(chat.user_turn(1, turn_text("", 1, item.max_turns), obs.image.copy()))
            envs.append(env)
            trajs.append(Trajectory(item.maze_id, g, conv, env.stats))
    turn = 1
    active = list(range(len(envs)))
    while active:
        contexts = [trajs[i].conversation.context(history.turns, history.images) for i in active]
        learn = [True] * len(active)
        if teacher is not None:
            outputs = []
            for k, i in enumerate(active):
                text, learn[k] = teacher(envs[i])
                outputs.append(_teacher_output(chat, text, sampling))
        else:
            assert engine is not None
            requests = [GenerationRequest(c.ids, c.images, derive_seed(sampling.seed, call_offset + turn, episode_keys[i]))
                        for c, i in zip(contexts, active)]
            outputs = engine.generate(requests, sampling, call_id=call_offset + turn)
        still = []
        for i, ctx, out, lrn in zip(active, contexts, outputs, learn):
            tr = trajs[i]
            tr.conversation.record_turn(ctx, chat.reply(turn, out.ids, out.logprobs, learn=lrn, forced=out.forced))
            text = chat.decode_reply(out.ids)
            tr.replies.append(text)
            tr.truncated_replies += int(not out.finished)
            tr._versions.add(out.weights_version)
            tr.weights_version = min(tr._versions)
            result = envs[i].step(text)
            tr.rewards.append(result.reward)
            if not result.done:
                obs = result.observation
                tr.conversation.add(chat.user_turn(turn + 1, turn_text(obs.feedback, turn + 1, envs[i].config.max_turns), obs.image.copy()))
                still.append(i)
        active = still
        if on_turn:
            on_turn(turn, len(active))
        turn += 1
    for tr, env in zip(trajs, envs):
        tr.stats = env.stats
    return trajs


def _teacher_output(chat: ChatFormat, text: str, sampling: SamplingParams) -> GenerationOutput:
    """A teacher's reply in token space; under the action grammar, shaped (and masked) as the sampler's."""
    if sampling.grammar == "action":
        action = parse_action(text)
        if action is None:
            raise ValueError(f"teacher reply {text!r} names no action, which the action grammar cannot express")
        grammar = ActionGrammar.from_chat(chat)
        ids = grammar.reply(grammar.word_index(action))
        return GenerationOutput(ids=ids, logprobs=[0.0] * len(ids), finished=True, forced=grammar.forced())
    ids = chat.text(text) + [chat.im_end]
    return GenerationOutput(ids=ids, logprobs=[0.0] * len(ids), finished=True)


def items_from_split(df, rows, render_scale: float = 1.0, max_turns: int | None = None) -> list[RolloutItem]:
    """Rollout items for the given row positions of a maze split (see mazes.dataset_io).

    Each maze keeps its split's turn budget unless `max_turns` overrides it."""
    from ..mazes.dataset_io import row_render_options, row_to_maze

    items = []
    for i in rows:
        row = df.iloc[int(i)]
        opts = row_render_options(row)
        if render_scale != 1.0:
            opts = opts.model_copy(update={"square_px": max(4, round(opts.square_px * render_scale))})
        budget = int(max_turns if max_turns is not None else row["max_turns"])
        items.append(RolloutItem(MazeTask.build(row_to_maze(row), opts), str(row["maze_id"]), budget))
    return items
