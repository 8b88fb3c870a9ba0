import random

import pytest
import torch

from mazerl.envs.agents import as_reply, oracle_action
from mazerl.envs.maze_env import MazeTask
from mazerl.mazes.render import RenderOptions
from mazerl.mazes.sampling import sample_maze
from mazerl.rl.logprobs import token_logprobs
from mazerl.rollout.engine import GenerationOutput, HFEngine, SamplingParams
from mazerl.rollout.multiturn import HistoryConfig, RolloutItem, rollout

MARKOV = HistoryConfig(turns=0, images=1)


def items(n: int, cells=(4, 4), max_turns: int = 6, px: int = 32):
    return [RolloutItem(MazeTask.build(sample_maze("wilson", cells, s), RenderOptions(square_px=px)), f"m{s}", max_turns) for s in range(n)]


def test_sampled_logprobs_equal_a_training_forward(tiny_policy):
    """Token ids and positions as generated = as trained: no retokenisation drift, right mRoPE,
    with left padding in the batch and several images per sequence (full history)."""
    policy, chat = tiny_policy
    engine = HFEngine.from_chat(policy.model, chat)
    its = items(2, cells=(3, 3), max_turns=3) + items(1, cells=(4, 4), max_turns=3)
    for history, temperature in ((HistoryConfig(), 1.0), (MARKOV, 0.7)):
        params = SamplingParams(max_new_tokens=5, seed=3, temperature=temperature, banned_ids=tuple(chat.banned_reply_ids))
        trajs = rollout(engine, chat, its, group_size=2, sampling=params, history=history)
        samples = [s for t in trajs for s in t.samples()]
        assert all(s.n_loss_tokens > 0 for s in samples)
        with torch.no_grad():
            tl = token_logprobs(policy.model, chat, samples, params)
        assert torch.allclose(tl.logprobs, tl.old_logprobs, atol=2e-4), (tl.logprobs - tl.old_logprobs).abs().max()
        if history.turns is None:
            assert len(samples) == len(trajs)  # one sequence per episode
            assert max(len(s.images) for s in samples) == 3


def test_rollouts_are_reproducible_and_seeded(tiny_policy):
    policy, chat = tiny_policy
    engine = HFEngine.from_chat(policy.model, chat)
    its = items(3, max_turns=3)

    def play(seed, temperature=1.0):
        trajs = rollout(engine, chat, its, group_size=2, history=MARKOV,
                        sampling=SamplingParams(max_new_tokens=6, seed=seed, temperature=temperature,
                                                        banned_ids=tuple(chat.banned_reply_ids)))
        return [t.replies for t in trajs]

    assert play(1) == play(1)
    assert play(1) != play(2)
    assert play(1, 0.0) == play(2, 0.0)  # greedy ignores the seed


def test_batched_and_one_at_a_time_rollouts_agree(tiny_policy):
    policy, chat = tiny_policy
    engine = HFEngine.from_chat(policy.model, chat)
    its = items(4, max_turns=3)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6, banned_ids=tuple(chat.banned_reply_ids))
    batched = rollout(engine, chat, its, sampling=greedy, history=MARKOV)
    single = [rollout(engine, chat, [it], sampling=greedy, history=MARKOV)[0] for it in its]
    assert [t.replies for t in batched] == [t.replies for t in single]


def test_a_maze_samples_the_same_alone_or_in_any_batch(tiny_policy):
    """Seeds follow the episode (maze, sample k), not its slot, so slicing a step's mazes across
    rollout workers, or reordering them, changes nothing."""
    policy, chat = tiny_policy
    engine = HFEngine.from_chat(policy.model, chat)
    its = items(3, max_turns=3)
    params = SamplingParams(max_new_tokens=6, seed=5, temperature=1.0, banned_ids=tuple(chat.banned_reply_ids))
    batched = rollout(engine, chat, its, group_size=2, sampling=params, history=MARKOV)
    alone = rollout(engine, chat, [its[2]], group_size=2, sampling=params, history=MARKOV)
    reordered = rollout(engine, chat, its[::-1], group_size=2, sampling=params, history=MARKOV)
    by_maze = lambda trajs: {(t.maze_id, k % 2): t.replies for k, t in enumerate(trajs)}
    assert by_maze(alone) == {k: v for k, v in by_maze(batched).items() if k[0] == "m2"}
    assert by_maze(reordered) == by_maze(batched)
    assert batched[0].replies != batched[1].replies or batched[2].replies != batched[3].replies  # samples differ


class GarbageEngine:
    """Replies with random token ids of random length (up to 400 tokens): a model gone wrong."""

    def __init__(self, vocab: int, end_id: int):
        self.vocab, self.end_id = vocab, end_id
        self.rng = random.Random(0)

    def sync_weights(self):
        pass

    def generate(self, requests, params, call_id=0):
        out = []
        for _ in requests:
            n = self.rng.choice([0, 1, 7, 400])
            ids = [self.rng.randrange(self.vocab) for _ in range(n)]
            out.append(GenerationOutput(ids=ids, logprobs=[-5.0] * n, finished=False))
        return out


def test_garbage_replies_are_counted_not_fatal(tiny_policy):
    policy, chat = tiny_policy
    trajs = rollout(GarbageEngine(len(policy.tokenizer), chat.im_end), chat, items(3, max_turns=5), history=MARKOV)
    for t in trajs:
        assert t.stats.turns == 5 and t.stats.timeout
        # every turn is exactly one of: unparsable, a wall bump, a move, or the stop that ended it
        assert t.stats.parse_failures + t.stats.wall_bumps + t.stats.moves + int(t.stats.stopped) == t.stats.turns
    assert sum(t.stats.parse_failures for t in trajs) >= 10


def test_teacher_rollouts_solve_every_maze_and_mark_what_to_learn(tiny_policy):
    _, chat = tiny_policy
    flip = iter([False, True] * 100)

    def teacher(env):
        return as_reply(oracle_action(env)), next(flip)

    trajs = rollout(None, chat, items(3, max_turns=40), teacher=teacher, history=MARKOV)
    assert all(t.stats.success and t.stats.moves == t.stats.optimal_moves for t in trajs)
    samples = [s for t in trajs for s in t.samples()]
    learned = [s for s in samples if s.n_loss_tokens]
    assert 0 < len(learned) < len(samples)
    with pytest.raises(ValueError, match="engine or a teacher"):
        rollout(None, chat, items(1))


def test_max_new_tokens_cut_is_recorded(tiny_policy):
    policy, chat = tiny_policy
    engine = HFEngine.from_chat(policy.model, chat)
    trajs = rollout(engine, chat, items(2, max_turns=2), sampling=SamplingParams(max_new_tokens=2, banned_ids=tuple(chat.banned_reply_ids)), history=MARKOV)
    assert sum(t.truncated_replies for t in trajs) >= 1
    for t in trajs:
        samples = t.samples()
        assert len(samples) == t.stats.turns  # Markov view: one training sequence per turn
        for s, truncated in zip(samples, _truncated_per_turn(t, chat)):
            assert s.ids[-2] == chat.im_end  # every reply is closed for the next turn
            # an end-of-turn the model sampled carries loss; one we appended after a cut does not
            assert s.loss_mask[-2] == (0 if truncated else 1)


def _truncated_per_turn(traj, chat):
    """Per turn: was the reply cut by max_new_tokens (its closing end-of-turn appended, not sampled)?"""
    replies = [traj.conversation.segments[i] for i in traj.conversation.turn_replies]
    return [not seg.generated[len(seg.ids) - 2] for seg in replies]


def test_generation_leaves_the_global_rng_alone_and_keeps_only_sampled_logprobs(tiny_policy):
    policy, chat = tiny_policy
    engine = HFEngine.from_chat(policy.model, chat)
    params = SamplingParams(max_new_tokens=4, seed=2, temperature=1.0, banned_ids=tuple(chat.banned_reply_ids))
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    trajs = rollout(engine, chat, items(2, cells=(3, 3), max_turns=2), sampling=params, history=MARKOV)
    assert torch.equal(torch.rand(3), expected)  # the trainer's RNG stream is untouched by sampling
    for t in trajs:
        for s in t.samples():
            reply = [lp for lp, m in zip(s.old_logprobs, s.loss_mask) if m]
            assert reply and all(lp <= 0.0 for lp in reply)
            banned = set(chat.banned_reply_ids)
            assert not any(tok in banned for tok, m in zip(s.ids, s.loss_mask) if m)
