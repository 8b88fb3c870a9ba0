"""Build a tiny Qwen3-VL-architecture model with random weights, its own tokenizer and the Qwen
image processor, saved as a normal Hugging Face model directory.

It stands in for `Qwen/Qwen3-VL-8B-Instruct` where nothing can be downloaded (CI, laptops): the
same loader (`policy.loading.load_policy`) opens both. Sizes are chosen to learn on 2 CPU cores:
`small` (~2.7M parameters: 4 text layers of width 192, a 2-layer vision tower of width 96) and
`medium` (~9M) use 16 px patches merged 2x2, so at 32 px per maze square one vision token covers
exactly one square. `base` (the shape of the shipped pretrained `tiny-base`) uses unmerged 16 px
patches at 16 px per square: the same one token per square from a quarter of the pixels. `deep`
(~4.5M) is `base` with 8 text layers and 64-wide heads (measured in docs/BENCHMARKS.md: it levels
off where `base` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers.models.qwen3_vl.modeling_qwen3_vl import get_vision_position_ids

from ..atomic import atomic_directory
from ..envs.actions import ACTIONS
from ..envs.maze_env import FEEDBACK_INVALID, FEEDBACK_OK, FEEDBACK_WALL
from .prompts import SHORT_SYSTEM_PROMPT, SYSTEM_PROMPT, turn_text

# Qwen's special tokens, in Qwen's order, so chat formatting code written for Qwen works unchanged.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
ACTION_OPEN, ACTION_CLOSE = "<action>", "</action>"

# ChatML, as Qwen models use it; images become <|vision_start|><|image_pad|><|vision_end|>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SIZES = {
    # text: hidden, layers, heads, kv heads, head dim, mlp; vision: hidden, depth, heads, mlp, patch px, merge;
    # tokenizer: vocabulary, whole_phrases (merges across spaces: fixed phrases become few tokens)
    "small": dict(hidden=192, layers=4, heads=6, kv_heads=2, head_dim=32, mlp=512, v_hidden=96, v_depth=2, v_heads=2, v_mlp=384,
                  patch=16, merge=2, vocab=640, whole_phrases=False),
    "medium": dict(hidden=320, layers=6, heads=10, kv_heads=2, head_dim=32, mlp=1024, v_hidden=128, v_depth=3, v_heads=4, v_mlp=512,
                   patch=16, merge=2, vocab=640, whole_phrases=False),
    # tiny-base's shape: one 16 px patch = one maze square at 16 px (render_scale 0.64), no merging, so
    # every image token is one square; short token sequences (phrase tokens) keep a step cheap on CPU.
    "base": dict(hidden=192, layers=4, heads=4, kv_heads=2, head_dim=48, mlp=576, v_hidden=128, v_depth=3, v_heads=4, v_mlp=512,
                 patch=16, merge=1, vocab=1024, whole_phrases=True),
    # base's view with twice the text depth and 64-wide heads (which vLLM's CPU build serves): more
    # layers for following a route through the maze, within the 20 MB cap of a shipped base.
    "deep": dict(hidden=192, layers=8, heads=3, kv_heads=1, head_dim=64, mlp=512, v_hidden=128, v_depth=3, v_heads=2, v_mlp=512,
                 patch=16, merge=1, vocab=1024, whole_phrases=True),
}
# base with twice the text layers and nothing else changed, so `vision_init: maze` (four vision heads)
# still applies: does depth raise where GRPO levels off? (docs/history.md, 2026-12-07: it does not)
SIZES["base-deep"] = dict(SIZES["base"], layers=8)
TinySize = Literal["small", "medium", "base", "deep", "base-deep"]
# How the vision tower starts: "random" (Hugging Face's init); "neighbours": block 0's first four heads
# look at the square to the right, above, left and below (position-only attention, as ConViT starts its
# heads local), so every vision token carries its neighbours' content from step 0; "maze": that, and
# block 1's first two heads attend from every square to the agent's square and to the goal's, so
# every vision token also carries what is around the agent and where both are. All of it is only a
# starting point: every weight trains (docs/BENCHMARKS.md measures what each start changes).
VisionInit = Literal["random", "neighbours", "maze"]
NEIGHBOUR_OFFSETS = ((0, 1), (-1, 0), (0, -1), (1, 0))  # (row, column) steps: right, up, left, down
# Whole images from 64x64 up to 512x512 (a 16x16-square maze at 32 px); larger ones are scaled down.
MIN_PIXELS = 64 * 64
MAX_PIXELS = 512 * 512


def _tokenizer_corpus(whole_phrases: bool = False) -> list[str]:
    """Text the tiny model will read and write; the BPE merges are learned from it."""
    lines = [SYSTEM_PROMPT] * 64 + [SHORT_SYSTEM_PROMPT] * 64 + [FEEDBACK_OK, FEEDBACK_WALL, FEEDBACK_INVALID]
    for turn in range(1, 65):
        for fb in (FEEDBACK_OK, FEEDBACK_WALL, FEEDBACK_INVALID, ""):
            lines.append(turn_text(fb, turn, 64))
    for a in ACTIONS:
        lines += [f"{ACTION_OPEN}{a}{ACTION_CLOSE}", f" {a}", a] * 8
    if whole_phrases:
        lines += ["system\n", "user\n", "assistant\n"] * 256  # ChatML role headers: one token each
    return lines


def build_tokenizer(vocab_size: int = 640, whole_phrases: bool = False):
    """A byte-level BPE tokenizer (any text encodes) trained on our prompt texts."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # whole_phrases: merges may cross spaces, so fixed phrases (feedback, turn counter) become a few tokens
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not whole_phrases)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(whole_phrases), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=32768,
    )
    # The answer tags are ordinary (decoded, never skipped) single tokens.
    fast.add_tokens([ACTION_OPEN, ACTION_CLOSE])
    for word in ACTIONS:
        ids = fast.encode(word, add_special_tokens=False)
        if len(ids) != 1:
            raise RuntimeError(f"action word {word!r} is not a single token in the tiny tokenizer: {ids}")
    return fast


def build_processor(tokenizer, patch: int = 16, merge: int = 2):
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    common = dict(patch_size=patch, merge_size=merge, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    image_processor = Qwen2VLImageProcessor(size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}, **common)
    video_processor = Qwen3VLVideoProcessor(size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}, **common)
    return Qwen3VLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor, chat_template=CHAT_TEMPLATE
    )


def build_config(tokenizer, size: TinySize = "small"):
    from transformers import Qwen3VLConfig

    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}: allowed {', '.join(SIZES)}")
    s = SIZES[size]
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    half = s["head_dim"] // 2
    mrope = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]  # (t, h, w) sections, as Qwen splits them
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=s["hidden"],
            intermediate_size=s["mlp"],
            num_hidden_layers=s["layers"],
            num_attention_heads=s["heads"],
            num_key_value_heads=s["kv_heads"],
            head_dim=s["head_dim"],
            max_position_embeddings=32768,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope, "mrope_interleaved": True},
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(
            depth=s["v_depth"],
            hidden_size=s["v_hidden"],
            intermediate_size=s["v_mlp"],
            num_heads=s["v_heads"],
            patch_size=s["patch"],
            spatial_merge_size=s["merge"],
            temporal_patch_size=2,
            out_hidden_size=s["hidden"],
            num_position_embeddings=1024,  # a 32x32 grid of learned positions, interpolated per image
            deepstack_visual_indexes=[s["v_depth"] - 1],
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def neighbour_attention_biases(model, offsets=NEIGHBOUR_OFFSETS, layer: int = 0, grid: int = 9, steps: int = 300,
                               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Query and key biases that make head h of vision block `layer` attend to the patch at
    `offsets[h]` (rows, columns) from every patch, through the model's own 2D rotary embedding.

    With the query and key weights at zero, an attention score depends only on the two patches'
    relative position, so the biases are fitted on a `grid` x `grid` image and hold for any size.
    Returns (query biases, key biases) of shape (heads, head_dim) and the mean attention the fitted
    heads give their target patch."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

    vis = model.model.visual
    attn = vis.blocks[layer].attn
    if len(offsets) > attn.num_heads:
        raise ValueError(f"{len(offsets)} neighbour heads asked of a vision block with {attn.num_heads} heads")
    n = grid * grid
    position_ids = get_vision_position_ids(torch.tensor([[1, grid, grid]]), vis.spatial_merge_size)
    cos, sin = vis.rotary_pos_emb(torch.zeros(n, vis.config.hidden_size), position_ids)
    targets = []
    for dr, dc in offsets:
        pairs = [(i, (i // grid + dr) * grid + i % grid + dc) for i in range(n)
                 if 0 <= i // grid + dr < grid and 0 <= i % grid + dc < grid]
        targets.append(torch.tensor(pairs))
    gen = torch.Generator().manual_seed(seed)
    bq = torch.randn(len(offsets), attn.head_dim, generator=gen).requires_grad_()
    bk = torch.randn(len(offsets), attn.head_dim, generator=gen).requires_grad_()
    opt = torch.optim.Adam([bq, bk], lr=0.05)
    for _ in range(steps):
        q, k = apply_rotary_pos_emb_vision(bq.expand(n, -1, -1), bk.expand(n, -1, -1), cos, sin)
        logp = (torch.einsum("ihd,jhd->hij", q, k) * attn.scaling).log_softmax(-1)
        fit = torch.stack([logp[h, t[:, 0], t[:, 1]].mean() for h, t in enumerate(targets)])
        loss = -fit.mean() + 1e-4 * (bq.square().sum() + bk.square().sum())  # the penalty keeps them finite
        opt.zero_grad()
        loss.backward()
        opt.step()
    return bq.detach(), bk.detach(), float(fit.detach().exp().mean())


def init_neighbour_heads(model, seed: int = 0) -> float:
    """Start vision block 0 as a neighbour look-up (see VisionInit): its first heads' queries and keys
    become the fitted position-only biases, and its value and output maps orthogonal, so a
    neighbour's content arrives at full strength. Returns the fitted heads' mean target attention."""
    attn = model.model.visual.blocks[0].attn
    dim, hd = attn.dim, attn.head_dim
    bq, bk, fit = neighbour_attention_biases(model, seed=seed)
    with torch.no_grad():
        for h in range(len(bq)):
            for part, bias in ((0, bq[h]), (1, bk[h])):  # qkv rows: [queries | keys | values], head by head
                rows = slice(part * dim + h * hd, part * dim + (h + 1) * hd)
                attn.qkv.weight[rows] = 0.0
                attn.qkv.bias[rows] = bias
        torch.nn.init.orthogonal_(attn.qkv.weight[2 * dim:])
        attn.qkv.bias[2 * dim:] = 0.0
        torch.nn.init.orthogonal_(attn.proj.weight)
        attn.proj.bias.zero_()
    return fit


def _marker_frames(processor_image, count: int, seed: int):
    """Rendered frames of random 2x2-4x4 mazes with the agent on a random floor square, at tiny-base's
    16 px squares, and for each frame the flat patch index of the agent and of the goal."""
    import random

    from ..mazes.render import RenderOptions, render_rgb
    from ..mazes.sampling import sample_maze

    rng = random.Random(seed)
    frames, agents, goals = [], [], []
    offset = 0
    for i in range(count):
        cells = rng.choice((2, 3, 4, 4))
        maze = sample_maze("wilson", (cells, cells), 7_000_000 + seed * 10_000 + i)
        h, w = maze.grid.shape
        floor = [(r, c) for r in range(h) for c in range(w) if not maze.grid[r, c] and (r, c) != maze.goal]
        agent = rng.choice(floor)
        frames.append(render_rgb(maze.grid, agent, maze.goal, RenderOptions(square_px=16)))
        agents.append(offset + agent[0] * w + agent[1])
        goals.append(offset + maze.goal[0] * w + maze.goal[1])
        offset += h * w
    return frames, agents, goals


def _block_input(model, image_processor, frames, layer: int) -> torch.Tensor:
    """What vision block `layer` normalises and attends over, for `frames` (all patches, in order)."""
    from .chat import vision_inputs

    vis = model.model.visual
    captured = []
    hook = vis.blocks[layer].register_forward_pre_hook(lambda m, args, kwargs: captured.append(args[0]), with_kwargs=True)
    try:
        inputs = vision_inputs(image_processor, frames)
        with torch.no_grad():
            vis(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"])
    finally:
        hook.remove()
    return vis.blocks[layer].norm1(captured[0]).detach()


def _linear_detector(features: torch.Tensor, positive: torch.Tensor, steps: int = 400) -> tuple[torch.Tensor, torch.Tensor, float]:
    """A logistic-regression direction separating the `positive` rows; returns (weights, bias, margin):
    the smallest positive score minus the largest negative one."""
    w = torch.zeros(features.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=0.05)
    balance = (~positive).sum() / positive.sum()
    for _ in range(steps):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(features @ w + b, positive.float(), pos_weight=balance)
        loss = loss + 1e-3 * w.square().sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    score = (features @ w + b).detach()
    return w.detach(), b.detach(), float(score[positive].min() - score[~positive].max())


def init_finder_heads(model, image_processor, seed: int = 0, sharpness: float = 12.0) -> dict[str, float]:
    """Block 1's heads 0 and 1 attend from every square to the agent's square and to the goal's.

    Each key is a linear detector of its marker, fitted on block 1's inputs for rendered frames and
    placed in the head's slowest rotary dimension (it barely turns over a maze's width), with a
    constant query: the score depends on the key's content alone. `sharpness` is the score gap between
    the marker and the best other square on the fitted frames. Returns each detector's margin."""
    vis = model.model.visual
    attn = vis.blocks[1].attn
    dim, hd = attn.dim, attn.head_dim
    frames, agents, goals = _marker_frames(image_processor, 96, seed)
    features = _block_input(model, image_processor, frames, layer=1)
    n = len(features)
    # the slowest-turning rotary dimension: cos stays ~1 across any 64x64 grid of positions
    position_ids = get_vision_position_ids(torch.tensor([[1, 64, 64]]), vis.spatial_merge_size)
    cos, _ = vis.rotary_pos_emb(torch.zeros(64 * 64, vis.config.hidden_size), position_ids)
    slow = int(cos[:, : hd // 2].min(0).values.argmax())
    margins = {}
    for h, (name, index) in enumerate((("agent", agents), ("goal", goals))):
        positive = torch.zeros(n, dtype=torch.bool)
        positive[index] = True
        w, b, margin = _linear_detector(features, positive)
        if margin <= 0:
            raise RuntimeError(f"no linear detector separates the {name}'s square in vision block 1 (margin {margin:.2f})")
        gain = sharpness / (margin * attn.scaling)
        with torch.no_grad():
            q_rows = slice(h * hd, (h + 1) * hd)
            k_rows = slice(dim + h * hd, dim + (h + 1) * hd)
            attn.qkv.weight[q_rows] = 0.0
            attn.qkv.bias[q_rows] = 0.0
            attn.qkv.bias[h * hd + slow] = 1.0
            attn.qkv.weight[k_rows] = 0.0
            attn.qkv.bias[k_rows] = 0.0
            attn.qkv.weight[dim + h * hd + slow] = gain * w
            attn.qkv.bias[dim + h * hd + slow] = gain * b
        margins[name] = margin
    with torch.no_grad():
        torch.nn.init.orthogonal_(attn.qkv.weight[2 * dim:])
        attn.qkv.bias[2 * dim:] = 0.0
        torch.nn.init.orthogonal_(attn.proj.weight)
        attn.proj.bias.zero_()
    return margins


def init_tiny(out: str | Path, size: TinySize = "small", seed: int = 0, overwrite: bool = False,
              vision_init: VisionInit = "random") -> Path:
    """Write a randomly initialised tiny Qwen3-VL model directory to `out` (`vision_init`: how its
    first vision block starts)."""
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}: allowed {', '.join(SIZES)}")
    spec = SIZES[size]
    if vision_init not in ("random", "neighbours", "maze"):
        raise ValueError(f"unknown vision_init {vision_init!r}: allowed random, neighbours, maze")
    if vision_init != "random" and (spec["patch"] != 16 or spec["merge"] != 1):
        square_sizes = ", ".join(k for k, v in SIZES.items() if v["patch"] == 16 and v["merge"] == 1)
        raise ValueError(f"vision_init {vision_init!r} needs one vision token per 16 px square (sizes {square_sizes}), not {size!r}")
    tokenizer = build_tokenizer(spec["vocab"], whole_phrases=spec["whole_phrases"])
    processor = build_processor(tokenizer, spec["patch"], spec["merge"])
    config = build_config(tokenizer, size)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config)
    if vision_init in ("neighbours", "maze"):
        init_neighbour_heads(model, seed=seed)
    if vision_init == "maze":
        init_finder_heads(model, processor.image_processor, seed=seed)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    from ..atomic import write_json
    from .config import PolicyConfig
    from .views import named_view

    with atomic_directory(out, overwrite=overwrite) as tmp:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        # a model mazerl made carries its view, as trained ones do: mazerl's defaults, which it was shown
        # until now without a file (a model with no view file needs a named one: policy.views)
        write_json(tmp / PolicyConfig.VIEW_FILE, named_view("mazerl").settings)
    return Path(out)
