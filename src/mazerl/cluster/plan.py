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
from dataclasses import asdict, dataclass, field, replace
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
# Left free between a colocated training rank and the vLLM share derived for it, as a fraction of the GPU: vLLM's
# own CUDA context and graphs, both allocators' fragmentation, and what these estimates miss
SHARE_MARGIN = 0.05


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
        v = job.cfg.policy.vllm
        share = utilization if utilization is not None else (
            v.gpu_memory_utilization if v.gpu_memory_utilization is not None else v.SOLE_GPU_SHARE)
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
    # a Ray training rank drops its gradients after the update (TrainRank.release_cached_memory): not held in the rollout
    released = terms["gradients"] if job.cfg.distributed.backend == "ray" else 0
    engine = terms["vllm_weights"] + terms["kv_cache"]
    # the engine asleep during the update frees its share (vLLM sleep mode level 1); awake, it keeps it
    asleep = job.cfg.policy.engine == "vllm" and job.cfg.policy.vllm.enable_sleep_mode
    engine_in_update = 0 if not job.colocated or asleep else (terms["vllm_weights"] if job.cfg.policy.engine == "hf" else engine)
    phases = {
        "rollout": resident - released + (engine if job.colocated else 0),
        "update": resident + terms["gathered_unit"] + terms["activations"] + engine_in_update,
    }
    return {**terms, "total": max(phases.values())}, phases


def sleeps_through_update(job: Job) -> bool:
    """Whether a colocated vLLM engine gives its memory back during the update: sleep mode on, and a trainer that
    calls it (RayGRPO's loop does; the in-process trainer does not)."""
    return job.cfg.policy.vllm.enable_sleep_mode and job.cfg.distributed.backend == "ray"


def rank_beside_engine(job: Job) -> int:
    """What a training rank holds on its GPU while a colocated vLLM engine holds its share: with sleep mode on Ray,
    the training state the rollout keeps (the engine wakes only after the rank has emptied its caches:
    TrainRank.release_cached_memory); otherwise the update's whole peak, which the engine sits through (the
    in-process trainer never puts its engine to sleep)."""
    terms, phases = per_gpu(job, utilization=0.0)  # the engine's own terms are left out below
    if sleeps_through_update(job):
        return phases["rollout"] - (terms["vllm_weights"] + terms["kv_cache"] if job.colocated else 0)
    return phases["update"] - terms["vllm_weights"] - terms["kv_cache"]


@dataclass(frozen=True)
class MemoryShare:
    """vLLM's gpu_memory_utilization for a job: set, or derived from what the colocated training rank needs."""

    gpu_memory_utilization: float
    derived: bool
    largest: float | None  # colocated: the most that fits beside the training rank (no margin); None: a GPU of its own
    rank_bytes_beside_engine: int | None
    problem: str | None = None  # a share set too large, or no room left to derive one


def _hundredths_down(x: float) -> float:
    return math.floor(x * 100 + 1e-9) / 100


def memory_share(job: Job) -> MemoryShare | None:
    """The engine's share of a GPU (None: not a vLLM job). Colocated and unset: the GPU less what the rank holds
    beside it (rank_beside_engine) less SHARE_MARGIN, in hundredths, rounded down; set explicitly: kept, and a
    problem when larger than what the rank leaves. With a GPU of its own: as set, else SOLE_GPU_SHARE."""
    v = job.cfg.policy.vllm
    if job.cfg.policy.engine != "vllm":
        return None
    if not job.colocated:
        return MemoryShare(v.gpu_memory_utilization or v.SOLE_GPU_SHARE, v.gpu_memory_utilization is None, None, None)
    gpu = job.hardware.gpu_bytes
    rank = rank_beside_engine(job)
    largest = _hundredths_down((gpu - rank) / gpu)
    beside = ("beside it" if sleeps_through_update(job) else "through the update (enable_sleep_mode is off)"
              if job.cfg.distributed.backend == "ray" else "through the update (the in-process trainer keeps it awake)")
    if v.gpu_memory_utilization is None:
        derived = _hundredths_down((gpu - rank) / gpu - SHARE_MARGIN)
        problem = None
        if derived <= 0:
            problem = (f"the training rank needs {_gib(rank)} of the {_gib(gpu)} GPU {beside}, which leaves no share "
                       f"for the colocated vLLM engine (policy.vllm.gpu_memory_utilization, derived: {derived:g})")
        return MemoryShare(max(derived, 0.0), True, largest, rank, problem)
    problem = None
    if v.gpu_memory_utilization > largest:
        problem = (f"policy.vllm.gpu_memory_utilization = {v.gpu_memory_utilization:g} is too large: the training rank "
                   f"colocated with the engine needs {_gib(rank)} of the {_gib(gpu)} GPU {beside}; needs <= {largest:g} "
                   "(or leave it unset: it is then derived from what the rank needs, less a margin)")
    return MemoryShare(v.gpu_memory_utilization, False, largest, rank, problem)


def with_memory_share(cfg, share: MemoryShare | None):
    """`cfg` (a GRPO config) with vLLM's share set to `share`'s value (a no-op without one)."""
    if share is None:
        return cfg
    v = cfg.policy.vllm.model_copy(update={"gpu_memory_utilization": share.gpu_memory_utilization})
    return cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"vllm": v})})


def resolve_memory_share(cfg, train_df, gpu_bytes: int):
    """The GRPO job config its colocated vLLM engines run with: gpu_memory_utilization derived (unset) or checked
    (set) against a GPU of `gpu_bytes` (measured where the ranks run) and the rank beside each engine, as the plan
    works it out. What RayGRPO calls before it starts the engines; a no-op unless vLLM shares the ranks' GPUs.
    A share that does not fit is a PlanError naming it and the number it needs."""
    if cfg.policy.engine != "vllm":
        return cfg
    d = cfg.distributed
    ray = d.backend == "ray"
    if ray and d.placement != "colocated":
        return cfg
    hw = Hardware("this GPU", int(gpu_bytes), 1, 0.0, 0.0, 0.0)  # the links play no part in memory
    episodes = split_episodes(train_df, cfg.policy.render_scale, cfg.max_turns)
    try:
        job = _job(cfg, episodes, hw, d.ranks if ray else 1, True, d.rollout_workers if ray else 1, 1)
    except PlanError as err:  # a model whose architecture cannot be read here: a share set is taken as it is
        if cfg.policy.vllm.gpu_memory_utilization is not None:
            return cfg
        raise PlanError(f"{err}; or set policy.vllm.gpu_memory_utilization (the colocated engine's GPU share) "
                        "explicitly") from None
    share = memory_share(job)
    if share is not None and share.problem:
        raise PlanError(share.problem)
    return with_memory_share(cfg, share)


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
    # vLLM's GPU share and how it came (MemoryShare's fields); None for the HF engine
    vllm_memory_share: dict | None = None
    # the estimated time of the profile's evaluations (estimate_evaluation); None where the GPU's throughput is unknown
    evaluation: dict | None = None

    def to_json(self) -> dict:
        return asdict(self)


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def weight_sync(job: Job) -> tuple[int, float]:
    """Bytes the engines receive per step (one copy of the weights each) and seconds at the links.

    The weights go in policy.dtype (what the engines run in; the fp32 master weights stay on the ranks),
    bucket by bucket from the ranks; neither the driver nor a disk is in the path.
    direct (colocated placement): every rank gathers each bucket (an all-gather over the GPU link), then
    hands it to the engine beside it through host memory (down to the host and up again), all ranks at
    once. broadcast (split placement): rank 0 sends one copy to each engine over NVLink (one node) or
    the network. The in-process HF engine shares the training model: nothing moves."""
    cfg = job.cfg
    if cfg.policy.engine == "hf" and cfg.distributed.backend != "ray":
        return 0, 0.0
    full = job.arch.total_params * job.dtype_bytes
    hw = job.hardware
    if cfg.distributed.backend != "ray":  # one process: into its own vLLM engine through host memory
        return full, full / hw.host_link_bytes_per_s
    d = cfg.distributed
    direct = d.weight_sync == "direct" or (d.weight_sync == "auto" and d.placement == "colocated")
    if direct:
        gather_link = hw.network_bytes_per_s if job.nodes > 1 else (hw.gpu_link_bytes_per_s or hw.host_link_bytes_per_s)
        return full * job.engines, full / gather_link + 2 * full / hw.host_link_bytes_per_s
    link = hw.network_bytes_per_s if job.nodes > 1 else (hw.gpu_link_bytes_per_s or hw.host_link_bytes_per_s)
    return full * job.engines, full / hw.host_link_bytes_per_s + full * job.engines / (link * max(1, job.nodes))


def checkpoint(job: Job) -> tuple[int, float]:
    """Bytes one checkpoint writes (the ranks' shards of the model state and AdamW's moments: what resume needs),
    and seconds to write them over the nodes' networks in parallel (FSx for Lustre, and again to S3 when
    checkpoint_uri is set)."""
    total = master_weights(job, 1) + optimizer(job, 1)
    copies = 2 if job.cfg.checkpoint_uri else 1
    return total, copies * total / (job.hardware.network_bytes_per_s * job.nodes)


# ---- the plan of a job config on a profile ---------------------------------------------------------------------
def sizing_overrides(profile) -> dict[str, object]:
    """The training config's distributed settings the profile's RayJob shape implies: one rank and one
    colocated vLLM engine per GPU."""
    r = profile.rayjob
    ranks = r.workers * r.gpus_per_worker
    return {"distributed.backend": "ray", "distributed.ranks": ranks, "distributed.rollout_workers": ranks,
            "distributed.placement": "colocated", "distributed.gpus_per_rank": 1,
            "distributed.cpus_per_actor": max(1, r.cpus_per_worker // (2 * r.gpus_per_worker)),
            "policy.engine": "vllm", "policy.device": "cuda"}


def job_config_for_profile(profile, config: str | None = None, overrides: dict | None = None):
    """The GRPO config as the profile's training step runs it: the profile's pipeline.grpo_config and base model
    (or `config` as given), the RayJob's sizing (backend rayjob, as build_rayjob sets it), then `overrides`."""
    from ..config import load_config, resolve_job_config
    from ..rl.config import GRPOConfig

    implied: dict[str, object] = {} if config is not None else {"policy.model": profile.pipeline.model}
    if profile.backend == "rayjob" and profile.rayjob is not None:
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


def _merge(model: str) -> int:
    return int(getattr(image_processor(model), "merge_size", 2))


def _job(cfg, episodes: Episodes, hw: Hardware, shards: int, colocated: bool, engines: int, nodes: int) -> Job:
    """The memory terms' inputs: the model's architecture and the longest prompt of `episodes` on hardware `hw`."""
    count_image_tokens = image_tokens_counter(cfg.policy.model)
    image_tokens = max(count_image_tokens(h, w) for h, w in episodes.frame_sizes)
    needed = prompt_limits(cfg.policy, episodes, count_image_tokens)
    return Job(cfg, architecture(cfg.policy.model), needed, image_tokens * _merge(cfg.policy.model) ** 2, hw, shards,
               colocated, engines, nodes)


def build_plan(profile, cfg, episodes: Episodes | None = None) -> Plan:
    """The plan of job config `cfg` (as the training step runs it: job_config_for_profile) on `profile`, with
    `problems` listing what does not fit (empty when it all fits)."""
    if profile.kind == "local":
        raise PlanError(f"profile {profile.name!r} trains on this machine's CPU: the capacity plan is for GPU profiles "
                        "(hyperpod-*)")
    instance, hw = hardware_of(profile)
    gpus, shards, colocated, engines, nodes = _layout(cfg, profile, hw)
    episodes = episodes or train_episodes(cfg, profile)
    job = _job(cfg, episodes, hw, shards, colocated, engines, nodes)
    arch, needed = job.arch, job.limits
    image_tokens = job.patches_per_image // _merge(cfg.policy.model) ** 2
    problems: list[str] = []
    share = memory_share(job)
    if share is not None:
        if share.problem:
            problems.append(share.problem)
        cfg = with_memory_share(cfg, share)
        job = replace(job, cfg=cfg)
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
    problems += _memory_problems(job, terms, phases, instance, share)
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
        vllm_memory_share=asdict(share) if share is not None else None,
        evaluation=estimate_evaluation(profile, cfg.policy, hw),
    )


def _memory_problems(job: Job, terms: dict, phases: dict, instance: str, share: MemoryShare | None = None) -> list[str]:
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
    # colocated vLLM: memory_share checks the rollout (the rank's training state beside the engine's share)
    if phases["rollout"] > gpu and not (cfg.policy.engine == "vllm" and job.colocated):
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
            derived = " (derived: what the training rank leaves)" if share is not None and share.derived else ""
            problems.append(f"policy.vllm.gpu_memory_utilization = {cfg.policy.vllm.gpu_memory_utilization:g}{derived} leaves vLLM "
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
    if (share := plan.vllm_memory_share) is not None:
        how = ("derived: the GPU less what the training rank holds beside the engine "
               f"({_gib(share['rank_bytes_beside_engine'])}), less a {SHARE_MARGIN:.0%} margin"
               if share["derived"] and share["largest"] is not None else "derived: a GPU of its own" if share["derived"]
               else "set" + (f"; at most {share['largest']:g} fits beside the training rank" if share["largest"] is not None else ""))
        lines.append(f"vLLM GPU share (policy.vllm.gpu_memory_utilization): {share['gpu_memory_utilization']:g} ({how})")
    if plan.rollout_sequences_at_full_length is not None:
        lines.append(f"rollout: vLLM's KV cache holds {plan.rollout_sequences_at_full_length} prompts of full length at "
                     f"once; {plan.rollout_sequences_per_engine} episodes per engine")
    lines.append(f"weight sync: {plan.weight_sync_bytes_per_step / 1e9:.1f} GB a step (>= {plan.weight_sync_seconds:.1f} s "
                 f"at the links); checkpoint: {plan.checkpoint_bytes / 1e9:.1f} GB (>= {plan.checkpoint_seconds:.1f} s)")
    if plan.evaluation is not None:
        lines += format_evaluation(plan.evaluation)
    return "\n".join(lines)


# ---- evaluation time: a roofline of batched greedy decoding (an estimate) ---------------------------------------
@dataclass(frozen=True)
class GPUThroughput:
    memory_bytes_per_s: float  # the GPU memory's bandwidth (HBM, GDDR)
    bf16_flops: float  # dense bf16 tensor-core peak, without sparsity
    vllm_max_seqs: int  # vLLM's default max_num_seqs for the offline LLM class on this GPU


# Sources: NVIDIA's H100 SXM data sheet (3.35 TB/s HBM3, 989 TFLOPS dense bf16); H200 data sheet (4.8 TB/s HBM3e,
# the H100's tensor cores); A100 data sheet (40 GB: 1,555 GB/s, 80 GB: 2,039 GB/s; 312 TFLOPS dense bf16); AWS's
# A10G: 24 GB GDDR6 at 600 GB/s like the A10, but fewer tensor FLOPs (about 70 TFLOPS dense bf16 against the
# A10's 125; Baseten's A10 vs A10G comparison). max_num_seqs: vllm/engine/arg_utils.py (1024 on GPUs of >= 70 GiB
# other than the A100, else 256).
GPU_THROUGHPUT = {
    "H100 80GB HBM3": GPUThroughput(3.35e12, 989e12, 1024),
    "H200 141GB HBM3e": GPUThroughput(4.8e12, 989e12, 1024),
    "A100 40GB": GPUThroughput(1.555e12, 312e12, 256),
    "A100 80GB": GPUThroughput(2.039e12, 312e12, 256),
    "A10G 24GB": GPUThroughput(600e9, 70e12, 256),
}
# What a serving engine reaches of those peaks (assumptions, stated with the estimate): decoding streams the
# weights and the KV cache at about 80% of the memory bandwidth; prefill runs its matrix products at about 50%
# of the tensor peak.
DECODE_BANDWIDTH_SHARE = 0.8
PREFILL_FLOPS_SHARE = 0.5
EVALUATIONS_PER_RUN = 2  # the baseline and the trained model, on the same splits
SHORT_REPLY_TOKENS = (256, 64)  # reply lengths the estimate is also given at (what-ifs, below max_new_tokens)


@dataclass(frozen=True)
class EvalGroup:
    """Episodes of one split that share a turn budget: what the estimate plays."""

    split: str
    episodes: int
    turn_budget: int
    frame_sizes: tuple[tuple[int, int], ...]  # (height, width) of its frames, in pixels


def _played(counts: list[tuple[object, int]], limit: int | None) -> list[tuple[object, int]]:
    """The first `limit` rows of a split written in this order of (key, rows) blocks (evaluation plays the
    first N rows of a split: workflow.evaluation_limits)."""
    out, left = [], limit if limit is not None else sum(n for _, n in counts)
    for key, n in counts:
        if left <= 0:
            break
        out.append((key, min(n, left)))
        left -= min(n, left)
    return out


def evaluation_groups(preset: str, heldout: int, other: int, render_scale: float, reference: bool = True) -> list[EvalGroup]:
    """The episodes both evaluations play, by split and turn budget: `heldout` of the heldout split, `other` of each
    other generated split (its first rows: sizes in the preset's order), and the VisGym reference splits in full.
    A split without a fixed budget gets the budget of the longest route of its size (every cell): a bound."""
    from ..mazes.splits import TRAIN_SPLIT, default_turn_budget, preset as dataset_preset

    cfg = dataset_preset(preset)
    groups = []
    for name, spec in cfg.splits.items():
        if name == TRAIN_SPLIT:
            continue
        source = cfg.splits[spec.derived_from] if spec.derived_from else spec
        if spec.derived_from is None:  # written size by size, each size's algorithms in turn
            blocks = [(size, spec.count_of(size) * len(spec.algorithms)) for size in spec.sizes]
        else:  # layouts sampled from the source split: its largest size bounds them
            blocks = [(max(source.sizes, key=lambda rc: rc[0] * rc[1]), spec.total())]
        for (rows, cols), n in _played(blocks, heldout if name == "heldout" else other):
            fixed = spec.max_turns if spec.max_turns is not None else source.max_turns  # a derived split keeps its source's
            budget = fixed if fixed is not None else default_turn_budget(rows * cols - 1)
            frames = tuple(sorted({_frame_size(rows, cols, r, render_scale) for r in spec.render}))
            groups.append(EvalGroup(name, n, budget, frames))
    if reference and cfg.reference_splits:
        from ..mazes.render import RenderOptions
        from ..mazes.solver import analyse
        from ..mazes.visgym import VISGYM_MAX_TURNS, load_visgym_fixture, reference_file

        episodes = load_visgym_fixture(reference_file())
        for base, env_id in cfg.reference_splits.items():
            budgets: dict[tuple[int, tuple[int, int]], int] = {}
            for ep in (e for e in episodes if e.env_id == env_id):  # as mazes/splits.py gives them their budget
                budget = (VISGYM_MAX_TURNS if env_id == "maze_2d/easy"
                          else default_turn_budget(analyse(ep.maze).shortest_path_moves))
                key = (budget, _frame_size(ep.maze.height, ep.maze.width, RenderOptions(), render_scale))
                budgets[key] = budgets.get(key, 0) + 1
            groups += [EvalGroup(base, n, budget, (frame,)) for (budget, frame), n in sorted(budgets.items())]
    return groups


@functools.lru_cache(maxsize=8)
def _attention_width(directory: str) -> int:
    """Query heads x head size of the text model: what attention multiplies against every cached token."""
    from transformers import AutoConfig

    text = AutoConfig.from_pretrained(directory).get_text_config()
    return text.num_attention_heads * (getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)


def turn_prompts(policy, budget: int, image_tokens: int, reply_tokens: int | None = None) -> list[tuple[int, int]]:
    """(prompt tokens, images) at each turn of an episode of `budget` turns, every reply `reply_tokens` long
    (None: max_new_tokens): the layout prompt_limits walks (system turn, each kept turn's frame, text and reply)."""
    from ..envs.maze_env import FEEDBACK_INVALID, FEEDBACK_OK, FEEDBACK_WALL
    from ..policy.prompts import PROMPTS, turn_text

    frame = image_tokens + 2
    system = 1 + _utf8("system\n" + PROMPTS[policy.prompt]) + 2
    feedback = max((FEEDBACK_OK, FEEDBACK_WALL, FEEDBACK_INVALID), key=_utf8)
    text = 1 + _utf8("user\n") + _utf8(turn_text(feedback, budget, budget)) + 2 + 1 + _utf8("assistant\n")
    reply = (reply_tokens or policy.max_new_tokens) + 2
    prompts = []
    for t in range(1, budget + 1):
        kept = t - 1 if policy.history.turns is None else min(t - 1, policy.history.turns)
        images = kept + 1 if policy.history.images is None else min(kept + 1, policy.history.images)
        prompts.append((system + (kept + 1) * text + images * frame + kept * reply, images))
    return prompts


def evaluation_seconds(policy, engine: str, groups: list[EvalGroup], arch: Architecture, attention_width: int,
                       count_image_tokens: Callable[[int, int], int], patches_per_token: int, hw: Hardware,
                       reply_tokens: int | None = None) -> dict:
    """Seconds one greedy evaluation takes on one GPU, by the roofline of batched decoding, every episode played to
    its turn budget and every reply `reply_tokens` long (None: max_new_tokens, an upper bound on the work;
    episodes that end early take less). Turn by turn, every episode of a group waits for the others (the
    rollout is synchronous), in waves of the sequences the engine runs at once, as many as the KV cache holds
    at that turn's length (the weights aside):

    - vllm: up to its max_num_seqs, in the share of a GPU of its own (VLLMSettings.SOLE_GPU_SHARE); prefix
      caching keeps earlier turns' KV, so with full history a turn prefills only its new image and text; with a
      history window the context changes and is prefilled again;
    - hf: up to policy.max_batch sequences a generate call, the whole context prefilled every turn (its Python
      work between decode steps is not counted: a lower bound for it).

    A decode step reads the text weights once for its whole wave, and each sequence's KV cache; it computes 2
    FLOPs per weight per sequence and the attention over the cache: per turn the larger of the bytes at
    DECODE_BANDWIDTH_SHARE of the memory bandwidth and the FLOPs at PREFILL_FLOPS_SHARE of the bf16 peak.
    Prefill is FLOPs at that share: 2 per text weight per token, attention over the context, 2 per vision weight
    per image patch."""
    gpu = GPU_THROUGHPUT[hw.gpu]
    bandwidth, flops = gpu.memory_bytes_per_s * DECODE_BANDWIDTH_SHARE, gpu.bf16_flops * PREFILL_FLOPS_SHARE
    weights = arch.text_params * COMPUTE_BYTES
    kv_token = arch.kv_elements_per_token * COMPUTE_BYTES
    # the evaluate pod's engine has its GPU to itself (its policy carries only the job's view, not its vLLM share)
    kv_room = max(0, int(policy.vllm.SOLE_GPU_SHARE * hw.gpu_bytes) - arch.total_params * COMPUTE_BYTES)
    steps = reply_tokens or policy.max_new_tokens
    attention = 4 * arch.layers * attention_width  # FLOPs per query token per cached token (QK^T and AV)
    full_history = policy.history.turns is None and policy.history.images is None
    decode = prefill = 0.0
    per_split: dict[str, dict] = {}
    most_at_once = 0
    for g in groups:
        image_tokens = max(count_image_tokens(h, w) for h, w in g.frame_sizes)
        vision = 2 * arch.vision_params * image_tokens * patches_per_token  # FLOPs to encode one frame
        prompts = turn_prompts(policy, g.turn_budget, image_tokens, steps)
        seconds = 0.0
        for t, (prompt, images) in enumerate(prompts):
            if engine == "vllm":
                at_once = max(1, min(g.episodes, gpu.vllm_max_seqs, kv_room // ((prompt + steps) * kv_token)))
                cached = prompts[t - 1][0] + steps if full_history and t > 0 else 0
            else:
                at_once = max(1, min(g.episodes, policy.max_batch, kv_room // ((prompt + steps) * kv_token)))
                cached = 0
            most_at_once = max(most_at_once, at_once)
            new_images = 1 if cached else images  # frames the vision tower encodes this turn
            fresh = prompt - cached  # tokens each sequence prefills this turn
            prefill_s = g.episodes * (fresh * (2 * arch.text_params + attention * (prompt - fresh / 2))
                                      + new_images * vision) / flops
            full, rest = divmod(g.episodes, at_once)
            decode_s = 0.0
            for wave, n in ((at_once, full), (rest, 1 if rest else 0)):
                if not n:
                    continue
                cached_tokens = wave * (steps * prompt + steps * (steps - 1) / 2)  # summed over the turn's steps
                bytes_s = (steps * weights + cached_tokens * kv_token) / bandwidth
                flops_s = (steps * wave * 2 * arch.text_params + cached_tokens * attention) / flops
                decode_s += n * max(bytes_s, flops_s)
            decode, prefill, seconds = decode + decode_s, prefill + prefill_s, seconds + decode_s + prefill_s
        entry = per_split.setdefault(g.split, {"episodes": 0, "turn_budgets": [], "seconds": 0.0})
        entry["episodes"] += g.episodes
        entry["turn_budgets"] = sorted(set(entry["turn_budgets"]) | {g.turn_budget})
        entry["seconds"] = round(entry["seconds"] + seconds, 1)
    return {"engine": engine, "episodes": sum(g.episodes for g in groups), "seconds": round(decode + prefill, 1),
            "decode_seconds": round(decode, 1), "prefill_seconds": round(prefill, 1),
            "sequences_at_once": most_at_once, "per_split": per_split}


def estimate_evaluation(profile, policy, hw: Hardware) -> dict | None:
    """The estimated time of the profile's evaluations (pipeline.eval_heldout_mazes, eval_other_mazes and the
    reference splits of its dataset preset) of `policy` (the GRPO job's view: history, max_new_tokens) on one GPU
    of the profile's evaluate pods, with its engine (eval_engine) and, for comparison, the other engine; None
    for a GPU whose throughput the plan does not know."""
    if hw.gpu not in GPU_THROUGHPUT:
        return None
    arch = architecture(policy.model)
    directory = model_directory(policy.model)
    width = _attention_width(str(directory.resolve())) if directory is not None else arch.hidden
    merge = int(getattr(image_processor(policy.model), "merge_size", 2))
    d = profile.pipeline
    groups = evaluation_groups(d.dataset_preset, d.eval_heldout_mazes, d.eval_other_mazes, policy.render_scale)
    counter = image_tokens_counter(policy.model)
    def seconds(engine: str, reply_tokens: int | None = None) -> dict:
        return evaluation_seconds(policy, engine, groups, arch, width, counter, merge * merge, hw, reply_tokens)

    chosen = seconds(profile.eval_engine)
    other = "hf" if profile.eval_engine == "vllm" else "vllm"
    gpu = GPU_THROUGHPUT[hw.gpu]
    # the bound takes every reply at max_new_tokens; a model that answers in a few words decodes far less
    shorter = [n for n in SHORT_REPLY_TOKENS if n < policy.max_new_tokens]
    return {
        **chosen, "gpu": hw.gpu, "max_new_tokens": policy.max_new_tokens,
        "seconds_per_run": round(EVALUATIONS_PER_RUN * chosen["seconds"], 1),
        "seconds_at_reply_tokens": {str(n): seconds(profile.eval_engine, n)["seconds"] for n in shorter},  # JSON keys
        "other_engine_seconds": {other: seconds(other)["seconds"]},
        "assumptions": {
            "memory_bytes_per_s": gpu.memory_bytes_per_s, "bf16_flops": gpu.bf16_flops,
            "decode_bandwidth_share": DECODE_BANDWIDTH_SHARE, "prefill_flops_share": PREFILL_FLOPS_SHARE,
            "every_turn_played": True, "every_reply_at_max_new_tokens": True,
            "not_counted": "engine start (loading the weights, CUDA graph capture), image rendering, the host's work",
        },
    }


def format_evaluation(e: dict) -> list[str]:
    """The evaluation estimate as a reader wants it: hours, minutes, and what it assumes."""
    def hm(seconds: float) -> str:
        return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"

    other = ", ".join(f"{k} {hm(v)}" for k, v in e["other_engine_seconds"].items())
    shorter = "; ".join(f"{hm(v)} if replies average {n} tokens" for n, v in e["seconds_at_reply_tokens"].items())
    return [
        f"evaluation (estimate, {e['engine']} on one {e['gpu']}): {e['episodes']} episodes, {hm(e['seconds'])} each "
        f"(decode {hm(e['decode_seconds'])}, prefill {hm(e['prefill_seconds'])}), {hm(e['seconds_per_run'])} for the "
        f"run's two; {other} with the other engine" + (f"; {shorter}" if shorter else ""),
        f"  an upper bound from a roofline: every turn of the budget played, every reply {e['max_new_tokens']} tokens; "
        f"decoding at {e['assumptions']['decode_bandwidth_share']:.0%} of the memory bandwidth, prefill at "
        f"{e['assumptions']['prefill_flops_share']:.0%} of the bf16 peak; not counted: {e['assumptions']['not_counted']}",
    ]
