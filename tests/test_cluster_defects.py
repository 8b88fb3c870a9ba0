"""Issue #33 (the HyperPod run as shipped), part 4: defects found by reading the 8B cluster run.

- the baseline and the trained model are evaluated with the same view, the job's, so compare accepts them;
- `--overwrite` never discards a damaged checkpoint silently: it is named, discarding is an explicit choice;
- each training rank of the Ray backend receives only its slice of a mini-batch;
- free-form vLLM sampling bans tokens without a ~vocabulary-sized allow-list per request (real vLLM CPU build).

Not run here: the 8B weights (the tiny model stands in for them: the view is the shipped 8B job's) and GPUs.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
JOB_8B = "qwen3vl-8b-grpo"


# ---- 3. baseline and trained model: one view, the job's ----------------------------------------------------
@pytest.fixture(scope="module")
def view_mazes(tmp_path_factory) -> Path:
    """One 2x2 maze to evaluate, in at most 5 turns (the 8B view allows 1,024 new tokens a turn)."""
    from mazerl.mazes.splits import DatasetConfig, generate_dataset

    out = tmp_path_factory.mktemp("view") / "mazes"
    generate_dataset(DatasetConfig.model_validate({"reference_splits": {}, "splits": {
        "heldout": {"count": 1, "sizes": ["2x2"], "max_turns": 5}, "train": {"count": 2, "sizes": ["3x3"]}}}), out)
    return out


def test_baseline_and_trained_models_are_evaluated_with_the_jobs_view(view_mazes, tmp_path):
    """The shipped 8B job starts from a hub model (no mazerl_policy.json) and saves its view beside the
    trained weights. Both evaluations must use that view (1,024 new tokens, full history and prompt),
    not the hub model's defaults (16 new tokens), or compare refuses the pair after the whole run."""
    from safetensors.torch import load_file, save_file

    from mazerl import workflow
    from mazerl.config import load_config
    from mazerl.policy.config import PolicyConfig
    from mazerl.policy.loading import load_policy, resolve_model_name
    from mazerl.policy.trainable import save_model_dir
    from mazerl.rl.config import GRPOConfig

    hub_like = tmp_path / "hub-model"  # tiny-base's weights stand in for Qwen/Qwen3-VL-8B-Instruct: no saved view
    shutil.copytree(resolve_model_name("tiny-base"), hub_like)
    (hub_like / PolicyConfig.VIEW_FILE).unlink()
    # so that 1,024 new tokens a turn cost nothing here: the text's final norm zeroed, every logit ties and
    # greedy decoding picks the first token not banned, the end of turn (every reply ends at once)
    weights = load_file(hub_like / "model.safetensors")
    weights["model.language_model.norm.weight"].zero_()
    save_file(weights, hub_like / "model.safetensors", metadata={"format": "pt"})
    job = load_config(GRPOConfig, JOB_8B, {"policy.model": str(hub_like), "train_data": str(view_mazes / "train.parquet"),
                                           "output_dir": str(tmp_path / "grpo")})
    assert job.policy.max_new_tokens == 1024 and job.policy.history.turns is None and job.policy.prompt == "full"
    assert PolicyConfig.for_model(str(hub_like)).max_new_tokens == 16  # the hub model's own view: the defaults
    trained = tmp_path / "grpo" / "final"  # what training writes at its end: the weights and the job's view
    policy = load_policy(hub_like)
    save_model_dir(policy.model, policy.processor, trained, job.policy)

    base = workflow.evaluate(str(hub_like), str(view_mazes), str(tmp_path / "eval-base"), 1, 1, config=JOB_8B)
    new = workflow.evaluate(str(trained), str(view_mazes), str(tmp_path / "eval-new"), 1, 1, config=JOB_8B)
    assert base["meta"]["view"] == new["meta"]["view"] == job.policy.view()
    result = workflow.compare(str(tmp_path / "eval-base"), str(tmp_path / "eval-new"), str(tmp_path / "cmp"), 0.0, 1.0)
    assert result["splits"]["heldout"]["mazes"] == 1
    assert base["splits"]["heldout"]["greedy"]["episodes"] == 1


def test_the_pipeline_gives_both_evaluations_the_training_jobs_config(tmp_path):
    from typer.testing import CliRunner

    from mazerl.cli import app

    out = tmp_path / "p.yaml"
    result = CliRunner().invoke(app, ["pipeline", "compile", "--profile", "hyperpod-p5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    spec = next(yaml.safe_load_all(out.read_text()))
    handler = next(t for t in spec["root"]["dag"]["tasks"].values() if "exit-handler" in t.get("componentRef", {}).get("name", ""))
    dag = spec["components"][handler["componentRef"]["name"]]["dag"]["tasks"]  # the tasks inside the ExitHandler
    for name in ("evaluate", "evaluate-2"):
        assert dag[name]["inputs"]["parameters"]["config"]["componentInputParameter"] == "pipelinechannel--grpo_config"
    assert dag["train-grpo"]["inputs"]["parameters"]["config"]["componentInputParameter"] == "pipelinechannel--grpo_config"


# ---- 13. --overwrite never discards a damaged checkpoint silently --------------------------------------------
def _damage(checkpoint: Path) -> None:
    weights = next((checkpoint / "model").glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))


def test_overwrite_never_discards_damaged_checkpoints_silently(tiny_model_dir, small_mazes, tmp_path, caplog):
    from typer.testing import CliRunner

    from mazerl.cli import app
    from mazerl.rl.config import GRPOConfig
    from mazerl.rl.trainer import GRPOTrainer, ResumeError

    out = tmp_path / "run"
    raw = {"policy": {"model": str(tiny_model_dir), "history": {"turns": 0, "images": 1}, "max_new_tokens": 4, "prompt": "short"},
           "train_data": str(small_mazes / "train.parquet"), "output_dir": str(out), "steps": 1, "mazes_per_step": 1,
           "group_size": 2, "eval_every": 0, "checkpoint_every": 1, "max_turns": 1}
    cfg = GRPOConfig.model_validate(raw)
    GRPOTrainer(cfg).run(resume="never")
    checkpoint = out / "checkpoints" / "step-00000001"
    _damage(checkpoint)
    metrics = (out / "metrics.jsonl").read_bytes()

    # --overwrite alone (what a retried cluster job passes): refused, the damaged checkpoint named, nothing removed
    with pytest.raises(ResumeError, match="no usable checkpoint") as err:
        GRPOTrainer(cfg).run(resume="auto", overwrite=True)
    assert "step-00000001" in str(err.value) and "does not match its hash" in str(err.value)
    assert "--discard-damaged-checkpoints" in str(err.value)
    assert checkpoint.is_dir() and (out / "metrics.jsonl").read_bytes() == metrics
    # the same through the command line: a clear error (exit 2), no traceback
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["train", "grpo", "--config", str(path), "--overwrite"])
    assert result.exit_code == 2 and "step-00000001" in result.output and "Traceback" not in result.output, result.output
    assert checkpoint.is_dir()

    # discarding is an explicit choice, and the run says what it discarded
    with caplog.at_level("WARNING"):
        record = GRPOTrainer(cfg).run(resume="auto", overwrite=True, discard_damaged=True)
    assert record["step"] == 1
    assert "step-00000001" in caplog.text and "does not match its hash" in caplog.text and "discard" in caplog.text


# ---- 7. each rank receives only its slice of a mini-batch ----------------------------------------------------
def test_each_fsdp_rank_given_only_its_slice_makes_the_one_process_update(small_mazes, tmp_path):
    """Two FSDP2 ranks, each handed only `MiniBatch.slice_for_rank` (its every-other sample, the
    mini-batch's normalisers), make the same update as one process on the whole mini-batch."""
    import torch

    from mazerl.distributed.group import run_group
    from test_distributed import _mini_batches, _train

    batches = _mini_batches("tiny-base", small_mazes, n_batches=1)
    assert len(batches[0].samples) % 2 == 1  # an odd count: rank 0 holds one sample more
    slices = [[b.slice_for_rank(r, 2) for b in batches] for r in range(2)]
    for b, (zero, one) in zip(batches, zip(*slices)):
        assert len(zero.samples) + len(one.samples) == len(b.samples) and len(zero.samples) - len(one.samples) == 1
        assert zero.tokens == one.tokens == b.tokens  # the whole mini-batch's normaliser on every rank
    single = _train(0, 1, "tiny-base", batches, None)
    out = tmp_path / "ranks.pt"
    run_group(2, _train_own_slice, slices, str(out))
    sharded = torch.load(out, weights_only=True)
    assert sharded["losses"] == pytest.approx(single["losses"], abs=1e-5)
    assert sharded["grad_norms"] == pytest.approx(single["grad_norms"], rel=1e-5)


def _train_own_slice(rank: int, world: int, slices, out_file: str):
    from test_distributed import _train

    return _train(rank, world, "tiny-base", slices[rank], out_file)


def test_the_ray_driver_sends_each_rank_only_its_slice(small_mazes, tmp_path):
    """`train grpo --backend ray` with 2 ranks: what each rank actor is sent (counted by the rank, from
    its call's arguments) adds up to the step's trained turns once, not once per rank."""
    from mazerl.metrics import read_metrics

    out = tmp_path / "run"
    cfg = {"policy": {"model": "tiny-base"}, "train_data": str(small_mazes / "train.parquet"), "output_dir": str(out),
           "steps": 1, "mazes_per_step": 2, "group_size": 2, "max_turns": 3, "micro_batch": 8, "eval_every": 0,
           "checkpoint_every": 1, "optim": {"lr": 1e-4}, "env": {"progress_reward": 0.1},
           "distributed": {"ranks": 2, "rollout_workers": 1, "cpus_per_actor": 0.5}}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""}
    proc = subprocess.run([sys.executable, "-m", "mazerl.cli", "train", "grpo", "--config", str(path), "--backend", "ray"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (record,) = read_metrics(out / "metrics.jsonl")
    turns = record["trained_turns"]
    sent = [record["update/rank0_samples"], record["update/rank1_samples"]]
    assert turns >= 2, "too few turns to share between two ranks: not a test"
    assert sum(sent) == turns and sent == [math.ceil(turns / 2), turns // 2]


# ---- 8. banned tokens without per-request allow-lists (the real vLLM CPU build) -----------------------------
def test_free_form_vllm_sampling_bans_tokens_without_an_allow_list(tmp_path):
    """From a flat next-token distribution (LM head zeroed) a banned token would be drawn ~1% of the
    time: over ~1,000 draws none is, every drawn token's log-probability is that of one among the
    vocabulary less the banned tokens (they are masked to -inf, as the trainer assumes), as HFEngine's,
    and the request carries a handful of bad words, not an allow-list of every other token id."""
    from test_vllm_engine import vllm_python

    out = tmp_path / "banned.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    proc = subprocess.run([vllm_python(), str(REPO / "tests" / "vllm_checks.py"), str(out), str(tmp_path), "banned"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    banned = set(r["banned_ids"])
    assert r["allowed_token_ids"] is None and len(r["bad_words"]) == len(banned)
    drawn = [t for ids in r["vllm_ids"] for t in ids]
    assert len(drawn) >= 500 and not banned & set(drawn)
    flat = -math.log(r["vocab"] - len(banned))
    for engine in ("vllm", "hf"):
        assert not banned & {t for ids in r[f"{engine}_ids"] for t in ids}
        assert all(lp == pytest.approx(flat, abs=1e-4) for lps in r[f"{engine}_logprobs"] for lp in lps)
