"""The pipeline's steps as plain functions: each KFP component calls exactly one of these.

generate -> (baseline evaluation | warm start -> GRPO) -> evaluation -> comparison -> promotion.
Scheduled retraining: `resolve_base_model` starts from the last promoted model when the registry
has one; `generate` takes a fresh train seed per run while the evaluation splits stay frozen
(their `eval_splits_hash` is checked against the registry's).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import json
import time
from pathlib import Path

from .atomic import write_json
from .config import ConfigError, load_config
from .evaluation.guards import guard_settings
from .mazes.layout import MazeError
from .progress import PREFIX, Progress
from .storage import join_address

REGISTRY_FILE = "promoted.json"


def train_seed_for_run(train_seed: int, run_id: str) -> int:
    """The training pool's seed: `train_seed` when given (>= 0), else one derived from the run's id,
    so every scheduled run trains on fresh mazes while a rerun with an explicit seed repeats exactly."""
    if train_seed >= 0:
        return train_seed
    if not run_id:
        raise ConfigError("train_seed < 0 asks for a per-run seed, but the run id is empty")
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "big") & 0x7FFFFFFF


# The pipeline's `reference` parameter: the shipped VisGym recording, none, or a file's path.
SHIPPED_REFERENCE = "visgym"
NO_REFERENCE = ("", "none")


def resolve_reference(reference: str | None) -> str | None:
    """`visgym` -> the shipped VisGym reference mazes; '' or `none` -> no reference splits; else a path
    that must exist (a missing file is an error, never silently dropped)."""
    from .mazes.visgym import reference_file

    if reference is None or reference.strip().lower() in NO_REFERENCE:
        return None
    if reference == SHIPPED_REFERENCE:
        return str(reference_file())
    if not Path(reference).is_file():
        raise MazeError(f"reference file not found: {reference} (use {SHIPPED_REFERENCE!r} for the shipped VisGym "
                        "mazes, or 'none' for no reference splits)")
    return reference


def evaluation_split_names(preset: str, reference: str | None) -> list[str]:
    """The splits a run's evaluations will have: the dataset preset's generated splits but train, then the
    reference file's (named BASE-N after the mazes it holds, as generate names them)."""
    from .mazes.splits import TRAIN_SPLIT, reference_split_name
    from .mazes.splits import preset as load_preset
    from .mazes.visgym import load_visgym_fixture

    cfg = load_preset(preset)
    names = [n for n in cfg.splits if n != TRAIN_SPLIT]
    ref = resolve_reference(reference)
    if ref is not None:
        episodes = load_visgym_fixture(ref)
        for base, env_id in cfg.reference_splits.items():
            count = sum(e.env_id == env_id for e in episodes)
            if count:
                names.append(reference_split_name(base, count))
    return names


def check_guard_parameters(params: dict) -> None:
    """Before a run starts, the guard parameters among a run's `params` (given and default): each in its range, and
    the splits `guard_splits` and `guard_loop_splits` name among those the run will evaluate (from its
    `dataset_preset` and `reference`; found only at the compare step, a bad one would come after the training).
    Either wrong: a ConfigError naming the parameter and what is allowed."""
    from .evaluation.guards import GUARD_PARAMETERS, guarded_splits

    settings = guard_settings({k: v for k, v in params.items() if k in GUARD_PARAMETERS})
    if not any(params.get(k) for k in ("guard_splits", "guard_loop_splits")):
        return
    try:
        guarded_splits(settings, evaluation_split_names(params.get("dataset_preset", "default"), params.get("reference")))
    except MazeError as err:
        raise ConfigError(str(err)) from None


def generate(out_dir: str, preset: str, reference: str | None, train_seed: int, registry_root: str | None = None) -> dict:
    from .mazes.splits import generate_dataset
    from .mazes.splits import preset as load_preset

    cfg = load_preset(preset).model_copy(update={"train_seed": train_seed})
    ref = resolve_reference(reference)
    total = sum(s.total() for s in cfg.splits.values())
    if ref is not None:
        from .mazes.visgym import load_visgym_fixture

        wanted = set(cfg.reference_splits.values())
        total += sum(ep.env_id in wanted for ep in load_visgym_fixture(ref))
    done: dict[str, int] = {}
    with Progress("generate-mazes", total, "mazes") as bar:

        def tick(split: str, n: int, _total: int) -> None:
            done[split] = n
            bar.update(sum(done.values()), split=split)

        manifest = generate_dataset(cfg, out_dir, ref, overwrite=True, progress=tick)
    promoted = read_registry(registry_root) if registry_root else None
    if promoted and promoted.get("eval_splits_hash") not in (None, manifest["eval_splits_hash"]):
        raise MazeError(
            f"the frozen evaluation splits changed (hash {manifest['eval_splits_hash'][:12]} vs promoted "
            f"{promoted['eval_splits_hash'][:12]}): runs would not be comparable"
        )
    return manifest


def read_registry(root: str | None) -> dict | None:
    """The promotion pointer at `root` (a local/FSx path or s3://), or None before the first promotion."""
    if not root:
        return None
    from .storage import read_json

    return read_json(join_address(root, REGISTRY_FILE))


def resolve_base_model(model: str, out_dir: str, registry_root: str | None) -> str:
    """The last promoted model if there is one, else `model`: `tiny` builds the random tiny model,
    `tiny-base` is the shipped pretrained one (its files checked), anything else is a path or hub id."""
    from .policy.loading import resolve_model_name

    promoted = read_registry(registry_root)
    if promoted and promoted["model"].startswith("s3://"):
        # the address itself goes on: this pod's folders are not the next step's (each loader fetches it)
        from .policy.loading import fetch_s3_model

        fetch_s3_model(promoted["model"])  # fail here, clearly, if the upload is incomplete
        print(f"starting from the last promoted model: {promoted['model']} (run {promoted.get('run_id')})")
        return promoted["model"]
    if promoted:
        if not Path(promoted["model"]).exists():
            raise ConfigError(
                f"the registry {Path(registry_root or '') / REGISTRY_FILE} names promoted model {promoted['model']}, "
                "which no longer exists: restore it, or move promoted.json away to start from the base model again"
            )
        print(f"starting from the last promoted model: {promoted['model']} (run {promoted.get('run_id')})")
        return promoted["model"]
    if model == "tiny":
        from .policy.tiny import init_tiny

        return str(init_tiny(out_dir, overwrite=True))
    return resolve_model_name(model)


def _job_overrides(model: str, data_dir: str, out_dir: str, extra: dict) -> dict:
    return {"policy.model": model, "train_data": str(Path(data_dir) / "train.parquet"),
            "eval_data": str(Path(data_dir) / "heldout.parquet"), "output_dir": out_dir, **extra}


# The pipeline's `model_view` parameter: '' = the model's own mazerl_policy.json; else a named view
# (policy.views), for a starting model trained elsewhere, which carries none.
MODEL_VIEW_PARAMETER = "model_view"


def check_model_view(model_view: str | None) -> None:
    """A bad `model_view` is a ViewError listing the views, before anything runs."""
    if model_view:
        from .policy.views import named_view

        named_view(model_view)


def named_view_overrides(config: str, model_view: str | None, extra: dict | None = None) -> dict:
    """Job-config overrides that put the named view `model_view` where the starting model's own
    mazerl_policy.json would be: it sets the view fields the job config (and `extra`) leave unset, so the
    job's explicit settings still win, and the model's saved view is not read for them. '' = none."""
    if not model_view:
        return {}
    from .config import load_job_settings
    from .policy.views import named_view

    settings = named_view(model_view).settings
    data = load_job_settings(config) if config else {}
    policy = data.get("policy")
    policy = policy if isinstance(policy, dict) else {}
    given = set(policy) | {k.removeprefix("policy.") for k in (extra or {}) if k.startswith("policy.")}
    return {f"policy.{k}": v for k, v in settings.items() if k not in given}


def cluster_run_dir(profile_json: str, run_id: str) -> Path | None:
    """On a cluster profile, the run's directory on FSx (`<fsx>/mazerl/runs/<run id>`), where a step
    that hands a model to later steps writes it: a task's artifact folder is local to its pod (KFP
    uploads it when the task ends), so neither a retried pod nor the next step's pod could read it.
    None for the local profile (kfp.local: one machine)."""
    if not profile_json:
        return None
    profile = _profile(profile_json)
    if profile.kind != "hyperpod":
        return None
    from .cluster.train_step import run_directory

    return run_directory(profile, run_id)


def warm_start(model: str, data_dir: str, config: str, out_dir: str, extra: dict | None = None,
               profile_json: str = "", run_id: str = "", model_view: str = "") -> str:
    """`model_view`: a named view for a starting model without mazerl_policy.json (named_view_overrides)."""
    from .rl.config import SFTConfig
    from .rl.sft import train_sft

    run_dir = cluster_run_dir(profile_json, run_id)
    work_dir = run_dir / "warm-start" if run_dir else Path(out_dir)
    extra = {**named_view_overrides(config, model_view, extra), **(extra or {})}
    cfg = load_config(SFTConfig, config, _job_overrides(model, data_dir, str(work_dir), extra))
    with Progress("warm-start", cfg.steps, "step", deadline_s=cfg.max_minutes * 60 if cfg.max_minutes else None) as bar:
        train_sft(cfg, lambda step, r: bar.update(step, loss=r.get("loss"), accuracy=r.get("move_accuracy")), overwrite=True)
    if run_dir:
        write_json(Path(out_dir) / "run.json", {"model": str(work_dir / "final")})
    return str(work_dir / "final")


# Where GRPO runs, by the profile's `backend`. "local": in this process (the KFP task pod, or
# kfp.local here). "ray": the Ray backend (distributed/ray_grpo.py) from this task, on the Ray
# cluster at RAY_ADDRESS or a Ray started in the task's pod; the job config's `distributed:` sizes
# it. "rayjob": a KubeRay RayJob launched and followed from this task (cluster/train_step.py), sized
# by the profile's `rayjob:` section.
TRAINING_BACKENDS = ("local", "ray", "rayjob")


def check_backend(backend: str) -> None:
    if backend not in TRAINING_BACKENDS:
        raise ConfigError(f"training backend {backend!r} is not available in this version of mazerl "
                          f"(available: {', '.join(TRAINING_BACKENDS)})")


def _profile(profile_json: str):
    from .profiles import Profile

    return Profile.model_validate_json(profile_json)


def cleanup_launched(backend: str, profile_json: str = "", run_id: str = "") -> str:
    """The ExitHandler's step. local and ray launch nothing that outlives their task (the Ray driver
    kills its actors when it ends); rayjob deletes every RayJob labelled with this run (cancel, failure)."""
    check_backend(backend)
    if backend != "rayjob":
        return f"nothing to clean up (backend {backend})"
    from .cluster.train_step import cancel_run

    deleted = cancel_run(_profile(profile_json), run_id)
    return f"deleted RayJobs: {', '.join(deleted)}" if deleted else "no RayJob of this run was left"


def train_grpo(model: str, data_dir: str, config: str, out_dir: str, extra: dict | None = None,
               backend: str = "local", profile_json: str = "", run_id: str = "", model_view: str = "") -> tuple[str, dict]:
    """`model_view`: a named view for a starting model without mazerl_policy.json (named_view_overrides);
    the trained model saves the resulting view beside its weights."""
    from .rl.config import GRPOConfig
    from .rl.trainer import GRPOTrainer

    check_backend(backend)
    extra = {**named_view_overrides(config, model_view, extra), **(extra or {})}
    if backend == "rayjob":
        from .cluster.train_step import train_on_rayjob

        return train_on_rayjob(_profile(profile_json), run_id, model, data_dir, config, out_dir, extra or {})
    run_dir = cluster_run_dir(profile_json, run_id)
    # on a cluster: checkpoints on FSx (and S3), so a retried pod resumes, and the model where later pods read it
    work_dir = str(run_dir / "grpo") if run_dir else out_dir
    overrides = _job_overrides(model, data_dir, work_dir, extra or {})
    if run_dir:
        from .cluster.train_step import checkpoint_uri

        if (uri := checkpoint_uri(_profile(profile_json), run_id)) is not None:
            overrides["checkpoint_uri"] = uri
    if backend == "ray":
        overrides["distributed.backend"] = "ray"
    cfg = load_config(GRPOConfig, config, overrides)
    deadline = cfg.max_minutes * 60 if cfg.max_minutes else None
    with Progress("train-grpo", cfg.steps, "step", deadline_s=deadline) as bar:

        def on_step(step: int, r: dict) -> None:
            # with fit_schedule_to_max_minutes, the step the deadline will stop at
            bar.update(step, total=r.get("lr_schedule_steps"), reward=r.get("reward_mean"), success=r.get("success_rate"),
                       parse_fail=r.get("parse_failure_rate"), entropy=r.get("entropy"), heldout=r.get("eval/success"))

        if cfg.distributed.backend == "ray":
            from .distributed.ray_grpo import RayGRPO

            record = RayGRPO(cfg, on_step).run(resume="auto", overwrite=True)  # as in process, below
        else:
            # a retried task resumes from its last checkpoint; with none, it starts over in its own output folder
            record = GRPOTrainer(cfg, on_step).run(resume="auto", overwrite=True)
    if run_dir:
        from .cluster.train_step import hand_back

        hand_back(Path(work_dir), out_dir, {"run_directory": str(run_dir), "checkpoint_uri": overrides.get("checkpoint_uri")})
    return str(Path(work_dir) / "final"), record


def evaluation_limits(data_dir: str, splits: list[str], heldout: int, other: int, reference: int = 0) -> dict[str, int]:
    """Split -> how many of its mazes to play; the reference splits (named in the manifest) are
    absent, i.e. played in full, unless `reference` > 0."""
    from .mazes.splits import read_manifest, reference_splits

    references = reference_splits(read_manifest(data_dir))
    limits = {}
    for name in splits:
        if name not in references:
            limits[name] = heldout if name == "heldout" else other
        elif reference > 0:
            limits[name] = reference
    return limits


def job_view(config: str, model: str, data_dir: str, model_view: str = "") -> dict:
    """How the training job `config` shows mazes to `model` (prompt, history, new tokens a turn, reply
    grammar, image scale): the config's settings, the rest from the model's saved view (or the named view
    `model_view`), exactly as train_grpo builds its policy. The trained model saves the same view beside its weights."""
    from .rl.config import GRPOConfig

    # the job's data and model as train_grpo sets them; its output folder is required but never used here
    overrides = _job_overrides(model, data_dir, str(Path(data_dir) / "unused-output"),
                               named_view_overrides(config, model_view))
    return load_config(GRPOConfig, config, overrides).policy.view()


def evaluate(model: str, data_dir: str, out_dir: str, heldout_mazes: int, other_mazes: int,
             training_log: str | None = None, reference_mazes: int = 0, label: str = "evaluate",
             config: str = "", engine: str = "hf", model_view: str = "") -> dict:
    """Greedy evaluation of every frozen split: `heldout_mazes` of heldout, `other_mazes` of each other
    generated split, and the VisGym reference splits in full (all their mazes) unless `reference_mazes` > 0.
    `config`: the GRPO job config; the model is shown the mazes as that job shows them (`job_view`), so
    the baseline (e.g. a hub model, which has no saved view) and the trained model are evaluated alike
    and can be compared. '' = the model's own saved view; a model without one needs `model_view`.
    `model_view`: a named view (policy.views) for a model without mazerl_policy.json; with `config`, it takes
    the place of the model's saved view beneath the job's settings; without, it is the view ('' = none).
    `engine`: hf (transformers generate) or vllm (the profile's eval_engine; its per-prompt limits are
    derived from the splits played, and vLLM must be importable here)."""
    from .evaluation.runner import EvalConfig
    from .evaluation.runner import evaluate as run_eval
    from .policy.config import PolicyConfig

    if engine not in ("hf", "vllm"):
        raise ConfigError(f"evaluation engine {engine!r} is not one mazerl has: allowed hf, vllm")
    check_model_view(model_view)
    if engine == "vllm":  # before anything is read or loaded
        from .rollout.vllm_engine import require_vllm

        require_vllm()
    data = sorted(str(p) for p in Path(data_dir).glob("*.parquet") if p.stem != "train")
    if not data:
        raise MazeError(f"{data_dir} has no evaluation splits")
    limits = evaluation_limits(data_dir, [Path(p).stem for p in data], heldout_mazes, other_mazes, reference_mazes)
    import torch

    # a cluster task pod with a GPU evaluates on it (bf16); kfp.local and CPU pods use fp32 on CPU
    device = {"device": "cuda", "dtype": "bfloat16"} if torch.cuda.is_available() else {}
    if device:
        print(f"evaluating on {torch.cuda.get_device_name(0)} in bfloat16 with the {engine} engine (CPU evaluation "
              "uses float32)")
    if config:
        view = job_view(config, model, data_dir, model_view)
        choice = {"name": model_view or "job", "source": f"job config {config}" + (
            f" over named view {model_view}" if model_view else " over the model's saved view")}
    else:
        from .policy.views import choose_view

        chosen = choose_view(model, model_view or None, option=f"the pipeline parameter {MODEL_VIEW_PARAMETER}")
        view, choice = chosen.settings, {"name": chosen.name, "source": chosen.source}
    policy = PolicyConfig.for_model(model, **view, **device, engine=engine)
    print(f"{label}: view {choice['name']} ({choice['source']}): {json.dumps(policy.view(), sort_keys=True)}", flush=True)
    cfg = EvalConfig(policy="model", model=policy, data=data, out=out_dir, limits=limits, overwrite=True,
                     view_choice=choice)
    if training_log and not Path(training_log).exists():
        raise ConfigError(f"training log not found: {training_log}")
    with Progress(label, None, "mazes") as bar:
        def tick(split: str, done: int, total: int, share: float) -> None:
            bar.total = total
            bar.update(done, progress=share, split=split)

        summary = run_eval(cfg, progress=tick, metrics_log=training_log or None)
    heldout = summary["splits"].get("heldout", {}).get("greedy")
    if heldout:
        print(f"{PREFIX} {label}  heldout success {heldout['success']:.3f} ({heldout['successes']}/{heldout['episodes']})", flush=True)
    return summary


def compare(base_dir: str, new_dir: str, out_dir: str, min_gain: float, max_p_value: float,
            guards: dict | None = None) -> dict:
    """The promotion rule: heldout success rises by more than `min_gain` with McNemar p <= `max_p_value`, and
    no guard (`evaluation.guards`; `guards`: GuardSettings fields, all on by default) finds the new model worse.
    `decision.blocked_by` names the guards that failed; `decision.undecided` those with too few mazes to tell."""
    from .evaluation.compare import compare as run_compare
    from .evaluation.report import write_compare_report

    settings = guard_settings(guards or {})
    result = run_compare(base_dir, new_dir, settings)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    head = result["splits"].get("heldout") or next(iter(result["splits"].values()))
    criterion = head["success_diff"] > min_gain and head["mcnemar_p"] <= max_p_value
    blocked = [g["name"] for g in result["guards"] if not g["passed"]]
    result["decision"] = {"split": "heldout" if "heldout" in result["splits"] else next(iter(result["splits"])),
                          "success_diff": head["success_diff"], "p_value": head["mcnemar_p"],
                          "min_gain": min_gain, "max_p_value": max_p_value, "criterion_met": bool(criterion),
                          "guards": settings.model_dump(mode="json"), "blocked_by": blocked,
                          "undecided": [g["name"] for g in result["guards"] if not g["decided"]],
                          "improved": bool(criterion and not blocked)}
    write_compare_report(out_dir, result)
    write_json(Path(out_dir) / "comparison.json", result)
    return result


def read_comparison(result_dir: str) -> dict:
    """compare's comparison.json (the decision and every split's paired figures)."""
    path = Path(result_dir) / "comparison.json"
    try:
        comparison = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read the comparison {path}: {err}") from None
    if not isinstance(comparison, dict) or not isinstance(comparison.get("decision"), dict):
        raise ConfigError(f"{path} holds no promotion decision: not the output of compare")
    return comparison


def run_facts(run_id: str, registry_root: str, eval_splits_hash: str, profile_json: str = "", run: dict | None = None,
              previous: dict | None = None) -> dict:
    """What a promoted model's card records of the run that trained it. `run` (from the pipeline's promote
    step): `parameters` (the run's pipeline parameters), `base_model` (the model it started from),
    `train_seed` (the seed it drew) and `data_dir` (the generated dataset, whose manifest holds the hashes)."""
    from .model_card import code_version

    run = run or {}
    profile = _profile(profile_json) if profile_json else None
    facts: dict = {"run_id": run_id, "registry_root": registry_root, "eval_splits_hash": eval_splits_hash,
                   "parameters": dict(run.get("parameters") or {}), "base_model": run.get("base_model") or None,
                   "train_seed": run.get("train_seed"), "code_version": code_version(),
                   "profile": {"name": profile.name, "kind": profile.kind} if profile else {},
                   "image": profile.images.runtime if profile and profile.kind != "local" else None}
    # the registry's model then: a reproduction names it, as the registry will have moved on
    facts["started_from_promoted"] = bool(previous and facts["base_model"] and previous.get("model") == facts["base_model"])
    if run.get("data_dir"):
        from .mazes.splits import read_manifest

        manifest = read_manifest(run["data_dir"]) or {}
        splits = manifest.get("splits") or {}
        facts["dataset"] = {"train_hash": (splits.get("train") or {}).get("content_hash"),
                            "split_hashes": {name: info.get("content_hash") for name, info in splits.items()}}
        if facts["train_seed"] is None:
            facts["train_seed"] = manifest.get("train_seed")
    return facts


def promote(model_dir: str, registry_root: str, comparison: dict, eval_splits_hash: str, run_id: str,
            profile_json: str = "", run: dict | None = None) -> dict:
    """Record the promoted model in the registry pointer (atomic; the previous one is kept in history),
    with its card (README.md, `model_card`) in the model's directory, and register it in SageMaker's
    Model Registry, card included, when the profile names a model package group. `run`: the run's facts
    for the card (`run_facts`). The card is rendered before anything is written: a missing comparison
    is a ModelCardError and leaves the registry as it was."""
    from .model_card import CARD_FILE, render_card, sagemaker_card_content

    if not Path(model_dir).exists():
        raise ConfigError(f"cannot promote {model_dir}: it does not exist")
    previous = read_registry(registry_root)
    # the model goes where the registry is, so the pointer outlives the task that wrote it (a task's
    # output folder is pod-local on a cluster): s3://.../models/<run> (manifest last), or a copy on FSx
    durable = join_address(registry_root, "models", re.sub(r"[^A-Za-z0-9._-]", "-", run_id) or "run")
    promoted_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    facts = run_facts(run_id, registry_root, eval_splits_hash, profile_json, run, previous)
    on_s3 = registry_root.startswith("s3://")
    facts.update(model=durable if on_s3 else str(Path(durable).resolve()), promoted_at=promoted_at)
    card = render_card(comparison, facts)
    if on_s3:
        from .storage import put_tree, write_text

        put_tree(Path(model_dir), durable)
        card_address = join_address(durable, CARD_FILE)
        write_text(card_address, card, content_type="text/markdown")  # one PUT: there whole or not at all
    else:
        from .atomic import atomic_directory

        with atomic_directory(Path(durable), overwrite=True) as tmp:
            shutil.copytree(model_dir, tmp, dirs_exist_ok=True)
            (tmp / CARD_FILE).write_text(card, encoding="utf-8")  # inside the folder that appears whole, or not at all
        durable = str(Path(durable).resolve())
        card_address = str(Path(durable) / CARD_FILE)
    entry = {"model": durable, "run_id": run_id, "promoted_at": promoted_at, "model_card": card_address,
             "eval_splits_hash": eval_splits_hash, "decision": comparison.get("decision"),
             "history": ([{k: v for k, v in previous.items() if k != "history"}] + previous.get("history", [])) if previous else []}
    from .storage import write_json as write_document

    profile = _profile(profile_json) if profile_json else None
    sm = profile.sagemaker if profile is not None else None
    if sm is not None and sm.model_package_group:
        from .cluster.sagemaker import register_model

        decision = comparison.get("decision") or {}
        metrics_uri = join_address(registry_root, "models", Path(durable).name, "comparison.json")
        write_document(metrics_uri, comparison)
        per_split = {f"{split}/{key}": fig[key] for split, fig in (comparison.get("splits") or {}).items()
                     for key in ("mazes", "success_base", "success_new", "mcnemar_p", "loop_rate_new") if key in fig}
        entry["model_package_arn"] = register_model(
            sm.model_package_group, durable, sm.serving_image,
            {**decision, "run_id": run_id, "eval_splits_hash": eval_splits_hash, "model_card": card_address, **per_split},
            f"mazerl GRPO run {run_id}; model card: {card_address}", approval=sm.approval_status,
            metrics_uri=metrics_uri if metrics_uri.startswith("s3://") else None,
            model_card=sagemaker_card_content(comparison, facts, card_address))
    write_document(join_address(registry_root, REGISTRY_FILE), entry)
    return entry
