"""The mazerl DAG:
    draw_train_seed -> generate_mazes -> resolve_model -> warm_start (off for tiny-base) -> [evaluate (baseline)]
                                                  -> train_grpo -> [evaluate (trained)]
                   -> compare (heldout gain and the guards) -> If(compare's output == 1) -> promote
    inside an ExitHandler whose cleanup deletes launched resources (nothing locally).

Generation is cached (same preset + seeds = same splits); training and evaluation are not. Both
evaluations show the mazes as the GRPO job does (its config), and both run on the profile's
eval_engine (vllm: in the trainer image), so the pair can be compared.
`model_view` ('' = the starting model's own mazerl_policy.json) names the view (policy.views) of a starting
model trained elsewhere: warm start, training and both evaluations take it where the model's file would be.
Steps that can hit transient faults (storage, cluster) retry. The branch is on a number.
"""


from kfp import dsl

from .. import components
from ..profiles import Profile


def build_pipeline(profile: Profile):
    # evaluation with vLLM runs in the trainer image (the runtime image has no vLLM); on a local profile the
    # image is unused (kfp.local runs components in this Python)
    vllm_image = profile.images.trainer if profile.eval_engine == "vllm" and profile.kind == "hyperpod" else None
    comps = components.build(profile.images.runtime, evaluate_image=vllm_image)
    defaults = profile.pipeline

    @dsl.pipeline(name="mazerl", description="Multi-turn GRPO of a vision-language model on mazes, evaluated on held-out mazes")
    def mazerl_pipeline(
        model: str = defaults.model,
        model_view: str = "",
        dataset_preset: str = defaults.dataset_preset,
        reference: str = "visgym",
        train_seed: int = -1,
        warm_start: bool = defaults.warm_start,
        sft_config: str = defaults.sft_config or "",
        grpo_config: str = defaults.grpo_config,
        sft_steps: int = 0,
        grpo_steps: int = 0,
        heldout_mazes: int = defaults.eval_heldout_mazes,
        other_mazes: int = defaults.eval_other_mazes,
        reference_mazes: int = 0,
        min_gain: float = defaults.min_gain,
        max_p_value: float = defaults.max_p_value,
        guards: bool = True,
        guard_p_value: float = 0.05,
        guard_margin: float = 0.10,
        guard_success_tolerance: float = 0.0,
        guard_loop_tolerance: float = 0.0,
        guard_wall_bump_tolerance: float = 0.0,
        guard_steps_tolerance: float = 0.05,
        guard_splits: str = "",
        guard_loop_splits: str = "heldout",
        registry_root: str = profile.storage.root,
    ):
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        profile_json = profile.model_dump_json()  # compile-time settings the cluster steps need (no credentials)
        cleanup = comps["cleanup"](backend=profile.backend, run_id=run_id, profile=profile_json)
        with dsl.ExitHandler(cleanup, name="run"):
            seed = comps["draw_train_seed"](train_seed=train_seed, run_id=run_id).set_caching_options(False)
            gen = comps["generate_mazes"](preset=dataset_preset, reference=reference, train_seed=seed.output, registry_root=registry_root)
            gen.set_caching_options(True).set_retry(2)
            start = comps["resolve_model"](model=model, registry_root=registry_root).set_caching_options(False)
            warm = comps["warm_start"](model=start.outputs["Output"], mazes=gen.outputs["mazes"], config=sft_config, enabled=warm_start,
                                  steps=sft_steps, run_id=run_id, profile=profile_json, model_view=model_view)
            warm.set_caching_options(False)
            baseline = comps["evaluate"](model=warm.outputs["Output"], mazes=gen.outputs["mazes"], heldout_mazes=heldout_mazes,
                                         other_mazes=other_mazes, reference_mazes=reference_mazes, training_log="", label="baseline",
                                         config=grpo_config, engine=profile.eval_engine, model_view=model_view).set_caching_options(False)
            baseline.set_display_name("evaluate-baseline")
            train = comps["train_grpo"](model=warm.outputs["Output"], mazes=gen.outputs["mazes"], config=grpo_config, steps=grpo_steps,
                                        backend=profile.backend, run_id=run_id, profile=profile_json, model_view=model_view)
            train.set_caching_options(False).set_retry(1)
            trained = comps["evaluate"](model=train.outputs["model"], mazes=gen.outputs["mazes"], heldout_mazes=heldout_mazes,
                                        other_mazes=other_mazes, reference_mazes=reference_mazes, training_log=train.outputs["training_log"],
                                        label="trained", config=grpo_config, engine=profile.eval_engine,
                                        model_view=model_view).set_caching_options(False)
            trained.set_display_name("evaluate-trained")
            decision = comps["compare"](base=baseline.outputs["results"], new=trained.outputs["results"],
                                        min_gain=min_gain, max_p_value=max_p_value, guards=guards,
                                        guard_p_value=guard_p_value, guard_margin=guard_margin,
                                        guard_success_tolerance=guard_success_tolerance,
                                        guard_loop_tolerance=guard_loop_tolerance,
                                        guard_wall_bump_tolerance=guard_wall_bump_tolerance,
                                        guard_steps_tolerance=guard_steps_tolerance,
                                        guard_splits=guard_splits,
                                        guard_loop_splits=guard_loop_splits).set_caching_options(False)
            with dsl.If(decision.outputs["Output"] == 1, name="improved"):
                promote = comps["promote"](model=train.outputs["model"], registry_root=registry_root, eval_splits_hash=gen.outputs["Output"],
                                 comparison=decision.outputs["result"],
                                 run_id=run_id, profile=profile_json,
                                 # the run's facts and parameters, for the promoted model's card
                                 mazes=gen.outputs["mazes"], base_model=start.outputs["Output"], train_seed=seed.output,
                                 model_parameter=model, model_view=model_view, dataset_preset=dataset_preset,
                                 reference=reference, warm_start=warm_start, sft_config=sft_config, grpo_config=grpo_config,
                                 sft_steps=sft_steps, grpo_steps=grpo_steps, heldout_mazes=heldout_mazes,
                                 other_mazes=other_mazes, reference_mazes=reference_mazes).set_retry(2)
        if profile.kind == "hyperpod":
            if profile.backend == "rayjob":
                # train and cleanup are small CPU pods that drive the RayJob: FSx only, no GPU-node selectors,
                # and no Kueue labels (the RayJob is the workload Kueue admits; the launcher must not queue too)
                _apply_cluster_settings(profile, [seed, gen, start, warm, baseline, trained, decision, promote])
                _apply_cluster_settings(profile, [train, cleanup], scheduling=False)
                # the train pod's name, uid and namespace (downward API): the RayJob's owner reference
                from kfp import kubernetes

                from ..cluster.rayjob import POD_ENV_FIELDS

                for env_name, field_path in POD_ENV_FIELDS.items():
                    kubernetes.use_field_path_as_env(train, env_name=env_name, field_path=field_path)
            else:
                _apply_cluster_settings(profile, [seed, gen, start, warm, baseline, train, trained, decision, promote, cleanup])
            if profile.task_gpus and profile.backend == "local":  # the model runs inside these pods
                for task in (warm, baseline, train, trained):
                    task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(profile.task_gpus)
            if profile.eval_gpus and profile.backend == "rayjob":  # training is the RayJob's; evaluation needs a GPU too
                for task in (warm, baseline, trained):
                    task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(profile.eval_gpus)

    return mazerl_pipeline


def _apply_cluster_settings(profile: Profile, tasks, scheduling: bool = True) -> None:
    """kfp-kubernetes: FSx claim, and (`scheduling`) node selectors, tolerations and Kueue labels on each task pod."""
    from kfp import kubernetes

    for task in tasks:
        if profile.storage.fsx_claim:
            kubernetes.mount_pvc(task, pvc_name=profile.storage.fsx_claim, mount_path=profile.storage.fsx_mount_path)
        if not scheduling:
            continue
        for key, value in profile.node_selector.items():
            kubernetes.add_node_selector(task, label_key=key, label_value=value)
        for t in profile.tolerations:
            kubernetes.add_toleration(task, key=t.key, operator=t.operator, value=t.value, effect=t.effect)
        if profile.kueue:
            kubernetes.add_pod_label(task, label_key="kueue.x-k8s.io/queue-name", label_value=profile.kueue.queue_name)
            if profile.kueue.priority_class:
                kubernetes.add_pod_label(task, label_key="kueue.x-k8s.io/priority-class", label_value=profile.kueue.priority_class)
