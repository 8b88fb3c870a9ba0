"""Runs in a process of its own for tests/test_weight_sync_direct.py, which asserts on the JSON it writes
(this script only measures and records):

    python tests/weight_sync_checks.py vllm OUT.json WORKDIR        (the vLLM venv) bucketed syncs into VLLMEngine
    python tests/weight_sync_checks.py reference OUT.json WORKDIR [DIR...]   (the vLLM venv) vLLM's own loader from disk
    python tests/weight_sync_checks.py ray OUT.json WORKDIR CONFIG.json   RayGRPO: a sync, a step, a sync (HF or vLLM)

The engine's weights are read back from inside vLLM's worker as the model computes with them: the CPU
build repacks linear layers' weights (the parameter itself is left empty), so those are read as the
layer's output on an identity matrix. The same read-back of an engine vLLM loaded from disk itself is
the reference they must equal.
"""

import json
import os
import sys
from pathlib import Path


def effective_weights(worker) -> dict:
    """Inside vLLM's worker: every weight as the model computes with it (run by collective_rpc)."""
    import torch

    model = worker.model_runner.get_model()
    out = {}
    with torch.no_grad():
        for module_name, module in model.named_modules():
            linear = getattr(module, "cpu_linear", None)
            if linear is None:
                continue
            k = getattr(module, "input_size_per_partition", None) or getattr(module, "embedding_dim")
            dtype = getattr(module, "params_dtype", None) or torch.float32
            out[f"{module_name}.weight"] = linear(torch.eye(k, dtype=dtype), module.weight, None).t().contiguous().clone()
        for name, p in model.named_parameters():
            if name not in out and p.numel() > 0:
                out[name] = p.detach().clone()
    return out


def perturbed(state: dict, seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    return {k: (v + 0.05 * torch.randn(v.shape, generator=g, dtype=v.dtype)) if v.is_floating_point() else v.clone()
            for k, v in state.items()}


class WriteWatch:
    """Counts every attempt to write a file in this process (Python's open and os.open for writing,
    safetensors' and torch's savers, new temporary files and folders) while it is active."""

    def __init__(self):
        self.writes: list[str] = []
        self.active = False

    def install(self) -> None:
        import builtins
        import io
        import tempfile

        import safetensors.torch
        import torch

        def wrap(owner, attr, is_write):
            original = getattr(owner, attr)

            def watched(*args, **kwargs):
                if self.active and is_write(*args, **kwargs):
                    self.writes.append(f"{attr}{args[:2]!r}")
                return original(*args, **kwargs)

            setattr(owner, attr, watched)

        def mode_writes(file=None, mode="r", *args, **kwargs):
            return any(c in str(kwargs.get("mode", mode)) for c in "wax+")

        def flags_write(path=None, flags=0, *args, **kwargs):
            return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))

        always = lambda *a, **k: True  # noqa: E731
        wrap(builtins, "open", mode_writes)
        wrap(io, "open", mode_writes)
        wrap(os, "open", flags_write)
        for name in ("save_file", "save"):
            wrap(safetensors.torch, name, always)
        wrap(torch, "save", always)
        for name in ("mkdtemp", "mkstemp", "NamedTemporaryFile", "TemporaryDirectory"):
            wrap(tempfile, name, always)


def vllm_syncs(out_json: str, workdir: str) -> None:
    import torch

    from mazerl.distributed.weight_sync import WeightSyncError, layout_of, plan_buckets
    from mazerl.policy.chat import ChatFormat
    from mazerl.policy.loading import load_policy
    from mazerl.policy.prompts import SHORT_SYSTEM_PROMPT
    from mazerl.policy.tiny import init_tiny
    from mazerl.rollout.engine import GenerationRequest, SamplingParams
    from mazerl.rollout.vllm_engine import VLLMEngine

    work = Path(workdir)
    model_dir = init_tiny(work / "tiny", size="small", seed=1, overwrite=True)
    policy = load_policy(model_dir)
    chat = ChatFormat(policy.processor, system_prompt=SHORT_SYSTEM_PROMPT)
    engine = VLLMEngine(str(model_dir), chat, dtype="float32", max_model_len=2048, max_images_per_prompt=1)
    base = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    results: dict = {"has_weights_dir": hasattr(engine, "_weights_dir"),
                     "engine_core": type(engine.llm.llm_engine.engine_core).__name__}
    request = GenerationRequest([t for s in chat.system() for t in s.ids], [], seed=0)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4)

    def read() -> dict:
        return engine.llm.collective_rpc(effective_weights)[0]

    torch.save(read(), work / "initial.pt")
    watch = WriteWatch()
    watch.install()
    syncs = []
    for version, seed in ((1, 11), (2, 22)):
        weights = perturbed(base, seed)
        sizes = {k: v.numel() * v.element_size() for k, v in weights.items()}
        plan = plan_buckets(sizes, 1 * 2**20)  # 1 MiB buckets: the tiny model in several
        watch.active = True
        engine.begin_weight_sync(layout_of(weights))
        for names in plan:
            engine.load_weight_bucket([(n, weights[n]) for n in names])
        done = engine.finish_weight_sync(version)
        watch.active = False
        torch.save(read(), work / f"synced{version}.pt")
        syncs.append({**done, "planned_buckets": len(plan), "bytes_sent": sum(sizes.values()),
                      "version": engine.weights_version, "generated": engine.generate([request], greedy)[0].ids})
        policy.model.load_state_dict(weights)  # the reference's copy on disk, written after the sync
        policy.model.save_pretrained(work / f"weights{version}", safe_serialization=True)
        policy.processor.save_pretrained(work / f"weights{version}")
    results["syncs"] = syncs
    results["writes_during_syncs"] = watch.writes

    # refusals: another layout (nothing loaded, still serving); an unknown name midway (half-loaded: no
    # generation until a complete sync); a name missing at the end
    layout = layout_of(base)
    wrong = dict(layout)
    wrong["lm_head.weight"] = ((3, 3), torch.float32)
    try:
        engine.begin_weight_sync(wrong)
        results["wrong_layout"] = None
    except WeightSyncError as err:
        results["wrong_layout"] = str(err)
    results["serves_after_wrong_layout"] = engine.generate([request], greedy)[0].ids == syncs[-1]["generated"]
    engine.begin_weight_sync(layout)
    first = list(base.items())[:3]
    engine.load_weight_bucket(first)
    try:
        engine.load_weight_bucket([("model.no_such.weight", torch.zeros(2))])
        results["unknown_name"] = None
    except WeightSyncError as err:
        results["unknown_name"] = str(err)
    try:
        engine.generate([request], greedy)
        results["generate_when_half_synced"] = None
    except WeightSyncError as err:
        results["generate_when_half_synced"] = str(err)
    engine.begin_weight_sync(layout)
    engine.load_weight_bucket(list(base.items())[:-1])
    try:
        engine.finish_weight_sync(3)
        results["missing_name"] = None
    except WeightSyncError as err:
        results["missing_name"] = str(err)
    engine.sync_weights(perturbed(base, 22), version=4, bucket_mb=1)  # a complete sync: serving again
    results["after_recovery"] = engine.generate([request], greedy)[0].ids
    torch.save(read(), work / "recovered.pt")
    engine.close()
    Path(out_json).write_text(json.dumps(results))


def reference(out_json: str, workdir: str, *names: str) -> None:
    """vLLM loading WORKDIR/<first name> from disk itself, then reloading each further one from disk (its
    own path); each one's weights read back to WORKDIR/reference-<name>.pt."""
    import torch

    from mazerl.policy.chat import ChatFormat
    from mazerl.policy.loading import load_policy
    from mazerl.policy.prompts import SHORT_SYSTEM_PROMPT
    from mazerl.rollout.vllm_engine import VLLMEngine

    work = Path(workdir)
    policy = load_policy(work / names[0])
    chat = ChatFormat(policy.processor, system_prompt=SHORT_SYSTEM_PROMPT)
    engine = VLLMEngine(str(work / names[0]), chat, dtype="float32", max_model_len=2048, max_images_per_prompt=1)
    for k, name in enumerate(names):
        if k:
            engine.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(work / name)})
        torch.save(engine.llm.collective_rpc(effective_weights)[0], work / f"reference-{name}.pt")
    engine.close()
    Path(out_json).write_text(json.dumps({"ok": True}))


def readable_rollout_worker():
    """The rollout actor, plus a way for this check to read its vLLM engine's weights back (to a file)."""
    from mazerl.distributed.ray_grpo import RolloutWorker

    class ReadableRolloutWorker(RolloutWorker):
        def save_engine_weights(self, path: str) -> bool:
            import torch

            torch.save(self.tp.engine.llm.collective_rpc(effective_weights)[0], path)
            return True

    return ReadableRolloutWorker


def ray_run(out_json: str, workdir: str, config_json: str) -> None:
    """RayGRPO as the driver runs it: the first sync, one step's rollout and update, a second sync. The
    driver's ray.put and ray.get are watched: what reaches the driver during a sync is recorded by type."""
    import ray

    from mazerl.distributed.ray_grpo import RayGRPO
    from mazerl.rl.config import GRPOConfig

    cfg = GRPOConfig.model_validate(json.loads(Path(config_json).read_text()))
    puts: list[str] = []
    received: list[str] = []
    original_put, original_get = ray.put, ray.get
    watching = {"on": False}

    def put(value, *args, **kwargs):
        puts.append(type(value).__name__)
        return original_put(value, *args, **kwargs)

    def kinds(value) -> list[str]:
        """Type names of anything but plain numbers, strings and None, in nested dicts and lists."""
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, (list, tuple)):
            return [k for v in value for k in kinds(v)]
        return [] if isinstance(value, (int, float, str, bool, type(None))) else [type(value).__name__]

    def get(refs, *args, **kwargs):
        value = original_get(refs, *args, **kwargs)
        if watching["on"]:
            received.extend(kinds(value) or ["numbers"])
        return value

    ray.put, ray.get = put, get
    vllm = cfg.policy.engine == "vllm"
    if vllm:  # the engine's weights are read back inside vLLM's worker, compared with vLLM's own load of them
        import mazerl.distributed.ray_grpo as ray_grpo

        shipped, ray_grpo.RolloutWorker = ray_grpo.RolloutWorker, readable_rollout_worker()
    try:
        g = RayGRPO(cfg)
    finally:
        if vllm:
            ray_grpo.RolloutWorker = shipped
    try:
        results: dict = {"mode": g.weight_sync_mode}
        watching["on"] = True
        first = g.sync_weights()
        watching["on"] = False
        results["trainer0"] = g.ray.get([r.serving_digest.remote() for r in g.ranks])[0]  # a collective
        if vllm:
            save_trained(g, cfg, Path(workdir) / "trained0")
            g.ray.get(g.rollouts[0].save_engine_weights.remote(str(Path(workdir) / "engine-trained0.pt")))
        else:
            results["engines0"] = g.ray.get([w.engine_digest.remote() for w in g.rollouts])
        trajs, _ = g.collect()
        results["update"] = {k: v for k, v in g.update(trajs).items() if isinstance(v, (int, float))}
        g.step += 1
        watching["on"] = True
        second = g.sync_weights()
        watching["on"] = False
        results["trainer1"] = g.ray.get([r.serving_digest.remote() for r in g.ranks])[0]
        if vllm:
            save_trained(g, cfg, Path(workdir) / "trained1")
            g.ray.get(g.rollouts[0].save_engine_weights.remote(str(Path(workdir) / "engine-trained1.pt")))
        else:
            results["engines1"] = g.ray.get([w.engine_digest.remote() for w in g.rollouts])
        results["versions"] = g.ray.get([w.version.remote() for w in g.rollouts])
        results["metrics"] = [first, second]
        results["driver_puts"] = puts
        results["driver_received"] = received
    finally:
        g.shutdown()
    Path(out_json).write_text(json.dumps(results))


def save_trained(g, cfg, target: Path) -> None:
    """The trainer's weights (one rank: its consolidated state dict) as a model directory, for the reference."""
    from mazerl.policy.loading import load_policy

    state = g.ray.get([r.full_state_dict.remote() for r in g.ranks])[0]
    policy = load_policy(cfg.policy.model)
    policy.model.load_state_dict(state)
    policy.model.save_pretrained(target, safe_serialization=True)
    policy.processor.save_pretrained(target)


if __name__ == "__main__":  # vLLM may spawn processes: the guard keeps them from rerunning this
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    mode = sys.argv[1]
    if mode == "vllm":
        vllm_syncs(sys.argv[2], sys.argv[3])
    elif mode == "reference":
        reference(sys.argv[2], sys.argv[3], *(sys.argv[4:] or ["weights1", "weights2"]))
    elif mode == "ray":
        ray_run(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        raise SystemExit(f"unknown mode {mode!r}: allowed vllm, reference, ray")
