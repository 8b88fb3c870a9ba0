"""Per-token log-probabilities of packed samples under the current model.

Only the positions that carry loss are projected through the LM head, so memory grows with the
number of reply tokens, not with sequence length x vocabulary (151k for Qwen).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..policy.chat import ChatFormat, PackedSample
from ..rollout.engine import SamplingParams, vision_inputs


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
                   return_hidden: bool = False) -> TokenLogprobs:
    """Run the model on `samples` (right-padded into one batch) and score their loss tokens.

    `sampling` must be what the tokens were sampled with (its temperature and banned tokens), so
    that on-policy ratios are 1.
    `allowed_ids`: the tokens the sampler could choose from at every loss position (the action
    grammar's words); the distribution is renormalised over them, exactly as sampled.
    `return_hidden`: also return the last hidden state of every position (for pretraining's
    perception loss at the image tokens)."""
    device = next(model.parameters()).device
    width = max(len(s.ids) for s in samples)
    n = len(samples)
    ids = torch.full((n, width), chat.pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.bool)
    old = torch.zeros((n, width), dtype=torch.float32)
    for row, s in enumerate(samples):
        L = len(s.ids)
        ids[row, :L] = torch.tensor(s.ids)
        attention[row, :L] = 1
        loss_mask[row, :L] = torch.tensor(s.loss_mask, dtype=torch.bool)
        old[row, :L] = torch.tensor(s.old_logprobs)
    if loss_mask[:, 0].any():
        raise ValueError("a sample's first token carries loss: nothing precedes it to predict it")
    images = [img for s in samples for img in s.images]
    inputs = {"input_ids": ids, "attention_mask": attention, "mm_token_type_ids": (ids == chat.image_pad).long(),
              **vision_inputs(chat.image_processor, images)}
    inputs = {k: v.to(device) for k, v in inputs.items()}
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(next(model.parameters()).dtype)
    backbone, head = backbone_and_head(model)
    hidden = backbone(**inputs).last_hidden_state  # (n, width, H)
    rows, cols = loss_mask.nonzero(as_tuple=True)  # token at `cols` is predicted from position cols-1
    temperature = 1.0 if sampling.greedy else sampling.temperature
    logits = head(hidden[rows.to(device), (cols - 1).to(device)]).float() / temperature
    logits[:, list(sampling.banned_ids)] = float("-inf")  # the sampler never draws them either
    if allowed_ids is not None:
        keep = torch.full_like(logits, float("-inf"))
        keep[:, list(allowed_ids)] = 0.0
        logits = logits + keep
    logp_all = torch.log_softmax(logits, dim=-1)
    targets = ids[rows, cols].to(device)
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
    return TokenLogprobs(logprobs=logp, entropy=entropy, old_logprobs=old[rows, cols].to(device),
                         sample_index=rows.to(device), argmax_correct=correct, hidden=hidden if return_hidden else None)
