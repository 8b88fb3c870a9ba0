"""The vLLM inference engine: the same `InferenceEngine` contract as HFEngine, served by vLLM.

vLLM is an optional dependency (`pip install 'mazerl[vllm]'` on GPU; `make vllm-env` builds its CPU
build in a venv of its own). It holds its own copy of the weights, so after every update the trainer
loads the new ones into it bucket by bucket (`begin_weight_sync`, `load_weight_bucket`...,
`finish_weight_sync`; `sync_weights` for a whole state dict): each bucket goes through the model's own
`load_weights` inside vLLM's worker, between vLLM's layer-wise reload hooks (which re-run the
per-layer processing, e.g. the CPU build's packed GEMM weights, once a layer has all its weights). No
file is written. Then the encoder and prefix caches are dropped (stale image embeddings and KV blocks
would otherwise be served with the new weights).

The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): `collective_rpc` then calls
our loader on the worker with the bucket's tensors themselves. With vLLM's default engine-core process
the callable would have to be pickled (VLLM_ALLOW_INSECURE_SERIALIZATION) and every bucket copied over
its socket. On GPU the same holds: the worker lives in the rollout actor's process, which owns the
GPU, so a bucket received on the GPU (the NCCL broadcast) is loaded without leaving it. In process,
vLLM shares the caller's thread state: generation switches off any autocast the caller set.

Prompts are token ids as the trainer sees them, with every image's placeholder run expanded; vLLM
expands placeholders itself, so each run is collapsed to one `<|image_pad|>` on the way in, and the
expanded length vLLM reports is checked against ours: a mismatch means vLLM would condition on a
different context than the trainer scores, which is refused rather than trained on.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import torch

from ..errors import UserError
from ..policy.grammar import ActionGrammar, GrammarError
from ..policy.sampling import SamplingParams
from .engine import DAMAGED, DamagedModelError, GenerationOutput, GenerationRequest
from ..mazes.seeding import derive_seed


class VLLMUnavailableError(UserError):
    """engine: vllm where vLLM is not installed, or a model vLLM cannot serve correctly."""


INSTALL_HINT = ("install it with `pip install 'mazerl[vllm]'` (GPU, CUDA) or use the CPU build's venv that "
                "`make vllm-env` creates (README: \"The vLLM engine\"), or set policy.engine: hf")


def require_vllm() -> None:
    """Fail before any work starts when vLLM cannot be imported here."""
    if importlib.util.find_spec("vllm") is None:
        raise VLLMUnavailableError(f"policy.engine is 'vllm' but vLLM is not installed in this Python ({sys.executable}): "
                                   + INSTALL_HINT)


def _on_cpu() -> bool:
    return not torch.cuda.is_available()


def _cpu_environment() -> None:
    """vLLM's CPU build reserves most of RAM for its KV cache unless told, and binds its OpenMP threads
    to fewer cores than it may use: set both unless the user has."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{max(cores, 1) - 1}")


def check_servable(model_dir: str) -> None:
    """Refuse models vLLM's CPU attention would compute wrongly: it accepts unsupported head sizes
    without complaint and returns near-uniform scores (seen with head_dim 48)."""
    if not _on_cpu():
        return
    from transformers import AutoConfig

    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    cfg = AutoConfig.from_pretrained(model_dir)
    text = getattr(cfg, "text_config", cfg)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    allowed = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in allowed:
        raise VLLMUnavailableError(
            f"{model_dir}: head_dim {head_dim} is not one vLLM's CPU attention supports ({', '.join(map(str, allowed))}); "
            "it would generate from wrong scores. Use policy.engine: hf for this model, or a model whose head size "
            "is supported (`mazerl policy init-tiny` builds one)")


class VLLMEngine:
    """vLLM's offline `LLM`, one request per episode turn, each with its own seed."""

    shares_module = False  # holds its own weights: sync_weights needs them

    def __init__(self, model_dir: str, chat, *, dtype: str = "float32", max_model_len: int = 4096,
                 max_images_per_prompt: int = 8, gpu_memory_utilization: float = 0.85, enable_sleep_mode: bool = False,
                 seed: int = 0):
        require_vllm()
        if _on_cpu():
            _cpu_environment()
        check_servable(model_dir)
        from vllm import LLM

        self.chat = chat
        self.end_id = chat.im_end
        self.image_pad = chat.image_pad
        try:
            self.grammar: ActionGrammar | None = ActionGrammar.from_chat(chat)
        except GrammarError:
            self.grammar = None
        self.weights_version = 0
        self._bad_words_cache: dict[tuple[int, ...], list[str]] = {}
        self.sleep_supported = enable_sleep_mode and not _on_cpu()  # a no-op on CPU
        self._asleep = False
        from .weight_loading import IncrementalLoad

        self._load = IncrementalLoad(_hf_layout(model_dir, dtype))
        self._vllm_names: set[str] = set()
        self._vllm_loaded: set[str] = set()
        kwargs = dict(model=model_dir, dtype=dtype, max_model_len=max_model_len, seed=seed,
                      limit_mm_per_prompt={"image": max_images_per_prompt, "video": 0},
                      # the sampled token's log-probability after temperature and masks, as HFEngine reports it
                      logprobs_mode="processed_logprobs")
        if _on_cpu():
            kwargs.update(enforce_eager=True)
        else:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=self.sleep_supported)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process (module docstring)
        self.llm = LLM(**kwargs)
        core = type(self.llm.llm_engine.engine_core).__name__
        if core != "InprocClient":
            raise VLLMUnavailableError(f"vLLM started its engine core as {core}, not in this process; the weight sync "
                                       "loads buckets in process: do not set VLLM_ENABLE_V1_MULTIPROCESSING")

    # ---- generation --------------------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest], params: SamplingParams, call_id: int = 0) -> list[GenerationOutput]:
        if self._asleep:
            raise RuntimeError("the vLLM engine is asleep: call wake() before generate()")
        self._load.check_servable()
        if params.grammar == "action" and self.grammar is None:
            raise GrammarError("this model's tokenizer cannot express the action grammar: use reply_grammar 'free'")
        seeds = [r.seed if r.seed is not None else derive_seed(params.seed, call_id, "request", i)
                 for i, r in enumerate(requests)]
        prompts = [self._prompt(r, params) for r in requests]
        sampling = [self._vllm_params(params, s) for s in seeds]
        with _own_precision():
            outs = self.llm.generate(prompts, sampling, use_tqdm=False)
        results = []
        for req, prompt, out in zip(requests, prompts, outs):
            expected = len(req.ids) + (len(self.grammar.prefix) if params.grammar == "action" else 0)
            if len(out.prompt_token_ids) != expected:
                raise RuntimeError(
                    f"vLLM expanded a prompt to {len(out.prompt_token_ids)} tokens where the trainer has {expected}: "
                    "its image processing differs from the processor's (check the model's preprocessor config)")
            results.append(self._output(out.outputs[0], params))
        return results

    def _prompt(self, req: GenerationRequest, params: SamplingParams) -> dict:
        ids = _collapse_runs(req.ids, self.image_pad)
        if params.grammar == "action":
            ids = ids + list(self.grammar.prefix)
        prompt: dict = {"prompt_token_ids": ids}
        if req.images:
            from PIL import Image

            prompt["multi_modal_data"] = {"image": [Image.fromarray(np.asarray(img)) for img in req.images]}
        return prompt

    def _vllm_params(self, params: SamplingParams, seed: int):
        from vllm import SamplingParams as VLLMSamplingParams

        common = dict(temperature=params.temperature, seed=seed, logprobs=0, detokenize=False)
        if params.grammar == "action":
            # one sampled token among the action words; the grammar's fixed tokens are added around it
            return VLLMSamplingParams(max_tokens=1, allowed_token_ids=list(self.grammar.word_ids), **common)
        # exact: the banned tokens are masked to -inf at every step, as the trainer's log-probabilities assume
        bad_words = self._bad_words(params.banned_ids) if params.banned_ids else None
        return VLLMSamplingParams(max_tokens=params.max_new_tokens, top_p=params.top_p, stop_token_ids=[self.end_id],
                                  bad_words=bad_words, **common)

    def _bad_words(self, banned_ids: tuple[int, ...]) -> list[str]:
        """The banned token ids as vLLM `bad_words`: each token's own text, which vLLM tokenizes back to
        that one id and masks to -inf before sampling (so a request carries a few words, not an
        allow-list of the other ~150k ids of Qwen's vocabulary). Checked once per banned set with vLLM's
        own tokenization: a token whose text would ban anything but exactly itself is refused."""
        if banned_ids not in self._bad_words_cache:
            from vllm import SamplingParams as VLLMSamplingParams

            tokenizer = self.llm.get_tokenizer()
            words = [tokenizer.decode([t]) for t in banned_ids]
            probe = VLLMSamplingParams(bad_words=words)
            probe.update_from_tokenizer(tokenizer)  # what the engine does with every request's bad words
            if probe.bad_words_token_ids != [[t] for t in banned_ids]:
                raise VLLMUnavailableError(
                    f"vLLM cannot ban tokens {list(banned_ids)} exactly: as bad words {words!r} they become token "
                    f"sequences {probe.bad_words_token_ids}; use policy.engine: hf for this tokenizer")
            self._bad_words_cache[banned_ids] = words
        return self._bad_words_cache[banned_ids]

    def _output(self, completion, params: SamplingParams) -> GenerationOutput:
        ids = list(completion.token_ids)
        logprobs = []
        for tok, entry in zip(ids, completion.logprobs or []):
            lp = entry[tok].logprob
            if not np.isfinite(lp):
                raise DamagedModelError(DAMAGED)
            logprobs.append(float(lp))
        if len(logprobs) != len(ids):
            raise RuntimeError(f"vLLM returned {len(logprobs)} log-probabilities for {len(ids)} tokens")
        if params.grammar == "action":
            g = self.grammar
            k = list(g.word_ids).index(ids[0])
            forced = g.forced()
            return GenerationOutput(ids=g.reply(k), logprobs=[0.0 if f else logprobs[0] for f in forced], finished=True,
                                    forced=forced, weights_version=self.weights_version)
        finished = bool(ids) and ids[-1] == self.end_id
        return GenerationOutput(ids=ids, logprobs=logprobs, finished=finished, weights_version=self.weights_version)

    # ---- weights -----------------------------------------------------------------------------------
    def sync_weights(self, weights: dict[str, torch.Tensor] | None, version: int, bucket_mb: float = 512) -> None:
        """Load a whole state dict (plain Hugging Face keys), in buckets of about `bucket_mb`."""
        if weights is None:
            raise ValueError("the vLLM engine holds its own copy of the weights: sync_weights needs the state dict")
        from ..distributed.weight_sync import layout_of, plan_buckets

        self.begin_weight_sync(layout_of(weights))
        sizes = {k: v.numel() * v.element_size() for k, v in weights.items()}
        for names in plan_buckets(sizes, int(bucket_mb * 2**20)):
            self.load_weight_bucket([(n, weights[n]) for n in names])
        self.finish_weight_sync(version)

    def weight_layout(self) -> dict:
        return dict(self._load.layout)

    def begin_weight_sync(self, layout: dict | None = None) -> None:
        self._load.begin(layout)
        self._vllm_names = set(self.llm.collective_rpc(_begin_in_worker)[0])
        self._vllm_loaded = set()

    def load_weight_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> int:
        self._load.check(bucket)
        try:
            loaded = self.llm.collective_rpc(_load_in_worker, args=(bucket,))[0]
        except Exception as err:  # noqa: BLE001 - whatever vLLM raised, the engine is now half-loaded
            raise self._load.fail(f"vLLM's load_weights failed ({type(err).__name__}: {str(err)[:300]})") from err
        self._vllm_loaded.update(loaded)
        return self._load.loaded_bucket(bucket)

    def finish_weight_sync(self, version: int) -> dict:
        self._load.finish()
        missing = sorted(self._vllm_names - self._vllm_loaded)
        if missing:  # every Hugging Face name arrived, yet some of vLLM's own parameters were not written
            raise self._load.fail(f"vLLM parameters not loaded: {', '.join(missing[:3])}"
                                  f"{' ...' if len(missing) > 3 else ''}")
        try:
            self.llm.collective_rpc(_finish_in_worker)
        except Exception as err:  # noqa: BLE001 - layers left unprocessed: not servable
            raise self._load.fail(f"vLLM could not finish the reload ({type(err).__name__}: {str(err)[:300]})") from err
        # without these the next image request can hit a stale (or missing) encoder cache entry, and
        # prefix-cached KV blocks would have been computed with the old weights
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_prefix_cache()
        self.weights_version = version
        return {"bytes": self._load.bytes, "buckets": self._load.buckets}

    # ---- memory: sleep while the trainer updates (colocated mode) ----------------------------------
    def sleep(self) -> None:
        """Free the GPU for the update (level 1: weights to CPU, KV cache dropped); a no-op without sleep mode."""
        if self.sleep_supported and not self._asleep:
            self.llm.sleep(level=1)
        self._asleep = True

    def wake(self) -> None:
        if self.sleep_supported and self._asleep:
            self.llm.wake_up()
        self._asleep = False

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None and hasattr(llm, "llm_engine"):
            shutdown = getattr(llm.llm_engine, "shutdown", None)
            if callable(shutdown):
                shutdown()


def _own_precision():
    """vLLM runs in this process (module docstring), so a caller's torch.autocast (the in-process trainer
    rolls out under `autocast`) would reach its kernels: vLLM computes in its own dtype, so it is switched off."""
    import contextlib

    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast("cpu", enabled=False))
    if torch.cuda.is_available():
        stack.enter_context(torch.autocast("cuda", enabled=False))
    return stack


def _hf_layout(model_dir: str, dtype: str) -> dict:
    """The plain Hugging Face state-dict layout of the model (built on the meta device: no memory, no
    weights read) with its floating-point weights in `dtype`: what a sync must deliver."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from .weight_loading import float_layout

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    return float_layout({k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}, getattr(torch, dtype))


# Run inside vLLM's worker by `collective_rpc` (in this process: see the module docstring). Between
# vLLM's layer-wise reload hooks, each layer is rebuilt once all its weights have arrived, so a bucket
# may hold any part of the model.
def _begin_in_worker(worker) -> list[str]:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

    model = worker.model_runner.get_model()
    names = sorted(name for name, _ in model.named_parameters())
    with set_current_vllm_config(worker.vllm_config):
        initialize_layerwise_reload(model)
    return names


def _load_in_worker(worker, bucket) -> list[str]:
    from vllm.config import set_current_vllm_config

    model = worker.model_runner.get_model()
    with torch.no_grad(), set_current_vllm_config(worker.vllm_config):
        loaded = model.load_weights(iter(bucket))
    if loaded is None:
        raise RuntimeError(f"{type(model).__name__}.load_weights does not report what it loaded")
    return sorted(loaded)


def _finish_in_worker(worker) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    model = worker.model_runner.get_model()
    with set_current_vllm_config(worker.vllm_config):
        finalize_layerwise_reload(model, worker.vllm_config.model_config)
    worker.model_runner.reset_encoder_cache()
    worker.model_runner.reset_mm_cache()


def _collapse_runs(ids: list[int], token: int) -> list[int]:
    """Each run of `token` becomes one `token` (vLLM expands image placeholders itself)."""
    out: list[int] = []
    for t in ids:
        if t == token and out and out[-1] == token:
            continue
        out.append(t)
    return out
