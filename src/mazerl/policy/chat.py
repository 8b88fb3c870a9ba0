"""Conversations kept as token ids: what the model saw and said, turn by turn, never re-tokenised.

A conversation is a list of segments: prompt text, images, and the model's replies exactly as
sampled (with their log-probabilities). The context for the next turn is built from segments, so:
- the sampled token ids are reused verbatim (no retokenisation drift);
- an image outside the history window is dropped as a whole: its placeholder tokens and its
  pixels together (they can never disagree);
- mRoPE positions are recomputed by the model from the final ids and image grids each time, which
  is what the model does during generation too, so they are consistent across turns.

The text between special tokens is tokenised piece by piece, which is exactly what a tokenizer does
with a ChatML string, so the ids equal `processor.apply_chat_template(...)` (tests check this).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from .prompts import SYSTEM_PROMPT

if TYPE_CHECKING:
    import torch

SegmentKind = Literal["prompt", "image", "reply"]


@dataclass
class Segment:
    kind: SegmentKind
    ids: list[int]
    turn: int  # 0 = system prompt; k = the k-th user turn and the reply to it
    image: np.ndarray | None = None  # (H, W, 3) uint8 frame for image segments
    logprobs: list[float] | None = None  # per reply token, from the sampler
    generated: list[bool] | None = None  # per reply token: sampled (True) or appended by us (False)


@dataclass
class Context:
    """A model input: token ids, the images their placeholders stand for (in order), and which
    segments it was made of."""

    ids: list[int]
    images: list[np.ndarray]
    segments: tuple[int, ...]


@dataclass
class PackedSample:
    """One training sequence: a context plus replies, with the loss on the replies sampled from it."""

    ids: list[int]
    images: list[np.ndarray]
    loss_mask: list[int]  # 1 on sampled reply tokens of the turns this sequence was the context for
    old_logprobs: list[float]  # sampler log-probs at those positions, 0 elsewhere
    turns: list[int]
    token_turns: list[int] = field(default_factory=list)  # per token: the turn of the segment it belongs to (0: system)

    @property
    def n_loss_tokens(self) -> int:
        return int(sum(self.loss_mask))


class ChatFormat:
    """ChatML in token space for Qwen-VL processors (and our tiny model's, which mirrors them)."""

    def __init__(self, processor, system_prompt: str = SYSTEM_PROMPT):
        tok = processor.tokenizer
        self.tokenizer = tok
        self.image_processor = processor.image_processor
        self.system_prompt = system_prompt
        ids = tok.convert_tokens_to_ids
        self.im_start = ids("<|im_start|>")
        self.im_end = ids("<|im_end|>")
        self.vision_start = ids("<|vision_start|>")
        self.vision_end = ids("<|vision_end|>")
        self.image_pad = ids("<|image_pad|>")
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.im_end
        for name in ("im_start", "im_end", "vision_start", "vision_end", "image_pad"):
            if getattr(self, name) in (None, tok.unk_token_id):
                raise ValueError(f"the tokenizer has no {name} token: not a Qwen-VL-style (ChatML) tokenizer")
        self.merge = int(getattr(self.image_processor, "merge_size", 2))
        # Tokens a reply may never contain: vision markers would corrupt the next turn's image
        # bookkeeping (mRoPE counts them), and a new turn header is not the model's to write.
        banned = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<|im_start|>"]
        self.banned_reply_ids = sorted({ids(t) for t in banned if ids(t) not in (None, tok.unk_token_id)} | {self.pad_id} - {self.im_end})
        self._newline = self.text("\n")
        self._token_count_cache: dict[tuple[int, int], int] = {}

    def text(self, s: str) -> list[int]:
        return self.tokenizer.encode(s, add_special_tokens=False) if s else []

    def image_tokens(self, height: int, width: int) -> int:
        """How many placeholder tokens an image of this size becomes (after resizing and merging)."""
        key = (height, width)
        if key not in self._token_count_cache:
            patches = self.image_processor.get_number_of_image_patches(height, width, {})
            self._token_count_cache[key] = patches // (self.merge * self.merge)
        return self._token_count_cache[key]

    def system(self) -> list[Segment]:
        ids = [self.im_start, *self.text("system\n" + self.system_prompt), self.im_end, *self._newline]
        return [Segment("prompt", ids, turn=0)]

    def user_turn(self, turn: int, text: str, image: np.ndarray) -> list[Segment]:
        """`<|im_start|>user\\n<image>{text}<|im_end|>\\n<|im_start|>assistant\\n` as three segments."""
        n = self.image_tokens(image.shape[0], image.shape[1])
        head = [self.im_start, *self.text("user\n")]
        img = [self.vision_start, *([self.image_pad] * n), self.vision_end]
        tail = [*self.text(text), self.im_end, *self._newline, self.im_start, *self.text("assistant\n")]
        return [Segment("prompt", head, turn), Segment("image", img, turn, image=image), Segment("prompt", tail, turn)]

    def reply(self, turn: int, ids: list[int], logprobs: list[float], learn: bool = True,
              forced: list[bool] | None = None) -> Segment:
        """The model's reply as sampled, closed with `<|im_end|>\\n` (appended, not sampled, if missing).

        `learn=False` marks a reply that is context only (e.g. an injected random move): no loss on it.
        `forced` marks tokens a reply grammar fixed (policy.grammar): they are not the model's choice
        and carry no loss.
        """
        ids = list(ids)
        generated = [learn and not (forced[k] if forced else False) for k in range(len(ids))]
        lps = list(logprobs)
        if not ids or ids[-1] != self.im_end:
            ids.append(self.im_end)
            generated.append(False)
            lps.append(0.0)
        ids += self._newline
        generated += [False] * len(self._newline)
        lps += [0.0] * len(self._newline)
        return Segment("reply", ids, turn, logprobs=lps, generated=generated)

    def decode_reply(self, ids: list[int]) -> str:
        """Reply text for the environment: everything sampled, up to the end-of-turn token."""
        if ids and ids[-1] == self.im_end:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)


@dataclass
class Conversation:
    """One episode's segments, plus the context each turn was generated from."""

    segments: list[Segment] = field(default_factory=list)
    turn_contexts: list[tuple[int, ...]] = field(default_factory=list)  # per turn: segment indices
    turn_replies: list[int] = field(default_factory=list)  # per turn: index of its reply segment

    def add(self, segs: list[Segment] | Segment) -> None:
        self.segments.extend(segs if isinstance(segs, list) else [segs])

    def context(self, history_turns: int | None, history_images: int | None) -> Context:
        """The model input for the current (last) turn.

        `history_turns`: earlier turns kept (None = all); `history_images`: how many of the most
        recent turns keep their image (None = all, >= 1: the current image is always shown).
        """
        current = self.segments[-1].turn
        first_turn = 1 if history_turns is None else max(1, current - history_turns)
        first_image_turn = 1 if history_images is None else current - history_images + 1
        keep: list[int] = []
        for i, seg in enumerate(self.segments):
            if seg.turn != 0 and seg.turn < first_turn:
                continue
            if seg.kind == "image" and seg.turn < first_image_turn:
                continue
            keep.append(i)
        ids: list[int] = []
        images: list[np.ndarray] = []
        for i in keep:
            seg = self.segments[i]
            ids += seg.ids
            if seg.image is not None:
                images.append(seg.image)
        return Context(ids=ids, images=images, segments=tuple(keep))

    def record_turn(self, context: Context, reply: Segment) -> None:
        self.turn_contexts.append(context.segments)
        self.add(reply)
        self.turn_replies.append(len(self.segments) - 1)

    def pack(self) -> list[PackedSample]:
        """Training sequences: consecutive turns share one sequence while each turn's context is a
        prefix of the next (always, with full history); a dropped image or turn starts a new one."""
        samples: list[PackedSample] = []
        chain: list[int] = []  # turn numbers (0-based) in the current sequence
        for t, ctx in enumerate(self.turn_contexts):
            full = (*ctx, self.turn_replies[t])
            if chain:
                prev = (*self.turn_contexts[chain[-1]], self.turn_replies[chain[-1]])
                if full[: len(prev)] != prev:
                    samples.append(self._sample(chain))
                    chain = []
            chain.append(t)
        if chain:
            samples.append(self._sample(chain))
        return samples

    def _sample(self, chain: list[int]) -> PackedSample:
        last = chain[-1]
        keys = (*self.turn_contexts[last], self.turn_replies[last])
        on_policy = {self.turn_replies[t] for t in chain}
        ids: list[int] = []
        images: list[np.ndarray] = []
        mask: list[int] = []
        lps: list[float] = []
        token_turns: list[int] = []
        for i in keys:
            seg = self.segments[i]
            ids += seg.ids
            token_turns += [seg.turn] * len(seg.ids)
            if seg.image is not None:
                images.append(seg.image)
            if i in on_policy and seg.generated is not None and seg.logprobs is not None:
                mask += [int(g) for g in seg.generated]
                lps += [lp if g else 0.0 for lp, g in zip(seg.logprobs, seg.generated)]
            else:
                mask += [0] * len(seg.ids)
                lps += [0.0] * len(seg.ids)
        return PackedSample(ids=ids, images=images, loss_mask=mask, old_logprobs=lps, turns=[t + 1 for t in chain],
                            token_turns=token_turns)


def vision_inputs(image_processor, images: list[np.ndarray]) -> dict[str, torch.Tensor]:
    """pixel_values and image_grid_thw for images in placeholder order (empty dict for none)."""
    if not images:
        return {}
    out = image_processor(images=images, return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
