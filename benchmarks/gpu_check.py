"""The GPU paths on one GPU, in minutes (benchmarks/gpu_check.sh runs this; budget <= 8 minutes).

1. builds a randomly initialised Qwen3-VL of ~2B parameters from a config (no hub download),
2. measures HFEngine and VLLMEngine tokens/s on the same maze prompts at batch 64,
3. runs 3 GRPO steps on Ray: one FSDP2 rank (NCCL) and one vLLM rollout actor colocated on the GPU,
   the engine reloaded after every update,
4. prints peak GPU memory; everything also goes to OUT/gpu_check.json.

    python benchmarks/gpu_check.py --out OUT
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# ~2B: Qwen3-VL-2B's text shape (hidden 2048, 28 layers, 16 heads of 128, 8 KV heads, MLP 6144, full
# vocabulary) with a smaller vision tower; tokenizer and processor are the tiny model's.
TWO_B = dict(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, mlp=6144, vocab=151_936,
             v_hidden=1024, v_depth=12, v_heads=16, v_mlp=4096)


def build_model(out: Path) -> Path:
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from mazerl.atomic import atomic_directory
    from mazerl.policy.tiny import build_processor, build_tokenizer

    tok = build_tokenizer(640)
    processor = build_processor(tok, patch=16, merge=2)
    s = TWO_B
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
                           out_hidden_size=s["hidden"], deepstack_visual_indexes=[3, 7, 11]),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3VLForConditionalGeneration(config).to(torch.bfloat16)
    with atomic_directory(out, overwrite=True) as tmp:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
    n = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    return out, n


def maze_prompts(chat, data: Path, n: int):
    import pandas as pd

    from mazerl.envs.maze_env import MazeEnv
    from mazerl.rollout.engine import GenerationRequest
    from mazerl.policy.prompts import turn_text
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    args = ap.parse_args()
    import torch

    from mazerl.mazes.splits import DatasetConfig, generate_dataset
    from mazerl.policy.chat import ChatFormat
    from mazerl.policy.loading import load_policy
    from mazerl.rollout.engine import HFEngine, SamplingParams
    from mazerl.rollout.vllm_engine import VLLMEngine

    assert torch.cuda.is_available(), "gpu_check needs a CUDA device"
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"gpu": torch.cuda.get_device_name(0)}
    t0 = time.perf_counter()
    model_dir, n_params = build_model(out / "qwen3vl-2b-random")
    report.update(params_b=n_params / 1e9, build_s=time.perf_counter() - t0)
    print(f"model: {n_params / 1e9:.2f} B parameters in {report['build_s']:.0f} s", flush=True)
    generate_dataset(DatasetConfig.model_validate(
        {"reference_splits": {}, "splits": {"train": {"count": 64, "sizes": ["5x5"]}}}), out / "mazes")

    policy = load_policy(model_dir, dtype="bfloat16", device="cuda")
    chat = ChatFormat(policy.processor)
    requests = maze_prompts(chat, out / "mazes" / "train.parquet", args.batch)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, banned_ids=tuple(chat.banned_reply_ids))
    report["hf_tokens_per_s"] = engine_speed(HFEngine.from_chat(policy.model, chat, max_batch=args.batch), requests, params)
    print(f"HF engine: {report['hf_tokens_per_s']:.0f} tokens/s at batch {args.batch}", flush=True)
    report["hf_peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
    del policy
    torch.cuda.empty_cache()
    vllm = VLLMEngine(str(model_dir), chat, dtype="bfloat16", max_model_len=4096, max_images_per_prompt=1,
                      gpu_memory_utilization=0.6)
    report["vllm_tokens_per_s"] = engine_speed(vllm, requests, params)
    report["vllm_vs_hf"] = report["vllm_tokens_per_s"] / report["hf_tokens_per_s"]
    print(f"vLLM engine: {report['vllm_tokens_per_s']:.0f} tokens/s ({report['vllm_vs_hf']:.1f}x HF; target >= 10x)", flush=True)
    vllm.close()
    del vllm
    torch.cuda.empty_cache()

    # 3 GRPO steps: one FSDP2 rank and one vLLM rollout actor sharing the GPU (colocated), through the CLI
    run = out / "grpo"
    sets = {"policy.model": str(model_dir), "policy.dtype": "bfloat16", "policy.device": "cuda", "policy.engine": "vllm",
            "policy.prompt": "full", "policy.max_new_tokens": 64, "policy.vllm.gpu_memory_utilization": 0.3,
            "policy.vllm.max_images_per_prompt": 2, "policy.vllm.enable_sleep_mode": "true",
            "policy.history.turns": 1, "policy.history.images": 1,
            "train_data": str(out / "mazes" / "train.parquet"), "eval_data": "null", "output_dir": str(run),
            "steps": 3, "mazes_per_step": 8, "group_size": 4, "micro_batch": 4, "max_minutes": "null", "eval_every": 0,
            "checkpoint_every": 3, "max_turns": 4, "update_turns_per_episode": 2,
            "distributed.backend": "ray", "distributed.ranks": 1, "distributed.rollout_workers": 1,
            "distributed.placement": "colocated", "distributed.gpus_per_rank": 1, "distributed.cpus_per_actor": 2}
    cmd = [sys.executable, "-m", "mazerl", "train", "grpo", "--config", "tiny-grpo"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, text=True, capture_output=True)
    report["grpo_returncode"], report["grpo_s"] = proc.returncode, time.perf_counter() - t0
    metrics = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()] if (run / "metrics.jsonl").exists() else []
    report["grpo_steps"] = [{k: m.get(k) for k in ("step", "rollout_versions", "time/rollout", "time/update",
                                                   "time/weight_sync", "rollout_tokens_per_s", "gpu_memory_gb/rank0")}
                            for m in metrics]
    print(proc.stderr[-3000:] if proc.returncode else "", flush=True)
    print(f"GRPO (FSDP2 + vLLM, colocated): exit {proc.returncode}, {len(metrics)} steps in {report['grpo_s']:.0f} s", flush=True)
    for m in report["grpo_steps"]:
        print("  ", m, flush=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    main()
