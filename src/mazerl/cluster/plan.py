"""The capacity plan: what a GRPO job config asks of a cluster profile's GPUs, worked out before any
GPU is asked for.

From the model's architecture (built on the meta device from its config.json: the configs of
Qwen3-VL-8B-Instruct and Qwen3-VL-2B-Instruct ship with mazerl, as no hub is reachable where a
pipeline is compiled), the job config and the profile (its instance type names the GPU and links):

- parameters (text, vision) and what each GPU holds, term by term (every term below has a docstring:
  what it counts and why), in the two phases of a step: the rollout (the engine generating) and the
  update (forward and backward); the peak of the two against the GPU's memory;
- the per-prompt limits the history needs (images, tokens) against the vLLM engine's settings: a
  limit left unset (None) is derived from them, one set explicitly too low is refused;
- the bytes weight sync moves every step and a checkpoint writes, and the seconds they take at the
  profile's links (estimates: the bytes over the link, nothing else).

A combination that does not fit, or whose limits are too small, is a PlanError naming the setting
and the number it needs. `check_plan` runs wherever a job config meets a profile: `mazerl pipeline
compile`/`submit`, `mazerl cluster render-rayjob` and the RayJob's train step (build_rayjob), and
`mazerl cluster plan` prints the whole plan.

Lengths are upper bounds: every reply is taken at max_new_tokens and every turn of the budget is
played, because that is what the settings allow and what an engine's limits must admit. Text is
counted in UTF-8 bytes, which bounds the tokens of a byte-level BPE tokenizer (Qwen's) from above.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..config import ConfigError

GiB = 2**30
MiB = 2**20
ASSET_CONFIGS = Path(__file__).resolve().parents[1] / "assets" / "configs"
# hub ids whose config.json and preprocessor_config.json ship with mazerl (assets/configs/<name>/)
SHIPPED_ARCHITECTURES = {"Qwen/Qwen3-VL-8B-Instruct": "Qwen3-VL-8B-Instruct", "Qwen/Qwen3-VL-2B-Instruct": "Qwen3-VL-2B-Instruct"}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MASTER_BYTES = 4  # fp32 master weights, gradients and each of AdamW's two moments (issue #33: bf16 masters lose lr 1e-6 updates)
COMPUTE_BYTES = 2  # bf16: activations, gathered parameters, the KV cache
# CUDA context, NCCL's buffers and the caching allocator's fragmentation: an allowance, not a measurement
RUNTIME_RESERVE_BYTES = 3 * GiB


class PlanError(ConfigError):
    """A job config and profile that do not fit together; the message names each setting and the number it needs."""


# ---- the hardware an instance type gives each GPU ------------------------------------------------------
@dataclass(frozen=True)
class Hardware:
    gpu: str
    gpu_bytes: int  # one GPU's memory, as the driver reports its total (nvidia-smi)
    gpus_per_node: int
    host_link_bytes_per_s: float  # one GPU's PCIe link to host memory, one direction
    gpu_link_bytes_per_s: float  # NVLink between the GPUs of a node, per GPU and direction (0: none, PCIe only)
    network_bytes_per_s: float  # the node's network (EFA where the instance has it), one direction


# Published figures (AWS instance pages, NVIDIA data sheets); memory as nvidia-smi reports it.
INSTANCE_TYPES = {
    "ml.p5.48xlarge": Hardware("H100 80GB HBM3", 81_559 * MiB, 8, 64e9, 450e9, 3200e9 / 8),
    "ml.p5e.48xlarge": Hardware("H200 141GB HBM3e", 143_771 * MiB, 8, 64e9, 450e9, 3200e9 / 8),
    "ml.p4d.24xlarge": Hardware("A100 40GB", 40_960 * MiB, 8, 32e9, 300e9, 400e9 / 8),
    "ml.p4de.24xlarge": Hardware("A100 80GB", 81_920 * MiB, 8, 32e9, 300e9, 400e9 / 8),
    "ml.g5.12xlarge": Hardware("A10G 24GB", 23_028 * MiB, 4, 32e9, 0.0, 40e9 / 8),
    "ml.g5.48xlarge": Hardware("A10G 24GB", 23_028 * MiB, 8, 32e9, 0.0, 100e9 / 8),
}


def hardware_of(profile) -> tuple[str, Hardware]:
    from ..profiles import INSTANCE_TYPE_LABEL

    instance = profile.node_selector.get(INSTANCE_TYPE_LABEL)
    if instance not in INSTANCE_TYPES:
        raise PlanError(f"profile {profile.name!r}: node_selector {INSTANCE_TYPE_LABEL} = {instance!r} is not an instance "
                        f"type the capacity plan knows ({', '.join(INSTANCE_TYPES)}): its GPUs' memory and links decide "
                        "what fits")
    return instance, INSTANCE_TYPES[instance]


# ---- the model's architecture, from its config on the meta device ------------------------------------------
def model_directory(model: str) -> Path | None:
    """Where the config of `model` is read: a model directory, or the shipped copy for a known hub id."""
    if model in SHIPPED_ARCHITECTURES:
        return ASSET_CONFIGS / SHIPPED_ARCHITECTURES[model]
    path = Path(model)
    if (path / "config.json").is_file():
        return path
    return None


def _unknown_model(model: str) -> PlanError:
    return PlanError(f"policy.model {model!r}: no config.json here to plan with; give a model directory, or one of the "
                     f"models whose config ships with mazerl ({', '.join(SHIPPED_ARCHITECTURES)})")


@dataclass(frozen=True)
class Architecture:
    """What the plan needs of a model, counted on the model itself (built on the meta device)."""

    text_params: int
    vision_params: int
    vocab: int
    hidden: int
    layers: int
    kv_elements_per_token: int  # K and V of every layer for one token (times the dtype's bytes: the KV cache)
    text_layer_activation: int  # elements a decoder layer keeps for the backward, per token (see activations())
    vision_depth: int
    vision_hidden: int
    vision_block_activation: int  # the same for a vision block, per patch
    max_positions: int
    largest_layer_params: int  # the largest decoder layer or vision block: an FSDP unit of its own
    backbone_own_params: int  # the backbone unit's own parameters (embeddings, patch embedding, merger, norms)
    head_params: int  # the LM head unit (0 when tied to the embeddings: then it is not a parameter of its own)
    # a Linear's name (its last part, as peft matches target_modules) -> what a rank-1 adapter on all of them adds
    lora_params_per_rank: dict = field(default_factory=dict)

    @property
    def total_params(self) -> int:
        return self.text_params + self.vision_params


@functools.lru_cache(maxsize=8)
def _architecture(directory: str) -> Architecture:
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(directory)
    with torch.device("meta"):  # shapes only: no memory, no weights
        model = AutoModelForImageTextToText.from_config(config)
    text_cfg = config.get_text_config()
    vision_cfg = config.vision_config
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    total = sum(p.numel() for p in model.parameters())  # tied weights are one parameter
    backbone = model.model
    layers = list(backbone.language_model.layers)
    blocks = list(getattr(backbone.visual, "blocks", []))
    units = layers + blocks  # distributed/fsdp.py: each its own FSDP unit, then the backbone and the head
    in_units = sum(p.numel() for u in units for p in u.parameters())
    backbone_all = sum(p.numel() for p in backbone.parameters())
    head_tied = model.lm_head.weight is backbone.language_model.embed_tokens.weight
    lora: dict[str, int] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            suffix = name.rsplit(".", 1)[-1]
            lora[suffix] = lora.get(suffix, 0) + module.in_features + module.out_features  # B (out x r) and A (r x in)
    h, q = text_cfg.hidden_size, text_cfg.num_attention_heads * text_cfg.head_dim
    kv = text_cfg.num_key_value_heads * text_cfg.head_dim
    vh = vision_cfg.hidden_size
    return Architecture(
        text_params=total - vision, vision_params=vision, vocab=text_cfg.vocab_size, hidden=h,
        layers=text_cfg.num_hidden_layers, kv_elements_per_token=2 * text_cfg.num_hidden_layers * kv,
        text_layer_activation=4 * h + 3 * q + 3 * kv + 3 * text_cfg.intermediate_size,
        vision_depth=vision_cfg.depth, vision_hidden=vh,
        vision_block_activation=10 * vh + 2 * vision_cfg.intermediate_size,
        max_positions=text_cfg.max_position_embeddings,
        largest_layer_params=max(sum(p.numel() for p in u.parameters()) for u in units),
        backbone_own_params=backbone_all - in_units, head_params=0 if head_tied else model.lm_head.weight.numel(),
        lora_params_per_rank=lora,
    )


def architecture(model: str) -> Architecture:
    directory = model_directory(model)
    if directory is None:
        raise _unknown_model(model)
    return _architecture(str(directory.resolve()))


@functools.lru_cache(maxsize=8)
def _image_processor(source: str):
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(source)


def image_processor(model: str):
    """The model's image processor: from its directory or the shipped copy of its config, else by name (where a
    hub is reachable: a cluster's pods)."""
    directory = model_directory(model)
    try:
        return _image_processor(str(directory.resolve()) if directory is not None else model)
    except (OSError, ValueError) as err:
        raise PlanError(f"policy.model {model!r}: its image processor cannot be opened here ({err}); give a model "
                        f"directory, or one of the models whose config ships with mazerl "
                        f"({', '.join(SHIPPED_ARCHITECTURES)})") from None


def image_tokens_counter(model: str) -> Callable[[int, int], int]:
    """(height, width) of a frame -> the placeholder tokens it becomes: the model's own image processor
    (its resize rule, patch and merge sizes), as ChatFormat.image_tokens counts them."""
    processor = image_processor(model)
    merge = int(getattr(processor, "merge_size", 2))
    return lambda height, width: processor.get_number_of_image_patches(height, width, {}) // (merge * merge)


# ---- what a prompt holds: the history the policy sees ------------------------------------------------------
@dataclass(frozen=True)
class Episodes:
    """The shape of the episodes a job plays: the turn budget and the frames' pixel sizes."""

    turn_budget: int
    frame_sizes: tuple[tuple[int, int], ...]  # distinct (height, width) of the frames, in pixels


def _frame_size(rows: int, cols: int, render, render_scale: float) -> tuple[int, int]:
    """The pixel size of the frame of a maze of rows x cols cells, from the renderer itself (FrameRenderer, as a
    rollout draws it)."""
    import random

    from ..mazes.generators import generate_grid
    from ..mazes.render import FrameRenderer

    if render_scale != 1.0:  # as rollout.multiturn.items_from_split scales it
        render = render.model_copy(update={"square_px": max(4, round(render.square_px * render_scale))})
    grid = generate_grid("wilson", rows, cols, random.Random(0))
    height, width, _ = FrameRenderer(grid, (1, 1), render).shape
    return int(height), int(width)


def pipeline_train_episodes(preset: str, render_scale: float, max_turns: int | None) -> Episodes:
    """The episodes of the train split the pipeline generates (profile pipeline.dataset_preset): its
    maze sizes, render options and turn budget (`max_turns` of the job config overrides the budget)."""
    from ..mazes.splits import TRAIN_SPLIT, default_turn_budget, preset as dataset_preset

    spec = dataset_preset(preset).splits[TRAIN_SPLIT]
    sizes = {_frame_size(r, c, opts, render_scale) for r, c in spec.sizes for opts in spec.render}
    if max_turns is not None:
        budget = max_turns
    elif spec.max_turns is not None:
        budget = spec.max_turns
    else:  # per maze: at most the budget of the longest possible route (every cell)
        budget = max(default_turn_budget(r * c - 1) for r, c in spec.sizes)
    return Episodes(budget, tuple(sorted(sizes)))


def split_episodes(df, render_scale: float, max_turns: int | None) -> Episodes:
    """The episodes of a maze split (a parquet's rows): its largest turn budget and its frames' sizes."""
    from ..mazes.dataset_io import RENDER_COLUMNS
    from ..rollout.multiturn import items_from_split

    keys = ["height", "width", *RENDER_COLUMNS]  # one maze of each size and look: their frames' sizes
    rows = df.reset_index(drop=True).drop_duplicates(subset=keys).index.tolist()
    items = items_from_split(df.reset_index(drop=True), rows, render_scale, max_turns)
    sizes = {tuple(int(x) for x in it.task.renderer.shape[:2]) for it in items}
    budget = max_turns if max_turns is not None else int(df["max_turns"].max())
    return Episodes(budget, tuple(sorted(sizes)))


@dataclass(frozen=True)
class PromptLimits:
    images: int  # images in the longest prompt
    tokens: int  # the longest prompt plus its reply: what max_model_len must admit
    loss_tokens: int  # reply tokens of the longest training sequence (what the loss projects onto the vocabulary)


def _utf8(text: str) -> int:
    return len(text.encode("utf-8"))


def prompt_limits(policy, episodes: Episodes, image_tokens: Callable[[int, int], int]) -> PromptLimits:
    """The images and tokens of the longest prompt of an episode, turn by turn through the budget, as
    policy/chat.py lays a conversation out (ChatML) and Conversation.context keeps its history:

    system turn:   <|im_start|> "system\\n" + prompt <|im_end|> "\\n"
    each turn t:   <|im_start|> "user\\n" <|vision_start|> image tokens <|vision_end|> turn text <|im_end|> "\\n"
                   <|im_start|> "assistant\\n"
    each reply:    up to max_new_tokens, then <|im_end|> "\\n" (appended when the reply was cut)

    `history.turns` keeps that many earlier turns, `history.images` the images of that many latest turns.
    The tokens needed at turn t are its prompt plus max_new_tokens; the most over the budget is the limit.
    """
    from ..envs.maze_env import FEEDBACK_INVALID, FEEDBACK_OK, FEEDBACK_WALL
    from ..policy.prompts import PROMPTS, turn_text

    budget = episodes.turn_budget
    frame = max(image_tokens(h, w) for h, w in episodes.frame_sizes) + 2  # and the two vision markers
    system = 1 + _utf8("system\n" + PROMPTS[policy.prompt]) + 2
    feedback = max((FEEDBACK_OK, FEEDBACK_WALL, FEEDBACK_INVALID), key=_utf8)
    text = 1 + _utf8("user\n") + _utf8(turn_text(feedback, budget, budget)) + 2 + 1 + _utf8("assistant\n")
    reply = policy.max_new_tokens + 2
    most_images = most_tokens = 0
    for t in range(1, budget + 1):
        kept_turns = t - 1 if policy.history.turns is None else min(t - 1, policy.history.turns)
        images = kept_turns + 1 if policy.history.images is None else min(kept_turns + 1, policy.history.images)
        tokens = system + (kept_turns + 1) * text + images * frame + kept_turns * reply + policy.max_new_tokens
        most_images, most_tokens = max(most_images, images), max(most_tokens, tokens)
    # with full history every turn's context is a prefix of the next: one sequence carries every reply
    full = policy.history.turns is None and policy.history.images is None
    loss_tokens = (budget if full else 1) * policy.max_new_tokens
    return PromptLimits(most_images, most_tokens, loss_tokens)


def with_prompt_limits(policy, needed: PromptLimits):
    """`policy` (a PolicyConfig) with the vLLM engine's limits set: one left unset (None) becomes what the history
    needs; one set explicitly below that is refused (never raised silently). Other engines have no such limits."""
    if policy.engine != "vllm":
        return policy
    v = policy.vllm
    problems = []
    if v.max_images_per_prompt is not None and v.max_images_per_prompt < needed.images:
        problems.append(f"policy.vllm.max_images_per_prompt = {v.max_images_per_prompt}, but a prompt carries up to "
                        f"{needed.images} images (policy.history: turns {policy.history.turns}, images "
                        f"{policy.history.images}; None is all); needs >= {needed.images}")
    if v.max_model_len is not None and v.max_model_len < needed.tokens:
        problems.append(f"policy.vllm.max_model_len = {v.max_model_len}, but the longest prompt and its reply take up "
                        f"to {needed.tokens} tokens; needs >= {needed.tokens}")
    if problems:
        raise PlanError("the vLLM engine would refuse the longest prompts of an episode: " + "; ".join(problems)
                        + " (or leave it unset: it is then derived from the history, the turn budget and max_new_tokens)")
    return policy.model_copy(update={"vllm": v.model_copy(update={
        "max_images_per_prompt": v.max_images_per_prompt or needed.images, "max_model_len": v.max_model_len or needed.tokens})})


def resolve_prompt_limits(cfg, train_df):
    """The GRPO job config its engines run with: the vLLM limits derived (or checked) from the train split it
    plays (`train_df`: its turn budgets and frame sizes) and the model's image processor. What the trainers
    call before they open an engine; a no-op for engines other than vLLM."""
    if cfg.policy.engine != "vllm":
        return cfg
    episodes = split_episodes(train_df, cfg.policy.render_scale, cfg.max_turns)
    needed = prompt_limits(cfg.policy, episodes, image_tokens_counter(cfg.policy.model))
    return cfg.model_copy(update={"policy": with_prompt_limits(cfg.policy, needed)})


def default_prompt_limits(policy, image_tokens: Callable[[int, int], int]):
    """`policy` with vLLM limits for an engine opened without a train split to size them by (evaluation): those
    of the VisGym easy mazes the pipeline trains on (18 turns); limits set explicitly are kept as they are."""
    episodes = pipeline_train_episodes("default", policy.render_scale, None)
    v = policy.vllm
    needed = prompt_limits(policy, episodes, image_tokens)
    return policy.model_copy(update={"vllm": v.model_copy(update={
        "max_images_per_prompt": v.max_images_per_prompt or needed.images, "max_model_len": v.max_model_len or needed.tokens})})


# ---- memory per GPU: one function per term ---------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """What the memory terms read: the job config, the model, the episodes' limits and the layout on GPUs."""

    cfg: object  # GRPOConfig
    arch: Architecture
    limits: PromptLimits
    patches_per_image: int  # vision patches of the largest frame, before merging
    hardware: Hardware
    shards: int  # training ranks sharing the model with FSDP2 (1: one process holds all of it)
    colocated: bool  # the rollout engine shares the training GPU
    engines: int  # rollout engines that receive the weights each step
    nodes: int

    @property
    def lora(self) -> bool:
        return self.cfg.lora is not None

    @property
    def trainable_params(self) -> int:
        if self.lora:
            rank, targets = self.cfg.lora.r, self.cfg.lora.target_modules
            return rank * sum(self.arch.lora_params_per_rank.get(t, 0) for t in targets)
        return self.arch.total_params - (self.arch.vision_params if self.cfg.freeze_vision else 0)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.cfg.policy.dtype]

    @property
    def compute_bytes(self) -> int:
        """bf16 compute unless the policy runs in float32 without autocast."""
        return 4 if self.cfg.policy.dtype == "float32" and self.cfg.autocast == "off" else COMPUTE_BYTES

    @property
    def activation_checkpointing(self) -> bool:
        # the field another part of issue #33 adds to the distributed settings; absent: off
        return bool(getattr(self.cfg.distributed, "activation_checkpointing", False))


def master_weights(job: Job, shards: int) -> int:
    """The model's parameters as the trainer holds them, each rank 1/shards of them (FSDP2 keeps the sharded
    parameters in the dtype they were loaded in): fp32 for full fine-tuning, as updates of lr 1e-6 vanish in bf16
    weights; with LoRA, the frozen base in policy.dtype and the adapters in fp32."""
    if job.lora:
        return (job.arch.total_params * job.dtype_bytes + job.trainable_params * MASTER_BYTES) // shards
    return job.arch.total_params * MASTER_BYTES // shards


def gradients(job: Job, shards: int) -> int:
    """One fp32 gradient per trainable parameter, sharded (FSDP2 reduces in fp32 into the sharded gradient). They
    live from the backward until the next update's zero_grad, so through the rollout too."""
    return job.trainable_params * MASTER_BYTES // shards


def optimizer(job: Job, shards: int) -> int:
    """AdamW's two fp32 moments (exp_avg, exp_avg_sq) per trainable parameter, sharded like the parameters."""
    return 2 * job.trainable_params * MASTER_BYTES // shards


def reference(job: Job, shards: int) -> int:
    """The KL reference (kl_coef > 0): a frozen copy of the initial model. On Ray it is loaded in policy.dtype and
    sharded like the policy; in one process it is a copy of the training model (fp32). With LoRA the base model
    with its adapters disabled is the reference: nothing extra."""
    if job.cfg.kl_coef <= 0 or job.lora:
        return 0
    per_param = job.dtype_bytes if job.cfg.distributed.backend == "ray" else MASTER_BYTES
    return job.arch.total_params * per_param // shards


def gathered_unit(job: Job, shards: int) -> int:
    """What FSDP2 unshards at once, in bf16: the backbone unit's own parameters (embeddings, the vision tower's
    patch embedding and merger) stay gathered while its layers run, with the current decoder layer and the next
    one (prefetched); or the LM head alone. Plus the fp32 gradient of the largest unit before its reduce-scatter.
    In one process with fp32 weights and bf16 compute, autocast keeps a bf16 copy of every weight it casts
    for the forward and backward instead."""
    a = job.arch
    if job.cfg.distributed.backend == "ray":  # FSDP2 units, even over one rank
        gathered = max(a.backbone_own_params + 2 * a.largest_layer_params, a.head_params) * COMPUTE_BYTES
        return gathered + max(a.backbone_own_params, a.largest_layer_params, a.head_params) * MASTER_BYTES
    if not job.lora and job.compute_bytes < MASTER_BYTES:
        return job.arch.total_params * job.compute_bytes
    return 0


def activations(job: Job, micro_batch: int, checkpointing: bool) -> int:
    """What the forward keeps for the backward, for `micro_batch` sequences of the longest sample (every turn's
    image, feedback and a max_new_tokens reply, as PromptLimits.tokens counts them), in the compute dtype:

    - each decoder layer, per token, without checkpointing: its two RMSNorms' inputs and outputs (4 h), the
      q/k/v projections (q + 2 kv), the normed and rotated q and k attention reads (q + kv), the attention's
      output (q), and the MLP's gate, up and gated product (3 i): Architecture.text_layer_activation; each
      vision block likewise per patch (norms 4 vh, q/k/v 3 vh, rotated q and k 2 vh, output vh, the MLP's
      two 2 iv): Architecture.vision_block_activation;
    - with activation checkpointing: each layer's input only (h per token), plus one layer's full set while
      the backward recomputes it;
    - the log-probabilities: the LM head projects every reply token of the sequence onto the vocabulary, and
      the loss keeps the fp32 logits and their log-softmax (8 bytes per token per vocabulary entry).
    """
    a, tokens = job.arch, job.limits.tokens
    patches = job.limits.images * job.patches_per_image
    b = job.compute_bytes
    if checkpointing:
        text = tokens * (a.layers * a.hidden + a.text_layer_activation) * b
        vision = patches * (a.vision_depth * a.vision_hidden + a.vision_block_activation) * b
    else:
        text = tokens * a.layers * a.text_layer_activation * b
        vision = patches * a.vision_depth * a.vision_block_activation * b
    logits = job.limits.loss_tokens * a.vocab * 2 * MASTER_BYTES
    return micro_batch * (text + vision + logits)


def engine_weights(job: Job) -> int:
    """The rollout engine's own copy of the weights on the GPU, in policy.dtype (vLLM, or the HF engine of a Ray
    rollout actor); the in-process HF engine serves the training model itself: nothing extra."""
    if job.cfg.policy.engine == "vllm" or job.cfg.distributed.backend == "ray":
        return job.arch.total_params * job.dtype_bytes
    return 0


def kv_bytes_per_token(job: Job) -> int:
    """K and V of every layer for one token, in the compute dtype."""
    return job.arch.kv_elements_per_token * job.compute_bytes


def kv_cache(job: Job, utilization: float | None = None, max_batch: int | None = None) -> int:
    """vLLM: what it keeps for its KV cache, its memory share (gpu_memory_utilization x the GPU) less its weights;
    it takes the share whole when it starts. The HF engine: the cache of one generate call, max_batch sequences
    (at most the episodes of a step) padded to the longest prompt and its reply."""
    if job.cfg.policy.engine == "vllm":
        share = job.cfg.policy.vllm.gpu_memory_utilization if utilization is None else utilization
        return max(0, int(share * job.hardware.gpu_bytes) - engine_weights(job))
    episodes = job.cfg.episodes_per_step // max(1, job.engines or 1)
    batch = min(job.cfg.policy.max_batch if max_batch is None else max_batch, episodes)
    return batch * job.limits.tokens * kv_bytes_per_token(job)


def per_gpu(job: Job, *, shards: int | None = None, micro_batch: int | None = None, checkpointing: bool | None = None,
            utilization: float | None = None, max_batch: int | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """Every term for one training GPU (with `total`, the peak), and the two phases of a step: the rollout (the
    training state resident, the colocated engine generating) and the update (the training state, the gathered
    units, the activations, and the engine unless it sleeps). The keywords replace the job's own
    settings (what-if questions: the smallest fitting micro-batch, the GPUs needed)."""
    shards = job.shards if shards is None else shards
    micro_batch = job.cfg.micro_batch if micro_batch is None else micro_batch
    checkpointing = job.activation_checkpointing if checkpointing is None else checkpointing
    terms = {
        "master_weights": master_weights(job, shards),
        "gradients": gradients(job, shards),
        "optimizer": optimizer(job, shards),
        "reference": reference(job, shards),
        "gathered_unit": gathered_unit(job, shards),
        "activations": activations(job, micro_batch, checkpointing),
        "vllm_weights": engine_weights(job),
        "kv_cache": kv_cache(job, utilization, max_batch),
        "reserve": RUNTIME_RESERVE_BYTES,
    }
    resident = sum(terms[k] for k in ("master_weights", "gradients", "optimizer", "reference", "reserve"))
    engine = terms["vllm_weights"] + terms["kv_cache"]
    # the engine asleep during the update frees its share (vLLM sleep mode level 1); awake, it keeps it
    asleep = job.cfg.policy.engine == "vllm" and job.cfg.policy.vllm.enable_sleep_mode
    engine_in_update = 0 if not job.colocated or asleep else (terms["vllm_weights"] if job.cfg.policy.engine == "hf" else engine)
    phases = {
        "rollout": resident + (engine if job.colocated else 0),
        "update": resident + terms["gathered_unit"] + terms["activations"] + engine_in_update,
    }
    return {**terms, "total": max(phases.values())}, phases


@dataclass
class Plan:
    """What `mazerl cluster plan --json` prints: bytes, counts and seconds; `problems` empty when it all fits."""

    profile: str
    instance_type: str
    gpu: str
    model: str
    parameters: dict
    trainable_parameters: int
    gpus: int
    gpu_bytes: int
    per_gpu_bytes: dict
    phases: dict
    activation_checkpointing: bool
    activations_bytes: dict  # {"with_checkpointing", "without_checkpointing"} at the job's micro-batch
    fits: bool
    turn_budget: int
    image_tokens_per_frame: int
    vllm_limits_needed: dict  # {"images", "tokens"}
    vllm_limits: dict | None  # what the engine runs with (set, or derived); None for the HF engine
    rollout_sequences_at_full_length: int | None  # vLLM: prompts of max_model_len its KV cache holds at once
    rollout_sequences_per_engine: int
    weight_sync_bytes_per_step: int
    weight_sync_seconds: float
    checkpoint_bytes: int
    checkpoint_seconds: float
    problems: list[str]

    def to_json(self) -> dict:
        return asdict(self)


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def weight_sync(job: Job) -> tuple[int, float]:
    """Bytes moved per step to bring the updated weights to the engines, and seconds at the links.

    The full state dict is gathered on rank 0 and sent in policy.dtype (what the engines run in; the fp32
    master weights stay on the ranks): parameters x dtype bytes per copy.
    object_store (colocated placement): rank 0 hands it to the driver on the Ray head, which puts it in the
    object store, from which every engine fetches a copy: 1 + engines copies over the network. broadcast
    (split placement, NCCL): rank 0 sends one copy to each engine over NVLink (one node) or the network.
    The in-process HF engine shares the training model: nothing moves."""
    cfg = job.cfg
    if cfg.policy.engine == "hf" and cfg.distributed.backend != "ray":
        return 0, 0.0
    full = job.arch.total_params * job.dtype_bytes
    hw = job.hardware
    if cfg.distributed.backend != "ray":  # one process: into its own vLLM engine through host memory
        return full, full / hw.host_link_bytes_per_s
    d = cfg.distributed
    broadcast = d.weight_sync == "broadcast" or (d.weight_sync == "auto" and d.placement == "split" and d.gpus_per_rollout_worker > 0)
    if broadcast:
        link = hw.network_bytes_per_s if job.nodes > 1 else (hw.gpu_link_bytes_per_s or hw.host_link_bytes_per_s)
        return full * job.engines, full / hw.host_link_bytes_per_s + full * job.engines / (link * max(1, job.nodes))
    return full * (1 + job.engines), full / hw.host_link_bytes_per_s + full * (1 + job.engines) / hw.network_bytes_per_s


def checkpoint(job: Job) -> tuple[int, float]:
    """Bytes one checkpoint writes (the ranks' shards of the model state and AdamW's moments: what resume needs),
    and seconds to write them over the nodes' networks in parallel (FSx for Lustre, and again to S3 when
    checkpoint_uri is set)."""
    total = master_weights(job, 1) + optimizer(job, 1)
    copies = 2 if job.cfg.checkpoint_uri else 1
    return total, copies * total / (job.hardware.network_bytes_per_s * job.nodes)


# ---- the plan of a job config on a profile ---------------------------------------------------------------------
def job_config_for_profile(profile, config: str | None = None, overrides: dict | None = None):
    """The GRPO config as the profile's training step runs it: the profile's pipeline.grpo_config and base model
    (or `config` as given), the RayJob's sizing (backend rayjob, as build_rayjob sets it), then `overrides`."""
    from ..config import load_config
    from ..profiles import resolve_job_config
    from ..rl.config import GRPOConfig

    implied: dict[str, object] = {} if config is not None else {"policy.model": profile.pipeline.model}
    if profile.backend == "rayjob" and profile.rayjob is not None:
        from .rayjob import sizing_overrides

        implied.update(sizing_overrides(profile))
    elif profile.backend == "ray":
        implied["distributed.backend"] = "ray"
    return load_config(GRPOConfig, resolve_job_config(config or profile.pipeline.grpo_config), {**implied, **(overrides or {})})


def _layout(cfg, profile, hw: Hardware) -> tuple[int, int, bool, int, int]:
    """(GPUs, FSDP shards, colocated, engines, nodes) of the job on the profile."""
    if cfg.distributed.backend == "ray":
        d = cfg.distributed
        if d.gpus_per_rank <= 0:
            raise PlanError(f"distributed.gpus_per_rank = {d.gpus_per_rank:g}: the training ranks would run on CPU on a GPU "
                            "profile; needs >= 1")
        colocated = d.placement == "colocated"
        gpus = math.ceil(d.ranks * d.gpus_per_rank + (0 if colocated else d.rollout_workers * d.gpus_per_rollout_worker))
        nodes = profile.rayjob.workers if profile.rayjob is not None else max(1, math.ceil(gpus / hw.gpus_per_node))
        return gpus, d.ranks, colocated, d.rollout_workers, nodes
    if profile.task_gpus < 1:
        raise PlanError(f"profile {profile.name!r}: task_gpus = {profile.task_gpus}: training in the task pod (backend "
                        "local) needs >= 1 GPU")
    return 1, 1, True, 1 if cfg.policy.engine == "vllm" else 0, 1


def train_episodes(cfg, profile) -> Episodes:
    """The train split's episodes: read from cfg.train_data where it is readable (the train step's pod), else
    those of the split the pipeline generates (profile pipeline.dataset_preset)."""
    if Path(cfg.train_data).is_file():
        from ..mazes.dataset_io import read_split

        return split_episodes(read_split(cfg.train_data), cfg.policy.render_scale, cfg.max_turns)
    return pipeline_train_episodes(profile.pipeline.dataset_preset, cfg.policy.render_scale, cfg.max_turns)


def build_plan(profile, cfg, episodes: Episodes | None = None) -> Plan:
    """The plan of job config `cfg` (as the training step runs it: job_config_for_profile) on `profile`, with
    `problems` listing what does not fit (empty when it all fits)."""
    if profile.kind == "local":
        raise PlanError(f"profile {profile.name!r} trains on this machine's CPU: the capacity plan is for GPU profiles "
                        "(hyperpod-*)")
    instance, hw = hardware_of(profile)
    gpus, shards, colocated, engines, nodes = _layout(cfg, profile, hw)
    arch = architecture(cfg.policy.model)
    episodes = episodes or train_episodes(cfg, profile)
    count_image_tokens = image_tokens_counter(cfg.policy.model)
    image_tokens = max(count_image_tokens(h, w) for h, w in episodes.frame_sizes)
    merge = int(getattr(image_processor(cfg.policy.model), "merge_size", 2))
    needed = prompt_limits(cfg.policy, episodes, count_image_tokens)
    job = Job(cfg, arch, needed, image_tokens * merge * merge, hw, shards, colocated, engines, nodes)
    problems: list[str] = []
    if needed.tokens > arch.max_positions:
        problems.append(f"the longest prompt and its reply take {needed.tokens} tokens, more than the model's "
                        f"{arch.max_positions} positions: lower policy.max_new_tokens or max_turns, or keep less history "
                        "(policy.history)")
    limits = None
    if cfg.policy.engine == "vllm":
        try:
            v = with_prompt_limits(cfg.policy, needed).vllm
            limits = {"images": v.max_images_per_prompt, "tokens": v.max_model_len}
        except PlanError as err:
            problems.append(str(err))
    terms, phases = per_gpu(job)
    problems += _memory_problems(job, terms, phases, instance)
    sync_bytes, sync_s = weight_sync(job)
    ckpt_bytes, ckpt_s = checkpoint(job)
    one_sequence = needed.tokens * kv_bytes_per_token(job)
    per_engine = cfg.episodes_per_step // max(1, engines)
    return Plan(
        profile=profile.name, instance_type=instance, gpu=hw.gpu, model=cfg.policy.model,
        parameters={"text": arch.text_params, "vision": arch.vision_params, "total": arch.total_params},
        trainable_parameters=job.trainable_params, gpus=gpus, gpu_bytes=hw.gpu_bytes, per_gpu_bytes=terms, phases=phases,
        activation_checkpointing=job.activation_checkpointing,
        activations_bytes={"with_checkpointing": activations(job, cfg.micro_batch, True),
                           "without_checkpointing": activations(job, cfg.micro_batch, False)},
        fits=not problems, turn_budget=episodes.turn_budget, image_tokens_per_frame=image_tokens,
        vllm_limits_needed={"images": needed.images, "tokens": needed.tokens}, vllm_limits=limits,
        rollout_sequences_at_full_length=terms["kv_cache"] // one_sequence if cfg.policy.engine == "vllm" else None,
        rollout_sequences_per_engine=per_engine,
        weight_sync_bytes_per_step=sync_bytes, weight_sync_seconds=round(sync_s, 3),
        checkpoint_bytes=ckpt_bytes, checkpoint_seconds=round(ckpt_s, 3), problems=problems,
    )


def _memory_problems(job: Job, terms: dict, phases: dict, instance: str) -> list[str]:
    """Each phase over the GPU's memory, with the settings that would bring it under and the number each needs."""
    cfg, gpu = job.cfg, job.hardware.gpu_bytes
    where = f"of the {_gib(gpu)} of an {job.hardware.gpu} ({instance})"
    problems = []
    if phases["update"] > gpu:
        fixes = []
        most = _micro_batch_fitting(job, job.activation_checkpointing)
        if most is not None and most < cfg.micro_batch:
            fixes.append(f"micro_batch = {cfg.micro_batch}: needs <= {most}")
        elif most is None and not job.activation_checkpointing and (most := _micro_batch_fitting(job, True)) is not None:
            fixes.append("distributed.activation_checkpointing: needs true"
                         + (f", with micro_batch <= {most} (now {cfg.micro_batch})" if most < cfg.micro_batch else ""))
        if cfg.policy.engine == "vllm" and job.colocated and not cfg.policy.vllm.enable_sleep_mode:
            fixes.append(f"policy.vllm.enable_sleep_mode: needs true (the engine keeps "
                         f"{_gib(terms['vllm_weights'] + terms['kv_cache'])} through the update otherwise)")
        if (n := _shards_needed(job, "update")) is not None and n > job.shards:
            fixes.append(_more_gpus(job, n))
        problems.append(f"per GPU the update needs {_gib(phases['update'])} {where}: "
                        + ("; or ".join(fixes) if fixes else "no setting of this job config brings it under"))
    if phases["rollout"] > gpu:
        fixes = []
        resident = phases["rollout"] - terms["vllm_weights"] - terms["kv_cache"]
        if cfg.policy.engine == "vllm":
            most = math.floor((gpu - resident) / gpu * 100) / 100
            fixes.append(f"policy.vllm.gpu_memory_utilization = {cfg.policy.vllm.gpu_memory_utilization:g}: needs <= {most:g}"
                         if most > 0 else "the training state alone fills the GPU")
        else:
            fitting = [b for b in range(cfg.policy.max_batch - 1, 0, -1) if per_gpu(job, max_batch=b)[1]["rollout"] <= gpu]
            if fitting:
                fixes.append(f"policy.max_batch = {cfg.policy.max_batch}: needs <= {fitting[0]}")
        if (n := _shards_needed(job, "rollout")) is not None and n > job.shards:
            fixes.append(_more_gpus(job, n))
        problems.append(f"per GPU the rollout needs {_gib(phases['rollout'])} {where}: " + "; or ".join(fixes))
    if cfg.policy.engine == "vllm":
        one = job.limits.tokens * kv_bytes_per_token(job)
        if terms["kv_cache"] < one:
            least = math.ceil((terms["vllm_weights"] + one) / gpu * 100) / 100
            problems.append(f"policy.vllm.gpu_memory_utilization = {cfg.policy.vllm.gpu_memory_utilization:g} leaves vLLM "
                            f"{_gib(terms['kv_cache'])} for its KV cache, less than one prompt of {job.limits.tokens} tokens "
                            f"takes ({_gib(one)}): needs >= {least:g}")
    return problems


def _micro_batch_fitting(job: Job, checkpointing: bool) -> int | None:
    """The largest micro-batch up to the job's whose update fits the GPU, if any."""
    for mb in range(job.cfg.micro_batch, 0, -1):
        if per_gpu(job, micro_batch=mb, checkpointing=checkpointing)[1]["update"] <= job.hardware.gpu_bytes:
            return mb
    return None


def _shards_needed(job: Job, phase: str) -> int | None:
    """The fewest training ranks (one per GPU) whose shards would fit the phase, if any up to 1024 do."""
    for n in range(1, 1025):
        if per_gpu(job, shards=n)[1][phase] <= job.hardware.gpu_bytes:
            return n
    return None


def _more_gpus(job: Job, n: int) -> str:
    if job.cfg.distributed.backend == "ray":
        return (f"distributed.ranks = {job.shards} (the profile's rayjob.workers x rayjob.gpus_per_worker with backend "
                f"rayjob): needs >= {n} GPUs")
    return f"the model sharded over >= {n} GPUs (distributed.backend ray), where one GPU holds {job.shards} share"


def check_plan(profile, cfg, episodes: Episodes | None = None) -> Plan:
    """The plan, or a PlanError naming every setting that does not fit and the number it needs."""
    plan = build_plan(profile, cfg, episodes)
    if plan.problems:
        raise PlanError(f"job config on profile {profile.name!r} does not fit ({plan.model}, {plan.gpus} x {plan.gpu}): "
                        + "; ".join(plan.problems))
    return plan


def check_profile(profile) -> Plan | None:
    """The plan of the profile's own training job (pipeline.grpo_config with pipeline.model), checked; None for a
    profile that trains on CPU (local). What `mazerl pipeline compile` and `submit` run."""
    if profile.kind == "local":
        return None
    return check_plan(profile, job_config_for_profile(profile))


def format_plan(plan: Plan) -> str:
    """The plan as a reader wants it: GiB, billions of parameters, one term a line."""
    billions = {k: f"{v / 1e9:.2f} B" for k, v in plan.parameters.items()}
    lines = [f"{plan.model}: {billions['total']} parameters (text {billions['text']}, vision {billions['vision']}; "
             f"trainable {plan.trainable_parameters / 1e9:.3f} B)",
             f"profile {plan.profile}: {plan.gpus} x {plan.gpu} ({_gib(plan.gpu_bytes)} each, {plan.instance_type})",
             "per GPU:"]
    names = {"master_weights": "master weights", "gradients": "gradients", "optimizer": "AdamW moments",
             "reference": "KL reference", "gathered_unit": "gathered FSDP unit",
             "activations": f"activations (checkpointing {'on' if plan.activation_checkpointing else 'off'})",
             "vllm_weights": "rollout engine weights", "kv_cache": "KV cache", "reserve": "CUDA/NCCL reserve"}
    for key, name in names.items():
        lines.append(f"  {name:<34}{_gib(plan.per_gpu_bytes[key]):>12}")
    phases = ", ".join(f"{k} {_gib(v)}" for k, v in plan.phases.items())
    lines.append(f"  {'peak':<34}{_gib(plan.per_gpu_bytes['total']):>12}  of {_gib(plan.gpu_bytes)}: "
                 + ("fits" if plan.fits else "does NOT fit") + f" ({phases})")
    a = plan.activations_bytes
    lines.append(f"activations at the micro-batch: {_gib(a['with_checkpointing'])} with checkpointing, "
                 f"{_gib(a['without_checkpointing'])} without")
    need = plan.vllm_limits_needed
    lines.append(f"per prompt: up to {need['images']} images and {need['tokens']} tokens (turn budget {plan.turn_budget}, "
                 f"{plan.image_tokens_per_frame} image tokens a frame)"
                 + (f"; vLLM runs with {plan.vllm_limits['images']} images, max_model_len {plan.vllm_limits['tokens']}"
                    if plan.vllm_limits else ""))
    if plan.rollout_sequences_at_full_length is not None:
        lines.append(f"rollout: vLLM's KV cache holds {plan.rollout_sequences_at_full_length} prompts of full length at "
                     f"once; {plan.rollout_sequences_per_engine} episodes per engine")
    lines.append(f"weight sync: {plan.weight_sync_bytes_per_step / 1e9:.1f} GB a step (>= {plan.weight_sync_seconds:.1f} s "
                 f"at the links); checkpoint: {plan.checkpoint_bytes / 1e9:.1f} GB (>= {plan.checkpoint_seconds:.1f} s)")
    return "\n".join(lines)
