from typing import NamedTuple

from kfp.dsl import Dataset, Input, Metrics, Model, Output


def train_grpo(model: str, mazes: Input[Dataset], config: str, steps: int, backend: str, run_id: str, profile: str,
               model_view: str,
               trained: Output[Model], metrics: Output[Metrics]) -> NamedTuple("Trained", [("model", str), ("training_log", str)]):
    """Multi-turn GRPO, run where the profile's backend says (local: in this task's process).

    Args:
        model: model to train (path or hub id).
        mazes: the dataset from generate_mazes.
        config: GRPO config YAML.
        steps: GRPO steps (0 = the config's).
        backend: the profile's training backend (see mazerl.workflow.TRAINING_BACKENDS).
        run_id: the KFP run id (rayjob: names the RayJob and the run directory on FSx).
        profile: the deployment profile as JSON (rayjob: the RayJob's shape, namespace, storage).
        model_view: a named view (visgym | mazerl) for a starting model without mazerl_policy.json ('' = the
            model's own): it fills the view settings the config leaves unset.
        trained: output directory: final/, metrics.jsonl (kfp.local: also checkpoints/, tensorboard/;
            on a cluster, every backend: a copy, and run.json, the pointer to the run directory on FSx
            where checkpoints live, and to the checkpoints on S3).
        metrics: headline numbers of the last step.
    Returns:
        model: path of the trained model (on a cluster: on FSx, which every task pod mounts); training_log:
            its metrics.jsonl, beside it.
    """
    import os
    from collections import namedtuple

    from mazerl.workflow import train_grpo as run

    extra = {"steps": steps} if steps > 0 else {}
    final, record = run(model, mazes.path, config, trained.path, extra, backend=backend, profile_json=profile, run_id=run_id,
                        model_view=model_view)
    for key in ("reward_mean", "success_rate", "entropy", "step"):
        if key in record:
            metrics.log_metric(key, float(record[key]))
    # beside the model: the artifact folder with kfp.local, the run directory on FSx on a cluster (the
    # later tasks' pods cannot see this pod's artifact folder)
    return namedtuple("Trained", ["model", "training_log"])(final, os.path.join(os.path.dirname(final), "metrics.jsonl"))
