"""Hostile input (issue #32): checkpoints and model files. A manifest vouches for exactly the files of
its folder (an empty or misshapen one vouches for nothing); a damaged or foreign model file is named;
faults while writing (SIGTERM, a full disk), an unreachable S3 and a missing GPU are one clear message,
and nothing half-written is left behind."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.errors import UserError
from mazerl.policy import loading
from mazerl.policy.loading import PolicyLoadError, load_policy, packaged_model_dir
from mazerl.rl.checkpoint import MANIFEST, verify

from conftest import S3_TEST_BUCKET
from conftest import assert_clear_error

runner = CliRunner()
SETTINGS = settings(max_examples=int(os.environ.get("MAZERL_PROPERTY_EXAMPLES", "40")), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def run(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def grpo_config(model: Path, mazes: Path, out: Path, path: Path, **over) -> Path:
    """A one-step GRPO config on the tiny model, written as YAML for the command line."""
    raw = {"policy": {"model": str(model), "history": {"turns": 0, "images": 1}, "render_scale": 1.28, "max_new_tokens": 6,
                      "prompt": "short"},
           "train_data": str(mazes / "train.parquet"), "output_dir": str(out), "steps": 1, "mazes_per_step": 1,
           "group_size": 2, "eval_every": 0, "checkpoint_every": 1, "max_turns": 2}
    raw.update(over)
    path.write_text(yaml.safe_dump(raw))
    return path


def leftovers(folder: Path) -> list[str]:
    """Temporary files or folders the atomic writers would leave behind if they did not clean up."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.endswith((".tmp", ".old")))


# ------------------------------------------------------------------------------ manifests, every kind


def small_folder(root: Path) -> Path:
    """A checkpoint-shaped folder of small files and its correct manifest."""
    (root / "model").mkdir(parents=True)
    (root / "model" / "config.json").write_text('{"model_type": "qwen3_vl"}')
    (root / "model" / "model.safetensors").write_bytes(b"weights" * 10)
    (root / "state.json").write_text('{"step": 1}')
    files = {str(p.relative_to(root)): sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}
    (root / MANIFEST).write_text(json.dumps({"step": 1, "files": files}))
    return root


def correct_files(root: Path) -> dict[str, str]:
    return json.loads((root / MANIFEST).read_text())["files"]


HEX = "0123456789abcdef"
BAD_PATHS = st.sampled_from(["/etc/passwd", "../outside", "model/../../x", "", ".", "model/", "a\\..\\b", "manifest.json"])
BAD_DIGESTS = st.one_of(st.none(), st.integers(), st.text(max_size=10), st.text(alphabet=HEX, min_size=63, max_size=63),
                        st.just("F" * 64), st.lists(st.just("0" * 64), max_size=1))
JUNK = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=6), st.lists(st.text(max_size=4), max_size=3),
                 st.just({}))


@st.composite
def wrong_manifest(draw, files: dict[str, str]) -> bytes:
    """Anything but the exact manifest: unreadable bytes, other JSON, or a `files` mapping that is
    empty, misshapen, or not the folder's own list."""
    kind = draw(st.sampled_from(["binary", "not json", "not an object", "files junk", "drop", "add", "digest",
                                 "bad path", "bad digest"]))
    files = dict(files)
    if kind == "binary":
        return b"\xff\xfe" + draw(st.binary(max_size=20))
    if kind == "not json":
        return draw(st.sampled_from([b"", b"{", b"files: {}", b"{'files': {}}", b"\x00\x01"]))
    if kind == "not an object":
        return json.dumps(draw(st.one_of(st.lists(st.integers(), max_size=3), st.integers(), st.text(max_size=5), st.none()))).encode()
    if kind == "files junk":
        return json.dumps({"step": 1, "files": draw(JUNK)}).encode()
    if kind == "drop":  # an unlisted file: the manifest no longer vouches for it
        files.pop(draw(st.sampled_from(sorted(files))))
    elif kind == "add":
        files[draw(st.sampled_from(["model/extra.safetensors", "other.json", "state.json.bak"]))] = "0" * 64
    elif kind == "digest":
        rel = draw(st.sampled_from(sorted(files)))
        files[rel] = draw(st.text(alphabet=HEX, min_size=64, max_size=64).filter(lambda d: d != files[rel]))
    elif kind == "bad path":
        files[draw(BAD_PATHS)] = "0" * 64
    else:
        files[draw(st.sampled_from(sorted(files)))] = draw(BAD_DIGESTS)
    return json.dumps({"step": 1, "files": files}).encode()


@SETTINGS
@given(data=st.data())
def test_a_checkpoint_is_trusted_only_with_its_exact_manifest(tmp_path_factory, data):
    folder = small_folder(tmp_path_factory.mktemp("ckpt") / "step-00000001")
    assert verify(folder) is None
    bad = data.draw(wrong_manifest(correct_files(folder)))
    (folder / MANIFEST).write_bytes(bad)
    problem = verify(folder)
    assert problem is not None and problem.strip()


@pytest.mark.parametrize("files", [{}, [], "all", None])
def test_an_empty_or_misshapen_file_list_vouches_for_nothing(tmp_path, files):
    folder = small_folder(tmp_path / "step-00000001")
    (folder / MANIFEST).write_text(json.dumps({"step": 1, "files": files}))
    problem = verify(folder)
    assert problem is not None and "files" in problem and str(folder / MANIFEST) in problem


def test_an_unlisted_weight_file_is_refused(tmp_path):
    folder = small_folder(tmp_path / "step-00000001")
    (folder / "model" / "model-00002.safetensors").write_bytes(b"planted")
    problem = verify(folder)
    assert problem is not None and "model/model-00002.safetensors" in problem and "not listed" in problem


def test_a_binary_or_non_json_manifest_is_named(tmp_path):
    folder = small_folder(tmp_path / "step-00000001")
    (folder / MANIFEST).write_bytes(b"\x89PNG\r\n\x1a\n\xff\xff")
    problem = verify(folder)
    assert str(folder / MANIFEST) in problem and "UTF-8" in problem
    (folder / MANIFEST).write_text("files: {}")
    problem = verify(folder)
    assert str(folder / MANIFEST) in problem and "JSON" in problem


@pytest.fixture(scope="module")
def real_checkpoint(tiny_model_dir, small_mazes, tmp_path_factory) -> tuple[Path, Path]:
    """(config, checkpoint) of a real GRPO run's checkpoint on the tiny model, saved before any step."""
    from mazerl.config import load_config
    from mazerl.rl.config import GRPOConfig
    from mazerl.rl.trainer import GRPOTrainer

    root = tmp_path_factory.mktemp("grpo")
    cfg_path = grpo_config(tiny_model_dir, small_mazes, root / "run", root / "grpo.yaml")
    trainer = GRPOTrainer(load_config(GRPOConfig, cfg_path, {}))
    return cfg_path, trainer.save_checkpoint()


def tamper(weights: Path) -> None:
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))


@pytest.mark.parametrize("files", [{}, ["model/model.safetensors"]])
def test_resume_refuses_tampered_weights_under_an_empty_or_misshapen_manifest(real_checkpoint, tmp_path, files):
    cfg, checkpoint = real_checkpoint
    copy = tmp_path / checkpoint.name
    shutil.copytree(checkpoint, copy)
    tamper(copy / "model" / "model.safetensors")
    manifest = json.loads((copy / MANIFEST).read_text())
    (copy / MANIFEST).write_text(json.dumps({**manifest, "files": files}))
    result = run("train", "grpo", "--config", cfg, "--resume", copy, "--set", f"output_dir={tmp_path / 'out'}")
    assert_clear_error(result, "cannot be trusted", str(copy / MANIFEST))
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_a_sharded_checkpoint_with_an_empty_manifest_is_refused(tmp_path):
    from mazerl.distributed.checkpoint import load_sharded
    from mazerl.rl.checkpoint import CheckpointMismatchError

    folder = small_folder(tmp_path / "step-00000001")
    (folder / MANIFEST).write_text(json.dumps({"step": 1, "files": {}}))
    with pytest.raises(CheckpointMismatchError, match="cannot be trusted.*empty"):
        load_sharded(folder, model=None, optimizer=None, scheduler=None)


@pytest.fixture()
def fake_tiny_base(tmp_path, monkeypatch) -> Path:
    """A packaged `tiny-base` of small files with a correct provenance.json, in place of the shipped one."""
    folder = tmp_path / "assets" / "tiny-base"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "qwen3_vl"}')
    (folder / "model.safetensors").write_bytes(b"weights" * 10)
    files = {p.name: sha256(p) for p in sorted(folder.iterdir())}
    (folder / "provenance.json").write_text(json.dumps({"name": "tiny-base", "files": files}))
    monkeypatch.setattr(loading, "_assets_dir", lambda: tmp_path / "assets")
    assert packaged_model_dir("tiny-base") == folder
    return folder


@SETTINGS
@given(data=st.data())
def test_tiny_base_is_trusted_only_with_its_exact_provenance(fake_tiny_base, data):
    provenance = fake_tiny_base / "provenance.json"
    good = provenance.read_bytes()
    try:
        files = json.loads(good)["files"]
        provenance.write_bytes(data.draw(wrong_manifest(files)))
        with pytest.raises(PolicyLoadError, match="tiny-base"):
            packaged_model_dir("tiny-base")
    finally:
        provenance.write_bytes(good)


def test_tiny_base_with_an_empty_provenance_list_does_not_load_tampered_weights(fake_tiny_base):
    tamper(fake_tiny_base / "model.safetensors")
    provenance = fake_tiny_base / "provenance.json"
    provenance.write_text(json.dumps({"name": "tiny-base", "files": {}}))
    with pytest.raises(PolicyLoadError, match="empty"):
        packaged_model_dir("tiny-base")
    provenance.write_text(json.dumps({"name": "tiny-base", "files": ["model.safetensors"]}))
    with pytest.raises(PolicyLoadError, match="must be a mapping"):
        packaged_model_dir("tiny-base")


def _put_manifest(s3, name: str, body: bytes) -> None:
    s3.put_object(Bucket=S3_TEST_BUCKET, Key=f"models/{name}/config.json", Body=b'{"model_type": "qwen3_vl"}')
    s3.put_object(Bucket=S3_TEST_BUCKET, Key=f"models/{name}/{MANIFEST}", Body=body)


@pytest.mark.parametrize("body", [json.dumps({"files": {}}).encode(), json.dumps({"files": ["config.json"]}).encode(),
                                  b"\xff\xfe\x00binary", b"not json", json.dumps({"files": {"../../escape": "0" * 64}}).encode()])
def test_a_model_on_s3_with_a_misshapen_manifest_is_refused(s3, tmp_path, monkeypatch, body):
    from mazerl.storage import get_tree

    _put_manifest(s3, "m", body)
    with pytest.raises(UserError, match=f"s3://{S3_TEST_BUCKET}/models/m/{MANIFEST}"):
        get_tree(f"s3://{S3_TEST_BUCKET}/models/m", tmp_path / "m")
    assert not (tmp_path / "m").exists() and leftovers(tmp_path) == []


def test_an_empty_folder_is_not_uploaded_as_a_model(s3, tmp_path):
    from mazerl.storage import put_tree

    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="empty"):
        put_tree(tmp_path / "empty", f"s3://{S3_TEST_BUCKET}/models/empty")


# ------------------------------------------------------------------------------ damaged or foreign model files


def model_copy(tiny_model_dir: Path, where: Path) -> Path:
    shutil.copytree(tiny_model_dir, where)
    return where


def eval_model(model, small_mazes, out):
    return run("eval", "--model", model, "--data", small_mazes / "heldout.parquet", "--out", out)


@pytest.mark.parametrize("keep", [0.5, 0.001, 0.0])
def test_a_truncated_weights_file_is_named(tiny_model_dir, small_mazes, tmp_path, keep):
    model = model_copy(tiny_model_dir, tmp_path / "m")
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * keep)])
    result = eval_model(model, small_mazes, tmp_path / "e")
    assert_clear_error(result, str(weights), "damaged")
    assert "internal error" not in result.output and "SafetensorError" not in result.output
    assert not (tmp_path / "e").exists()


def test_a_truncated_checkpoint_weights_file_is_named(tiny_policy, tmp_path):
    from mazerl.rl.checkpoint import load_model_weights

    policy, _ = tiny_policy
    (tmp_path / "model").mkdir()
    weights = tmp_path / "model" / "model.safetensors"
    weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(UserError, match="model.safetensors"):
        load_model_weights(policy.model, tmp_path)


@pytest.mark.parametrize("change", [{"model_type": "llama"}, {"model_type": None}, {"model_type": 7}, "drop", "list"])
def test_a_model_of_another_architecture_says_what_is_supported(tiny_model_dir, small_mazes, tmp_path, change):
    model = model_copy(tiny_model_dir, tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    if change == "drop":
        config.pop("model_type")
    elif change == "list":
        config = [config]
    else:
        config.update(change)
    (model / "config.json").write_text(json.dumps(config))
    result = eval_model(model, small_mazes, tmp_path / "e")
    assert_clear_error(result, str(model / "config.json"), "qwen3_vl")
    assert "internal error" not in result.output and len(result.output.strip().splitlines()) <= 3


@pytest.mark.parametrize("content", [b"\xff\xfe\x00\x01", b"{not json"])
def test_an_unreadable_model_config_is_named(tiny_model_dir, small_mazes, tmp_path, content):
    model = model_copy(tiny_model_dir, tmp_path / "m")
    (model / "config.json").write_bytes(content)
    assert_clear_error(eval_model(model, small_mazes, tmp_path / "e"), str(model / "config.json"))


# ------------------------------------------------------------------------------ faults


SIGTERM_DURING_CHECKPOINT = textwrap.dedent("""
    # Run `mazerl` with the checkpoint writer held mid-write: the model files are in the temporary
    # directory, state.json not yet; a marker file says we got there, then SIGTERM arrives.
    import sys, time
    from pathlib import Path
    import mazerl.rl.checkpoint as checkpoint

    marker, real_write_json = Path(sys.argv[1]), checkpoint.write_json

    def held_write_json(path, obj):
        if Path(path).name == "state.json":
            marker.write_text("writing")
            time.sleep(600)
        real_write_json(path, obj)

    checkpoint.write_json = held_write_json
    from mazerl.cli import app
    sys.argv = ["mazerl", *sys.argv[2:]]
    app()
""")


def test_sigterm_during_a_checkpoint_write_cleans_up_and_says_so(tiny_model_dir, small_mazes, tmp_path):
    out = tmp_path / "run"
    cfg = grpo_config(tiny_model_dir, small_mazes, out, tmp_path / "g.yaml")
    marker, stdout, stderr = tmp_path / "writing", tmp_path / "stdout", tmp_path / "stderr"
    with open(stdout, "w") as so, open(stderr, "w") as se:
        proc = subprocess.Popen([sys.executable, "-c", SIGTERM_DURING_CHECKPOINT, str(marker), "train", "grpo", "--config", str(cfg)],
                                stdout=so, stderr=se, env={**os.environ, "MAZERL_ERROR_LOG_DIR": str(tmp_path / "logs")})
        try:
            for _ in range(3000):  # a guard against a hang (10 minutes), not a speed check
                if marker.exists() or proc.poll() is not None:
                    break
                try:
                    proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
            assert marker.exists(), f"the run never reached its checkpoint:\n{stdout.read_text()}\n{stderr.read_text()}"
            assert leftovers(out / "checkpoints"), "the checkpoint is not being written"
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    err, printed = stderr.read_text(), stdout.read_text()
    assert proc.returncode == 143, err
    assert "interrupted" in err.lower() and "SIGTERM" in err, err
    assert "Traceback" not in err + printed and "internal error" not in err
    assert leftovers(out) == [] and not any((out / "checkpoints").glob("step-*")), list(out.rglob("*"))


def test_sigterm_is_turned_into_an_interrupt_only_while_the_cli_runs():
    from mazerl.errors import Terminated, sigterm_as_interrupt

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), sigterm_as_interrupt():
        signal.raise_signal(signal.SIGTERM)
        for _ in range(1000):  # the Python-level handler runs between bytecodes, right after the signal
            pass
    assert signal.getsignal(signal.SIGTERM) is before
    assert issubclass(Terminated, KeyboardInterrupt)


def test_a_full_disk_during_a_checkpoint_is_bad_input_not_an_internal_error(tiny_model_dir, small_mazes, tmp_path, monkeypatch):
    import mazerl.rl.checkpoint as checkpoint

    def full_disk(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    out = tmp_path / "run"
    result = run("train", "grpo", "--config", grpo_config(tiny_model_dir, small_mazes, out, tmp_path / "g.yaml"))
    assert_clear_error(result, "no space left on the device", str(out / "checkpoints" / "step-00000001"))
    assert "internal error" not in result.output
    assert leftovers(out) == [] and not any((out / "checkpoints").glob("step-*"))


@pytest.mark.parametrize("error", [
    SafetensorError('Error while serializing: I/O error: No space left on device (os error 28)'),
    RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file data/0: file write failed")])
def test_a_full_disk_reported_by_the_weights_writer_is_named(tiny_policy, tmp_path, monkeypatch, error):
    """safetensors and torch report a full disk as errors of their own, not as an OSError."""
    import mazerl.rl.checkpoint as checkpoint
    from mazerl.rl.checkpoint import CheckpointManager

    def full_disk(*args, **kwargs):
        raise error

    policy, _ = tiny_policy
    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 0))
    with pytest.raises(OSError) as caught:
        CheckpointManager(tmp_path).save(1, policy.model, policy.processor, {}, {"step": 1})
    assert caught.value.errno == errno.ENOSPC and str(tmp_path / "step-00000001") in str(caught.value.filename)
    assert leftovers(tmp_path) == []


def closed_port() -> int:
    from mazerl.distributed.group import free_port

    return free_port()  # bound and released: nothing listens there


def no_aws(monkeypatch, tmp_path) -> None:
    """No credentials anywhere boto3 looks, and no instance metadata lookup (it would leave 127.0.0.1)."""
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it caches the credentials an earlier test found
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE",
                "AWS_ROLE_ARN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # one try: the endpoint is closed on purpose
    monkeypatch.setenv("MAZERL_MODEL_CACHE", str(tmp_path / "cache"))


def test_an_s3_model_without_credentials_is_one_clear_error(small_mazes, tmp_path, monkeypatch):
    no_aws(monkeypatch, tmp_path)
    result = eval_model("s3://mazerl-models/models/run-1", small_mazes, tmp_path / "e")
    assert_clear_error(result, "s3://mazerl-models/models/run-1", "credentials", "AWS_ACCESS_KEY_ID")
    assert "internal error" not in result.output


def test_an_s3_model_behind_an_unreachable_endpoint_is_one_clear_error(small_mazes, tmp_path, monkeypatch):
    no_aws(monkeypatch, tmp_path)
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    result = eval_model("s3://mazerl-models/models/run-1", small_mazes, tmp_path / "e")
    assert_clear_error(result, "s3://mazerl-models/models/run-1", endpoint, "AWS_ENDPOINT_URL")
    assert "internal error" not in result.output


def test_cuda_on_a_machine_without_a_gpu_is_a_clear_error(tiny_model_dir, small_mazes, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = grpo_config(tiny_model_dir, small_mazes, tmp_path / "run", tmp_path / "g.yaml")
    result = run("train", "grpo", "--config", cfg, "--set", "policy.device=cuda")
    assert_clear_error(result, "no CUDA device", "use cpu")
    assert "internal error" not in result.output and not (tmp_path / "run" / "metrics.jsonl").exists()
    with pytest.raises(PolicyLoadError, match="no CUDA device"):
        load_policy(tiny_model_dir, device="cuda:0")


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cuda:-1", "", "tpu:0"])
def test_a_device_that_is_not_one_is_refused_at_config_load(tiny_model_dir, small_mazes, tmp_path, device):
    cfg = grpo_config(tiny_model_dir, small_mazes, tmp_path / "run", tmp_path / "g.yaml")
    raw = yaml.safe_load(cfg.read_text())
    raw["policy"]["device"] = device
    cfg.write_text(yaml.safe_dump(raw))
    assert_clear_error(run("train", "grpo", "--config", cfg), "policy.device", "cpu", "cuda")


def test_a_trailing_newline_does_not_pass_a_pattern_check():
    """`re.match` with `$` accepts a final newline: every validator here matches the whole value."""
    from mazerl.integrity import ManifestError, check_file_list
    from mazerl.policy.loading import check_device_name
    from mazerl.rl.checkpoint import _STEP_DIR

    with pytest.raises(ManifestError):
        check_file_list({"model.safetensors": "0" * 64 + "\n"}, "manifest.json")
    assert check_file_list({"model.safetensors": "0" * 64}, "manifest.json")
    with pytest.raises(ValueError, match="is not a device"):
        check_device_name("cuda\n")
    assert _STEP_DIR.fullmatch("step-00000001\n") is None and _STEP_DIR.fullmatch("step-00000001")
