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
TinySize = Literal["small", "medium", "base", "deep"]
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


def init_tiny(out: str | Path, size: TinySize = "small", seed: int = 0, overwrite: bool = False) -> Path:
    """Write a randomly initialised tiny Qwen3-VL model directory to `out`."""
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}: allowed {', '.join(SIZES)}")
    spec = SIZES[size]
    tokenizer = build_tokenizer(spec["vocab"], whole_phrases=spec["whole_phrases"])
    processor = build_processor(tokenizer, spec["patch"], spec["merge"])
    config = build_config(tokenizer, size)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    with atomic_directory(out, overwrite=overwrite) as tmp:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
    return Path(out)
