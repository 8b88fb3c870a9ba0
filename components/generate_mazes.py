from kfp.dsl import Dataset, Output


def generate_mazes(preset: str, reference: str, train_seed: int, registry_root: str, mazes: Output[Dataset]) -> str:
    """Generate the frozen maze splits and this run's training pool.

    Args:
        preset: dataset preset (default | smoke).
        reference: path of a VisGym-format fixture for the reference splits ('' = none).
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
