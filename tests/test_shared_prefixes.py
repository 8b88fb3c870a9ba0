"""Sharing one forward pass between samples (trainer) and requests (engine) with the same input.

A GRPO group's episodes meet at the same squares with the same turn counter and feedback; the model's
state there is the same, so the trainer scores and the engine samples from one pass per distinct
input. These tests hold that to what one pass per sample gives: the same numbers and gradients.
"""

import numpy as np
import pytest
import torch

from mazerl.mazes.render import RenderOptions
from mazerl.mazes.sampling import sample_maze
from mazerl.envs.maze_env import MazeTask
from mazerl.policy.chat import ChatFormat, PackedSample
from mazerl.policy.grammar import ActionGrammar
from mazerl.policy.loading import load_policy
from mazerl.policy.prompts import SHORT_SYSTEM_PROMPT
from mazerl.rl.logprobs import shared_inputs, token_logprobs
from mazerl.rollout.engine import GenerationRequest, HFEngine, SamplingParams
from mazerl.rollout.multiturn import HistoryConfig, RolloutItem, rollout

ONE_TURN = HistoryConfig(turns=1, images=1)
PAD = 99


@pytest.fixture(scope="module")
def base_policy(tmp_path_factory):
    from mazerl.policy.tiny import init_tiny

    path = init_tiny(tmp_path_factory.mktemp("m") / "base", size="base", seed=4)
    policy = load_policy(path)
    return policy, ChatFormat(policy.processor, system_prompt=SHORT_SYSTEM_PROMPT)


def _items(n, max_turns=4):
    render = RenderOptions(square_px=16)
    return [RolloutItem(MazeTask.build(sample_maze("wilson", (4, 4), 300 + i), render), f"m{i}", max_turns)
            for i in range(n)]


def _sample(ids, mask, images):
    return PackedSample(ids=ids, images=images, loss_mask=mask, old_logprobs=[0.0] * len(ids), turns=[1])


def test_samples_that_differ_only_in_their_last_loss_token_share_one_input():
    img = np.zeros((4, 4, 3), np.uint8)
    a = _sample([1, PAD, 2, 7, 8], [0, 0, 0, 1, 0], [img])
    b = _sample([1, PAD, 2, 5, 8], [0, 0, 0, 1, 0], [img.copy()])  # another move, an equal image
    other_image = _sample([1, PAD, 2, 7, 8], [0, 0, 0, 1, 0], [img + 1])
    other_prefix = _sample([1, PAD, 3, 7, 8], [0, 0, 0, 1, 0], [img])
    inputs, source = shared_inputs([a, b, other_image, other_prefix], PAD)
    assert source == [0, 0, 1, 2]
    assert inputs[0][0] == [1, PAD, 2]  # cut before the loss token: it is predicted, not read


def test_a_sample_keeps_what_follows_its_last_loss_token_when_an_image_lies_there():
    img = np.zeros((4, 4, 3), np.uint8)
    s = _sample([1, 7, PAD, 8], [0, 1, 0, 0], [img])
    inputs, source = shared_inputs([s], PAD)
    assert inputs[0][0] == [1, 7, PAD, 8] and source == [0]


def test_a_sample_without_loss_tokens_is_kept_whole():
    s = _sample([1, 2, 3], [0, 0, 0], [])
    inputs, _ = shared_inputs([s], PAD)
    assert inputs[0][0] == [1, 2, 3]


def _group_samples(policy, chat, seed=2):
    engine = HFEngine.from_chat(policy.model, chat)
    params = SamplingParams(temperature=1.0, grammar="action", seed=seed)
    trajs = rollout(engine, chat, _items(2), group_size=6, history=ONE_TURN, sampling=params)
    return [s for t in trajs for s in t.samples()], params


def test_shared_scores_and_gradients_equal_one_pass_per_sample(base_policy):
    policy, chat = base_policy
    model = policy.model
    grammar = ActionGrammar.from_chat(chat)
    samples, params = _group_samples(policy, chat)
    inputs, _ = shared_inputs(samples, chat.image_pad)
    # the first turn alone: 12 samples (2 mazes x 6 episodes), 2 distinct inputs
    assert len(inputs) <= len(samples) - 10

    def score_and_grad(share):
        model.zero_grad(set_to_none=True)
        tl = token_logprobs(model, chat, samples, params, allowed_ids=grammar.word_ids, share_prefixes=share)
        weights = torch.linspace(-1.0, 1.0, tl.logprobs.numel())  # a loss that weighs every token differently
        (weights * tl.logprobs).sum().backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        return tl, grads

    shared, g_shared = score_and_grad(True)
    alone, g_alone = score_and_grad(False)
    assert torch.equal(shared.sample_index, alone.sample_index)
    assert torch.equal(shared.old_logprobs, alone.old_logprobs)
    assert torch.equal(shared.argmax_correct, alone.argmax_correct)
    assert torch.allclose(shared.logprobs, alone.logprobs, atol=1e-5)
    assert torch.allclose(shared.entropy, alone.entropy, atol=1e-5)
    assert g_shared.keys() == g_alone.keys() and len(g_shared) > 10
    for name in g_alone:
        assert torch.allclose(g_shared[name], g_alone[name], atol=1e-5, rtol=1e-4), name


class _CountingForward:
    """Counts the rows of every forward pass the engine runs."""

    def __init__(self, model):
        self.model, self.rows = model, []
        self.original = model.forward

    def __enter__(self):
        def counted(*args, **kwargs):
            self.rows.append(int(kwargs["input_ids"].shape[0]))
            return self.original(*args, **kwargs)
        self.model.forward = counted
        return self

    def __exit__(self, *exc):
        del self.model.forward


def test_engine_runs_one_pass_per_distinct_request_and_each_samples_alone(base_policy):
    policy, chat = base_policy
    engine = HFEngine.from_chat(policy.model, chat)
    grammar = ActionGrammar.from_chat(chat)
    first = rollout(None, chat, _items(2, max_turns=1), teacher=lambda env: ("<action>up</action>", True),
                    history=ONE_TURN, sampling=SamplingParams(grammar="action"))
    contexts = [t.conversation.context(1, 1) for t in first]
    requests = [GenerationRequest(contexts[k % 2].ids, contexts[k % 2].images, seed=1000 + k) for k in range(8)]
    params = SamplingParams(temperature=2.0, grammar="action")
    with _CountingForward(policy.model) as counter:
        together = engine.generate(requests, params)
    assert counter.rows == [2]  # eight requests, two distinct contexts
    for req, out in zip(requests, together):
        alone = engine.generate([req], params)[0]
        assert out.ids == alone.ids
        assert out.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
        assert out.ids[len(grammar.prefix)] in grammar.word_ids
    # different seeds on one context: the draws differ (temperature 2 over five words)
    assert len({tuple(o.ids) for o in together[0::2]}) > 1


def test_the_batch_limit_counts_distinct_requests(base_policy):
    policy, chat = base_policy
    first = rollout(None, chat, _items(3, max_turns=1), teacher=lambda env: ("<action>up</action>", True),
                    history=ONE_TURN, sampling=SamplingParams(grammar="action"))
    contexts = [t.conversation.context(1, 1) for t in first]
    requests = [GenerationRequest(contexts[k % 3].ids, contexts[k % 3].images, seed=k) for k in range(9)]
    params = SamplingParams(temperature=1.0, grammar="action")
    engine = HFEngine.from_chat(policy.model, chat, max_batch=2)
    with _CountingForward(policy.model) as counter:
        shared = engine.generate(requests, params)
    assert counter.rows == [2, 1]  # three distinct contexts in batches of at most two
    unshared_engine = HFEngine(policy.model, chat.image_processor, chat.im_end, chat.pad_id, chat.image_pad,
                               max_batch=2, grammar=ActionGrammar.from_chat(chat), share_identical_requests=False)
    with _CountingForward(policy.model) as counter:
        alone = unshared_engine.generate(requests, params)
    assert counter.rows == [2, 2, 2, 2, 1]
    assert [o.ids for o in shared] == [o.ids for o in alone]
