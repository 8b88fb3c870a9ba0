from kfp.dsl import Dataset, Output


def draw_train_seed(train_seed: int, run_id: str) -> int:
    """The seed of this run's training pool.

    Args:
        train_seed: an explicit seed (>= 0, repeats a run's training mazes), or -1 for a fresh seed per run.
        run_id: the pipeline run's id (dsl.PIPELINE_JOB_ID_PLACEHOLDER).
    Returns:
        The seed to generate the training pool with.
    """
    from mazerl.workflow import train_seed_for_run

    return train_seed_for_run(train_seed, run_id)


def generate_mazes(preset: str, reference: str, train_seed: int, registry_root: str, mazes: Output[Dataset]) -> str:
    """Generate the frozen maze splits and this run's training pool.

    Args:
        preset: dataset preset (default | smoke).
        reference: VisGym reference splits: 'visgym' (the shipped 64 easy + 64 hard mazes), 'none', or a recording's path.
        train_seed: seed of the training pool (a fresh one per scheduled run).
        registry_root: promotion registry root; its eval_splits_hash must match ('' = none).
        mazes: output directory: one parquet per split + manifest.json.
    Returns:
        The evaluation splits' hash.
    """
    from mazerl.workflow import generate

    manifest = generate(mazes.path, preset, reference or None, train_seed, registry_root or None)
    mazes.metadata["eval_splits_hash"] = manifest["eval_splits_hash"]
    for name, info in manifest["splits"].items():
        mazes.metadata[f"rows/{name}"] = info["rows"]
    return manifest["eval_splits_hash"]
