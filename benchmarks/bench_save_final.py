"""What writing the final model costs the writing rank in host memory and time: tensor by tensor from the trained
model (policy/export.py, what TrainRank.save_final and the in-process trainer now do) against the way save_final
worked before (the full state dict in policy.dtype, a second model opened and loaded with it, save_pretrained).

A Qwen3-VL model of tiny-base's tokenizer and vision tower with a wider, deeper text model (`--hidden`, `--layers`:
~150 M parameters by default) is opened for training (float32 masters) with policy.dtype bfloat16, as the shipped
8B config has it. Each mode runs in a fresh process (their peaks do not mix): the figure is the peak RSS above
what the process held with the trained model open (its weights written once, as an update leaves them), sampled
every millisecond (glibc's mmap threshold fixed at
64 KiB, so a freed tensor leaves the RSS at once), and the seconds the write took. One process stands for rank 0:
the gathers of a sharded model add the same one tensor at a time to both modes.

Usage: python benchmarks/bench_save_final.py [--hidden 1024] [--layers 12] [--shard-mb 100] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def build_model(directory: Path, hidden: int, layers: int) -> None:
    """tiny-base with its text model widened and deepened, random weights."""
    import torch
    from transformers import AutoConfig, AutoProcessor, Qwen3VLForConditionalGeneration

    from mazerl.policy.config import PolicyConfig

    base = PolicyConfig(model="tiny-base").model
    config = AutoConfig.from_pretrained(base)
    text = config.text_config
    text.hidden_size, text.intermediate_size, text.num_hidden_layers = hidden, 3 * hidden, layers
    text.num_attention_heads, text.num_key_value_heads, text.head_dim = hidden // 128, hidden // 256, 128
    config.vision_config.out_hidden_size = hidden
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(config)
    model.save_pretrained(directory)
    AutoProcessor.from_pretrained(base).save_pretrained(directory)
    for name in ("generation_config.json", "mazerl_policy.json"):
        (directory / name).write_bytes((Path(base) / name).read_bytes())


def measure(model_dir: str, mode: str, shard_mb: int, out: str) -> dict:
    import psutil
    import torch
    from bench_activation_checkpointing import PeakRSS

    from mazerl.policy.config import PolicyConfig
    from mazerl.policy.export import save_trained_model
    from mazerl.policy.trainable import in_dtype, save_model_dir
    from mazerl.rollout.factory import open_policy

    policy = PolicyConfig(model=model_dir, dtype="bfloat16")
    tp = open_policy(policy, with_engine=False, for_training=True)  # float32 masters, as a trainer holds them
    model = tp.policy.model
    with torch.no_grad():  # as an update leaves them: written in place (from_pretrained may map the file lazily)
        for p in model.parameters():
            p.mul_(1.0)
    params = sum(p.numel() for p in model.parameters())
    before = psutil.Process().memory_info().rss
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        if mode == "second-model":
            state = in_dtype(model.state_dict(), policy.dtype)
            plain = open_policy(policy, with_engine=False)
            plain.policy.model.load_state_dict(state, strict=True)
            save_model_dir(plain.policy.model, plain.policy.processor, out, policy)
        else:
            save_trained_model(model, tp.policy.processor, out, policy, max_shard_bytes=shard_mb * 2**20)
        seconds = time.perf_counter() - t0
    files = sorted(p.name for p in Path(out).glob("*.safetensors"))
    return {"mode": mode, "parameters": params, "bf16_weights_mib": params * 2 / 2**20,
            "peak_above_mib": (rss.peak - before) / 2**20, "seconds": seconds, "shards": len(files)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--shard-mb", type=int, default=100)
    ap.add_argument("--json")
    ap.add_argument("--_mode")
    ap.add_argument("--_model")
    ap.add_argument("--_out")
    args = ap.parse_args()
    if args._mode:
        print(json.dumps(measure(args._model, args._mode, args.shard_mb, args._out)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir, args.hidden, args.layers)
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        results = []
        for mode in ("second-model", "streamed"):
            run = subprocess.run([sys.executable, __file__, "--_mode", mode, "--_model", str(model_dir), "--_out",
                                  str(Path(tmp) / mode), "--shard-mb", str(args.shard_mb)],
                                 capture_output=True, text=True, env=env, check=True)
            results.append(json.loads(run.stdout.strip().splitlines()[-1]))
    for r in results:
        print(f"{r['mode']:>13}: peak +{r['peak_above_mib']:.0f} MiB above the trained model "
              f"({r['parameters'] / 1e6:.0f} M parameters, {r['bf16_weights_mib']:.0f} MiB in bf16), "
              f"{r['seconds']:.2f} s, {r['shards']} shard(s)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
