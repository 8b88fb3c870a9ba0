from kfp.dsl import Dataset, Input


def promote(model: str, registry_root: str, eval_splits_hash: str, comparison: Input[Dataset], run_id: str,
            profile: str, mazes: Input[Dataset] = None, base_model: str = "", train_seed: int = -1,
            model_parameter: str = "", model_view: str = "", dataset_preset: str = "", reference: str = "",
            warm_start: bool = False, sft_config: str = "", grpo_config: str = "", sft_steps: int = 0,
            grpo_steps: int = 0, heldout_mazes: int = 0, other_mazes: int = 0, reference_mazes: int = 0) -> str:
    """Record the trained model as the promoted one in the registry pointer, with its model card
    (README.md in the promoted model's directory), and (on a profile with a
    sagemaker.model_package_group) as a model package in SageMaker's Model Registry, card included.

    Args:
        model: trained model directory.
        registry_root: registry root (the profile's storage root).
        eval_splits_hash: hash of the frozen evaluation splits it was judged on.
        comparison: compare's result (comparison.json: the decision and every split's figures, kept with
            the promotion, rendered in the card and attached to the SageMaker model package).
        run_id: the KFP run id (the promoted model is kept under it).
        profile: the deployment profile as JSON (its sagemaker settings).
        mazes: the dataset from generate_mazes (its manifest: the split hashes for the card).
        base_model: the model the run started from (resolve_model's output).
        train_seed: the seed the run's training pool was drawn with.
        model_parameter: the run's `model` parameter; '' = the run's parameters were not passed (no
            reproduction command in the card). The rest are the run's pipeline parameters of the same names.
    Returns:
        Where the promoted model now lives.
    """
    from mazerl.workflow import promote as run, read_comparison

    parameters = {}
    if model_parameter:
        parameters = {"model": model_parameter, "model_view": model_view, "dataset_preset": dataset_preset,
                      "reference": reference, "warm_start": warm_start, "sft_config": sft_config, "grpo_config": grpo_config,
                      "sft_steps": sft_steps, "grpo_steps": grpo_steps, "heldout_mazes": heldout_mazes,
                      "other_mazes": other_mazes, "reference_mazes": reference_mazes}
    facts = {"parameters": parameters, "base_model": base_model or None, "train_seed": train_seed if train_seed >= 0 else None,
             "data_dir": mazes.path if mazes is not None else None}
    entry = run(model, registry_root, read_comparison(comparison.path), eval_splits_hash, run_id=run_id, profile_json=profile,
                run=facts)
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
