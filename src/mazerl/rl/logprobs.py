"""Per-token log-probabilities of packed samples under the current model.

Only the positions that carry loss are projected through the LM head, so memory grows with the
number of reply tokens, not with sequence length x vocabulary (151k for Qwen).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..policy.chat import ChatFormat, PackedSample
from ..policy.chat import vision_inputs
from ..policy.sampling import SamplingParams
from ..rollout.engine import image_digest


@dataclass
class TokenLogprobs:
    logprobs: torch.Tensor  # (T,) log p of each loss token; carries grad when the model does
    entropy: torch.Tensor  # (T,) entropy of the next-token distribution there (no grad)
    old_logprobs: torch.Tensor  # (T,) the sampler's log p of the same tokens
    sample_index: torch.Tensor  # (T,) which sample (row of the batch) each token came from
    argmax_correct: torch.Tensor  # (T,) bool: greedy decoding would produce this token
    hidden: torch.Tensor | None = None  # (n, width, H) last hidden states, when asked for (auxiliary losses)


def backbone_and_head(model):
    """The decoder stack (returns hidden states) and the LM head of a causal VLM, peft-wrapped or not.

    Split so that callers apply the head only where they need logits (one position per turn)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # unwrap peft
    return base.model, base.lm_head


def token_logprobs(model, chat: ChatFormat, samples: list[PackedSample], sampling: SamplingParams,
                   with_entropy: bool = True, allowed_ids: list[int] | tuple[int, ...] | None = None,
                   return_hidden: bool = False, share_prefixes: bool = True) -> TokenLogprobs:
    """Run the model on `samples` (right-padded into one batch) and score their loss tokens.

    `sampling` must be what the tokens were sampled with (its temperature and banned tokens), so
    that on-policy ratios are 1.
    `allowed_ids`: the tokens the sampler could choose from at every loss position (the action
    grammar's words); the distribution is renormalised over them, exactly as sampled.
    `return_hidden`: also return the last hidden state of every position (for pretraining's
    perception loss at the image tokens).
    `share_prefixes`: run the model once per distinct input (see `shared_inputs`); the scores and their
    gradients are those of one pass per sample. Off when `return_hidden` asks for every sample's states."""
    device = next(model.parameters()).device
    n = len(samples)
    for s in samples:
        if s.loss_mask and s.loss_mask[0]:
            raise ValueError("a sample's first token carries loss: nothing precedes it to predict it")
    inputs_of, source = (shared_inputs(samples, chat.image_pad) if share_prefixes and not return_hidden
                         else ([(s.ids, s.images) for s in samples], list(range(n))))
    width = max(len(i) for i, _ in inputs_of)
    ids = torch.full((len(inputs_of), width), chat.pad_id, dtype=torch.long)
    attention = torch.zeros((len(inputs_of), width), dtype=torch.long)
    for row, (input_ids, _) in enumerate(inputs_of):
        ids[row, : len(input_ids)] = torch.tensor(input_ids)
        attention[row, : len(input_ids)] = 1
    # the loss tokens, row by row, left to right: each is predicted from the position before it, in
    # the input that sample shares
    rows, cols, targets_list, old_list = [], [], [], []
    for r, s in enumerate(samples):
        for c, m in enumerate(s.loss_mask):
            if m:
                rows.append(r)
                cols.append(c)
                targets_list.append(s.ids[c])
                old_list.append(s.old_logprobs[c])
    rows_t = torch.tensor(rows, dtype=torch.long)
    cols_t = torch.tensor(cols, dtype=torch.long)
    images = [img for _, imgs in inputs_of for img in imgs]
    inputs = {"input_ids": ids, "attention_mask": attention, "mm_token_type_ids": (ids == chat.image_pad).long(),
              **vision_inputs(chat.image_processor, images)}
    inputs = {k: v.to(device) for k, v in inputs.items()}
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(next(model.parameters()).dtype)
    backbone, head = backbone_and_head(model)
    hidden = backbone(**inputs).last_hidden_state  # (distinct inputs, width, H)
    input_row = torch.tensor(source, dtype=torch.long)[rows_t]
    temperature = 1.0 if sampling.greedy else sampling.temperature
    logits = head(hidden[input_row.to(device), (cols_t - 1).to(device)]).float() / temperature
    logits[:, list(sampling.banned_ids)] = float("-inf")  # the sampler never draws them either
    if allowed_ids is not None:
        keep = torch.full_like(logits, float("-inf"))
        keep[:, list(allowed_ids)] = 0.0
        logits = logits + keep
    logp_all = torch.log_softmax(logits, dim=-1)
    targets = torch.tensor(targets_list, dtype=torch.long, device=device)
    if allowed_ids is not None and not torch.isin(targets, torch.tensor(list(allowed_ids), device=device)).all():
        raise ValueError("a loss token lies outside the reply grammar's choices: samples and grammar disagree")
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if with_entropy:
        with torch.no_grad():
            p = logp_all.exp()
            entropy = -(p * torch.where(p > 0, logp_all, torch.zeros_like(logp_all))).sum(-1)
    else:
        entropy = torch.zeros_like(logp).detach()
    correct = (logp_all.detach().argmax(-1) == targets)
    return TokenLogprobs(logprobs=logp, entropy=entropy, old_logprobs=torch.tensor(old_list, dtype=torch.float32, device=device),
                         sample_index=rows_t.to(device), argmax_correct=correct, hidden=hidden if return_hidden else None)


def shared_inputs(samples: list[PackedSample], image_pad_id: int) -> tuple[list[tuple[list[int], list]], list[int]]:
    """The distinct model inputs `samples` need, and for each sample the index of the one it uses.

    A causal model's state at a position depends only on the tokens (and images) up to it, so a sample
    needs its tokens only up to its last loss token (exclusive: that token is predicted, not read), and
    samples whose inputs are then equal share one forward pass. In a GRPO step that is common: the group's
    episodes meet at the same squares with the same turn counter and feedback, and only the sampled move
    after that prefix differs (with the action grammar, everything after the move is forced and carries no
    loss). A sample keeps its whole sequence when cutting it would drop one of its images."""
    distinct: dict[tuple, int] = {}
    inputs: list[tuple[list[int], list]] = []
    source: list[int] = []
    for s in samples:
        loss_cols = [c for c, m in enumerate(s.loss_mask) if m]
        ids = s.ids
        if loss_cols and image_pad_id not in ids[loss_cols[-1]:]:
            ids = ids[: loss_cols[-1]]
        key = (tuple(ids), tuple(image_digest(img) for img in s.images))
        if key not in distinct:
            distinct[key] = len(inputs)
            inputs.append((ids, s.images))
        source.append(distinct[key])
    return inputs, source

