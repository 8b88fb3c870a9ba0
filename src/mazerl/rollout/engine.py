"""The inference-engine interface and its Hugging Face (transformers) implementation.

An engine continues a batch of token-id prompts (with the images their placeholders stand for)
and returns the exact sampled ids with their log-probabilities under the sampling temperature.
`HFEngine` runs on CPU or one GPU; a vLLM engine (distributed issue) implements the same protocol.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from ..mazes.seeding import derive_seed
from ..errors import UserError
from ..policy.chat import vision_inputs
from ..policy.grammar import ActionGrammar, GrammarError
from ..policy.sampling import SamplingParams


DAMAGED = ("the model's next-token scores are NaN or infinite: its weights are damaged (a diverged or corrupted "
           "checkpoint?); evaluate or resume from an earlier checkpoint")


class DamagedModelError(UserError):
    """A model whose outputs are not finite numbers."""


class _SampledLogprobs(LogitsProcessor):
    """Records the log-probability of each sampled token and nothing else: the scores of step t are
    kept only until step t+1's input reveals the drawn token, so memory is 2 x batch x vocabulary,
    not batch x new tokens x vocabulary (~40 GB for 64 x 1,024 x 151,936 in fp32). It runs after the
    banned-token suppression and before temperature, so it applies the temperature itself."""

    def __init__(self, temperature: float, banned_ids: tuple[int, ...]):
        self.temperature = temperature
        self.banned = list(banned_ids)
        self.previous: torch.Tensor | None = None
        self.taken: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.previous is not None:
            self.taken.append(self.previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        if torch.isnan(scores).any() or torch.isposinf(scores).any():
            raise DamagedModelError(DAMAGED)
        z = scores.float() / self.temperature
        z[:, self.banned] = float("-inf")  # as sampled: banned tokens have probability 0
        self.previous = torch.log_softmax(z, dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """(batch, new tokens) log-probabilities, once generation is over."""
        if self.previous is not None:
            self.taken.append(self.previous.gather(-1, sequences[:, -1:]).squeeze(-1))
            self.previous = None
        return torch.stack(self.taken, dim=1) if self.taken else torch.zeros((sequences.shape[0], 0))


class _PerRequestSampler(LogitsProcessor):
    """Draws each row's next token from that row's own generator (its request's seed), then leaves
    only that token finite, so generate's greedy step takes it. A request's sample therefore never
    depends on which other requests share its batch, and the process's global RNG is not touched.
    Temperature, top-p and the banned tokens are applied here, exactly once."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float, banned_ids: tuple[int, ...], device):
        self.temperature, self.top_p, self.banned = temperature, top_p, list(banned_ids)
        self.generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        z = scores.float() / self.temperature
        z[:, self.banned] = float("-inf")
        probs = torch.softmax(z, dim=-1)
        if self.top_p < 1.0:  # nucleus: the smallest set of most likely tokens with mass >= top_p
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = (sorted_p.cumsum(dim=-1) - sorted_p) >= self.top_p
            sorted_p[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        chosen = torch.stack([torch.multinomial(probs[row], 1, generator=g) for row, g in enumerate(self.generators)])
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(-1, chosen, 0.0)
        return out


@dataclass
class GenerationRequest:
    ids: list[int]
    images: list[np.ndarray]
    seed: int | None = None  # this request's own sampling seed (None: derived from its place in the call)


@dataclass
class GenerationOutput:
    ids: list[int]  # sampled tokens, ending with the end-of-turn token when the model emitted it
    logprobs: list[float]  # log p(token) under softmax(logits / temperature) (temperature 1 when greedy)
    finished: bool  # True when the model ended its turn itself (not cut by max_new_tokens)
    forced: list[bool] | None = None  # per token: fixed by the reply grammar, not sampled (None: all sampled)
    weights_version: int = 0  # the engine's weights version when it sampled this


class InferenceEngine(Protocol):
    def generate(self, requests: list[GenerationRequest], params: SamplingParams, call_id: int = 0) -> list[GenerationOutput]:
        """Continue every request. `call_id` makes sampling reproducible: same params, same call id,
        same requests -> same tokens."""
        ...

    weights_version: int  # updates applied to the weights it samples with
    shares_module: bool  # True: serves the trainer's own module (in-process HF); False: needs the weights on sync

    def sync_weights(self, weights: dict[str, torch.Tensor] | None, version: int) -> None:
        """Generate with the trainer's weights after `version` updates from now on. `weights`: a full
        state dict to load; None when the engine serves the trainer's own module (in-process)."""
        ...

    # the incremental load a Ray rollout actor uses (rollout/weight_loading.py checks it)
    def weight_layout(self) -> dict:
        """Names, shapes and dtypes of the weights it serves (plain Hugging Face keys)."""
        ...

    def begin_weight_sync(self, layout: dict | None = None) -> None:
        """Start a sync; `layout` (the sender's) must equal `weight_layout()`. No generation until it finishes."""
        ...

    def load_weight_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> int:
        """Load some of the weights (each exactly once per sync); returns their bytes."""
        ...

    def finish_weight_sync(self, version: int) -> dict:
        """Every weight arrived: serve them as `version`. Returns {"bytes", "buckets"} of this sync."""
        ...


def image_digest(image: np.ndarray) -> tuple:
    """An image's identity for sharing work between requests: shape, dtype and a hash of its pixels."""
    arr = np.ascontiguousarray(image)
    return arr.shape, str(arr.dtype), hashlib.blake2b(arr.tobytes(), digest_size=16).digest()


class HFEngine:
    """transformers `generate` with a KV cache, batched with left padding."""

    shares_module = True  # in-process it serves the trainer's module; a Ray rollout actor passes weights anyway

    def __init__(self, model, image_processor, end_of_turn_id: int, pad_id: int, image_token_id: int,
                 max_batch: int = 64, grammar: ActionGrammar | None = None, share_identical_requests: bool = True):
        self.model = model
        self.share_identical_requests = share_identical_requests  # off only to measure what sharing saves
        self.grammar = grammar  # needed for SamplingParams(grammar="action")
        self.weights_version = 0
        self.image_processor = image_processor
        self.end_id = end_of_turn_id
        self.pad_id = pad_id
        self.image_token_id = image_token_id
        self.max_batch = max_batch

    @classmethod
    def from_chat(cls, model, chat, max_batch: int = 64) -> "HFEngine":
        try:
            grammar = ActionGrammar.from_chat(chat)
        except GrammarError:
            grammar = None  # free-form replies only; asking for the grammar then fails clearly
        return cls(model, chat.image_processor, chat.im_end, chat.pad_id, chat.image_pad, max_batch,
                   grammar)

    def sync_weights(self, weights: dict[str, torch.Tensor] | None, version: int) -> None:
        if weights is not None:  # a separate copy of the model (e.g. in a rollout actor): load them
            self.begin_weight_sync({k: (tuple(v.shape), v.dtype) for k, v in weights.items()})
            self.load_weight_bucket(list(weights.items()))
            self.finish_weight_sync(version)
        self.weights_version = version

    # ---- incremental weight sync (a separate copy of the model: a Ray rollout actor) ----------------
    def weight_layout(self) -> dict:
        return {k: (tuple(v.shape), v.dtype) for k, v in self.model.state_dict().items()}

    def begin_weight_sync(self, layout: dict | None = None) -> None:
        from .weight_loading import IncrementalLoad

        self._load = IncrementalLoad(self.weight_layout())
        self._load.begin(layout)
        self._targets = self.model.state_dict()  # the module's own tensors, copied into in place

    @torch.no_grad()
    def load_weight_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> int:
        self._load.check(bucket)
        for name, tensor in bucket:
            target = self._targets[name]
            target.copy_(tensor.to(target.device))
        return self._load.loaded_bucket(bucket)

    def finish_weight_sync(self, version: int) -> dict:
        self._load.finish()
        self._targets = None
        self.weights_version = version
        return {"bytes": self._load.bytes, "buckets": self._load.buckets}

    @torch.no_grad()
    def generate(self, requests: list[GenerationRequest], params: SamplingParams, call_id: int = 0) -> list[GenerationOutput]:
        if getattr(self, "_load", None) is not None:
            self._load.check_servable()
        seeds = [r.seed if r.seed is not None else derive_seed(params.seed, call_id, "request", i)
                 for i, r in enumerate(requests)]
        if params.grammar == "action":
            if self.grammar is None:
                raise GrammarError("this model's tokenizer cannot express the action grammar: use reply_grammar 'free'")
            return self._choose_actions(requests, params, seeds)
        # Similar lengths together: less padding. Results go back in request order.
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].ids))
        results: list[GenerationOutput | None] = [None] * len(requests)
        for start in range(0, len(order), self.max_batch):
            chunk = order[start : start + self.max_batch]
            try:
                outs = self._generate_batch([requests[i] for i in chunk], params, [seeds[i] for i in chunk])
            except RuntimeError as err:
                if "inf" in str(err) and "nan" in str(err):  # torch.multinomial on non-finite probabilities
                    raise DamagedModelError(DAMAGED) from None
                raise
            for i, out in zip(chunk, outs):
                results[i] = out
        return results  # type: ignore[return-value]

    def _model_inputs(self, id_lists: list[list[int]], images: list[np.ndarray]) -> dict[str, torch.Tensor]:
        """Left-padded batch with its vision inputs, on the model's device."""
        device = next(self.model.parameters()).device
        width = max(len(ids) for ids in id_lists)
        ids = torch.full((len(id_lists), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(id_lists), width), dtype=torch.long)
        for row, r in enumerate(id_lists):
            ids[row, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[row, width - len(r) :] = 1
        inputs = {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": (ids == self.image_token_id).long(),
                  **vision_inputs(self.image_processor, images)}
        inputs = {k: v.to(device) for k, v in inputs.items()}
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
        return inputs

    def _choose_actions(self, requests: list[GenerationRequest], params: SamplingParams, seeds: list[int]) -> list[GenerationOutput]:
        """The action grammar: one forward pass over prompt + prefix, then a choice among the action words.

        Requests with the same context (a group's episodes at the same square, turn and feedback) share
        one forward pass, and the distinct contexts go in batches of `max_batch`, similar lengths
        together. Each request samples from its own generator (its seed), so its action does not
        depend on which other requests share the call."""
        g = self.grammar
        assert g is not None
        distinct: dict[tuple, int] = {}
        firsts: list[GenerationRequest] = []
        source = []
        for r in requests:
            key = ((tuple(r.ids), tuple(image_digest(img) for img in r.images)) if self.share_identical_requests
                   else len(firsts))
            if key not in distinct:
                distinct[key] = len(firsts)
                firsts.append(r)
            source.append(distinct[key])
        order = sorted(range(len(firsts)), key=lambda i: len(firsts[i].ids))
        word_logits = torch.empty((len(firsts), len(g.word_ids)), dtype=torch.float32)
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(order), self.max_batch):
                chunk = [firsts[i] for i in order[start : start + self.max_batch]]
                inputs = self._model_inputs([r.ids + list(g.prefix) for r in chunk], [img for r in chunk for img in r.images])
                logits = self.model(**inputs, logits_to_keep=1).logits[:, -1]
                word_logits[order[start : start + self.max_batch]] = logits[:, list(g.word_ids)].float().cpu()
        finally:
            self.model.train(was_training)
        logits = word_logits[torch.tensor(source, dtype=torch.long)]
        if not torch.isfinite(logits).all():
            raise DamagedModelError(DAMAGED)
        temp = 1.0 if params.greedy else params.temperature
        logprobs = torch.log_softmax(logits / temp, dim=-1)
        outs = []
        for row, seed in enumerate(seeds):
            if params.greedy:
                k = int(logits[row].argmax())
            else:
                gen = torch.Generator().manual_seed(seed)
                k = int(torch.multinomial(logprobs[row].exp(), 1, generator=gen))
            ids = g.reply(k)
            forced = g.forced()
            lps = [0.0 if f else float(logprobs[row, k]) for f in forced]
            outs.append(GenerationOutput(ids=ids, logprobs=lps, finished=True, forced=forced, weights_version=self.weights_version))
        return outs

    def _generate_batch(self, requests: list[GenerationRequest], params: SamplingParams, seeds: list[int]) -> list[GenerationOutput]:
        device = next(self.model.parameters()).device
        width = max(len(r.ids) for r in requests)
        ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for row, r in enumerate(requests):
            ids[row, width - len(r.ids) :] = torch.tensor(r.ids, dtype=torch.long)
            mask[row, width - len(r.ids) :] = 1
        images = [img for r in requests for img in r.images]
        inputs = {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": (ids == self.image_token_id).long(),
                  **vision_inputs(self.image_processor, images)}
        inputs = {k: v.to(device) for k, v in inputs.items()}
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
        sample = not params.greedy
        # generate() itself always takes the best-scoring token: when sampling, _PerRequestSampler has
        # already drawn it per request and left it the only finite score
        gen_kwargs = dict(
            max_new_tokens=params.max_new_tokens,
            do_sample=False, temperature=None, top_p=None, top_k=None,
            eos_token_id=self.end_id,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            suppress_tokens=list(params.banned_ids) or None,
        )
        recorder = _SampledLogprobs(params.temperature if sample else 1.0, params.banned_ids)
        processors = [recorder]  # first: it reads the model's scores before the sampler replaces them
        if sample:
            processors.append(_PerRequestSampler(seeds, params.temperature, params.top_p, params.banned_ids, device))
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(**inputs, **gen_kwargs, logits_processor=LogitsProcessorList(processors))
        finally:
            self.model.train(was_training)
        new = out.sequences[:, width:].cpu()
        logprobs = recorder.finish(out.sequences).cpu()
        results = []
        for row in range(len(requests)):
            toks = new[row].tolist()
            n = len(toks)
            finished = False
            if self.end_id in toks:
                n = toks.index(self.end_id) + 1
                finished = True
            results.append(GenerationOutput(ids=toks[:n], logprobs=logprobs[row, :n].tolist(), finished=finished,
                                            weights_version=self.weights_version))
        return results
