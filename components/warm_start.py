from kfp.dsl import Dataset, Input, Model, Output


def resolve_model(model: str, registry_root: str, base_model: Output[Model]) -> str:
    """The model this run starts from: the last promoted one, else `model` ('tiny' builds it).

    Args:
        model: path or hub id of the base model, or 'tiny'.
        registry_root: promotion registry root ('' = none).
        base_model: output directory used when the tiny model is built.
    Returns:
        Path or hub id of the starting model.
    """
    from mazerl.workflow import resolve_base_model

    return resolve_base_model(model, base_model.path, registry_root or None)


def warm_start(model: str, mazes: Input[Dataset], config: str, enabled: bool, steps: int, run_id: str, profile: str,
               model_view: str, warm_model: Output[Model]) -> str:
    """Behaviour-cloning warm start on solver moves (for models without pretraining).

    Args:
        model: starting model (path, hub id or s3:// address).
        mazes: the dataset from generate_mazes.
        config: SFT config YAML.
        enabled: when False the starting model passes through unchanged.
        steps: behaviour-cloning steps (0 = the config's).
        run_id: the KFP run id (on a cluster: names the run directory on FSx).
        profile: the deployment profile as JSON (on a cluster the model is written to FSx).
        model_view: a named view (visgym | mazerl) for a starting model without mazerl_policy.json ('' = the
            model's own): it fills the view settings the config leaves unset.
        warm_model: output directory: the warm-started model (on a cluster: run.json, its FSx path).
    Returns:
        Path of the model GRPO starts from (on a cluster: on FSx, which every task pod mounts).
    """
    if not enabled:
        return model
    from mazerl.workflow import warm_start as run

    return run(model, mazes.path, config, warm_model.path, {"steps": steps} if steps > 0 else {},
               profile_json=profile, run_id=run_id, model_view=model_view)
