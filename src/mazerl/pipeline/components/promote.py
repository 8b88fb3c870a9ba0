from kfp.dsl import Dataset, Input


def promote(model: str, registry_root: str, eval_splits_hash: str, comparison: Input[Dataset], run_id: str,
            profile: str) -> str:
    """Record the trained model as the promoted one in the registry pointer (and, on a profile with a
    sagemaker.model_package_group, as a model package in SageMaker's Model Registry).

    Args:
        model: trained model directory.
        registry_root: registry root (the profile's storage root).
        eval_splits_hash: hash of the frozen evaluation splits it was judged on.
        comparison: compare's result (comparison.json: the decision and every split's figures, kept with
            the promotion and attached to the SageMaker model package).
        run_id: the KFP run id (the promoted model is kept under it).
        profile: the deployment profile as JSON (its sagemaker settings).
    Returns:
        Where the promoted model now lives.
    """
    from mazerl.workflow import promote as run, read_comparison

    entry = run(model, registry_root, read_comparison(comparison.path), eval_splits_hash, run_id=run_id, profile_json=profile)
    return entry["model"]


def cleanup(backend: str, run_id: str, profile: str) -> str:
    """Exit handler: delete resources launched for this run (rayjob: every RayJob labelled with the
    run id; none with the local and ray backends).

    Args:
        backend: the profile's training backend.
        run_id: the KFP run id the launched resources are labelled with.
        profile: the deployment profile as JSON (namespace).
    Returns:
        What was cleaned up.
    """
    from mazerl.workflow import cleanup_launched

    return cleanup_launched(backend, profile, run_id)
