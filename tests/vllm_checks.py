"""Runs inside the vLLM venv (`make vllm-env`): the same prompts through HFEngine and VLLMEngine.

tests/test_vllm_engine.py starts this script with that venv's Python and asserts on the JSON it
writes; this script only measures and records, so every comparison lives in the test.

    python tests/vllm_checks.py OUT.json WORKDIR [grpo | grpo-ray | banned]
"""

import json
import os
import sys
import time
from pathlib import Path


def sharpened_tiny_model(out: Path, seed: int) -> Path:
    """A random tiny Qwen3-VL (head_dim 32: one vLLM's CPU attention supports) whose LM head is scaled
    up, so next-token scores have clear winners and greedy comparisons do not hinge on float noise."""
    import torch
    from safetensors.torch import load_file, save_file

    from mazerl.policy.tiny import init_tiny

    init_tiny(out, size="small", seed=seed, overwrite=True)
    weights = load_file(str(out / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"] * 8.0
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    torch.manual_seed(seed)
    return out


def trajectories(engine, chat, items, sampling, history):
    from mazerl.rollout.multiturn import rollout

    trajs = rollout(engine, chat, items, group_size=1, sampling=sampling, history=history)
    return [{"replies": [seg.ids for seg in t.conversation.segments if seg.kind == "reply"],
             "logprobs": [seg.logprobs for seg in t.conversation.segments if seg.kind == "reply"],
             "version": t.weights_version} for t in trajs]


def main(out_json: str, workdir: str) -> None:
    import numpy as np
    import torch

    from mazerl.mazes.splits import DatasetConfig, generate_dataset
    from mazerl.policy.chat import ChatFormat
    from mazerl.policy.loading import load_policy
    from mazerl.policy.prompts import SHORT_SYSTEM_PROMPT
    from mazerl.rollout.engine import GenerationRequest, HFEngine, SamplingParams
    from mazerl.rollout.multiturn import HistoryConfig, items_from_split
    from mazerl.rollout.vllm_engine import VLLMEngine, VLLMUnavailableError, check_servable

    work = Path(workdir)
    results: dict = {}

    # the shipped tiny-base has head_dim 48: vLLM's CPU attention would serve it wrongly, so it is refused
    from mazerl.policy.loading import resolve_model_name

    try:
        check_servable(resolve_model_name("tiny-base"))
        results["tiny_base_refused"] = None
    except VLLMUnavailableError as err:
        results["tiny_base_refused"] = str(err)

    model_dir = sharpened_tiny_model(work / "tiny", seed=1)
    policy = load_policy(model_dir)
    chat = ChatFormat(policy.processor, system_prompt=SHORT_SYSTEM_PROMPT)
    hf = HFEngine.from_chat(policy.model, chat)
    t0 = time.perf_counter()
    vllm = VLLMEngine(str(model_dir), chat, dtype="float32", max_model_len=2048, max_images_per_prompt=4)
    results["vllm_start_s"] = time.perf_counter() - t0

    data = generate_dataset(DatasetConfig.model_validate(
        {"reference_splits": {}, "splits": {"train": {"count": 6, "sizes": ["3x3"]}}}), work / "mazes")
    import pandas as pd

    df = pd.read_parquet(work / "mazes" / "train.parquet")
    items = items_from_split(df, list(range(6)), render_scale=1.0, max_turns=3)
    history = HistoryConfig(turns=None, images=2)  # multi-turn prompts carrying two images
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8, banned_ids=tuple(chat.banned_reply_ids))

    # 1. greedy multi-turn episodes: every turn's reply, token for token, and its log-probabilities
    results["greedy_hf"] = trajectories(hf, chat, items, greedy, history)
    results["greedy_vllm"] = trajectories(vllm, chat, items, greedy, history)

    # 2. the action grammar (one choice among five words per turn)
    action = greedy.model_copy(update={"grammar": "action"})
    results["action_hf"] = trajectories(hf, chat, items, action, history)
    results["action_vllm"] = trajectories(vllm, chat, items, action, history)

    # 3. seeded sampling: same seeds -> same tokens; a request alone samples what it samples in a batch
    rng = np.random.default_rng(0)
    images = [(rng.random((48, 48, 3)) * 255).astype(np.uint8) for _ in range(4)]
    requests = [GenerationRequest([t for s in chat.system() + chat.user_turn(1, f"turn {k}", img) for t in s.ids], [img], seed=10 + k)
                for k, img in enumerate(images)]
    sampled = SamplingParams(temperature=1.0, max_new_tokens=8, banned_ids=tuple(chat.banned_reply_ids))
    results["sampled_a"] = [o.ids for o in vllm.generate(requests, sampled)]
    results["sampled_b"] = [o.ids for o in vllm.generate(requests, sampled)]
    results["sampled_alone"] = [vllm.generate([r], sampled)[0].ids for r in requests]
    results["sampled_other_seeds"] = [o.ids for o in vllm.generate(
        [GenerationRequest(r.ids, r.images, seed=1000 + k) for k, r in enumerate(requests)], sampled)]
    results["banned_ids"] = list(chat.banned_reply_ids)
    results["sampled_hf_a"] = [o.ids for o in hf.generate(requests, sampled)]
    results["sampled_hf_alone"] = [hf.generate([r], sampled)[0].ids for r in requests]

    # 4. a weight reload: new weights in vLLM (version 1) equal a fresh HF model holding them
    new_dir = sharpened_tiny_model(work / "tiny-new", seed=2)
    new_policy = load_policy(new_dir)
    state = {k: v.clone() for k, v in new_policy.model.state_dict().items()}
    t0 = time.perf_counter()
    vllm.sync_weights(state, version=1)
    results["reload_s"] = time.perf_counter() - t0
    hf_new = HFEngine.from_chat(new_policy.model, chat)
    hf_new.weights_version = 1
    results["reloaded_hf"] = trajectories(hf_new, chat, items, greedy, history)
    results["reloaded_vllm"] = trajectories(vllm, chat, items, greedy, history)
    results["old_weights_hf"] = results["greedy_hf"]

    # 5. tokens/s on the same batch of prompts (recorded for docs/BENCHMARKS.md; no target on CPU)
    batch = [GenerationRequest(r.ids, r.images, seed=k) for k, r in enumerate(requests * 8)]
    speed = SamplingParams(temperature=1.0, max_new_tokens=32, banned_ids=tuple(chat.banned_reply_ids))
    for name, engine in (("hf", hf_new), ("vllm", vllm)):
        engine.generate(batch[:2], speed)  # warm-up
        t0 = time.perf_counter()
        outs = engine.generate(batch, speed)
        seconds = time.perf_counter() - t0
        results[f"tokens_per_s_{name}"] = sum(len(o.ids) for o in outs) / seconds
    results["batch"] = len(batch)
    results["torch_threads"] = torch.get_num_threads()
    vllm.close()
    Path(out_json).write_text(json.dumps(results))


def grpo(out_json: str, workdir: str, backend: str = "local") -> None:
    """`mazerl train grpo` with policy.engine vllm (in-process trainer): 2 updates, the engine reloaded
    after each; records the metrics and the final model's presence."""
    import subprocess

    work = Path(workdir)
    model = sharpened_tiny_model(work / "tiny", seed=1)
    from mazerl.mazes.splits import DatasetConfig, generate_dataset

    generate_dataset(DatasetConfig.model_validate(
        {"reference_splits": {}, "splits": {"train": {"count": 8, "sizes": ["3x3"]}}}), work / "mazes")
    out = work / "grpo"
    sets = {"policy.model": str(model), "policy.engine": "vllm", "policy.prompt": "short", "policy.max_new_tokens": 8,
            "policy.vllm.max_model_len": 2048, "train_data": str(work / "mazes" / "train.parquet"), "eval_data": "null",
            "output_dir": str(out), "steps": 2, "mazes_per_step": 2, "group_size": 2, "micro_batch": 8,
            "max_minutes": "null", "eval_every": 0, "checkpoint_every": 1, "max_turns": 3}
    if backend == "ray":  # a Ray rollout actor with the vLLM engine; weights by broadcast group (gloo)
        sets.update({"distributed.ranks": 1, "distributed.rollout_workers": 1, "distributed.cpus_per_actor": 0.5,
                     "distributed.weight_sync": "broadcast"})
    args = [sys.executable, "-m", "mazerl", "train", "grpo", "--config", "tiny-grpo", "--backend", backend]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()] if (out / "metrics.jsonl").exists() else []
    Path(out_json).write_text(json.dumps({"returncode": proc.returncode, "stderr": proc.stderr[-3000:], "metrics": metrics,
                                          "final": (out / "final" / "model.safetensors").exists()}))


def banned(out_json: str, workdir: str) -> None:
    """Free-form sampling from a flat next-token distribution (LM head zeroed: every token equally
    likely), so a banned token would be drawn often if it were not masked. Records what one request
    carries (allow-list, bad words), every drawn token and its log-probability, vLLM's and HFEngine's."""
    import numpy as np
    from safetensors.torch import load_file, save_file

    from mazerl.policy.chat import ChatFormat
    from mazerl.policy.loading import load_policy
    from mazerl.policy.prompts import SHORT_SYSTEM_PROMPT
    from mazerl.rollout.engine import GenerationRequest, HFEngine, SamplingParams
    from mazerl.rollout.vllm_engine import VLLMEngine

    model_dir = sharpened_tiny_model(Path(workdir) / "flat", seed=1)
    weights = load_file(str(model_dir / "model.safetensors"))
    weights["lm_head.weight"].zero_()
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    policy = load_policy(model_dir)
    chat = ChatFormat(policy.processor, system_prompt=SHORT_SYSTEM_PROMPT)
    rng = np.random.default_rng(0)
    requests = []
    for k in range(16):
        img = (rng.random((48, 48, 3)) * 255).astype(np.uint8)
        requests.append(GenerationRequest([t for s in chat.system() + chat.user_turn(1, f"turn {k}", img) for t in s.ids],
                                          [img], seed=k))
    params = SamplingParams(temperature=1.0, max_new_tokens=64, banned_ids=tuple(chat.banned_reply_ids))
    vllm = VLLMEngine(str(model_dir), chat, dtype="float32", max_model_len=2048, max_images_per_prompt=1)
    request = vllm._vllm_params(params, seed=0)  # what every free-form request carries
    results = {"banned_ids": list(chat.banned_reply_ids), "vocab": policy.model.config.get_text_config().vocab_size,
               "allowed_token_ids": request.allowed_token_ids, "bad_words": request.bad_words}
    outs = vllm.generate(requests, params)
    results["vllm_ids"] = [o.ids for o in outs]
    results["vllm_logprobs"] = [o.logprobs for o in outs]
    outs = HFEngine.from_chat(policy.model, chat).generate(requests, params)
    results["hf_ids"] = [o.ids for o in outs]
    results["hf_logprobs"] = [o.logprobs for o in outs]
    vllm.close()
    Path(out_json).write_text(json.dumps(results))


if __name__ == "__main__":  # vLLM spawns its engine process: the guard keeps it from rerunning this
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if len(sys.argv) > 3 and sys.argv[3] in ("grpo", "grpo-ray"):
        grpo(sys.argv[1], sys.argv[2], backend="ray" if sys.argv[3] == "grpo-ray" else "local")
    elif len(sys.argv) > 3 and sys.argv[3] == "banned":
        banned(sys.argv[1], sys.argv[2])
    else:
        main(sys.argv[1], sys.argv[2])
