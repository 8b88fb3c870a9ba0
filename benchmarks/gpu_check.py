"""The GPU paths on one GPU, in minutes (benchmarks/gpu_check.sh runs this; budget <= 8 minutes).

Each section runs when what it needs is importable, else it is reported as not run, with why; a
section that fails is reported with its error and the next one still runs:

1. tiny_grpo_local   `mazerl train grpo --config tiny-grpo` from tiny-base with the policy on the GPU
                     (the in-process trainer: HF engine rollouts, autocast, updates, checkpoints),
                     greedy held-out success before and after;
2. build_2b          a randomly initialised Qwen3-VL of ~2B parameters from a config (no hub download);
3. hf_engine         HFEngine tokens/s on maze prompts at batch 64;
4. fsdp2_in_process  what each Ray actor of `--backend ray` runs, in this process and without Ray:
                     a TrainRank (FSDP2 over NCCL, one rank) and a RolloutWorker (HF engine on the
                     GPU), 3 GRPO steps on the 2B model with the weights synced into the engine after
                     every update, then a sharded checkpoint (DCP) that must restore the weights
                     exactly after a further update moved them;
5. vllm_engine       VLLMEngine tokens/s on the same prompts (needs vllm);
6. ray_grpo          3 GRPO steps through the CLI on Ray: one FSDP2 rank and one vLLM rollout actor
                     colocated on the GPU (needs ray and vllm).

Everything also goes to OUT/gpu_check.json (or --report).

    python benchmarks/gpu_check.py --out OUT
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

# ~2B: Qwen3-VL-2B's text shape (hidden 2048, 28 layers, 16 heads of 128, 8 KV heads, MLP 6144, full
# vocabulary) with a smaller vision tower; tokenizer and processor are the tiny model's.
TWO_B = dict(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, mlp=6144, vocab=151_936,
             v_hidden=1024, v_depth=12, v_heads=16, v_mlp=4096, deepstack=[3, 7, 11])
# `--device cpu --shape small`: the same sections on a CPU, to check the script before a GPU is spent on it.
SMALL = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=128, vocab=640,
             v_hidden=32, v_depth=4, v_heads=2, v_mlp=64, deepstack=[1, 2, 3])
SHAPES = {"2b": TWO_B, "small": SMALL}


def build_model(out: Path, shape: dict, device: str) -> tuple[Path, int]:
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from mazerl.atomic import atomic_directory
    from mazerl.policy.tiny import build_processor, build_tokenizer

    tok = build_tokenizer(640)
    processor = build_processor(tok, patch=16, merge=2)
    s = shape
    half = s["head_dim"] // 2
    mrope = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]
    ids = tok.convert_tokens_to_ids
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                         num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"],
                         intermediate_size=s["mlp"], max_position_embeddings=32768, pad_token_id=tok.pad_token_id,
                         rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": mrope,
                                          "mrope_interleaved": True}),
        vision_config=dict(hidden_size=s["v_hidden"], depth=s["v_depth"], num_heads=s["v_heads"],
                           intermediate_size=s["v_mlp"], patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                           out_hidden_size=s["hidden"], deepstack_visual_indexes=s["deepstack"]),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration(config).to(torch.bfloat16)
    with atomic_directory(out, overwrite=True) as tmp:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
    n = sum(p.numel() for p in model.parameters())
    del model
    free_cache()
    return out, n


def free_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def peak_gb() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def maze_prompts(chat, data: Path, n: int):
    import pandas as pd

    from mazerl.envs.maze_env import MazeEnv
    from mazerl.policy.prompts import turn_text
    from mazerl.rollout.engine import GenerationRequest
    from mazerl.rollout.multiturn import items_from_split

    df = pd.read_parquet(data)
    items = items_from_split(df, list(range(len(df))), 1.0, 18)
    requests = []
    for k in range(n):
        item = items[k % len(items)]
        obs = MazeEnv(item.task).reset()
        segs = chat.system() + chat.user_turn(1, turn_text("", 1, item.max_turns), obs.image)
        requests.append(GenerationRequest([t for s in segs for t in s.ids], [obs.image], seed=k))
    return requests


def engine_speed(engine, requests, params) -> float:
    engine.generate(requests[:4], params)  # warm-up
    t0 = time.perf_counter()
    outs = engine.generate(requests, params)
    return sum(len(o.ids) for o in outs) / (time.perf_counter() - t0)


def read_metrics_file(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def cli(*args: str, sets: dict) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mazerl", *args]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    return subprocess.run(cmd, text=True, capture_output=True)


# ---- the sections ---------------------------------------------------------------------------------
def tiny_grpo_local(ctx: dict) -> dict:
    """tiny-grpo from tiny-base on the GPU, in process: step times and greedy success before/after."""
    out = ctx["out"]
    run = out / "tiny-grpo"
    mazes = ctx["smoke_mazes"]
    steps = ctx["tiny_steps"]
    sets = {"policy.device": ctx["device"], "train_data": str(mazes / "train.parquet"),
            "eval_data": str(mazes / "heldout.parquet"), "output_dir": str(run), "steps": steps,
            "max_minutes": "null", "eval_every": steps, "eval_mazes": ctx["tiny_eval_mazes"], "checkpoint_every": steps}
    t0 = time.perf_counter()
    proc = cli("train", "grpo", "--config", "tiny-grpo", "--resume", "never", "--overwrite", sets=sets)
    metrics = read_metrics_file(run / "metrics.jsonl")
    trained = [m for m in metrics if m.get("step", 0) > 0]
    evals = {m["step"]: m["eval/success"] for m in metrics if "eval/success" in m}
    result = {"ok": proc.returncode == 0, "returncode": proc.returncode, "wall_s": time.perf_counter() - t0, "steps_run": len(trained),
              "eval_success_by_step": evals, "final_model": (run / "final" / "config.json").exists()}
    if trained:
        for key in ("time/rollout", "time/update", "time/step"):
            result[f"median {key}"] = statistics.median(m[key] for m in trained if key in m)
        result["success_rate first/last step"] = [trained[0]["success_rate"], trained[-1]["success_rate"]]
    if proc.returncode:
        result["stderr_tail"] = proc.stderr[-2000:]
    return result


def build_2b(ctx: dict) -> dict:
    t0 = time.perf_counter()
    ctx["model_dir"], n = build_model(ctx["out"] / f"qwen3vl-{ctx['shape']}-random", SHAPES[ctx["shape"]], ctx["device"])
    return {"params_b": n / 1e9, "build_s": time.perf_counter() - t0}


def hf_engine(ctx: dict) -> dict:
    from mazerl.policy.chat import ChatFormat
    from mazerl.policy.loading import load_policy
    from mazerl.rollout.engine import HFEngine, SamplingParams

    policy = load_policy(ctx["model_dir"], dtype="bfloat16", device=ctx["device"])
    chat = ChatFormat(policy.processor)
    ctx["chat"] = chat
    ctx["requests"] = maze_prompts(chat, ctx["smoke_mazes"] / "train.parquet", ctx["batch"])
    ctx["params"] = SamplingParams(temperature=1.0, max_new_tokens=ctx["new_tokens"], banned_ids=tuple(chat.banned_reply_ids))
    reset_peak()
    speed = engine_speed(HFEngine.from_chat(policy.model, chat, max_batch=ctx["batch"]), ctx["requests"], ctx["params"])
    ctx["hf_tokens_per_s"] = speed
    peak = peak_gb()
    del policy
    free_cache()
    return {"tokens_per_s": speed, "batch": ctx["batch"], "new_tokens": ctx["new_tokens"], "peak_gb": peak}


def fsdp2_in_process(ctx: dict) -> dict:
    """The Ray backend's rank and rollout actor classes, driven in this process as RayGRPO drives them."""
    import torch
    import torch.distributed as dist

    from mazerl.config import load_config
    from mazerl.distributed.group import free_port
    from mazerl.distributed.ray_grpo import RolloutWorker, TrainRank
    from mazerl.mazes.seeding import derive_seed
    from mazerl.rl.config import GRPOConfig
    from mazerl.rl.data import MazeSampler
    from mazerl.rl.driver import GRPODriver, episode_metrics, update_stats

    steps = 3
    cfg = load_config(GRPOConfig, "tiny-grpo", {
        "policy.model": str(ctx["model_dir"]), "policy.dtype": "bfloat16", "policy.device": ctx["device"],
        "policy.prompt": "full", "policy.reply_grammar": "action", "policy.max_new_tokens": 16,
        "policy.history.turns": 1, "policy.history.images": 1, "autocast": "off",  # bf16 weights: no autocast
        "train_data": str(ctx["smoke_mazes"] / "train.parquet"), "eval_data": None,
        "output_dir": str(ctx["out"] / "fsdp2"), "steps": steps + 1, "max_minutes": None,
        "mazes_per_step": 8, "group_size": 4, "micro_batch": 8, "max_turns": 4,
        "optim.lr": 1e-4, "distributed.backend": "ray", "distributed.gpus_per_rank": 1})
    cfg_json = cfg.model_dump(mode="json")
    reset_peak()
    rank = TrainRank(cfg_json, 0, 1)
    rank.setup(cfg.steps * cfg.optimizer_steps_per_step, "127.0.0.1", free_port())
    result: dict = {"backend": dist.get_backend(), "sharded": rank.sharded,
                    "dtensor_params": sum(type(p).__name__ == "DTensor" for p in rank.model.parameters())}
    actor = RolloutWorker(cfg_json)

    class Driver(GRPODriver):
        def __init__(self):
            self.cfg, self.step = cfg, 0

        def set_schedule_horizon(self, n: int) -> None:
            rank.set_schedule_horizon(n * cfg.optimizer_steps_per_step)

    driver = Driver()
    sampler = MazeSampler(len(actor.train_df), cfg.seed)
    first_batches: list = []

    def one_step(step: int) -> dict:
        t0 = time.perf_counter()
        trajs, _ = actor.collect(sampler.next(cfg.mazes_per_step), 0, derive_seed(cfg.seed, "rollout", step), step)
        t1 = time.perf_counter()
        driver.check_versions(trajs)
        batches, stats = driver.mini_batches(trajs)
        if step == 1:
            first_batches.extend(batches)
        outs = rank.train_steps(batches, step)
        driver.step = step
        t2 = time.perf_counter()
        sync_s = actor.sync(rank.full_state_dict(), step)
        upd = update_stats(outs, outs[-1]["lr"]) if outs else {}
        return {"step": step, "rollout_s": t1 - t0, "update_s": t2 - t1, "weight_sync_s": sync_s,
                "engine_version": actor.version(), "trained_turns": stats["trained_turns"],
                "loss_tokens": upd.get("loss_tokens"), "grad_norm": upd.get("grad_norm"),
                **{k: episode_metrics(trajs)[k] for k in ("reward_mean", "parse_failure_rate")}}

    actor.sync(rank.full_state_dict(), 0)
    result["steps"] = [one_step(s) for s in range(1, steps + 1)]
    served = actor.tp.policy.model.state_dict()
    trained = rank.full_state_dict()
    result["engine_equals_trainer"] = all(k in served and torch.equal(served[k].cpu(), v.to(served[k].dtype))
                                          for k, v in trained.items())

    ckpt = ctx["out"] / "fsdp2" / "checkpoints" / f"step-{steps:08d}"
    t0 = time.perf_counter()
    rank.save_checkpoint(str(ckpt), {"step": steps, "sampler": sampler.state_dict()})
    result["checkpoint_save_s"] = time.perf_counter() - t0
    result["checkpoint_mb"] = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file()) / 2**20
    # one more update moves the weights away from the checkpoint: the step-1 mini-batches again (a fresh
    # rollout of a random policy may carry no signal and so not move them)
    result["extra_update_turns"] = sum(len(b.samples) for b in first_batches)
    rank.train_steps(first_batches, steps + 1)
    moved = rank.full_state_dict()
    result["max_change_after_extra_step"] = max(float((moved[k].float() - trained[k].float()).abs().max()) for k in trained)
    t0 = time.perf_counter()
    rank.load_checkpoint(str(ckpt))
    result["checkpoint_load_s"] = time.perf_counter() - t0
    restored = rank.full_state_dict()
    result["max_diff_after_restore"] = max(float((restored[k].float() - trained[k].float()).abs().max()) for k in trained)
    result["restored_exactly"] = result["max_diff_after_restore"] == 0.0 and result["max_change_after_extra_step"] > 0
    result["peak_gb"] = peak_gb()
    rank.shutdown()
    del rank, actor
    free_cache()
    return result


def vllm_engine(ctx: dict) -> dict:
    from mazerl.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(ctx["model_dir"]), ctx["chat"], dtype="bfloat16", max_model_len=4096,
                        max_images_per_prompt=1, gpu_memory_utilization=0.6)
    speed = engine_speed(engine, ctx["requests"], ctx["params"])
    engine.close()
    del engine
    free_cache()
    return {"tokens_per_s": speed, "vs_hf": speed / ctx["hf_tokens_per_s"] if ctx.get("hf_tokens_per_s") else None,
            "target": ">= 10x HF"}


def ray_grpo(ctx: dict) -> dict:
    run = ctx["out"] / "grpo-ray"
    sets = {"policy.model": str(ctx["model_dir"]), "policy.dtype": "bfloat16", "policy.device": "cuda", "policy.engine": "vllm",
            "policy.prompt": "full", "policy.max_new_tokens": 64, "policy.vllm.gpu_memory_utilization": 0.3,
            "policy.vllm.max_images_per_prompt": 2, "policy.vllm.enable_sleep_mode": "true",
            "policy.history.turns": 1, "policy.history.images": 1, "policy.reply_grammar": "action", "autocast": "off",
            "train_data": str(ctx["smoke_mazes"] / "train.parquet"), "eval_data": "null", "output_dir": str(run),
            "steps": 3, "mazes_per_step": 8, "group_size": 4, "micro_batch": 4, "max_minutes": "null", "eval_every": 0,
            "checkpoint_every": 3, "max_turns": 4, "update_turns_per_episode": 2,
            "distributed.backend": "ray", "distributed.ranks": 1, "distributed.rollout_workers": 1,
            "distributed.placement": "colocated", "distributed.gpus_per_rank": 1, "distributed.cpus_per_actor": 2}
    t0 = time.perf_counter()
    proc = cli("train", "grpo", "--config", "tiny-grpo", "--resume", "never", "--overwrite", sets=sets)
    metrics = read_metrics_file(run / "metrics.jsonl")
    result = {"ok": proc.returncode == 0, "returncode": proc.returncode, "wall_s": time.perf_counter() - t0,
              "steps": [{k: m.get(k) for k in ("step", "rollout_versions", "time/rollout", "time/update",
                                               "time/weight_sync", "rollout_tokens_per_s", "gpu_memory_gb/rank0")}
                        for m in metrics]}
    if proc.returncode:
        result["stderr_tail"] = proc.stderr[-2000:]
    return result


SECTIONS = [  # name, function, modules it needs beyond torch/transformers
    ("tiny_grpo_local", tiny_grpo_local, ()),
    ("build_2b", build_2b, ()),
    ("hf_engine", hf_engine, ()),
    ("fsdp2_in_process", fsdp2_in_process, ()),
    ("vllm_engine", vllm_engine, ("vllm",)),
    ("ray_grpo", ray_grpo, ("ray", "vllm")),
]
NEEDS_BEFORE = {"hf_engine": "build_2b", "fsdp2_in_process": "build_2b", "vllm_engine": "hf_engine", "ray_grpo": "build_2b"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="work directory (models, mazes, runs)")
    ap.add_argument("--report", type=Path, help="where the JSON report goes (default OUT/gpu_check.json)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--tiny-steps", type=int, default=30)
    ap.add_argument("--tiny-eval-mazes", type=int, default=128, help="held-out mazes tiny_grpo_local evaluates before and after")
    ap.add_argument("--only", nargs="*", help="run just these sections")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: check the script itself")
    ap.add_argument("--shape", default="2b", choices=sorted(SHAPES), help="the random model's size (small: for --device cpu)")
    args = ap.parse_args()
    import torch

    from mazerl.mazes.splits import generate_dataset, preset

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device here (use --device cpu --shape small to check the script)")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    report_path = args.report or out / "gpu_check.json"
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report: dict = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "shape": args.shape, "torch": torch.__version__,
                    "transformers": __import__("transformers").__version__}
    generate_dataset(preset("smoke"), out / "mazes", overwrite=True)
    ctx = {"out": out, "smoke_mazes": out / "mazes", "batch": args.batch, "new_tokens": args.new_tokens,
           "tiny_steps": args.tiny_steps, "tiny_eval_mazes": args.tiny_eval_mazes, "device": args.device, "shape": args.shape}
    for name, fn, modules in SECTIONS:
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        before = NEEDS_BEFORE.get(name)
        if args.only is not None and name not in args.only:
            continue
        if missing:
            report[name] = {"not_run": f"{', '.join(missing)} not importable here"}
        elif before and report.get(before, {}).get("ok") is not True:
            report[name] = {"not_run": f"needs section {before}, which did not succeed"}
        else:
            t0 = time.perf_counter()
            try:
                report[name] = {"ok": True, **fn(ctx)}
            except Exception as err:  # a report of every section, whatever one of them does
                report[name] = {"ok": False, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
            report[name]["section_s"] = time.perf_counter() - t0
        print(name, json.dumps(report[name], indent=1, default=str), flush=True)
        report_path.write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    main()
