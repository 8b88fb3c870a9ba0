"""Steps that train inside their own KFP task pod on a cluster profile (backend local, as in
hyperpod-g5): they write to the run's directory on FSx, not to the pod-local artifact folder, so a
retried pod resumes from its checkpoints and the next step's pod can read the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mazerl.profiles import load_profile

RUN = "7a1e0c2d-aaaa-bbbb-cccc-ddddeeeeffff"
SMALL = {"steps": 2, "mazes_per_step": 2, "group_size": 2, "max_turns": 3, "eval_every": 0, "checkpoint_every": 1,
         "max_minutes": None}


def _g5_profile(tmp_path: Path, root: str) -> str:
    base = load_profile("hyperpod-g5")
    assert base.kind == "hyperpod" and base.backend == "local"
    return base.model_copy(update={"storage": base.storage.model_copy(
        update={"root": root, "fsx_mount_path": str(tmp_path / "fsx")})}).model_dump_json()


@pytest.mark.slow
def test_grpo_in_a_cluster_task_pod_checkpoints_on_fsx_and_s3_and_a_retry_resumes(s3, small_mazes, tmp_path):
    from conftest import S3_TEST_BUCKET

    from mazerl.metrics import read_metrics
    from mazerl.storage import S3CheckpointStore
    from mazerl.workflow import train_grpo

    profile = _g5_profile(tmp_path, f"s3://{S3_TEST_BUCKET}/g5")
    run_dir = tmp_path / "fsx" / "mazerl" / "runs" / RUN
    final, record = train_grpo("tiny-base", str(small_mazes), "tiny-grpo", str(tmp_path / "pod1"), SMALL,
                               backend="local", profile_json=profile, run_id=RUN)
    assert Path(final) == run_dir / "grpo" / "final" and (Path(final) / "config.json").is_file()
    assert (run_dir / "grpo" / "checkpoints").is_dir() and record["step"] == 2
    pointer = json.loads((tmp_path / "pod1" / "run.json").read_text())
    assert pointer["run_directory"] == str(run_dir) and pointer["checkpoint_uri"] == f"s3://{S3_TEST_BUCKET}/g5/runs/{RUN}/checkpoints"
    assert S3CheckpointStore(pointer["checkpoint_uri"]).latest() == "step-00000002"
    assert (tmp_path / "pod1" / "final" / "config.json").is_file()  # a copy for the pipeline UI's lineage
    # the task is retried in a fresh pod (a new, empty artifact folder) with a longer budget: it resumes
    final2, record2 = train_grpo("tiny-base", str(small_mazes), "tiny-grpo", str(tmp_path / "pod2"), {**SMALL, "steps": 3},
                                 backend="local", profile_json=profile, run_id=RUN)
    assert final2 == final and record2["step"] == 3
    assert [r["step"] for r in read_metrics(tmp_path / "pod2" / "metrics.jsonl") if "success_rate" in r] == [1, 2, 3]


def test_a_warm_start_in_a_cluster_task_pod_hands_its_model_over_fsx(small_mazes, tiny_model_dir, tmp_path):
    from mazerl.workflow import warm_start

    profile = _g5_profile(tmp_path, str(tmp_path / "root"))
    model = warm_start(str(tiny_model_dir), str(small_mazes), "tiny-sft", str(tmp_path / "artifact"), {"steps": 2, "batch_size": 4},
                       profile_json=profile, run_id=RUN)
    assert Path(model) == tmp_path / "fsx" / "mazerl" / "runs" / RUN / "warm-start" / "final"
    assert (Path(model) / "config.json").is_file()
    assert json.loads((tmp_path / "artifact" / "run.json").read_text()) == {"model": model}


def test_the_local_profile_keeps_everything_in_the_task_s_folder(small_mazes, tiny_model_dir, tmp_path):
    from mazerl.workflow import cluster_run_dir, warm_start

    assert cluster_run_dir(load_profile("local").model_dump_json(), RUN) is None and cluster_run_dir("", RUN) is None
    model = warm_start(str(tiny_model_dir), str(small_mazes), "tiny-sft", str(tmp_path / "artifact"), {"steps": 1, "batch_size": 4},
                       profile_json=load_profile("local").model_dump_json(), run_id=RUN)
    assert Path(model) == tmp_path / "artifact" / "final"
