"""The rehearsal's stand-in for a real model: a tiny Qwen3-VL with the real one's proportions.

From the real model's shipped `config.json`, every width is divided down and every ratio kept: attention
heads to KV heads (GQA), heads x head size = hidden size, MLP to hidden, vision MLP to vision width, the
deepstack layers at the same fractions of the vision tower's depth, the same patch size, temporal patch
and spatial merge. Its images go through the real model's `preprocessor_config.json`, so every maze
image is the same number of image tokens as for the real model, and the vLLM per-prompt limits the
history needs are the real ones. The text head size is one vLLM's CPU attention serves (it computes
other sizes wrongly; rollout/vllm_engine.check_servable).

Two things cannot be kept: Qwen's 151,936-token vocabulary needs its tokenizer (not downloadable here),
so the tiny BPE tokenizer of `policy.tiny` is used; and random weights would write every reply to
`max_new_tokens` without ever naming a move, so a few weights are set by hand to make the replies of a
random mover: `<action>` after the turn's prompt, then one of the four moves (rarely `stop`), `</action>`
and the end of the turn (`REPLY_GRAMMAR`). Replies are still sampled free-form from the whole vocabulary
and capped at the shipped `max_new_tokens`; the maze images still go through the vision tower.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import torch

from ..atomic import atomic_directory

REHEARSAL_TEXT_HEAD_DIM = 32  # served by vLLM's CPU attention (32, 64, 80, 96, 112, 128, ...)
TEXT_SCALE = 32  # 8B: 32 heads -> 1 KV group of 4 heads ... widths divided by this
VISION_SCALE = 8  # 8B: 16 vision heads of 72 -> 2 heads of 72
LAYERS = 4  # text decoder layers; the vision tower gets as many blocks
# (after this token, the next token is likely ..., its logit): each rule is a feature of the token's embedding that
# the residual stream carries to the last norm, read by the output rows of the tokens that follow it
REPLY_GRAMMAR = [("\n", ["<action>"], 12.0),
                 ("<action>", ["right", "up", "left", "down"], 10.0), ("<action>", ["stop"], 7.0),
                 ("right", ["</action>"], 10.0), ("up", ["</action>"], 10.0), ("left", ["</action>"], 10.0),
                 ("down", ["</action>"], 10.0), ("stop", ["</action>"], 10.0), ("</action>", ["<|im_end|>"], 10.0)]


def shipped_config(name: str) -> dict:
    """A real model's config.json shipped with the package (assets/configs/<name>)."""
    path = files("mazerl").joinpath(f"assets/configs/{name}/config.json")
    return json.loads(path.read_text())


def proportional_config(real: dict, tokenizer) -> "object":
    """The Qwen3VLConfig of the rehearsal model for the real model's config dict."""
    from transformers import Qwen3VLConfig

    from ..policy.tiny import SPECIAL_TOKENS

    t, v = real["text_config"], real["vision_config"]
    heads = max(1, t["num_attention_heads"] // TEXT_SCALE) * (t["num_attention_heads"] // t["num_key_value_heads"])
    kv_heads = max(1, heads * t["num_key_value_heads"] // t["num_attention_heads"])
    hidden = heads * REHEARSAL_TEXT_HEAD_DIM
    v_head = v["hidden_size"] // v["num_heads"]
    v_heads = max(1, v["num_heads"] // VISION_SCALE)
    v_hidden = v_heads * v_head
    depth = LAYERS
    deepstack = sorted({min(depth - 1, round(i * depth / v["depth"])) for i in v["deepstack_visual_indexes"]})
    half = REHEARSAL_TEXT_HEAD_DIM // 2
    real_sections = (t.get("rope_scaling") or t.get("rope_parameters") or {}).get("mrope_section", [24, 20, 20])
    sections = [round(s * half / sum(real_sections)) for s in real_sections]
    sections[0] += half - sum(sections)
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS}
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=hidden,
            intermediate_size=round(hidden * t["intermediate_size"] / t["hidden_size"]),
            num_hidden_layers=LAYERS, num_attention_heads=heads, num_key_value_heads=kv_heads,
            head_dim=REHEARSAL_TEXT_HEAD_DIM, max_position_embeddings=t["max_position_embeddings"],
            rope_parameters={"rope_type": "default", "rope_theta": float(t.get("rope_theta", 5_000_000)),
                             "mrope_section": sections, "mrope_interleaved": True},
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(
            depth=depth, hidden_size=v_hidden,
            intermediate_size=round(v_hidden * v["intermediate_size"] / v["hidden_size"]),
            num_heads=v_heads, patch_size=v["patch_size"], spatial_merge_size=v["spatial_merge_size"],
            temporal_patch_size=v["temporal_patch_size"], out_hidden_size=hidden,
            num_position_embeddings=v["num_position_embeddings"], deepstack_visual_indexes=deepstack,
        ),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=bool(real.get("tie_word_embeddings", False)),
    )


def _processor(real_name: str, tokenizer):
    """The tiny tokenizer with the real model's image processing (its preprocessor_config.json)."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    from ..policy.tiny import CHAT_TEMPLATE

    pre = json.loads(files("mazerl").joinpath(f"assets/configs/{real_name}/preprocessor_config.json").read_text())
    common = dict(patch_size=pre["patch_size"], merge_size=pre["merge_size"], temporal_patch_size=pre["temporal_patch_size"],
                  image_mean=pre["image_mean"], image_std=pre["image_std"], size=pre["size"])
    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**common), tokenizer=tokenizer,
                            video_processor=Qwen3VLVideoProcessor(**common), chat_template=CHAT_TEMPLATE)


def _token(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise RuntimeError(f"{text!r} is not one token of the rehearsal tokenizer: {ids}")
    return ids[0]


def set_reply_grammar(model, tokenizer) -> None:
    """Give token t's embedding a feature of its own (dimension k, value 1 where the rest are ~0.02) and the
    output row of each token that may follow t a weight on that feature: after t, those tokens' logits lead."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    hidden = embed.shape[1]
    after = list(dict.fromkeys(t for t, _, _ in REPLY_GRAMMAR))
    with torch.no_grad():
        for k, text in enumerate(after):
            embed[:, k] = 0.0
            embed[_token(tokenizer, text), k] = 1.0
            head[:, k] = 0.0
        scale = 1.0 / hidden ** 0.5  # the last norm makes a lone unit feature ~sqrt(hidden) wide
        for text, following, logit in REPLY_GRAMMAR:
            for nxt in following:
                head[_token(tokenizer, nxt), after.index(text)] = logit * scale


def build_rehearsal_model(real_name: str, out: str | Path, seed: int = 0) -> Path:
    """Write the rehearsal model for the shipped real model `real_name` (e.g. Qwen3-VL-8B-Instruct) to `out`."""
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    from ..policy.tiny import build_tokenizer

    real = shipped_config(real_name)
    tokenizer = build_tokenizer(640)
    config = proportional_config(real, tokenizer)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    set_reply_grammar(model, tokenizer)
    model.generation_config = GenerationConfig(eos_token_id=end, pad_token_id=tokenizer.pad_token_id, do_sample=False)
    with atomic_directory(out, overwrite=True) as tmp:
        model.save_pretrained(tmp)
        _processor(real_name, tokenizer).save_pretrained(tmp)
        (tmp / "rehearsal_model.json").write_text(json.dumps({"proportions_of": real_name, "seed": seed}, indent=2) + "\n")
    return Path(out)
