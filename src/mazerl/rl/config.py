"""Configs of the learning jobs: the optimizer, GRPO and behaviour cloning (the policy's own settings live in
policy/config.py)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..config import Seed, Temperature, TurnBudget
from ..envs.maze_env import EnvConfig
from ..policy.config import LoraSettings, PolicyConfig

__all__ = ["GRPOConfig", "LoraSettings", "OptimConfig", "PolicyConfig", "SFTConfig"]

# Upper bounds on sizes that otherwise fail only once a run has started (out of memory after the model
# is loaded, a Ray placement that never happens, a deadline too far for a timer): far above any real run.
MAX_MAZES_PER_STEP = 65_536
MAX_SEQUENCES_PER_BATCH = 65_536
MAX_GROUP_SIZE = 1_024
MAX_MINUTES = 525_600.0  # a year


class OptimConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    lr: float = Field(1e-6, gt=0.0, le=1.0)
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    betas: tuple[Annotated[float, Field(ge=0.0, lt=1.0)], Annotated[float, Field(ge=0.0, lt=1.0)]] = (0.9, 0.999)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="cosine floor, as a fraction of lr")
    max_grad_norm: float = Field(1.0, gt=0.0)


class DistributedSettings(BaseModel):
    """Where GRPO runs: in this process (`local`), or on Ray (`ray`): `ranks` training ranks in one
    process group sharding the policy with FSDP2, and `rollout_workers` actors with an engine each."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    backend: Literal["local", "ray"] = "local"
    ranks: int = Field(1, ge=1, le=1024)
    rollout_workers: int = Field(1, ge=1, le=1024)
    cpus_per_actor: float = Field(1.0, gt=0.0, le=1024.0, description="Ray CPUs each rank and rollout actor asks for")
    gpus_per_rank: float = Field(0.0, ge=0.0, le=16.0, description="Ray GPUs per training rank (0: CPU and gloo)")
    gpus_per_rollout_worker: float = Field(0.0, ge=0.0, le=16.0, description="Ray GPUs per rollout actor in split placement")
    placement: Literal["split", "colocated"] = Field(
        "split", description="split: ranks and rollout actors on their own resources; colocated: rollout actor k shares "
        "rank k's bundle (its GPU), and engines that can sleep do so during updates (then rollout_workers = ranks)")
    placement_timeout_s: float = Field(600.0, gt=0.0, le=86_400.0, description="how long to wait for Ray to place every actor")
    weight_sync: Literal["auto", "direct", "broadcast"] = Field(
        "auto", description="how updated weights reach the rollout actors, bucket by bucket from the ranks (never "
        "through the driver or a file): direct (colocated: rank k hands each bucket to the rollout actor beside it), "
        "broadcast (rank 0 and the actors form a process group: NCCL when ranks and actors have GPUs of their own, "
        "i.e. split placement, else gloo); auto: direct when colocated, else broadcast")
    weight_sync_bucket_mb: int = Field(
        512, ge=1, le=16_384, description="MiB of weights gathered and sent at a time (one tensor larger than this "
        "goes alone): what each rank and engine holds on top of its model during a sync")
    activation_checkpointing: bool = Field(
        False, description="keep only each decoder layer's and vision block's input in the forward pass and recompute "
        "the rest in the backward pass (non-reentrant torch checkpointing via transformers): the same loss and "
        "gradients in less memory, for one more forward pass; in process and on every FSDP2 rank")

    @field_validator("weight_sync", mode="before")
    @classmethod
    def _no_driver_path(cls, value):
        if value == "object_store":  # it gathered the whole state dict on the driver (the Ray head) every step
            raise ValueError("'object_store' is no longer offered (it sent the whole state dict through the driver); "
                             "allowed: auto, direct (colocated), broadcast")
        return value

    @field_validator("gpus_per_rank", "gpus_per_rollout_worker")
    @classmethod
    def _ray_gpu_count(cls, value: float) -> float:
        # Ray refuses a fractional request of more than one GPU (1.5) only when it places the actor
        if value > 1 and value != int(value):
            raise ValueError(f"{value:g} GPUs: Ray takes a whole number of GPUs, or a fraction below 1 (to share one)")
        return value


class GRPOConfig(BaseModel):
    """`mazerl train grpo`. Defaults follow SkyRL's VisGym recipe where it applies."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    policy: PolicyConfig
    train_data: str = Field(description="train split parquet")
    eval_data: str | None = Field(None, description="split parquet for the periodic greedy evaluation")
    output_dir: str
    seed: Seed = 0
    steps: int = Field(100, ge=1)
    max_minutes: float | None = Field(None, gt=0.0, le=MAX_MINUTES,
                                      description="stop (with a checkpoint) once this much time has passed")
    mazes_per_step: int = Field(32, ge=1, le=MAX_MAZES_PER_STEP, description="prompts per step (B)")
    group_size: int = Field(8, ge=2, le=MAX_GROUP_SIZE, description="samples per maze (G)")
    mini_batch_mazes: int | None = Field(None, ge=1, le=MAX_MAZES_PER_STEP, description="mazes per optimizer step (None: all)")
    micro_batch: int = Field(16, ge=1, le=MAX_SEQUENCES_PER_BATCH, description="sequences per forward/backward")
    update_turns_per_episode: TurnBudget | None = Field(
        None, description="train on at most this many of each episode's training sequences, drawn at random "
        "(seeded): every turn of an episode shares its advantage, so a sample keeps the gradient unbiased at a fraction "
        "of the update's cost (None: all)")
    skip_zero_advantage_turns: bool = Field(
        False, description="train only on turns whose advantage is not 0 (e.g. a state where every move of the group "
        "was the same, with turn_baseline 'state'): the same policy gradient at less cost; refused with kl_coef > 0, "
        "whose term those turns still carry")
    curriculum_start: float | None = Field(
        None, gt=0.0, le=1.0, description="easy mazes first: step 1 draws from this fraction of the train split with the "
        "fewest optimal moves, a share that grows linearly to the whole split at the last step (None: shuffled epochs of "
        "the whole split from the start)")
    temperature: Temperature = Field(1.0, description="sampling temperature of the rollouts (greedy 0 is not allowed: "
                                     "a group's samples would all be the same)")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    clip_low: float = Field(0.2, ge=0.0)
    clip_high: float = Field(0.2, ge=0.0)
    kl_coef: float = Field(0.0, ge=0.0, description="k3 KL to the initial policy (reference run: 0.005)")
    loss_aggregation: Literal["token-mean", "seq-mean"] = "token-mean"
    scale_advantages_by_std: bool = True
    episode_advantage_weight: float = Field(
        1.0, ge=0.0, description="weight of the episode-level (group-normalised episode reward) advantage in every move's "
        "advantage; 0 with turn_advantage_weight > 0 credits each move only against moves from the same state")
    turn_advantage_weight: float = Field(
        0.0, ge=0.0, description="add this x the turn-level advantage of the state a move was made from (GiGPO's "
        "anchor-state groups: same square, same last move and feedback, within a maze's group); 0: episode-level only")
    turn_gamma: float = Field(0.95, ge=0.0, le=1.0, description="discount of the return-to-go behind turn-level advantages")
    turn_baseline: Literal["state", "group"] = Field(
        "state", description="what a move's return-to-go is normalised against: `state`, the group's moves from the same "
        "anchor state (a state seen once gets no credit); `group`, every move of the maze's group (each move gets credit; "
        "with turn_gamma 0 and potential-based shaping, env.progress_reward, each move is judged by the squares it gained)")
    positive_advantages_only: bool = Field(
        False, description="train only on moves with a positive advantage (reinforce what worked, RAFT-style): a failed "
        "episode's mostly-correct early moves are not pushed down")
    filter_zero_variance_groups: bool = True
    max_weights_lag: int = Field(0, ge=0, description="updates a trajectory's weights may lag the trainer's (0: on-policy, "
                                 "every trajectory from the latest weights; > 0 allows asynchronous rollouts)")
    recompute_old_logprobs: bool = Field(False, description="score the sampled tokens with the trainer's model before the "
                                         "update instead of using the engine's log-probabilities (an engine's differ slightly)")
    autocast: Literal["off", "bfloat16", "auto"] = Field(
        "off", description="run rollouts and the update's forward and backward passes under torch.autocast in this "
        "dtype (mixed precision: weights, gradients and optimizer state stay in policy.dtype, float32; periodic "
        "evaluation stays in float32). auto: bfloat16 where the process's device has bf16 arithmetic (a CPU with "
        "avx512_bf16, amx_bf16 or ARM bf16; a CUDA GPU that supports it), off elsewhere: on a CPU without those "
        "instructions torch emulates bf16 and a step is many times slower. The tiny model on a CPU with them: ~1.7x "
        "faster steps. The engine's log-probabilities are then the bf16 model's, and the update's ratio corrects for "
        "the difference; an engine with its own copy (vLLM) samples in its own dtype")
    fit_schedule_to_max_minutes: bool = Field(
        False, description="when max_minutes will stop the run before `steps`, end the learning-rate schedule at the "
        "steps that fit instead (re-estimated after every step from this run's mean step time, evaluation not "
        "counted), so a slower machine still reaches the schedule's floor by the deadline; the horizon used is logged "
        "per step as lr_schedule_steps. Without max_minutes there is no deadline, and the schedule runs over `steps`")
    optim: OptimConfig = OptimConfig()
    distributed: DistributedSettings = DistributedSettings()
    lora: LoraSettings | None = None
    freeze_vision: bool = Field(False, description="keep the vision tower fixed: RL adjusts decisions, not perception")
    env: EnvConfig = EnvConfig()
    max_turns: TurnBudget | None = Field(None, description="override the split's per-maze turn budget in training")
    eval_every: int = Field(10, ge=0, description="steps between greedy evaluations (0: never)")
    eval_every_minutes: float | None = Field(
        None, gt=0.0, le=MAX_MINUTES, description="also evaluate each time this much training time has passed (evaluation time not counted)")
    eval_mazes: int = Field(64, ge=1, le=1_000_000)
    checkpoint_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    checkpoint_uri: str | None = Field(
        None, description="s3://bucket/prefix: every checkpoint is also uploaded there (manifest last, keep_checkpoints "
        "kept); a resume with no complete local checkpoint downloads the newest one from there")

    @property
    def optimizer_steps_per_step(self) -> int:
        """Optimizer steps in one GRPO step: one per mini-batch of `mini_batch_mazes` (default: all of the step's)."""
        return self.mazes_per_step // (self.mini_batch_mazes or self.mazes_per_step)

    @model_validator(mode="after")
    def _check(self):
        if self.checkpoint_uri is not None:
            from ..storage import StorageError, split_s3

            try:
                split_s3(self.checkpoint_uri)
            except StorageError as err:
                raise ValueError(f"checkpoint_uri: {err}") from None
        if self.autocast != "off" and self.policy.dtype != "float32":
            raise ValueError(f"autocast {self.autocast!r} mixes precision over float32 weights; policy.dtype is "
                             f"{self.policy.dtype!r}: set policy.dtype float32, or autocast off")
        d = self.distributed
        episodes = (self.mini_batch_mazes or self.mazes_per_step) * self.group_size
        if d.backend == "ray" and episodes % d.ranks:
            raise ValueError(f"distributed.ranks = {d.ranks} does not divide the {episodes} episodes of a mini-batch "
                             "(mini_batch_mazes x group_size): choose a divisor")
        if d.backend == "ray" and self.mazes_per_step < d.rollout_workers:
            raise ValueError(f"distributed.rollout_workers = {d.rollout_workers} is more than mazes_per_step = "
                             f"{self.mazes_per_step}: some workers would have nothing to play")
        if d.placement == "colocated" and d.rollout_workers != d.ranks:
            raise ValueError(f"distributed.placement 'colocated' puts one rollout actor beside each rank: set "
                             f"rollout_workers = ranks ({d.ranks}), not {d.rollout_workers}")
        if d.weight_sync == "direct" and d.placement != "colocated":
            raise ValueError("distributed.weight_sync 'direct' hands rank k's buckets to the rollout actor beside it: it "
                             "needs placement 'colocated'; split placement syncs by 'broadcast' (or 'auto')")
        if d.placement == "colocated" and d.gpus_per_rollout_worker:
            raise ValueError("distributed.gpus_per_rollout_worker is for split placement; colocated actors share their rank's GPU")
        if d.backend == "local" and (d.ranks > 1 or d.rollout_workers > 1):
            raise ValueError("distributed.ranks and rollout_workers > 1 need distributed.backend: ray")
        if self.episode_advantage_weight == 0 and self.turn_advantage_weight == 0:
            raise ValueError("episode_advantage_weight and turn_advantage_weight are both 0: no move would get any credit")
        if self.skip_zero_advantage_turns and self.kl_coef > 0:
            raise ValueError(f"skip_zero_advantage_turns with kl_coef = {self.kl_coef}: the KL term has a gradient on "
                             "every turn, so none may be skipped; set kl_coef: 0 or skip_zero_advantage_turns: false")
        if self.mini_batch_mazes is not None and self.mazes_per_step % self.mini_batch_mazes:
            raise ValueError(
                f"mazes_per_step ({self.mazes_per_step}) must be divisible by mini_batch_mazes ({self.mini_batch_mazes})"
            )
        return self

    @property
    def episodes_per_step(self) -> int:
        return self.mazes_per_step * self.group_size


class SFTConfig(BaseModel):
    """`mazerl train sft`: behaviour cloning on solver moves, in the same multi-turn chat format."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    policy: PolicyConfig
    train_data: str
    eval_data: str | None = None
    output_dir: str
    seed: Seed = 0
    steps: int = Field(700, ge=1)
    max_minutes: float | None = Field(None, gt=0.0, le=MAX_MINUTES, description="stop early when this much time has passed")
    batch_size: int = Field(32, ge=1, le=MAX_SEQUENCES_PER_BATCH, description="turns (samples) per optimizer step")
    noise: float = Field(0.1, ge=0.0, lt=1.0, description="chance a turn takes a random move (not learned): teaches recovery")
    optim: OptimConfig = OptimConfig(lr=3e-4, weight_decay=0.01, warmup_steps=20, schedule="cosine", min_lr_ratio=0.1)
    env: EnvConfig = EnvConfig()
    eval_every: int = Field(0, ge=0)
    eval_mazes: int = Field(64, ge=1, le=1_000_000)
