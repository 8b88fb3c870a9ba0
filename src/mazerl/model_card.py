"""The card of a promoted model: `README.md` in the model's directory, rendered from compare's
comparison.json and the facts of the run that trained it.

The top is a Hugging Face model card's YAML front matter (base_model, library_name, tags and a
`model-index` with one result per evaluated split: the trained model's greedy success rate, its 95%
Wilson interval, and the paired gain over the baseline with its 95% interval, exactly as
comparison.json holds it). Below it, the run card: the KFP run id, the train seed, the dataset and
evaluation-split hashes, the code version, the job config, the base model, the comparison with its
guards, and the command that runs the same pipeline again. `sagemaker_card_content` is the same card
in the JSON schema of a SageMaker model package's model card.
"""

from __future__ import annotations

import json
import math
import shlex
import subprocess
from pathlib import Path

import yaml

from .errors import UserError
from .evaluation.stats import wilson_interval

CARD_FILE = "README.md"
LIBRARY_NAME = "transformers"
TAGS = ["mazerl", "grpo", "reinforcement-learning", "vision-language-model", "maze-navigation"]
# Hugging Face's task id for a model that reads images and a prompt and writes text
TASK = {"type": "image-text-to-text", "name": "Maze navigation (multi-turn, greedy decoding)"}
DATASET_TYPE = "mazerl-mazes"
CARD_STATUS = "Draft"  # a SageMaker model card's status; the package's approval is separate

# the pipeline parameters a run card records, in the order of the DAG's signature
RUN_PARAMETERS = ("model", "model_view", "dataset_preset", "reference", "train_seed", "warm_start", "sft_config", "grpo_config",
                  "sft_steps", "grpo_steps", "heldout_mazes", "other_mazes", "reference_mazes")


class ModelCardError(UserError):
    """A card cannot be written from what was given; the message says what is missing."""


def check_comparison(comparison: object, where: str = "the comparison") -> dict:
    """compare's result, or a ModelCardError: a card is only written from a real comparison."""
    if not comparison:
        raise ModelCardError(f"cannot write the model card: {where} is missing (promote needs compare's comparison.json: "
                             "its decision and every split's paired figures)")
    if not isinstance(comparison, dict) or not isinstance(comparison.get("decision"), dict):
        raise ModelCardError(f"cannot write the model card: {where} holds no promotion decision (a `decision` object): "
                             "not the output of compare")
    splits = comparison.get("splits")
    if not isinstance(splits, dict) or not splits or not all(isinstance(v, dict) for v in splits.values()):
        raise ModelCardError(f"cannot write the model card: {where} has no evaluated splits (`splits`: split -> figures)")
    return comparison


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def split_results(comparison: dict) -> list[dict]:
    """Per evaluated split (as compare lists them): mazes, the trained model's success with its 95% Wilson
    interval, the baseline's, the gain with compare's 95% interval, the McNemar p. Splits without a
    success figure are left out."""
    results = []
    for split, fig in check_comparison(comparison)["splits"].items():
        success, mazes = _number(fig.get("success_new")), fig.get("mazes")
        if success is None or not isinstance(mazes, int) or mazes < 1:
            continue
        low, high = wilson_interval(round(success * mazes), mazes)
        gain_ci = fig.get("success_diff_ci95")
        results.append({
            "split": split, "mazes": mazes, "success": success, "success_ci95": [low, high],
            "success_base": _number(fig.get("success_base")), "gain": _number(fig.get("success_diff")),
            "gain_ci95": [float(x) for x in gain_ci] if isinstance(gain_ci, list) and len(gain_ci) == 2 else None,
            "mcnemar_p": _number(fig.get("mcnemar_p")),
        })
    return results


def code_version() -> dict:
    """mazerl's version, and the source checkout's commit when it runs from one (images install a wheel: none)."""
    from . import __version__

    version: dict = {"mazerl": __version__}
    root = Path(__file__).resolve().parents[2]
    if (root / ".git").exists():
        try:
            head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
            if head.returncode == 0:
                version["git_commit"] = head.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return version


def reproduce_command(facts: dict, comparison: dict) -> str | None:
    """The command that runs this pipeline again with the run's parameters: the drawn train seed made
    explicit, the model it started from, compare's rule and guards as decided, and a registry of its
    own (else the run would start from whatever the registry promotes by then). None when the run's
    parameters were not recorded (a promotion outside the pipeline)."""
    from .evaluation.guards import GUARD_PARAMETERS

    parameters = dict(facts.get("parameters") or {})
    profile = facts.get("profile") or {}
    if not parameters or not profile.get("name"):
        return None
    if facts.get("started_from_promoted") and facts.get("base_model"):
        parameters["model"] = facts["base_model"]  # the registry's model then, named explicitly
    if facts.get("train_seed") is not None:
        parameters["train_seed"] = facts["train_seed"]
    decision = comparison.get("decision") or {}
    for key in ("min_gain", "max_p_value"):
        if key in decision:
            parameters[key] = decision[key]
    guards = decision.get("guards") or {}
    for name, field in GUARD_PARAMETERS.items():
        if field in guards:
            value = guards[field]
            parameters[name] = ",".join(value) if isinstance(value, list) else "" if value is None else value
    if facts.get("registry_root") and facts.get("run_id"):
        from .storage import join_address

        parameters["registry_root"] = join_address(facts["registry_root"], "reproductions", facts["run_id"])
    verb = "run" if profile.get("kind") == "local" else "submit"
    words = ["mazerl", "pipeline", verb, "--profile", profile["name"]]
    for key, value in parameters.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        words += ["--param", f"{key}={text}"]
    return " ".join(shlex.quote(w) for w in words)


def front_matter(comparison: dict, facts: dict) -> dict:
    """The Hugging Face metadata: base_model, library_name, tags, model-index (one result per split)."""
    hashes = (facts.get("dataset") or {}).get("split_hashes") or {}
    results = []
    for r in split_results(comparison):
        def ci(method: str = "wilson") -> dict:  # a fresh mapping each time: no YAML anchors in the card
            return {"confidence": 0.95, "method": method}

        low, high = r["success_ci95"]
        metrics = [{"type": "success_rate", "name": "success rate", "value": r["success"]},
                   {"type": "success_rate_ci95_low", "name": "success rate, 95% interval low", "value": low, "args": ci()},
                   {"type": "success_rate_ci95_high", "name": "success rate, 95% interval high", "value": high, "args": ci()}]
        if r["success_base"] is not None:
            metrics.append({"type": "baseline_success_rate", "name": "baseline success rate", "value": r["success_base"]})
        if r["gain"] is not None:
            metrics.append({"type": "success_rate_gain", "name": "success gain over the baseline (paired)", "value": r["gain"]})
        if r["gain_ci95"] is not None:
            for end, value in zip(("low", "high"), r["gain_ci95"]):
                metrics.append({"type": f"success_rate_gain_ci95_{end}", "name": f"success gain, 95% interval {end}",
                                "value": value, "args": ci("newcombe-paired")})
        if r["mcnemar_p"] is not None:
            metrics.append({"type": "mcnemar_p_value", "name": "McNemar exact p (trained vs baseline)", "value": r["mcnemar_p"]})
        dataset = {"type": DATASET_TYPE, "name": f"mazerl {r['split']} mazes", "split": r["split"], "args": {"mazes": r["mazes"]}}
        if hashes.get(r["split"]):
            dataset["revision"] = hashes[r["split"]]  # the split's content hash: the exact mazes played
        results.append({"task": dict(TASK), "dataset": dataset, "metrics": metrics})
    meta: dict = {}
    if facts.get("base_model"):
        meta["base_model"] = str(facts["base_model"])
    meta.update({"library_name": LIBRARY_NAME, "tags": list(TAGS),
                 "model-index": [{"name": f"mazerl-{facts.get('run_id') or 'model'}", "results": results}]})
    return meta


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _interval(ci: list[float] | None, signed: bool = False) -> str:
    if not ci:
        return "-"
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"[{f.format(ci[0])}, {f.format(ci[1])}]"


def _run_rows(facts: dict) -> list[tuple[str, str]]:
    dataset = facts.get("dataset") or {}
    parameters = facts.get("parameters") or {}
    version = facts.get("code_version") or {}
    profile = facts.get("profile") or {}
    warm = bool(parameters.get("warm_start"))  # without a warm start the SFT config is not used
    jobs = ", ".join(f"{k} {parameters[k]}" for k in ("grpo_config", "sft_config") if parameters.get(k) and (warm or k != "sft_config"))
    if parameters and not warm:
        jobs = ", ".join(x for x in (jobs, "no warm start") if x)
    code = ", ".join(f"{k} {v}" for k, v in version.items() if v)
    rows = [("KFP run id", facts.get("run_id")), ("profile", f"{profile.get('name')} ({profile.get('kind')})" if profile else None),
            ("train seed", facts.get("train_seed")), ("dataset preset", parameters.get("dataset_preset")),
            ("training split hash", dataset.get("train_hash")), ("evaluation-split hash", facts.get("eval_splits_hash")),
            ("code version", code or None), ("image", facts.get("image")), ("job config", jobs or None),
            ("base model", facts.get("base_model")), ("promoted model", facts.get("model")),
            ("promoted at", facts.get("promoted_at"))]
    return [(k, "not recorded" if v in (None, "") else str(v)) for k, v in rows]


def render_card(comparison: dict, facts: dict) -> str:
    """README.md: the front matter, then the run card (Markdown)."""
    check_comparison(comparison)
    meta = front_matter(comparison, facts)
    decision = comparison["decision"]
    lines = ["---", yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).rstrip(), "---", "",
             f"# mazerl model from run {facts.get('run_id') or '(unknown run)'}", "",
             "A vision-language model post-trained with multi-turn GRPO to solve mazes turn by turn, promoted "
             "because it beat the model it started from on the frozen evaluation splits.", "",
             "## Evaluation", "",
             "Greedy decoding, trained model vs baseline on the same mazes (95% intervals: Wilson for a success rate, "
             "Newcombe's paired interval for the gain; McNemar's exact test).", "",
             "| split | mazes | baseline | trained | trained 95% interval | gain | gain 95% interval | McNemar p |",
             "|---|---:|---:|---:|---|---:|---|---:|"]
    for r in split_results(comparison):
        gain = f"{r['gain']:+.3f}" if r["gain"] is not None else "-"
        lines.append(f"| {r['split']} | {r['mazes']} | {_fmt(r['success_base'])} | {r['success']:.3f} | "
                     f"{_interval(r['success_ci95'])} | {gain} | {_interval(r['gain_ci95'], signed=True)} | {_fmt(r['mcnemar_p'], 4)} |")
    rule = ""
    if "min_gain" in decision and "max_p_value" in decision:
        rule = f" (rule: {decision.get('split', 'heldout')} gain > {decision['min_gain']} and p <= {decision['max_p_value']})"
    lines += ["", "## Decision", "",
              f"Promoted: {'yes' if decision.get('improved', True) else 'no'}{rule}; gain {_fmt(decision.get('success_diff'))}, "
              f"p = {_fmt(decision.get('p_value'), 4)}."]
    if decision.get("blocked_by"):
        lines.append(f"Blocked by: {', '.join(decision['blocked_by'])}.")
    if decision.get("undecided"):
        lines.append(f"Undecided guards (too few mazes to tell): {', '.join(decision['undecided'])}.")
    guards = comparison.get("guards")
    lines += ["", "### Guards", ""]
    if guards:
        lines += ["| guard | split | metric | baseline | trained | p | tolerance | passed | decided | why |",
                  "|---|---|---|---:|---:|---:|---:|---|---|---|"]
        for g in guards:
            lines.append(f"| {g.get('name')} | {g.get('split')} | {g.get('metric')} | {_fmt(g.get('base'))} | {_fmt(g.get('new'))} | "
                         f"{_fmt(g.get('p'), 4)} | {_fmt(g.get('tolerance'))} | {'yes' if g.get('passed') else 'no'} | "
                         f"{'yes' if g.get('decided') else 'no'} | {g.get('why', '')} |")
    else:
        off = (decision.get("guards") or {}).get("enabled") is False
        lines.append("Guards were off for this run." if off else "No guard records in the comparison.")
    lines += ["", "## Run", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in _run_rows(facts)]
    command = reproduce_command(facts, comparison)
    lines += ["", "## Reproduce", ""]
    if command:
        lines += ["The same pipeline with this run's parameters (the train seed it drew, the model it started from, "
                  "the decision rule and guards), into a registry of its own:", "", "```bash", command, "```"]
    else:
        lines.append("The run's parameters were not recorded (promoted outside the pipeline).")
    lines += ["", "The whole comparison is `comparison.json` (next to this model on S3 when it is registered in SageMaker, "
              "and in the compare step's output).", ""]
    return "\n".join(lines)


def read_front_matter(card: str) -> dict:
    """The YAML metadata at the top of a card (what the Hub reads)."""
    if not card.startswith("---\n"):
        raise ModelCardError("the card has no YAML front matter (it must start with a '---' line)")
    head, sep, _ = card[4:].partition("\n---\n")
    if not sep:
        raise ModelCardError("the card's YAML front matter is not closed by a '---' line")
    return yaml.safe_load(head)


def sagemaker_card_content(comparison: dict, facts: dict, card_uri: str | None = None) -> str:
    """The card as a SageMaker model package's ModelCardContent (the model package model card JSON schema:
    model_overview of model_creator and model_artifact, evaluation_details, additional_information)."""
    check_comparison(comparison)
    evaluations = []
    for r in split_results(comparison):
        data = [("success_rate", r["success"]), ("success_rate_ci95_low", r["success_ci95"][0]),
                ("success_rate_ci95_high", r["success_ci95"][1]), ("baseline_success_rate", r["success_base"]),
                ("success_rate_gain", r["gain"]), ("mcnemar_p_value", r["mcnemar_p"])]
        if r["gain_ci95"]:
            data += [("success_rate_gain_ci95_low", r["gain_ci95"][0]), ("success_rate_gain_ci95_high", r["gain_ci95"][1])]
        evaluations.append({"name": f"mazerl-{r['split']}"[:63],
                            "metadata": {"split": r["split"], "mazes": str(r["mazes"])},
                            "metric_groups": [{"name": "greedy success", "metric_data": [
                                {"name": name, "type": "number", "value": value} for name, value in data if value is not None]}]})
    guards = comparison.get("guards") or []
    if evaluations and guards:
        failed = [g["name"] for g in guards if not g.get("passed")]
        evaluations[0]["evaluation_observation"] = (f"{len(guards)} guards, "
                                                    + (f"failed: {', '.join(failed)}" if failed else "all passed"))[:2096]
    details = {k.replace(" ", "_").replace("-", "_"): v for k, v in _run_rows(facts)}
    if card_uri:
        details["model_card"] = card_uri
    info: dict = {"custom_details": {k: str(v)[:1024] for k, v in details.items()}}
    command = reproduce_command(facts, comparison)
    if command:
        info["caveats_and_recommendations"] = f"Reproduce: {command}"[:2048]
    content: dict = {"model_overview": {"model_creator": "mazerl"}, "evaluation_details": evaluations,
                     "additional_information": info}
    if facts.get("model"):
        content["model_overview"]["model_artifact"] = [str(facts["model"])]
    return json.dumps(content, sort_keys=True, allow_nan=False)
