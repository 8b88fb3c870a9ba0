"""The action reply grammar: every reply is `<action>WORD</action>`, sampled and scored the same way."""

import pytest
import torch

from mazerl.envs.actions import ACTIONS, parse_action
from mazerl.envs.agents import as_reply, oracle_action
from mazerl.mazes.render import RenderOptions
from mazerl.mazes.sampling import sample_maze
from mazerl.envs.maze_env import MazeTask
from mazerl.policy.chat import ChatFormat
from mazerl.policy.grammar import ActionGrammar
from mazerl.policy.loading import load_policy
from mazerl.policy.prompts import SHORT_SYSTEM_PROMPT
from mazerl.rl.logprobs import token_logprobs
from mazerl.rollout.engine import GenerationRequest, HFEngine, SamplingParams
from mazerl.rollout.multiturn import HistoryConfig, RolloutItem, rollout

ONE_TURN = HistoryConfig(turns=1, images=1)


@pytest.fixture(scope="module")
def base_policy(tmp_path_factory):
    """A random model of tiny-base's shape (16 px patches, no merging, phrase tokens)."""
    from mazerl.policy.tiny import init_tiny

    path = init_tiny(tmp_path_factory.mktemp("m") / "base", size="base", seed=3)
    policy = load_policy(path)
    return policy, ChatFormat(policy.processor, system_prompt=SHORT_SYSTEM_PROMPT)


def items(n, cells=4, max_turns=6):
    render = RenderOptions(square_px=16)
    return [RolloutItem(MazeTask.build(sample_maze("wilson", (cells, cells), 100 + i), render), f"m{i}", max_turns)
            for i in range(n)]


def test_every_sampled_reply_is_a_valid_action_and_only_the_word_is_learned(base_policy):
    policy, chat = base_policy
    engine = HFEngine.from_chat(policy.model, chat)
    grammar = ActionGrammar.from_chat(chat)
    trajs = rollout(engine, chat, items(3), group_size=4, history=ONE_TURN,
                    sampling=SamplingParams(temperature=5.0, grammar="action", seed=1))
    assert all(t.stats.parse_failures == 0 for t in trajs)
    assert sum(t.stats.turns for t in trajs) > 12
    for t in trajs:
        assert all(parse_action(r) in ACTIONS for r in t.replies)
        for s in t.samples():
            learned = [tok for tok, m in zip(s.ids, s.loss_mask) if m]
            assert len(learned) == 1 and learned[0] in grammar.word_ids  # forced tokens carry no loss


def test_sampler_and_trainer_agree_on_the_constrained_distribution(base_policy):
    policy, chat = base_policy
    engine = HFEngine.from_chat(policy.model, chat)
    grammar = ActionGrammar.from_chat(chat)
    temp = 0.7
    params = SamplingParams(temperature=temp, grammar="action", seed=5)
    trajs = rollout(engine, chat, items(2, max_turns=3), group_size=3, history=ONE_TURN, sampling=params)
    samples = [s for t in trajs for s in t.samples()]
    with torch.no_grad():
        tl = token_logprobs(policy.model, chat, samples, params, allowed_ids=grammar.word_ids)
    # the on-policy ratio is 1: the trainer renormalises over the same five words at the same temperature
    assert torch.allclose(tl.logprobs, tl.old_logprobs, atol=2e-4)
    assert bool((tl.logprobs < 0).all())
    free = token_logprobs(policy.model, chat, samples, params)
    assert bool((free.logprobs < tl.logprobs - 1e-3).all())  # without the restriction the mass is spread wider


def test_greedy_choice_is_the_best_of_the_five_words(base_policy):
    policy, chat = base_policy
    engine = HFEngine.from_chat(policy.model, chat)
    grammar = ActionGrammar.from_chat(chat)
    its = items(1, max_turns=1)
    convo_ids = None

    def capture(env):
        return as_reply(oracle_action(env)), True

    ref = rollout(None, chat, its, teacher=capture, history=ONE_TURN, sampling=SamplingParams(grammar="action"))
    context = ref[0].conversation.context(1, 1)
    convo_ids = context.ids
    out = engine.generate([GenerationRequest(convo_ids, context.images)], SamplingParams(temperature=0.0, grammar="action"))[0]
    with torch.no_grad():
        inputs = engine._model_inputs([convo_ids + list(grammar.prefix)], context.images)
        logits = policy.model(**inputs).logits[0, -1]
    best = int(torch.stack([logits[i] for i in grammar.word_ids]).argmax())
    assert out.ids == grammar.reply(best) and out.forced == grammar.forced()


def test_a_request_samples_the_same_action_whatever_shares_its_batch(base_policy):
    policy, chat = base_policy
    engine = HFEngine.from_chat(policy.model, chat)
    trajs = rollout(None, chat, items(4, max_turns=1), teacher=lambda env: (as_reply("up"), True), history=ONE_TURN,
                    sampling=SamplingParams(grammar="action"))
    reqs = []
    for k, t in enumerate(trajs):
        ctx = t.conversation.context(1, 1)
        reqs.append(GenerationRequest(ctx.ids, ctx.images, seed=1000 + k))
    params = SamplingParams(temperature=50.0, grammar="action", seed=11)  # near-uniform: any mix-up would show
    together = [o.ids for o in engine.generate(reqs, params, call_id=2)]
    alone = [engine.generate([r], params, call_id=2)[0].ids for r in reqs]
    reordered = [o.ids for o in engine.generate(list(reversed(reqs)), params, call_id=7)][::-1]
    assert together == alone == reordered
    # and the seeds matter: other seeds draw other actions somewhere among 4 near-uniform choices x 8
    others = [engine.generate([GenerationRequest(r.ids, r.images, seed=r.seed + 50 + j)], params)[0].ids
              for r in reqs for j in range(8)]
    assert len({tuple(o) for o in others}) > 1


def test_teacher_turns_under_the_grammar_learn_only_the_word(base_policy):
    policy, chat = base_policy
    grammar = ActionGrammar.from_chat(chat)
    trajs = rollout(None, chat, items(2, max_turns=20), teacher=lambda env: (as_reply(oracle_action(env)), True),
                    history=ONE_TURN, sampling=SamplingParams(grammar="action"))
    assert all(t.stats.success for t in trajs)
    for t in trajs:
        for s in t.samples():
            assert [tok for tok, m in zip(s.ids, s.loss_mask) if m][0] in grammar.word_ids
            assert s.n_loss_tokens == 1
    with pytest.raises(ValueError, match="names no action"):
        rollout(None, chat, items(1), teacher=lambda env: ("I refuse", True), history=ONE_TURN,
                sampling=SamplingParams(grammar="action"))
