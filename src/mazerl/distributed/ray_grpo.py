"""GRPO on Ray: a driver, N training-rank actors in one process group (FSDP2), M rollout actors.

    driver                                  ranks (FSDP2, gloo/NCCL)        rollout actors (engine)
    mazes = sampler.next(B)          ──────────────────────────────────────> collect(slice of mazes)
    trajectories, each tagged with its weights version  <──────────────────
    advantages, mini-batches (rl/driver.py)
    for each mini-batch:             ──> train_step(its slice of the batch) on every rank
    sync_weights(version)            ──> bucket by bucket, gathered on every rank (a collective), then
                                         colocated: rank k ──> its rollout actor k (direct)
                                         split: rank 0 ──> every rollout actor (broadcast group)
                                         the driver gets back byte counts and seconds, never weights
    every K steps: sharded checkpoint (DCP) on every rank + the driver's state

Connects to RAY_ADDRESS when set, else starts a local Ray. The same worker step runs in process in
`rl/trainer.py`; here it runs as a rank.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from ..errors import UserError
from ..mazes.dataset_io import read_split
from ..mazes.seeding import derive_seed
from ..metrics import MetricsWriter
from ..rl.checkpoint import CheckpointManager
from ..rl.config import GRPOConfig
from ..rl.data import train_sampler
from ..rl.driver import GRPODriver, episode_metrics, update_stats
from ..rl.precision import mixed_precision, report_autocast
from ..storage import CheckpointMirror

log = logging.getLogger(__name__)
# Fault injection for the tests: a rollout actor exits during this step (never set in real runs).
KILL_ROLLOUT_AT_STEP_ENV = "MAZERL_FAULT_KILL_ROLLOUT_AT_STEP"


class RayBackendError(UserError):
    """Ray cannot run the job as configured (not installed, unreachable, too few resources)."""


def check_ray_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast (Ray itself retries for minutes) when RAY_ADDRESS names a host and port that does
    not accept connections. 'auto' and 'local' are left to Ray."""
    import socket
    from urllib.parse import urlparse

    if address in ("auto", "local"):
        return
    parsed = urlparse(address if "://" in address else f"gcs://{address}")
    try:
        host, port = parsed.hostname, parsed.port
    except ValueError:
        host, port = None, None
    if not host or not port:
        raise RayBackendError(f"RAY_ADDRESS={address!r} is not HOST:PORT (or ray://HOST:PORT, auto)")
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as err:
        raise RayBackendError(f"cannot reach the Ray cluster at RAY_ADDRESS={address!r} ({err.strerror or err}); "
                              "unset RAY_ADDRESS to start a local Ray") from None


def _require_ray():
    try:
        import ray
    except ImportError:
        raise RayBackendError("distributed.backend 'ray' needs Ray: pip install 'ray>=2.50'") from None
    return ray


METRICS_PORT_ENV = "MAZERL_RAY_METRICS_PORT"


class TrainRank:
    """One training rank: its share of every mini-batch, FSDP2 shards of the policy and optimizer."""

    def __init__(self, cfg_json: dict, rank: int, world_size: int):
        from .memory import PhaseLog

        self.cfg = GRPOConfig.model_validate(cfg_json)
        self.rank, self.world_size = rank, world_size
        self.phases = PhaseLog(f"rank{rank}")
        report_autocast(self.cfg.autocast, self.cfg.policy.device, log)  # this rank's node, which may not be the driver's

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a port free on it (asked of rank 0: the process group meets there)."""
        import ray

        from .group import free_port

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, total_optimizer_steps: int, master_addr: str, master_port: int) -> bool:
        """Join the process group (every rank calls this together), open and shard the policy."""
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size))
        from ..rollout.factory import open_policy
        from ..rl.common import seed_everything
        from ..rl.worker import PolicyWorker
        from .fsdp import param_dtype_for, shard_policy

        # Ray gives an actor one intra-op thread per CPU it asked for; ranks compute while the rollout
        # actors wait (and the other way round), so each may use its share of the node's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.world_size))
        backend = "nccl" if self.cfg.distributed.gpus_per_rank > 0 and torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, rank=self.rank, world_size=self.world_size)
        seed_everything(self.cfg.seed)
        # rollouts are the rollout actors' job; float32 master weights, computing in policy.dtype
        self.tp = open_policy(self.cfg.policy, self.cfg.lora, with_engine=False, for_training=True,
                              activation_checkpointing=self.cfg.distributed.activation_checkpointing)
        self.model = self.tp.policy.model
        reference = None
        if self.cfg.kl_coef > 0 and self.cfg.lora is None:  # the KL anchor, sharded like the policy
            reference = open_policy(self.cfg.policy, with_engine=False).policy.model.eval().requires_grad_(False)
        self.sharded = self.world_size > 1 or backend == "nccl"  # on GPU even one rank is FSDP2 (the path 8 ranks take)
        if self.sharded:
            shard_policy(self.model, param_dtype=param_dtype_for(self.cfg.policy.dtype))
            if reference is not None:  # never trained: it stays in policy.dtype
                shard_policy(reference, param_dtype=param_dtype_for(self.cfg.policy.dtype))
        self.worker = PolicyWorker(self.model, self.tp.chat, self.tp.reply_choices, self.cfg, total_optimizer_steps,
                                   rank=self.rank, world_size=self.world_size, reference=reference)
        return True

    def train_steps(self, batches, step: int) -> list[dict]:
        """The step's whole update: one optimizer step per mini-batch (one call, so that the
        behaviour policy's log-probabilities can be rescored for all of them before the first)."""
        sampling = self.tp.sampling(temperature=self.cfg.temperature, top_p=self.cfg.top_p)
        self.phases.record("update_start", step=step)
        t0 = time.perf_counter()
        if self.cfg.recompute_old_logprobs:
            self.worker.rescore_old_logprobs(batches, sampling)
        rescore_seconds = time.perf_counter() - t0
        outs = [{**self.train_step(batch, sampling, step), "samples_received": len(batch.samples)} for batch in batches]
        if outs:
            outs[0]["seconds"] += rescore_seconds
        self.phases.record("update_end", step=step)
        return outs

    def gpu_total_bytes(self) -> int | None:
        """This rank's GPU memory in total (None on CPU): what a colocated engine's share is a fraction of."""
        if self.cfg.distributed.gpus_per_rank > 0 and torch.cuda.is_available():
            return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        return None

    def release_cached_memory(self, after: str) -> dict:
        """Between phases (`after`: 'update' or 'sync'): gradients dropped, the caching allocator emptied, so that
        a colocated engine waking next finds what the plan gave it (distributed/memory.py)."""
        from .memory import release_cached_memory

        released = release_cached_memory(self.worker.optimizer if after == "update" else None)
        self.phases.record("release", after=after, **released)
        return released

    def events(self) -> list[dict]:
        return self.phases.events()

    def train_step(self, batch, sampling, step: int) -> dict:
        t0 = time.perf_counter()
        out = self.worker.train_step(batch, sampling, step)
        out["seconds"] = time.perf_counter() - t0
        out["lr"] = self.worker.scheduler.get_last_lr()[0]
        if torch.cuda.is_available():
            out["gpu_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        return out

    def set_schedule_horizon(self, optimizer_steps: int) -> bool:
        from ..rl.optim import set_schedule_horizon

        set_schedule_horizon(self.worker.scheduler, optimizer_steps)
        return True

    def full_state_dict(self) -> dict | None:
        """A collective: every rank must call it; rank 0 returns the weights, the others None. In policy.dtype
        (what the rollout engines and the saved model hold), not the float32 masters. For the consolidated
        model (save_final) and in-process checks; weight sync goes by buckets (sync_weights)."""
        from ..policy.trainable import in_dtype
        from .fsdp import full_state_dict

        state = full_state_dict(self.model) if self.sharded else self.model.state_dict()
        return in_dtype({k: v.detach().cpu() for k, v in state.items()}, self.cfg.policy.dtype) if self.rank == 0 else None

    # ---- weight sync: bucket by bucket, rank -> engine (distributed/weight_sync.py) --------------------
    def join_weight_group(self, host: str, port: int, world_size: int, backend: str) -> bool:
        """Rank 0 only: become group rank 0 (the sender) of the weight-broadcast group."""
        from .weight_sync import WeightBroadcastGroup

        self.weight_group = WeightBroadcastGroup(host, port, 0, world_size, backend)
        self.weight_transport = "broadcast"
        return True

    def attach_engine(self, rollout_actor) -> bool:
        """Colocated: this rank feeds the rollout actor beside it (direct)."""
        self.engine_actor = rollout_actor
        self.weight_transport = "direct"
        return True

    def _sync_plan(self, state: dict) -> tuple[dict, list[list[str]]]:
        """The served layout (plain keys, LoRA merged, policy.dtype) and the buckets of state-dict names,
        worked out on the meta device (no weights touched)."""
        from ..policy.trainable import serving_weights
        from .weight_sync import layout_of, plan_buckets

        dtype = getattr(torch, self.cfg.policy.dtype)
        meta = {k: torch.empty(tuple(v.shape), dtype=dtype if v.is_floating_point() else v.dtype, device="meta")
                for k, v in state.items()}
        layout = layout_of(serving_weights(meta, self.cfg.lora))
        sizes = {k: t.numel() * t.element_size() for k, t in meta.items()}
        return layout, plan_buckets(sizes, self.cfg.distributed.weight_sync_bucket_mb * 2**20)

    def _gather(self, state: dict, names: list[str], device: str | None) -> list[tuple[str, torch.Tensor]]:
        """One bucket, whole on every rank (a collective for sharded parameters: each rank must call it
        with the same names), in policy.dtype (cast before the gather: half the bytes on the wire) and
        plain keys (a LoRA layer's adapters merged: buckets keep a module's entries together)."""
        from torch.distributed.tensor import DTensor

        from ..policy.trainable import serving_weights

        dtype = getattr(torch, self.cfg.policy.dtype)
        part = {}
        for name in names:
            t = state[name].detach()
            t = t.to(dtype) if t.is_floating_point() else t
            if isinstance(t, DTensor):
                t = t.full_tensor()
            part[name] = t.to(device) if device else t
        return list(serving_weights(part, self.cfg.lora).items())

    def _all_ok(self, ok: bool) -> bool:
        """Whether every training rank is ok (so that none is left waiting in a collective the others skip)."""
        import torch.distributed as dist

        if not dist.is_initialized() or self.world_size == 1:
            return ok
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([int(ok)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def sync_weights(self, version: int) -> dict:
        """The updated weights into the engines, bucket by bucket (every rank calls this together).

        direct (colocated): rank k hands each gathered bucket to rollout actor k as a Ray call argument:
        on CPU through the node's shared-memory object store, never the driver. On GPU the bucket is
        copied to host memory first, the same way; CUDA IPC handles (the actor mapping the rank's GPU
        memory) would avoid that copy and are not implemented. broadcast (split): rank 0 sends each
        bucket over the weight-broadcast group; the actors load each as it arrives (receive_weights).
        Returns {"bytes": what the engine loaded (direct) or rank 0 sent (broadcast), "buckets", "seconds"}."""
        import ray

        from .weight_sync import WeightSyncError

        t0 = time.perf_counter()
        state = self.model.state_dict()
        layout, plan = self._sync_plan(state)
        transport = getattr(self, "weight_transport", None)
        error: BaseException | None = None
        try:  # the engines (or the group's members) agree on the layout before any bucket is gathered
            if transport == "direct":
                ray.get(self.engine_actor.begin_weight_sync.remote(layout))
            elif transport == "broadcast" and self.rank == 0:
                self.weight_group.send_begin(layout)
        except Exception as err:  # noqa: BLE001 - raised below, once every rank knows
            error = err
        if not self._all_ok(error is None):
            raise error if error is not None else WeightSyncError("another rank's rollout engine refused the weights")
        sent, buckets, pending = 0, 0, None
        device = "cpu" if transport == "direct" else None
        for names in plan:
            bucket = self._gather(state, names, device)  # every rank takes part, whatever happened
            if error is not None:
                continue
            try:
                if transport == "direct":
                    if pending is not None:
                        ray.get(pending)  # at most two buckets in flight: one loading, one just gathered
                    pending = self.engine_actor.load_weight_bucket.remote(bucket)
                elif transport == "broadcast" and self.rank == 0:
                    sent += self.weight_group.send_bucket(bucket)
                buckets += 1
            except Exception as err:  # noqa: BLE001
                error = err
        try:
            if transport == "direct" and error is None:
                if pending is not None:
                    ray.get(pending)
                loaded = ray.get(self.engine_actor.finish_weight_sync.remote(version))
                sent, buckets = loaded["bytes"], loaded["buckets"]
            elif transport == "broadcast" and self.rank == 0:
                self.weight_group.send_end()  # also after an error: the receivers stop waiting
        except Exception as err:  # noqa: BLE001
            error = error or err
        if not self._all_ok(error is None):
            raise error if error is not None else WeightSyncError("another rank's rollout engine failed to load the weights")
        return {"bytes": int(sent) if transport == "direct" or self.rank == 0 else 0, "buckets": buckets,
                "seconds": time.perf_counter() - t0}

    def serving_digest(self) -> str | None:
        """A digest of the weights the engines should serve (rank 0; a collective), through the
        consolidated state dict rather than the buckets: what the tests compare the engines with."""
        from ..policy.trainable import serving_weights
        from .weight_sync import weights_digest

        state = self.full_state_dict()
        return None if state is None else weights_digest(serving_weights(state, self.cfg.lora).items())

    def save_checkpoint(self, path: str, state: dict) -> str:
        from .checkpoint import save_sharded

        return str(save_sharded(path, self.model, self.worker.optimizer, self.worker.scheduler, state,
                                self.rank, self.world_size))

    def load_checkpoint(self, path: str) -> dict:
        from .checkpoint import load_sharded

        # the driver verified the checkpoint once when it chose it (start_point): not again on every rank
        return load_sharded(path, self.model, self.worker.optimizer, self.worker.scheduler, self.rank, self.world_size,
                            verified=True)

    def save_final(self, target: str) -> str | None:
        """The consolidated model in the HF layout, LoRA merged, written from the sharded state tensor by tensor
        (a collective; rank 0 writes it, atomically: a retry replaces it whole). Opens no second model."""
        from ..policy.export import save_trained_model

        save_trained_model(self.model, self.tp.policy.processor, target, self.cfg.policy, self.cfg.lora,
                           writes=self.rank == 0)
        return target if self.rank == 0 else None

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class RolloutWorker:
    """An inference engine and a slice of every step's mazes."""

    def __init__(self, cfg_json: dict):
        from ..rollout.factory import open_policy

        from .memory import PhaseLog

        self.cfg = GRPOConfig.model_validate(cfg_json)
        self.phases = PhaseLog("rollout")
        report_autocast(self.cfg.autocast, self.cfg.policy.device, log)  # this actor's node
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.cfg.distributed.rollout_workers))  # see TrainRank.setup
        policy = self.cfg.policy
        if policy.engine == "vllm":  # vLLM holds the served copy on the GPU; the HF model open_policy opens beside it
            policy = policy.model_copy(update={"device": "cpu"})  # is not used for serving, so it stays in host memory
        self.tp = open_policy(policy)
        self.tp.policy.model.eval()
        self.train_df = read_split(self.cfg.train_data)

    def collect(self, rows: list[int], first_group: int, seed: int, step: int) -> tuple[list, float]:
        from ..rollout.multiturn import items_from_split, rollout

        if os.environ.get(KILL_ROLLOUT_AT_STEP_ENV) == str(step):
            os._exit(1)  # fault injection for the tests: the actor dies mid-step
        self.phases.record("collect_start", step=step)
        t0 = time.perf_counter()
        items = items_from_split(self.train_df, rows, self.cfg.policy.render_scale, self.cfg.max_turns)
        sampling = self.tp.sampling(temperature=self.cfg.temperature, top_p=self.cfg.top_p, seed=seed)
        with mixed_precision(self.cfg.autocast, self.tp.config.device):
            trajs = rollout(self.tp.engine, self.tp.chat, items, group_size=self.cfg.group_size, sampling=sampling,
                            env_config=self.cfg.env, history=self.cfg.policy.history)
        for t in trajs:
            t.group += first_group  # groups are numbered across all workers' slices
        self.phases.record("collect_end", step=step)
        return trajs, time.perf_counter() - t0

    def sync(self, weights: dict, version: int) -> float:
        t0 = time.perf_counter()
        from ..policy.trainable import serving_weights

        self.tp.engine.sync_weights(serving_weights(weights, self.cfg.lora), version)
        return time.perf_counter() - t0

    def greedy_eval(self) -> dict:
        """The periodic greedy evaluation (eval_data, eval_mazes) with the weights this actor serves."""
        from ..rl.common import greedy_success

        return greedy_success(self.tp, self.cfg.policy, self.cfg.eval_data, self.cfg.eval_mazes, self.cfg.env)

    def version(self) -> int:
        return self.tp.engine.weights_version

    def join_weight_group(self, host: str, port: int, rank: int, world_size: int, backend: str) -> bool:
        from .weight_sync import WeightBroadcastGroup

        if backend == "nccl":
            torch.cuda.set_device(0)  # Ray shows this actor its own GPU as device 0
        self.weight_group = WeightBroadcastGroup(host, port, rank, world_size, backend)
        return True

    # direct (colocated): the rank beside this actor calls these with each bucket it gathered
    def begin_weight_sync(self, layout: dict) -> bool:
        self.tp.engine.begin_weight_sync(layout)
        return True

    def load_weight_bucket(self, bucket: list) -> int:
        return self.tp.engine.load_weight_bucket(bucket)

    def finish_weight_sync(self, version: int) -> dict:
        return self.tp.engine.finish_weight_sync(version)

    def receive_weights(self, version: int) -> dict:
        """broadcast (split): receive the buckets rank 0 sends and load each as it arrives. Returns
        {"bytes", "buckets", "seconds"}: numbers only, for the driver."""
        t0 = time.perf_counter()
        engine = self.tp.engine
        self.weight_group.receive_begin(engine.weight_layout())  # a mismatch stops sender and receivers alike
        error = None
        engine.begin_weight_sync(engine.weight_layout())
        for bucket in self.weight_group.receive_buckets():
            if error is None:  # after a failure keep receiving, so that the sender is not left waiting
                try:
                    engine.load_weight_bucket(bucket)
                except Exception as err:  # noqa: BLE001
                    error = err
        if error is not None:
            raise error
        loaded = engine.finish_weight_sync(version)
        return {**loaded, "seconds": time.perf_counter() - t0}

    def engine_digest(self) -> str:
        """A digest of the weights this actor's HF engine serves (tests compare it with the trainer's)."""
        from .weight_sync import weights_digest

        return weights_digest(self.tp.engine.model.state_dict().items())

    def sleep(self) -> None:
        if hasattr(self.tp.engine, "sleep"):
            self.tp.engine.sleep()
        self.phases.record("sleep")

    def wake(self) -> None:
        self.phases.record("wake")
        if hasattr(self.tp.engine, "wake"):
            self.tp.engine.wake()

    def events(self) -> list[dict]:
        return self.phases.events()


class RayGRPO(GRPODriver):
    def __init__(self, cfg: GRPOConfig, on_step=None):
        from ..rl.common import refuse_inputs_in_run_files
        from ..rl.trainer import RUN_FILES

        refuse_inputs_in_run_files(cfg, RUN_FILES)  # before any work: the run may replace these files
        self.cfg, self.on_step = cfg, on_step
        self.out = Path(cfg.output_dir)
        self.step = 0
        self.ray = _require_ray()
        self.train_df = read_split(cfg.train_data)
        from ..cluster.plan import resolve_prompt_limits

        self.cfg = cfg = resolve_prompt_limits(cfg, self.train_df)  # vLLM's per-prompt limits, for the actors' engines
        self.sampler = train_sampler(self.train_df, cfg.seed, cfg.curriculum_start, cfg.steps)
        self.checkpoints = CheckpointManager(self.out / "checkpoints", cfg.keep_checkpoints)
        self.mirror = self.checkpoint_mirror(cfg, self.out)
        self._start()

    @staticmethod
    def checkpoint_mirror(cfg: GRPOConfig, out: Path) -> CheckpointMirror | None:
        """The run's checkpoints on S3 (checkpoint_uri), uploaded in the background while training goes on."""
        if not cfg.checkpoint_uri:
            return None
        return CheckpointMirror(cfg.checkpoint_uri, cfg.keep_checkpoints, tensorboard=out / "tensorboard", background=True)

    # ---- the actors ------------------------------------------------------------------------------
    def _start(self) -> None:
        ray, cfg, d = self.ray, self.cfg, self.cfg.distributed
        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS")
            if address:
                check_ray_address(address)
            try:
                if address:
                    ray.init(address=address, log_to_driver=False)
                else:
                    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local Ray: no token file
                    # MAZERL_RAY_METRICS_PORT: where this private Ray's metrics export serves (Prometheus format)
                    port = os.environ.get(METRICS_PORT_ENV)
                    ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                             **({"_metrics_export_port": int(port)} if port else {}))
            except (ConnectionError, RuntimeError, ValueError) as err:
                raise RayBackendError(f"cannot connect to Ray at RAY_ADDRESS={address!r}: {str(err).splitlines()[0]}") from None
        available = ray.cluster_resources()
        bundles = self._bundles()
        need_cpu = sum(b.get("CPU", 0) for b in bundles)
        need_gpu = sum(b.get("GPU", 0) for b in bundles)
        if available.get("CPU", 0) < need_cpu or available.get("GPU", 0) < need_gpu:
            raise RayBackendError(f"{d.ranks} ranks + {d.rollout_workers} rollout workers need {need_cpu:g} CPUs and "
                                  f"{need_gpu:g} GPUs; this Ray cluster has {available.get('CPU', 0):g} CPUs and "
                                  f"{available.get('GPU', 0):g} GPUs")
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        # one bundle per rank (colocated: the rank and its rollout actor share it) and, split, one per
        # rollout actor; PACK keeps a job's ranks on as few nodes as fit
        self.placement = placement_group(bundles, strategy="PACK")
        try:
            ray.get(self.placement.ready(), timeout=d.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(self.placement)
            raise RayBackendError(f"Ray could not place {len(bundles)} bundles {bundles} within {d.placement_timeout_s:g} s "
                                  "(resources are there in total but not free, or not on fitting nodes)") from None

        def at(bundle: int):
            return PlacementGroupSchedulingStrategy(placement_group=self.placement, placement_group_bundle_index=bundle)

        colocated = d.placement == "colocated"
        share = 0.5 if colocated else 1.0  # colocated: the rank and its engine split the bundle
        cfg_json = cfg.model_dump(mode="json")
        rank_cls = ray.remote(num_cpus=d.cpus_per_actor, num_gpus=d.gpus_per_rank * share)(TrainRank)
        rollout_gpus = d.gpus_per_rank * share if colocated else d.gpus_per_rollout_worker
        rollout_cls = ray.remote(num_cpus=d.cpus_per_actor, num_gpus=rollout_gpus)(RolloutWorker)
        self.ranks = [rank_cls.options(scheduling_strategy=at(r)).remote(cfg_json, r, d.ranks) for r in range(d.ranks)]
        # the process group's rendezvous is rank 0's node, on a port free there
        master_addr, master_port = ray.get(self.ranks[0].rendezvous_address.remote())
        ray.get([r.setup.remote(cfg.steps * cfg.optimizer_steps_per_step, master_addr, master_port) for r in self.ranks])
        if colocated and cfg.policy.engine == "vllm":  # the engines' share: what the ranks leave of their GPUs
            gpu_bytes = ray.get(self.ranks[0].gpu_total_bytes.remote())
            if gpu_bytes:
                from ..cluster.plan import resolve_memory_share

                self.cfg = cfg = resolve_memory_share(cfg, self.train_df, gpu_bytes)
                cfg_json = cfg.model_dump(mode="json")
        self.rollouts = [rollout_cls.options(scheduling_strategy=at(k if colocated else d.ranks + k)).remote(cfg_json)
                         for k in range(d.rollout_workers)]
        # colocated: rank k feeds the rollout actor beside it (direct); split: rank 0 broadcasts to the actors
        # over a group of their own, NCCL where every member has a GPU of its own, else gloo. (Colocated,
        # actor k shares rank k's GPU, which one NCCL communicator refuses.)
        nccl = d.placement == "split" and d.gpus_per_rank > 0 and d.gpus_per_rollout_worker > 0
        direct = d.weight_sync == "direct" or (d.weight_sync == "auto" and colocated)
        if direct:
            self.weight_sync_mode = "direct"
            ray.get([r.attach_engine.remote(w) for r, w in zip(self.ranks, self.rollouts)])
        else:  # rank 0 and the rollout actors form a group of their own, meeting on rank 0's node
            backend = "nccl" if nccl else "gloo"
            self.weight_sync_mode = f"broadcast-{backend}"
            host, port = ray.get(self.ranks[0].rendezvous_address.remote())
            world = 1 + d.rollout_workers
            ray.get([self.ranks[0].join_weight_group.remote(host, port, world, backend)]
                    + [w.join_weight_group.remote(host, port, k + 1, world, backend) for k, w in enumerate(self.rollouts)])

    def _bundles(self) -> list[dict]:
        d = self.cfg.distributed
        if d.placement == "colocated":
            return [{"CPU": 2 * d.cpus_per_actor, **({"GPU": d.gpus_per_rank} if d.gpus_per_rank else {})}] * d.ranks
        rank = {"CPU": d.cpus_per_actor, **({"GPU": d.gpus_per_rank} if d.gpus_per_rank else {})}
        rollout = {"CPU": d.cpus_per_actor, **({"GPU": d.gpus_per_rollout_worker} if d.gpus_per_rollout_worker else {})}
        return [rank] * d.ranks + [rollout] * d.rollout_workers

    def set_schedule_horizon(self, steps: int) -> None:
        self._on_all_ranks("set_schedule_horizon", steps * self.cfg.optimizer_steps_per_step)

    def _on_all_ranks(self, method: str, *args) -> list:
        return self.ray.get([getattr(r, method).remote(*args) for r in self.ranks])

    def shutdown(self) -> None:
        try:
            self._on_all_ranks("shutdown")
        finally:
            for a in [*self.ranks, *self.rollouts]:
                self.ray.kill(a)
            self.ray.util.remove_placement_group(self.placement)

    # ---- one step --------------------------------------------------------------------------------
    def collect(self) -> tuple[list, list[float]]:
        cfg = self.cfg
        rows = self.sampler.next(cfg.mazes_per_step)
        seed = derive_seed(cfg.seed, "rollout", self.step + 1)
        n = len(self.rollouts)
        slices = [list(range(k * len(rows) // n, (k + 1) * len(rows) // n)) for k in range(n)]
        # one seed for all workers: an episode's seed derives from its maze, so the batch samples the
        # same whatever the number of rollout workers
        calls = [w.collect.remote([rows[i] for i in s], s[0], seed, self.step + 1)
                 for w, s in zip(self.rollouts, slices)]
        try:
            results = self.ray.get(calls)
        except self.ray.exceptions.RayActorError as err:
            # never train on a partial batch: the step fails, and a resume redoes it from the last checkpoint
            raise RayBackendError(f"step {self.step + 1}: a rollout worker died ({str(err).splitlines()[0]}); "
                                  "the step was not trained on; resume from the last checkpoint") from None
        trajs = [t for ts, _ in results for t in ts]
        return trajs, [s for _, s in results]

    def update(self, trajs) -> dict:
        lag = self.check_versions(trajs)
        batches, stats = self.mini_batches(trajs)
        per_rank_seconds = [0.0] * len(self.ranks)
        counted, lr = [], None
        # each rank is sent only its slice of every mini-batch (samples, images and advantages): the rest
        # would cross the network to be ignored
        n = len(self.ranks)
        per_rank = self.ray.get([rank.train_steps.remote([b.slice_for_rank(r, n) for b in batches], self.step + 1)
                                 for r, rank in enumerate(self.ranks)])  # [rank][mini-batch]
        for r, outs in enumerate(per_rank):
            stats[f"update/rank{r}_samples"] = sum(out["samples_received"] for out in outs)
        for outs in zip(*per_rank):
            for r, out in enumerate(outs):
                per_rank_seconds[r] += out["seconds"]
                if "gpu_memory_gb" in out:
                    stats[f"gpu_memory_gb/rank{r}"] = out["gpu_memory_gb"]
            # token sums add up over ranks; the gradient norm is the whole mini-batch's, the same on every rank
            counted += [outs[0]] + [{**o, "grad_norm": None} for o in outs[1:]]
            lr = outs[0]["lr"]
        stats.update(update_stats(counted, lr), weights_lag=lag,
                     **{f"time/rank{r}_update": s for r, s in enumerate(per_rank_seconds)})
        return stats

    def _engines(self, method: str) -> None:
        if self.cfg.distributed.placement == "colocated":
            self.ray.get([getattr(w, method).remote() for w in self.rollouts])

    def _release_ranks(self, after: str) -> None:
        """Every rank gives back what its allocators cache (after the update: its gradients too), before a
        colocated engine wakes or rolls out (TrainRank.release_cached_memory)."""
        self._on_all_ranks("release_cached_memory", after)

    def sync_weights(self) -> dict:
        """The engines serve the ranks' weights as version `step`. The driver only starts the calls: the
        ranks gather bucket by bucket and push each into the engines (TrainRank.sync_weights); what comes
        back here is numbers. Returns time/weight_sync, weight_sync/bytes (what each engine received) and
        weight_sync/buckets, and weight_sync/mode (direct, broadcast-gloo or broadcast-nccl)."""
        t0 = time.perf_counter()
        calls = [r.sync_weights.remote(self.step) for r in self.ranks]
        receiving = self.weight_sync_mode.startswith("broadcast")
        if receiving:
            calls += [w.receive_weights.remote(self.step) for w in self.rollouts]
        results = self.ray.get(calls)
        per_engine = results[len(self.ranks):] if receiving else results  # direct: rank k reports its actor k
        return {"time/weight_sync": time.perf_counter() - t0,
                "weight_sync/bytes": min(int(r["bytes"]) for r in per_engine),
                "weight_sync/buckets": min(int(r["buckets"]) for r in per_engine), "weight_sync/mode": self.weight_sync_mode}

    # ---- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        if self.mirror is not None:
            self.mirror.wait()  # the previous upload is done (or its failure raised) before anything is pruned
        target = self.checkpoints.root / f"step-{self.step:08d}"
        target.parent.mkdir(parents=True, exist_ok=True)
        state = {"step": self.step, "config": self.cfg.model_dump(mode="json"), "sampler": self.sampler.state_dict()}
        self._on_all_ranks("save_checkpoint", str(target), state)
        (self.checkpoints.root / "latest").write_text(target.name + "\n")
        self.checkpoints.prune()
        if self.mirror is not None:
            self.mirror.after_save(target)  # in the background: the next step starts now
        return target

    def finish_uploads(self, raise_failure: bool = True) -> None:
        """The end of the run: the last checkpoint's upload is done, or its failure is raised (logged
        with `raise_failure=False`, when the run has failed already)."""
        if self.mirror is not None:
            self.mirror.close(raise_failure)

    def resume(self, how: str, overwrite: bool = False, discard_damaged: bool = False) -> int | None:
        """Where the run starts: the same rules as in process (`rl.trainer.start_point`)."""
        from ..rl.common import training_inputs
        from ..rl.trainer import start_point

        path = start_point(how, self.out, self.checkpoints, self.mirror, training_inputs(self.cfg), overwrite, discard_damaged)
        if path is None:
            return None
        state = self._on_all_ranks("load_checkpoint", str(path))[0]
        self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["step"])
        return self.step

    # ---- the loop --------------------------------------------------------------------------------
    def run(self, resume: str = "auto", overwrite: bool = False, discard_damaged: bool = False) -> dict:
        cfg = self.cfg
        record: dict = {}
        try:
            resumed = self.resume(resume, overwrite, discard_damaged)
            self.sync_weights()  # the engines start from the trainer's weights, version = step
            self._release_ranks("sync")
            metrics = MetricsWriter(self.out / "metrics.jsonl", self.out / "tensorboard", resume_step=resumed)
            from .prometheus import TrainingGauges

            gauges = TrainingGauges(os.environ.get("MAZERL_RUN_ID") or self.out.name)  # scraped from Ray's metrics port
            eval_seconds, evals_by_time = 0.0, 0  # periodic evaluation does not count against max_minutes
            if resumed is None and (cfg.eval_every or cfg.eval_every_minutes) and cfg.eval_data:
                metrics.write({"step": 0, **self.ray.get(self.rollouts[0].greedy_eval.remote())})
            started, first_step = time.perf_counter(), self.step
            try:
                while self.step < cfg.steps:
                    t0 = time.perf_counter()
                    trajs, worker_seconds = self.collect()
                    t1 = time.perf_counter()
                    # colocated: the engines give the GPU to the update (where they can), and wake only once the
                    # ranks have given back what the update left cached
                    self._engines("sleep")
                    upd = self.update(trajs)
                    self.step += 1
                    t2 = time.perf_counter()
                    self._release_ranks("update")
                    self._engines("wake")
                    synced = self.sync_weights()
                    self._release_ranks("sync")
                    context_tokens = sum(len(s.ids) for t in trajs for s in t.samples())
                    record = {"step": self.step, **episode_metrics(trajs), **upd,
                              "train_pool_mazes": self.sampler.available(self.step), "time/rollout": t1 - t0,
                              "rollout_tokens_per_s": context_tokens / max(t1 - t0, 1e-9),
                              "time/update": t2 - t1, **synced,
                              "rollout_versions": sorted({t.weights_version for t in trajs}),
                              **{f"time/rollout_worker{k}": s for k, s in enumerate(worker_seconds)},
                              "train_tokens_per_s": upd["train_tokens"] / max(t2 - t1, 1e-9)}
                    trained_s = time.perf_counter() - started - eval_seconds
                    due_by_time = cfg.eval_every_minutes is not None and trained_s >= (evals_by_time + 1) * cfg.eval_every_minutes * 60
                    if cfg.eval_data and ((cfg.eval_every and self.step % cfg.eval_every == 0) or due_by_time):
                        # rollout actor 0 already serves the new weights (synced above)
                        record.update(self.ray.get(self.rollouts[0].greedy_eval.remote()))
                        record["eval/training_minutes"] = trained_s / 60
                        eval_seconds += record["eval/seconds"]
                        evals_by_time += int(due_by_time)
                    record["time/training_total"] = time.perf_counter() - started - eval_seconds
                    out_of_time = cfg.max_minutes is not None and record["time/training_total"] > cfg.max_minutes * 60
                    self.fit_schedule(record, first_step)  # before the checkpoint, which keeps the horizon
                    if self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps or out_of_time:
                        self.save_checkpoint()
                    record["time/step"] = time.perf_counter() - t0
                    metrics.write(record)
                    gauges.update(record)
                    if self.on_step:
                        self.on_step(self.step, record)
                    if out_of_time:
                        break
            finally:
                metrics.close()
            self._on_all_ranks("save_final", str(self.out / "final"))
            self.finish_uploads()
        except BaseException:
            self.finish_uploads(raise_failure=False)  # not raised over the error that ended the run
            raise
        finally:
            self.shutdown()
        return record
