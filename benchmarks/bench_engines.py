"""vLLM vs HFEngine tokens/s on the same maze prompts, same run (issue 11; no target on CPU).

Runs in the vLLM venv (`make vllm-env`): .venv-vllm/bin/python benchmarks/bench_engines.py --json OUT
The model is a random tiny Qwen3-VL of the `small` shape (head_dim 32: the shipped tiny-base's 48 is
not one vLLM's CPU attention supports). Prompts: each maze's first turn (system prompt + image).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import engine_speed, maze_prompts  # noqa: E402  (same prompts and timing as the GPU check)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()
    import torch

    from mazerl.mazes.splits import DatasetConfig, generate_dataset
    from mazerl.policy.chat import ChatFormat
    from mazerl.policy.loading import load_policy
    from mazerl.policy.prompts import SHORT_SYSTEM_PROMPT
    from mazerl.policy.tiny import init_tiny
    from mazerl.rollout.engine import HFEngine, SamplingParams
    from mazerl.rollout.vllm_engine import VLLMEngine

    work = Path(tempfile.mkdtemp(prefix="bench-engines-"))
    model_dir = init_tiny(work / "tiny", size="small", seed=0)
    generate_dataset(DatasetConfig.model_validate(
        {"reference_splits": {}, "splits": {"train": {"count": 64, "sizes": ["5x5"]}}}), work / "mazes")
    policy = load_policy(model_dir)
    chat = ChatFormat(policy.processor, system_prompt=SHORT_SYSTEM_PROMPT)
    hf = HFEngine.from_chat(policy.model, chat, max_batch=max(args.batches))
    t0 = time.perf_counter()
    vllm = VLLMEngine(str(model_dir), chat, max_model_len=2048, max_images_per_prompt=1)
    start_s = time.perf_counter() - t0
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, banned_ids=tuple(chat.banned_reply_ids))
    rows = []
    for batch in args.batches:
        requests = maze_prompts(chat, work / "mazes" / "train.parquet", batch)
        row = {"batch": batch, "prompt_tokens": len(requests[0].ids), "new_tokens": args.new_tokens,
               "hf_tokens_per_s": engine_speed(hf, requests, params),
               "vllm_tokens_per_s": engine_speed(vllm, requests, params)}
        row["vllm_vs_hf"] = row["vllm_tokens_per_s"] / row["hf_tokens_per_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    vllm.close()
    result = {"vllm_start_s": start_s, "torch_threads": torch.get_num_threads(), "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":  # vLLM spawns its engine process
    main()
