"""Checkpoints and JSON on S3, through boto3 against moto's standalone server on 127.0.0.1, with
failures injected mid-upload: a checkpoint is visible only once complete; resume finds the last
complete one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mazerl.rl.checkpoint import MANIFEST, sha256_file, verify
from mazerl.storage import S3CheckpointStore, StorageError, read_json, split_s3, write_json

from conftest import S3_TEST_BUCKET as BUCKET


def make_checkpoint(root: Path, step: int, big_mib: int = 0) -> Path:
    """A checkpoint folder in the trainer's layout: files, then the manifest of their sha256."""
    path = root / f"step-{step:08d}"
    (path / "model").mkdir(parents=True)
    (path / "model" / "config.json").write_text(json.dumps({"step": step}))
    (path / "state.json").write_text(json.dumps({"step": step}))
    if big_mib:
        (path / "model" / "model.safetensors").write_bytes(os.urandom(big_mib * 2**20))
    files = {str(p.relative_to(path)): sha256_file(p) for p in sorted(path.rglob("*")) if p.is_file()}
    (path / MANIFEST).write_text(json.dumps({"step": step, "files": files}))
    return path


class Crash(Exception):
    """Stands for the process dying mid-upload (not something botocore retries)."""


def fail_on(client, operation: str, nth: int):
    """Raise Crash on the nth call of `operation` (UploadPart, PutObject, ...)."""
    calls = {"n": 0}

    def hook(**kwargs):
        calls["n"] += 1
        if calls["n"] == nth:
            raise Crash(f"{operation} #{nth}")

    client.meta.events.register(f"before-send.s3.{operation}", hook)
    return calls


def test_upload_list_download_roundtrip_with_multipart(s3, tmp_path):
    store = S3CheckpointStore(f"s3://{BUCKET}/runs/r1/checkpoints", part_bytes=5 * 2**20)
    local = make_checkpoint(tmp_path / "local", 10, big_mib=12)  # 12 MiB: three 5 MiB parts
    parts = {"n": 0}
    s3_client = store.client
    s3_client.meta.events.register("before-send.s3.UploadPart", lambda **kw: parts.__setitem__("n", parts["n"] + 1))
    uri = store.upload(local)
    assert uri == f"s3://{BUCKET}/runs/r1/checkpoints/step-00000010"
    assert parts["n"] == 3
    assert store.complete() == [(10, "step-00000010")] and store.latest() == "step-00000010"
    back = store.download("step-00000010", tmp_path / "back" / "step-00000010")
    assert verify(back) is None
    assert (back / "model" / "model.safetensors").read_bytes() == (local / "model" / "model.safetensors").read_bytes()
    manifest = s3.get_object(Bucket=BUCKET, Key="runs/r1/checkpoints/step-00000010/manifest.json")["Body"].read().decode()
    assert "testing" not in manifest and "AWS" not in manifest  # no credential ever written


def test_a_crash_mid_upload_leaves_no_visible_checkpoint_and_resume_takes_the_previous(s3, tmp_path):
    store = S3CheckpointStore(f"s3://{BUCKET}/runs/r2", part_bytes=5 * 2**20)
    store.upload(make_checkpoint(tmp_path / "local", 1, big_mib=6))
    crashing = S3CheckpointStore(f"s3://{BUCKET}/runs/r2", part_bytes=5 * 2**20)
    fail_on(crashing.client, "UploadPart", 2)  # the second part of step 2's big file
    with pytest.raises(Crash):
        crashing.upload(make_checkpoint(tmp_path / "local", 2, big_mib=12))
    reader = S3CheckpointStore(f"s3://{BUCKET}/runs/r2")
    assert reader.complete() == [(1, "step-00000001")]
    assert reader.latest() == "step-00000001"
    # the manifest is the last object: a crash just before it leaves every file there and still nothing visible
    last = S3CheckpointStore(f"s3://{BUCKET}/runs/r2", part_bytes=5 * 2**20)
    step3 = make_checkpoint(tmp_path / "local3", 3)
    n_files = len(json.loads((step3 / MANIFEST).read_text())["files"])
    fail_on(last.client, "PutObject", n_files + 1)  # every file is up; the manifest's PUT dies
    with pytest.raises(Crash):
        last.upload(step3)
    assert reader.latest() == "step-00000001"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="runs/r2/step-00000003/").get("Contents", [])]
    assert keys and not any(k.endswith(MANIFEST) for k in keys)
    assert verify(reader.download("step-00000001", tmp_path / "resume" / "step-00000001")) is None


def test_transient_errors_are_retried_with_backoff(s3, tmp_path):
    """S3 answering 503 SlowDown twice: botocore retries and the upload completes."""
    from botocore.awsrequest import AWSResponse

    class Raw:
        def __init__(self, body: bytes):
            self.body = body

        def stream(self, **kwargs):
            yield self.body

    store = S3CheckpointStore(f"s3://{BUCKET}/runs/r3")
    seen = {"n": 0}

    def slow_down(request, **kwargs):
        seen["n"] += 1
        if seen["n"] <= 2:
            return AWSResponse(request.url, 503, {}, Raw(b"<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>"))
        return None

    store.client.meta.events.register("before-send.s3.PutObject", slow_down)
    store.upload(make_checkpoint(tmp_path / "local", 5))
    assert seen["n"] > 2 and store.latest() == "step-00000005"


def test_keep_last_k_prunes_manifest_first_and_spares_a_newer_upload_in_flight(s3, tmp_path):
    store = S3CheckpointStore(f"s3://{BUCKET}/runs/r4", keep_last=2)
    for step in (1, 2, 3):
        store.upload(make_checkpoint(tmp_path / "local", step))
    crashing = S3CheckpointStore(f"s3://{BUCKET}/runs/r4")
    fail_on(crashing.client, "PutObject", 3)  # two files up, the manifest's PUT dies
    with pytest.raises(Crash):
        crashing.upload(make_checkpoint(tmp_path / "local4", 4))  # step 4: files there, no manifest (in flight)
    deleted = []
    store.client.meta.events.register("before-send.s3.DeleteObject", lambda request, **kw: deleted.append(request.url))
    assert store.prune() == ["step-00000001"]
    assert deleted and deleted[0].endswith("step-00000001/manifest.json")
    assert [n for _, n in store.complete()] == ["step-00000002", "step-00000003"]
    assert any(n == "step-00000004" for _, n in store._step_prefixes())  # newer than the newest complete: kept


def test_bad_addresses_and_incomplete_local_checkpoints_are_refused(s3, tmp_path):
    with pytest.raises(StorageError, match="not a valid S3 bucket name"):
        split_s3("s3://Bad_Bucket/x")
    with pytest.raises(StorageError, match="not an s3"):
        split_s3("/fsx/x")
    broken = make_checkpoint(tmp_path / "local", 7)
    (broken / "state.json").write_text("changed after the manifest")
    with pytest.raises(StorageError, match="does not match its hash"):
        S3CheckpointStore(f"s3://{BUCKET}/runs/r5").upload(broken)
    with pytest.raises(StorageError, match="NoSuchBucket"):
        S3CheckpointStore("s3://no-such-bucket-here/x").upload(make_checkpoint(tmp_path / "l2", 1))


def test_json_documents_local_and_s3(s3, tmp_path):
    for address in (str(tmp_path / "reg" / "registry.json"), f"s3://{BUCKET}/registry/registry.json"):
        assert read_json(address) is None
        write_json(address, {"promoted": ["a"]})
        assert read_json(address) == {"promoted": ["a"]}


def test_grpo_checkpoints_go_to_s3_and_a_new_pod_resumes_from_there(s3, small_mazes, tmp_path):
    """In-process GRPO with checkpoint_uri: every checkpoint is uploaded; a fresh output folder (a new
    pod, a lost node) resumes from the newest complete one on S3 and continues."""
    from mazerl.metrics import read_metrics
    from mazerl.rl.config import GRPOConfig
    from mazerl.rl.trainer import GRPOTrainer

    def cfg(out, steps):
        return GRPOConfig.model_validate({
            "policy": {"model": "tiny-base"}, "train_data": str(small_mazes / "train.parquet"), "output_dir": str(out),
            "steps": steps, "mazes_per_step": 2, "group_size": 2, "max_turns": 3, "micro_batch": 8, "eval_every": 0,
            "checkpoint_every": 1, "keep_checkpoints": 2, "checkpoint_uri": f"s3://{BUCKET}/runs/grpo/checkpoints"})

    GRPOTrainer(cfg(tmp_path / "pod1", 2)).run(resume="never")
    store = S3CheckpointStore(f"s3://{BUCKET}/runs/grpo/checkpoints")
    assert [n for _, n in store.complete()] == ["step-00000001", "step-00000002"]
    record = GRPOTrainer(cfg(tmp_path / "pod2", 3)).run(resume="auto")
    assert record["step"] == 3
    assert [r["step"] for r in read_metrics(tmp_path / "pod2" / "metrics.jsonl")] == [3]
    assert [n for _, n in store.complete()] == ["step-00000002", "step-00000003"]  # keep_checkpoints on S3 too
    events = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="runs/grpo/tensorboard/").get("Contents", [])]
    assert any("events.out.tfevents" in k for k in events)  # TensorBoard next to the checkpoints


def test_a_bad_checkpoint_uri_is_refused_in_the_config():
    from pydantic import ValidationError

    from mazerl.rl.config import GRPOConfig

    with pytest.raises(ValidationError, match="checkpoint_uri.*not a valid S3 bucket name"):
        GRPOConfig.model_validate({"policy": {"model": "tiny-base"}, "train_data": "x.parquet", "output_dir": "o",
                                   "checkpoint_uri": "s3://UPPER/x"})


# compare's result as promote needs it (a decision and a split's figures: the model card is rendered from it)
COMPARISON = {"decision": {"success_diff": 0.2, "p_value": 0.003, "improved": True},
              "splits": {"heldout": {"mazes": 500, "success_base": 0.44, "success_new": 0.64, "mcnemar_p": 0.003}}}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_the_promotion_registry_works_on_s3_and_on_local_or_fsx_paths(s3, tmp_path, where, monkeypatch):
    """promote() keeps the model where the registry is (a task's output folder is pod-local on a
    cluster), and the next run starts from it."""
    monkeypatch.setenv("MAZERL_MODEL_CACHE", str(tmp_path / "model-cache"))
    from mazerl.workflow import promote, read_registry, resolve_base_model

    model = tmp_path / "task-output" / "final"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"a": 1}')
    (model / "model.safetensors").write_bytes(b"weights")
    root = str(tmp_path / "registry") if where == "local" else f"s3://{BUCKET}/registry"
    assert read_registry(root) is None
    entry = promote(str(model), root, COMPARISON, "hash1", "run-1")
    assert read_registry(root)["model"] == entry["model"]
    if where == "s3":
        assert entry["model"] == f"s3://{BUCKET}/registry/models/run-1"
        assert not (Path.cwd() / "s3:").exists()  # the old bug: a local folder named "s3:"
    import shutil

    shutil.rmtree(tmp_path / "task-output")  # the task's pod is gone
    named = resolve_base_model("tiny-base", str(tmp_path / "next-run"), root)
    if where == "s3":
        # an address, not a folder of this pod, goes to the next step; each loading pod fetches its own copy
        from mazerl.policy.loading import resolve_model_name

        assert named == entry["model"] and not (tmp_path / "next-run").exists()
        start = Path(resolve_model_name(named))
        assert start.is_relative_to(tmp_path / "model-cache")
    else:
        start = Path(named)
    assert (start / "model.safetensors").read_bytes() == b"weights" and (start / "config.json").exists()
    second = promote(str(start), root, COMPARISON, "hash1", "run-2")
    assert read_registry(root)["history"][0]["run_id"] == "run-1" and second["run_id"] == "run-2"


def test_a_model_named_by_s3_address_is_fetched_once_checked_and_staged_for_rayjob_pods(s3, tmp_path, monkeypatch):
    from mazerl.policy.loading import resolve_model_name
    from mazerl.storage import StorageError
    from mazerl.workflow import promote

    monkeypatch.setenv("MAZERL_MODEL_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "final"
    model.mkdir()
    (model / "config.json").write_text('{"a": 1}')
    (model / "model.safetensors").write_bytes(b"weights")
    uri = promote(str(model), f"s3://{BUCKET}/registry", COMPARISON, "hash1", "run-9")["model"]
    local = Path(resolve_model_name(uri))
    assert (local / "model.safetensors").read_bytes() == b"weights"
    (local / "model.safetensors").write_bytes(b"kept")  # a second load reuses the copy instead of downloading again
    assert Path(resolve_model_name(uri)) == local and (local / "model.safetensors").read_bytes() == b"kept"
    with pytest.raises(StorageError, match="no manifest"):
        resolve_model_name(f"s3://{BUCKET}/registry/models/never-uploaded")
    assert not any(p.name != local.name for p in (tmp_path / "cache").iterdir())  # nothing half-written left behind


def test_rayjob_staging_puts_a_promoted_s3_model_on_fsx_for_every_pod(s3, small_mazes, tmp_path, monkeypatch):
    import yaml

    from mazerl.cluster.train_step import stage_run
    from mazerl.profiles import load_profile
    from mazerl.workflow import promote

    monkeypatch.setenv("MAZERL_MODEL_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "final"
    model.mkdir()
    (model / "config.json").write_text('{"a": 1}')
    (model / "model.safetensors").write_bytes(b"weights")
    uri = promote(str(model), f"s3://{BUCKET}/registry", COMPARISON, "hash1", "run-1")["model"]
    base = load_profile("hyperpod-p5")
    profile = base.model_copy(update={"storage": base.storage.model_copy(update={"fsx_mount_path": str(tmp_path / "fsx")})})
    run, config = stage_run(profile, "run-2", uri, str(small_mazes), "tiny-grpo", {})
    assert (run / "base-model" / "model.safetensors").read_bytes() == b"weights"
    assert yaml.safe_load(config.read_text())["policy"]["model"] == str(run / "base-model")
    assert not (tmp_path / "cache").exists()  # the launcher's pod did not keep a copy of its own
