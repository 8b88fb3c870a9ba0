def promote(model: str, registry_root: str, eval_splits_hash: str, success_diff: float, p_value: float) -> str:
    """Record the trained model as the promoted one in the registry pointer.

    Args:
        model: trained model directory.
        registry_root: registry root (the profile's storage root).
        eval_splits_hash: hash of the frozen evaluation splits it was judged on.
        success_diff: heldout success gain over the baseline.
        p_value: exact McNemar p-value of that gain.
    Returns:
        Path of the registry pointer.
    """
    from pathlib import Path

    from mazerl.workflow import REGISTRY_FILE
    from mazerl.workflow import promote as run

    run(model, registry_root, {"decision": {"success_diff": success_diff, "p_value": p_value}}, eval_splits_hash, run_id="kfp")
    return str(Path(registry_root) / REGISTRY_FILE)


def cleanup(backend: str) -> str:
    """Exit handler: delete resources launched for this run (none with the local backend).

    Args:
        backend: the profile's training backend.
    Returns:
        What was cleaned up.
    """
    from mazerl.workflow import cleanup_launched

    return cleanup_launched(backend)
