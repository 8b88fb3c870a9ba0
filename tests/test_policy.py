import shutil

import numpy as np
import pytest
import torch

from mazerl.envs.actions import ACTIONS
from mazerl.mazes.render import RenderOptions, render_rgb
from mazerl.mazes.sampling import sample_maze
from mazerl.policy.chat import Conversation
from mazerl.policy.loading import PolicyLoadError, load_policy
from mazerl.policy.prompts import turn_text


def frame(seed: int, px: int = 32) -> np.ndarray:
    m = sample_maze("wilson", (4, 4), seed)
    return render_rgb(m.grid, m.start, m.goal, RenderOptions(square_px=px))


def test_tiny_model_is_a_normal_hf_directory(tiny_model_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration"
    n = sum(p.numel() for p in model.parameters())
    assert 1.5e6 < n < 5e6
    for word in ACTIONS:
        assert len(processor.tokenizer.encode(word, add_special_tokens=False)) == 1
    # one merged vision token per maze square at 32 px: a 9x9 grid -> 81 tokens
    out = processor.image_processor(images=[frame(0)], return_tensors="pt")
    assert int(out["image_grid_thw"].prod()) // 4 == 81


def test_loader_names_what_is_missing(tiny_model_dir, tmp_path):
    with pytest.raises(PolicyLoadError, match="not found"):
        load_policy(tmp_path / "nope")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    for name in ("processor_config.json", "preprocessor_config.json"):
        (broken / name).unlink(missing_ok=True)
    with pytest.raises(PolicyLoadError, match="no processor"):
        load_policy(broken)
    (broken / "config.json").unlink()
    with pytest.raises(PolicyLoadError, match="config.json"):
        load_policy(broken)
    with pytest.raises(PolicyLoadError, match="dtype"):
        load_policy(tiny_model_dir, dtype="int3")


def test_token_ids_equal_the_processors_chat_template(tiny_policy):
    policy, chat = tiny_policy
    processor = policy.processor
    f1, f2 = frame(1), frame(2, px=25)
    conv = Conversation()
    conv.add(chat.system())
    conv.add(chat.user_turn(1, turn_text("", 1, 18), f1))
    reply_ids = chat.text("<action>up</action>") + [chat.im_end]
    ctx = conv.context(None, None)
    conv.record_turn(ctx, chat.reply(1, reply_ids, [0.0] * len(reply_ids)))
    conv.add(chat.user_turn(2, turn_text("Cannot move into a wall.", 2, 18), f2))
    ours = conv.context(None, None)
    messages = [
        {"role": "system", "content": chat.system_prompt},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": turn_text("", 1, 18)}]},
        {"role": "assistant", "content": "<action>up</action>"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": turn_text("Cannot move into a wall.", 2, 18)}]},
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    theirs = processor(text=[text], images=[f1, f2], return_tensors="pt")["input_ids"][0].tolist()
    assert ours.ids == theirs
    assert len(ours.images) == 2


def test_history_window_drops_image_tokens_and_pixels_together(tiny_policy):
    _, chat = tiny_policy
    conv = Conversation()
    conv.add(chat.system())
    for turn in range(1, 5):
        conv.add(chat.user_turn(turn, turn_text("", turn, 18), frame(turn)))
        ctx = conv.context(None, 2)
        ids = chat.text("<action>left</action>") + [chat.im_end]
        conv.record_turn(ctx, chat.reply(turn, ids, [-0.5] * len(ids)))
        assert len(ctx.images) == min(turn, 2)
        assert ctx.ids.count(chat.image_pad) == 81 * len(ctx.images)
        assert ctx.ids.count(chat.vision_start) == len(ctx.images)
    markov = conv.context(0, 1)
    assert markov.ids.count(chat.im_start) == 3  # system, current user turn, assistant header
    assert len(markov.images) == 1


def test_packing_full_history_is_one_sequence_with_every_reply_masked(tiny_policy):
    _, chat = tiny_policy
    conv = Conversation()
    conv.add(chat.system())
    for turn in range(1, 4):
        conv.add(chat.user_turn(turn, turn_text("", turn, 18), frame(turn)))
        ids = chat.text("<action>down</action>")  # cut before <|im_end|>: we close it, without loss
        conv.record_turn(conv.context(None, None), chat.reply(turn, ids, [-1.0] * len(ids)))
    samples = conv.pack()
    assert len(samples) == 1
    s = samples[0]
    assert s.turns == [1, 2, 3] and len(s.images) == 3
    assert s.n_loss_tokens == 3 * len(chat.text("<action>down</action>"))
    for i, m in enumerate(s.loss_mask):
        if m:
            assert s.ids[i] not in (chat.im_end, chat.image_pad) and s.old_logprobs[i] == -1.0


def test_packing_with_a_window_makes_one_sequence_per_turn(tiny_policy):
    _, chat = tiny_policy
    conv = Conversation()
    conv.add(chat.system())
    for turn in range(1, 4):
        conv.add(chat.user_turn(turn, turn_text("", turn, 18), frame(turn)))
        ids = chat.text("<action>up</action>") + [chat.im_end]
        conv.record_turn(conv.context(None, 1), chat.reply(turn, ids, [-0.1] * len(ids)))
    samples = conv.pack()
    assert [s.turns for s in samples] == [[1], [2], [3]]
    reply_len = len(chat.text("<action>up</action>")) + 1
    assert all(s.n_loss_tokens == reply_len for s in samples)  # earlier replies are context only
    assert [len(s.images) for s in samples] == [1, 1, 1]


def test_init_tiny_cli(tmp_path):
    from typer.testing import CliRunner

    from mazerl.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["policy", "init-tiny", "--out", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert "M parameters" in result.output and (tmp_path / "m" / "model.safetensors").exists()
    again = runner.invoke(app, ["policy", "init-tiny", "--out", str(tmp_path / "m")])
    assert again.exit_code == 2 and "not empty" in again.output
    bad = runner.invoke(app, ["policy", "init-tiny", "--out", str(tmp_path / "n"), "--size", "huge"])
    assert bad.exit_code == 2 and "small, medium" in bad.output


def test_every_tiny_size_loads_through_the_real_path_and_fits_a_shipped_base(tmp_path):
    """Each size is a Qwen3-VL that AutoModelForImageTextToText opens; the ones pretraining may ship
    (base, deep, base-deep) fit the 20 MiB cap in fp32."""
    from transformers import AutoModelForImageTextToText

    from mazerl.policy.tiny import SIZES, init_tiny

    for size in ("base", "deep", "base-deep"):
        model = AutoModelForImageTextToText.from_pretrained(init_tiny(tmp_path / size, size=size))
        text = model.config.text_config
        assert (text.num_hidden_layers, text.head_dim) == (SIZES[size]["layers"], SIZES[size]["head_dim"])
        assert sum(p.numel() for p in model.parameters()) * 4 <= 20 * 2**20, size


def test_base_deep_is_base_with_twice_the_text_layers_and_takes_the_maze_vision_init(tmp_path):
    """The depth experiment changes one thing: the text depth. Its vision tower is base's, so the
    maze-reading start (four neighbour heads, agent and goal finders) applies to it."""
    from transformers import AutoModelForImageTextToText

    from mazerl.policy.tiny import SIZES, init_tiny

    assert {k: v for k, v in SIZES["base-deep"].items() if k != "layers"} == {k: v for k, v in SIZES["base"].items() if k != "layers"}
    assert SIZES["base-deep"]["layers"] == 2 * SIZES["base"]["layers"]
    model = AutoModelForImageTextToText.from_pretrained(init_tiny(tmp_path / "m", size="base-deep", vision_init="maze"))
    assert model.config.text_config.num_hidden_layers == 8


def _block_output(model, image_processor, frame, layer: int = 0):
    """Vision block `layer`'s output per patch (raster order) for one frame, through the model's own forward."""
    from mazerl.rollout.engine import vision_inputs

    captured = {}
    hook = model.model.visual.blocks[layer].register_forward_hook(lambda m, i, o: captured.setdefault("out", o))
    try:
        inputs = vision_inputs(image_processor, [frame])
        model.model.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"])
    finally:
        hook.remove()
    return captured["out"]


@pytest.mark.parametrize("vision_init", ["neighbours", "random"])
def test_neighbour_vision_init_makes_block0_read_the_four_adjacent_squares(tmp_path, vision_init):
    """Change one square of the picture: with `neighbours`, block 0's output moves far more at the four
    squares next to it than at any square further away; a randomly initialised block has no such
    locality (the control that makes the first case mean something)."""
    from mazerl.policy.tiny import init_tiny

    policy = load_policy(init_tiny(tmp_path / "m", size="base", vision_init=vision_init))
    grid = sample_maze("wilson", (4, 4), 3).grid
    px = 16
    frame = render_rgb(grid, (1, 1), (7, 7), RenderOptions(square_px=px))
    r, c = 4, 4  # a square in the middle of the 9x9 picture
    changed = frame.copy()
    changed[r * px:(r + 1) * px, c * px:(c + 1) * px] = (0, 0, 255) if grid[r, c] else (128, 128, 128)
    with torch.no_grad():
        delta = (_block_output(policy.model, policy.processor.image_processor, changed)
                 - _block_output(policy.model, policy.processor.image_processor, frame)).norm(dim=-1).reshape(9, 9)
    neighbours = [delta[r + dr, c + dc].item() for dr, dc in ((0, 1), (-1, 0), (0, -1), (1, 0))]
    far = [delta[i, j].item() for i in range(9) for j in range(9) if abs(i - r) + abs(j - c) >= 2]
    if vision_init == "neighbours":
        assert min(neighbours) > 5 * max(far), (neighbours, max(far))
    else:
        assert min(neighbours) < 5 * max(far)


def test_neighbour_attention_biases_fit_each_direction(tmp_path):
    from mazerl.policy.tiny import init_tiny, neighbour_attention_biases

    policy = load_policy(init_tiny(tmp_path / "m", size="base"))
    bq, bk, fit = neighbour_attention_biases(policy.model)
    assert bq.shape == bk.shape == (4, policy.model.model.visual.blocks[0].attn.head_dim)
    assert fit > 0.9  # the mean attention each head gives the square it is meant to read
    with pytest.raises(ValueError, match="5 neighbour heads.*4 heads"):
        neighbour_attention_biases(policy.model, offsets=((0, 1),) * 5)


def test_maze_vision_init_tells_every_square_where_the_agent_is(tmp_path):
    """Move the agent from one corner of the maze to the other: with `maze`, block 1's output changes
    at squares far from both places (each square attends to the agent's square), many times more
    than a randomly initialised tower lets it."""
    from mazerl.policy.tiny import init_tiny

    maze = sample_maze("wilson", (4, 4), 11)
    options = RenderOptions(square_px=16)
    before = render_rgb(maze.grid, (1, 1), (7, 7), options)
    after = render_rgb(maze.grid, (7, 1), (7, 7), options)  # (7, 1) and (1, 1) are cells: always floor
    far = [(r, c) for r in range(9) for c in range(9) if min(abs(r - 1) + abs(c - 1), abs(r - 7) + abs(c - 1)) >= 3]
    change = {}
    for vision_init in ("maze", "random"):
        policy = load_policy(init_tiny(tmp_path / vision_init, size="base", vision_init=vision_init))
        ip = policy.processor.image_processor
        with torch.no_grad():
            a = _block_output(policy.model, ip, before, layer=1).reshape(9, 9, -1)
            b = _block_output(policy.model, ip, after, layer=1).reshape(9, 9, -1)
        change[vision_init] = sum(((b[r, c] - a[r, c]).norm() / a[r, c].norm()).item() for r, c in far) / len(far)
    assert change["maze"] > 5 * change["random"], change
    with pytest.raises(ValueError, match="one vision token per 16 px square"):
        init_tiny(tmp_path / "small", size="small", vision_init="maze")
